"""A long text encoded in parallel pieces gives exactly the ids and offsets of one ``encode`` call.

The reference is the Rust tokenizer's own ``encode`` of the whole text. Besides the real SmolLM2
tokenizer (and Qwen2.5-Coder's and Gemma 3's where their packages are installed), the same vocabulary
is run under the other pre-tokenizers, normalizers and post-processors the fast path takes, built
with the ``tokenizers`` library itself, and under ones it must refuse.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers, processors

from specprefill_sdk import _parallel_encode as pe
from specprefill_sdk import build_prompt
from specprefill_sdk.errors import ModelLoadError

pytestmark = pytest.mark.slow


@cache
def _folder(name: str) -> Path:
    from specprefill_sdk.models import resolve_model_path

    return Path(resolve_model_path(name, progress=False))


@cache
def _auto(name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(_folder(name)))
    except ModelLoadError as exc:  # its model packages are optional
        pytest.skip(f"{name} is not available: {exc}")


def _smol() -> Tokenizer:
    """A fresh Rust SmolLM2 tokenizer, free to reconfigure."""
    return Tokenizer.from_file(str(_folder("smollm2-135m") / "tokenizer.json"))


def _reference(backend: Tokenizer, text: str, add_special_tokens: bool) -> tuple[list[int], list[tuple[int, int]]]:
    enc = backend.encode(text, add_special_tokens=add_special_tokens)
    return enc.ids, enc.offsets


@pytest.fixture
def many_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of about a hundred characters, up to 32 of them: many cuts in every kind of text."""
    monkeypatch.setattr(pe, "MIN_PIECE_CHARS", 96)
    monkeypatch.setenv("RAYON_NUM_THREADS", "16")
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)


# ---------------------------------------------------------------------------------------------- texts
def _random_tokens(n: int, seed: int) -> str:
    """Decoded random ids, as the load generator makes prompts: stray bytes, specials, odd spacing."""
    ids = np.random.default_rng(seed).integers(0, 49152, size=n).tolist()
    return str(_auto("smollm2-135m").decode(ids, skip_special_tokens=False))


def _prose() -> str:
    from specprefill_sdk.eval.corpora import haystack

    return haystack(9000, start=3)


def _code() -> str:
    """This package's own source, some of it indented with tabs, with trailing and repeated spaces."""
    source = Path(pe.__file__).read_text(encoding="utf-8")
    tabbed = source.replace("    ", "\t")
    return source[:3000] + "\n\n\t\t  \n" + tabbed[:3000] + "   x  =   1  \r\n\r\n" + source[-2000:]


_WORDS = (
    "café", "naïve", "Ærøskøbing", "e\u0301le\u0300ve", "Straße", "привет", "мир", "ελληνικά", "λόγος",
    "日本語", "中文字符", "한국어", "😀", "👍🏽", "🇫🇷", "العربية", "हिन्दी", "x²", "×", "ǅemal", "İstanbul",
    "ﬁne", "Å", "ℌ", "z̧", "word", "a", "I", "'s", "'ll", "123", "4567", "…", "—", "«quoted»",
)  # fmt: skip
_GAPS = (" ", " ", " ", "  ", "\n", "\n\n", "\t", " \t ", "", "\u00a0", "\u3000", " \u0301", "\r\n")


def _unicode(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return "".join(_WORDS[rng.integers(len(_WORDS))] + _GAPS[rng.integers(len(_GAPS))] for _ in range(n))


def _specials(n: int, seed: int) -> str:
    """Words and special tokens, the tokens against letters, spaces and each other."""
    rng = np.random.default_rng(seed)
    parts = ("word", "Word", " ", " ", "<|im_start|>", "<|endoftext|>", "<|im_end|>", "\n", "user", "<repo_name>")
    return "".join(parts[rng.integers(len(parts))] for _ in range(n))


def _periodic() -> str:
    """A cut point at every third character: cuts land exactly on the pieces' targets."""
    return "ab " * 2000 + "a"


TEXTS: dict[str, Callable[[], str]] = {
    "random-tokens": lambda: _random_tokens(3000, 0),
    "random-tokens-2": lambda: _random_tokens(1500, 1),
    "prose": _prose,
    "code": _code,
    "unicode": lambda: _unicode(1500, 2),
    "specials": lambda: _specials(2500, 3),
    "periodic": _periodic,
    "leading-and-trailing-spaces": lambda: "  " + _prose()[:4000] + "  \n ",
}


# ------------------------------------------------------------------------------------- configurations
def _template(single: str) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single=single, special_tokens=[("<|im_start|>", 1), ("<|im_end|>", 2), ("<|endoftext|>", 0)]
    )


