r"""Encode a long text in pieces on several cores, with exactly the ids and offsets of one ``encode``.

The text is cut into pieces that the Rust tokenizer's ``encode_batch`` encodes in parallel; the ids
are joined and each piece's offsets shifted by where the piece starts. That is exact only where a cut
is a boundary of the whole text's pre-tokens, so that both encode the same pre-tokens and BPE, which
works on each pre-token alone, gives the same tokens. The argument, for the tokenizers taken here:

- A cut sits before a space that has a letter on either side (``text[i - 1]`` and ``text[i + 1]``
  letters, ``text[i] == " "``), so a piece ends in a letter and the next one starts with a space.
- Pre-tokenizer: the GPT-2 regex (``ByteLevel(use_regex=True)``), or ``Split`` by one of the known
  GPT-2, Llama-3 and Qwen2 regexes then ``ByteLevel(use_regex=False)``, each after any ``Digits``.
  No alternative of these regexes matches a letter followed by whitespace, so the match holding
  ``text[i - 1]`` ends at ``i``; none has a lookbehind, so the matches from ``i`` on are the
  piece's own; the one lookahead, ``\s+(?!\S)``, ends a run of whitespace, which in a piece that
  ends in a letter never reaches the piece's end. ``Digits`` isolates digits only, and the regex
  then cuts its run at ``i`` anyway. A prefix space (``add_prefix_space``) is added to the first
  piece as to the text, and to no later one, which starts with a space.
- Normalizer: none, or NFC, which composes nothing across a space between letters.
- Added tokens are matched before all this; one that contains no space cannot cross a cut. One with
  ``lstrip`` or ``rstrip`` would take the space, so those tokenizers are encoded whole.
- Post-processor: none, ``ByteLevel`` (its ``trim_offsets`` trims each token alone; with
  ``add_prefix_space`` it spares a piece's first token, so that pair is encoded whole),
  ``TemplateProcessing``, or a ``Sequence`` of those. The special tokens it adds (a BOS) are read
  off a probe encoded with and without them, and kept only when they sit before and after the text
  at offsets (0, 0), where they sit in the whole text's encoding too.

Anything else (SentencePiece or Metaspace tokenizers, BPE dropout, truncation or padding set, an
unknown regex) and a text without a cut point are encoded whole. So are texts too short to gain, and
all texts where ``TOKENIZERS_PARALLELISM`` turns the tokenizer's parallelism off. ``encode_batch``
runs on the tokenizer's rayon pool (``RAYON_NUM_THREADS`` threads, else one per core); where the
tokenizers library turns it off itself (in a process forked after the pool was used), the pieces run
one after another, with the same result.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

__all__ = ["encode", "encode_deferred", "piece_starts"]

#: The shortest piece worth a thread: below it the piece's own overhead eats its share of the work.
MIN_PIECE_CHARS = 2048
#: Pieces per core: several, so that a core that gets a slow piece (or is busy) costs less; rayon
#: hands the pieces out as the cores free up.
PIECES_PER_WORKER = 4

#: The letters a cut may sit between: those of the blocks from ASCII to Cyrillic, whose letters
#: (``str.isalpha``, Unicode's ``\p{L}``) were assigned long before any regex library's tables, so
#: Python and the tokenizer's regex agree on them. The class also holds non-letters (``×``,
#: combining marks), which `_cut_near` refuses by ``str.isalpha``.
_LETTER = "A-Za-z\u00c0-\u04ff"
_CUT = re.compile(f"[{_LETTER}] [{_LETTER}]")

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: The ``Split`` regexes of the argument above, exactly as a tokenizer's JSON spells them.
KNOWN_SPLITS = frozenset({_GPT2, _LLAMA3, _QWEN2})

#: Encoded with and without the post-processor's special tokens to learn what it adds.
_PROBE = "probe text"


def _workers() -> int:
    """The threads ``encode_batch`` runs on: rayon's pool, or one where the tokenizer's parallelism is off."""
    setting = os.environ.get("TOKENIZERS_PARALLELISM")
    if setting is not None and setting.strip().lower() in ("", "off", "false", "f", "no", "n", "0"):
        return 1
    rayon = os.environ.get("RAYON_NUM_THREADS", "")
    if rayon.isdigit() and int(rayon) > 0:
        return int(rayon)
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _state(component: Any) -> Any:
    return None if component is None else json.loads(component.__getstate__())


def _pre_tokenizer_ok(config: Any) -> bool:
    """The pre-tokenizer is ``Digits``*, then the GPT-2 ``ByteLevel`` or a known ``Split`` + a plain ``ByteLevel``."""
    if config is None:
        return False
    steps = config.get("pretokenizers", []) if config.get("type") == "Sequence" else [config]
    while steps and steps[0].get("type") == "Digits":
        steps = steps[1:]
    if len(steps) == 1:
        return steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex") is True
    if len(steps) != 2:
        return False
    split, byte_level = steps
    return (
        split.get("type") == "Split"
        and split.get("pattern", {}).get("Regex") in KNOWN_SPLITS
        and split.get("behavior") == "Isolated"
        and split.get("invert") is False
        and byte_level.get("type") == "ByteLevel"
        and byte_level.get("use_regex") is False
    )


def _post_processor_ok(config: Any) -> bool:
    if config is None or config.get("type") == "TemplateProcessing":
        return True
    if config.get("type") == "ByteLevel":
        return not (config.get("trim_offsets") and config.get("add_prefix_space"))
    if config.get("type") == "Sequence":
        return all(_post_processor_ok(step) for step in config.get("processors", []))
    return False


def _splittable(backend: Any) -> bool:
    """Whether a cut before a space between letters splits ``backend``'s encoding exactly (module doc)."""
    try:
        if backend.truncation is not None or backend.padding is not None:
            return False
        model = backend.model
        if type(model).__name__ != "BPE" or getattr(model, "dropout", None):
            return False
        added = backend.get_added_tokens_decoder().values()
        if any(" " in t.content or t.lstrip or t.rstrip for t in added):
            return False
        normalizer = _state(backend.normalizer)
        if normalizer is not None and normalizer.get("type") != "NFC":
            return False
        return _pre_tokenizer_ok(_state(backend.pre_tokenizer)) and _post_processor_ok(_state(backend.post_processor))
    except (AttributeError, TypeError, ValueError):  # not the Rust tokenizer this module knows
        return False