def _split(pattern: str) -> pre_tokenizers.Sequence:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _configured(**parts: Any) -> Tokenizer:
    backend = _smol()
    for name, value in parts.items():
        setattr(backend, name, value)
    return backend


TAKEN: dict[str, Callable[[], Tokenizer]] = {
    "smollm2": _smol,
    "bos-and-eos": lambda: _configured(post_processor=_template("<|im_start|> $A <|im_end|>")),
    "qwen2-split-nfc": lambda: _configured(
        normalizer=normalizers.NFC(),
        pre_tokenizer=_split(pe._QWEN2),
        post_processor=processors.ByteLevel(add_prefix_space=False, trim_offsets=True),
    ),
    "llama3-split-bos": lambda: _configured(
        pre_tokenizer=_split(pe._LLAMA3),
        post_processor=processors.Sequence(
            [processors.ByteLevel(add_prefix_space=True, trim_offsets=False), _template("<|endoftext|> $A")]
        ),
    ),
    "gpt2-split": lambda: _configured(pre_tokenizer=_split(pe._GPT2)),
    "digits-prefix-space": lambda: _configured(
        pre_tokenizer=pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=True)]
        ),
        post_processor=processors.ByteLevel(add_prefix_space=False, trim_offsets=True),
    ),
}


def _with_added(token: AddedToken) -> Tokenizer:
    backend = _smol()
    backend.add_tokens([token])
    return backend


def _dropout() -> Tokenizer:
    config = json.loads(_smol().to_str())
    config["model"]["dropout"] = 0.5
    return Tokenizer.from_str(json.dumps(config))


def _truncated() -> Tokenizer:
    backend = _smol()
    backend.enable_truncation(100_000)
    return backend


REFUSED: dict[str, Callable[[], Tokenizer]] = {
    "unknown-regex": lambda: _configured(pre_tokenizer=_split(r"\w+|\s+|[^\w\s]+")),
    "metaspace": lambda: _configured(pre_tokenizer=pre_tokenizers.Metaspace()),
    "whitespace-split": lambda: _configured(pre_tokenizer=pre_tokenizers.WhitespaceSplit()),
    "nfkc": lambda: _configured(normalizer=normalizers.NFKC()),
    "trim-with-prefix-space": lambda: _configured(
        post_processor=processors.ByteLevel(add_prefix_space=True, trim_offsets=True)
    ),
    "roberta": lambda: _configured(post_processor=processors.RobertaProcessing(("<|im_end|>", 2), ("<|im_start|>", 1))),
    "added-token-with-space": lambda: _with_added(AddedToken("new york", special=False)),
    "lstrip-added-token": lambda: _with_added(AddedToken("token", lstrip=True)),
    "rstrip-added-token": lambda: _with_added(AddedToken("token", rstrip=True)),
    "bpe-dropout": _dropout,
    "truncation": _truncated,
}


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("config", list(TAKEN))
@pytest.mark.parametrize("text", list(TEXTS))
def test_the_pieces_give_the_ids_and_offsets_of_one_encode(many_pieces: None, config: str, text: str) -> None:
    backend, value = TAKEN[config](), TEXTS[text]()
    starts = pe.piece_starts(backend, value)
    assert len(starts) > 2, "the fast path must be taken for this configuration"
    # every cut is a space between two letters
    assert all(value[s - 1].isalpha() and value[s] == " " and value[s + 1].isalpha() for s in starts[1:])
    for add_special_tokens in (True, False):
        assert pe.encode(backend, value, add_special_tokens) == _reference(backend, value, add_special_tokens)


@pytest.mark.parametrize("config", list(REFUSED))
def test_tokenizers_the_argument_does_not_cover_are_encoded_whole(many_pieces: None, config: str) -> None:
    backend, value = REFUSED[config](), TEXTS["prose"]() + " I left new york, one token here"
    assert pe.piece_starts(backend, value) == [0]
    if config != "bpe-dropout":  # dropout draws at random: there is no one reference
        for add_special_tokens in (True, False):
            assert pe.encode(backend, value, add_special_tokens) == _reference(backend, value, add_special_tokens)


def _cut_anyway(backend: Tokenizer, text: str, starts: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """``text`` encoded in pieces at ``starts`` without asking whether that is exact."""
    ends = [*starts[1:], len(text)]
    encodings = backend.encode_batch([text[a:b] for a, b in zip(starts, ends, strict=True)], add_special_tokens=False)
    ids = [i for e in encodings for i in e.ids]
    offsets = [(a + s, b + s) for s, e in zip(starts, encodings, strict=True) for a, b in e.offsets]
    return ids, offsets


@pytest.mark.parametrize(
    ("config", "text"),
    [
        ("trim-with-prefix-space", "It was a bright cold day in April"),  # each piece's first offset untrimmed
        ("added-token-with-space", "I left new york for good"),  # the token cut in two
        ("rstrip-added-token", "one token here"),  # the space it takes left to the next piece
    ],
)
def test_the_refusals_guard_real_differences(config: str, text: str) -> None:
    """Cut anyway at every cut point, the refused configurations give other ids or offsets than one encode."""
    backend = REFUSED[config]()
    starts = [0] + [
        i for i in range(1, len(text) - 1) if text[i - 1].isalpha() and text[i] == " " and text[i + 1].isalpha()
    ]
    assert len(starts) > 1
    assert _cut_anyway(backend, text, starts) != _reference(backend, text, False)


def test_a_text_without_a_cut_point_is_encoded_whole(many_pieces: None) -> None:
    backend = _smol()
    for value in ("日本語のテキスト、" * 800, "a\u0301 b" * 2000, "x " * 3, "1 2 3 " * 3000):
        assert pe.piece_starts(backend, value) == [0]
        assert pe.encode(backend, value, True) == _reference(backend, value, True)


def test_a_long_text_is_cut_at_the_default_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYON_NUM_THREADS", "4")
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    backend, value = _smol(), _prose() * 12
    starts = pe.piece_starts(backend, value)
    assert len(starts) == 4 * pe.PIECES_PER_WORKER
    assert min(np.diff([*starts, len(value)])) >= pe.MIN_PIECE_CHARS // 2
    assert pe.encode(backend, value, True) == _reference(backend, value, True)
    assert pe.piece_starts(backend, value[: 2 * pe.MIN_PIECE_CHARS - 1]) == [0]  # too short to gain
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # encode_batch would run the pieces serially
    assert pe.piece_starts(backend, value) == [0]


def test_build_prompt_tokenizes_text_and_chats_in_pieces(many_pieces: None, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = _auto("smollm2-135m")
    seen: list[int] = []
    real = pe.piece_starts

    def recorded(backend: Any, text: str) -> list[int]:
        starts = real(backend, text)
        seen.append(len(starts))
        return starts

    monkeypatch.setattr(pe, "piece_starts", recorded)
    value = _prose()
    prompt = build_prompt(tokenizer, value)
    assert (list(prompt.token_ids), list(prompt.offsets)) == _reference(tokenizer._tokenizer, value, True)
    chat = build_prompt(tokenizer, [{"role": "user", "content": value}])
    assert (list(chat.token_ids), list(chat.offsets)) == _reference(tokenizer._tokenizer, chat.text, False)
    assert len(seen) == 2 and min(seen) > 2


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_the_real_byte_level_tokenizers_take_the_pieces(many_pieces: None, name: str) -> None:
    backend = _auto(name)._tokenizer
    for text in TEXTS:
        value = TEXTS[text]()
        assert len(pe.piece_starts(backend, value)) > 2, text
        for add_special_tokens in (True, False):
            assert pe.encode(backend, value, add_special_tokens) == _reference(backend, value, add_special_tokens)


def test_gemma_is_encoded_whole(many_pieces: None) -> None:
    """Gemma 3's tokenizer marks spaces (``▁``) and splits after them: not the argument's shape."""
    backend = _auto("gemma3-270m")._tokenizer
    for text in ("prose", "unicode", "specials"):
        value = TEXTS[text]()
        assert pe.piece_starts(backend, value) == [0]
        assert pe.encode(backend, value, True) == _reference(backend, value, True)