Tokens = tuple[list[int], list[tuple[int, int]]]


def _special_parts(backend: Any) -> tuple[Tokens, Tokens] | None:
    """The (ids, offsets) the post-processor puts before and after a text, or None if it does more."""
    bare = backend.encode(_PROBE, add_special_tokens=False)
    full = backend.encode(_PROBE, add_special_tokens=True)
    ids, offsets, n = full.ids, full.offsets, len(bare.ids)
    fits = [k for k in range(len(ids) - n + 1) if ids[k : k + n] == bare.ids and offsets[k : k + n] == bare.offsets]
    if len(fits) != 1:
        return None
    k = fits[0]
    if any(o != (0, 0) for o in offsets[:k] + offsets[k + n :]):
        return None
    return (ids[:k], offsets[:k]), (ids[k + n :], offsets[k + n :])


def _cut_near(text: str, start: int, end: int) -> int | None:
    """The first cut point ``i`` in ``start <= i < end - 1``: the index of a space between two letters."""
    start -= 1  # the letter before a cut at ``start``
    while (m := _CUT.search(text, max(start, 0), end)) is not None:
        i = m.start() + 1
        if text[i - 1].isalpha() and text[i + 1].isalpha():
            return i
        start = i
    return None


def piece_starts(backend: Any, text: str) -> list[int]:
    """Where each piece of ``text`` starts (``[0]``: encode it whole).

    The pieces aim at equal lengths, `PIECES_PER_WORKER` per core and at most one per
    `MIN_PIECE_CHARS`; each cut is the first cut point at or after its even target, within half the
    spacing (so no piece is shorter than half of it), and a target without one is skipped (fewer,
    longer pieces).
    """
    workers = _workers()
    count = min(workers * PIECES_PER_WORKER, len(text) // MIN_PIECE_CHARS)
    if workers < 2 or count < 2 or not _splittable(backend):
        return [0]
    spacing = len(text) / count
    starts = [0]
    for k in range(1, count):
        target = int(k * spacing)
        cut = _cut_near(text, target, int(target + spacing / 2))
        if cut is not None:
            starts.append(cut)
    return starts


def encode_deferred(
    backend: Any, text: str, add_special_tokens: bool
) -> tuple[list[int], Callable[[], list[tuple[int, int]]]]:
    """The ids of ``backend.encode(text, add_special_tokens=...)`` now, and a function for its offsets.

    The offsets (a tuple per token, shifted by each piece's start) cost more Python time than the ids
    on a long text; the function computes them from the encodings when called. ``backend`` is a
    ``tokenizers.Tokenizer``; the module doc says when the pieces are taken.
    """
    starts = piece_starts(backend, text)
    specials = _special_parts(backend) if add_special_tokens and len(starts) > 1 else None
    if len(starts) < 2 or (add_special_tokens and specials is None):
        enc = backend.encode(text, add_special_tokens=add_special_tokens)
        return enc.ids, lambda: enc.offsets
    ends = [*starts[1:], len(text)]
    encodings = backend.encode_batch([text[a:b] for a, b in zip(starts, ends, strict=True)], add_special_tokens=False)
    head, tail = specials if specials is not None else (([], []), ([], []))
    ids = list(head[0])
    for enc in encodings:
        ids += enc.ids
    ids += tail[0]

    def offsets() -> list[tuple[int, int]]:
        out = list(head[1])
        for start, enc in zip(starts, encodings, strict=True):
            out += enc.offsets if start == 0 else [(a + start, b + start) for a, b in enc.offsets]
        return out + tail[1]

    return ids, offsets


def encode(backend: Any, text: str, add_special_tokens: bool) -> Tokens:
    """The ids and offsets of ``backend.encode(text, add_special_tokens=...)``, in parallel pieces when exact.

    ``backend`` is a ``tokenizers.Tokenizer``; the module doc says when the pieces are taken.
    """
    ids, offsets = encode_deferred(backend, text, add_special_tokens)
    return ids, offsets()
