"""StructuredChunks: chunks cut where the text breaks, checked against slow obvious references."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.selection import Adaptive, Chunked, KeepRate, Protect, StructuredChunks, TokenBudget
from specprefill_sdk.selection.base import BudgetSelector, ceil_count
from specprefill_sdk.selection.structured import Boundary, boundaries, has_text_offsets, text_chunks
from specprefill_sdk.types import Prompt, TokenScores

CLOSERS = "\"'\u201d\u2019)]}\u00bb"


def hand_prompt(pieces: Sequence[str | tuple[str, str, int]], *, protected: Sequence[int] = ()) -> Prompt:
    """A prompt from token texts, each ``text`` or ``(text, role, message)``; offsets are contiguous."""
    texts, roles, messages, offsets = [], [], [], []
    at = 0
    for piece in pieces:
        text, role, message = (piece, "text", 0) if isinstance(piece, str) else piece
        texts.append(text)
        roles.append(role)
        messages.append(message)
        offsets.append((at, at + len(text)))
        at += len(text)
    n = len(texts)
    return Prompt(
        token_ids=tuple(range(n)),
        text="".join(texts),
        roles=tuple(roles),
        message_index=tuple(messages),
        offsets=tuple(offsets),
        special=(False,) * n,
        protected=tuple(i in protected for i in range(n)),
        generation_start=n,
    )


def scores_of(values: Sequence[float] | torch.Tensor) -> TokenScores:
    return TokenScores(torch.as_tensor(values, dtype=torch.float32))


# ------------------------------------------------------------------ the slow obvious references
def reference_boundaries(prompt: Prompt) -> list[int]:
    """The break after each token, read character by character around the start of the next token."""
    text, out = prompt.text, []
    for t in range(prompt.n - 1):
        if prompt.message_index[t] != prompt.message_index[t + 1] or prompt.roles[t] != prompt.roles[t + 1]:
            out.append(4)
            continue
        p, q = prompt.offsets[t + 1]
        s = p
        while s > 0 and text[s - 1].isspace():
            s -= 1
        e = p
        while e < len(text) and text[e].isspace():
            e += 1
        strength = 0
        # a whitespace run at the start of token t + 1, which goes on past it (t does not)
        if s < e < q and prompt.offsets[t][1] <= e:
            newlines = text[s:e].count("\n")
            k = s - 1
            while k >= 0 and text[k] in CLOSERS:
                k -= 1
            if newlines >= 2:
                strength = 3
            elif newlines == 1:
                strength = 2
            elif k >= 0 and text[k] in ".!?":
                strength = 1
        out.append(strength)
    return out


def reference_chunks(strengths: Sequence[int], n: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """Cut at every break, merge short segments forward (a short rest backward), split long ones."""
    if n == 0:
        return []
    cuts = [t + 1 for t in range(n - 1) if strengths[t] >= 3]  # messages and paragraphs
    segments = list(zip([0, *cuts], [*cuts, n], strict=True))
    merged: list[tuple[int, int]] = []
    start = 0
    for _, end in segments:
        if end - start >= lo:
            merged.append((start, end))
            start = end
    if start < n:
        merged = [*merged[:-1], (merged[-1][0], n)] if merged else [(0, n)]

    def split(a: int, b: int) -> list[tuple[int, int]]:
        if b - a <= hi:
            return [(a, b)]
        candidates = [p for p in range(a + lo, b - lo + 1) if strengths[p - 1] > 0]
        if not candidates:
            k = math.ceil((b - a) / hi)
            sizes = [(b - a) // k + (1 if i < (b - a) % k else 0) for i in range(k)]
            out, at = [], a
            for size in sizes:
                out.append((at, at + size))
                at += size
            return out
        best = max(candidates, key=lambda p: (strengths[p - 1], -abs(2 * p - (a + b)), -p))
        return split(a, best) + split(best, b)

    return [piece for a, b in merged for piece in split(a, b)]


def reference_select(
    chunks: list[tuple[int, int]], values: list[float], forced: set[int], limit: int
) -> tuple[list[int], list[bool]]:
    """Best mean first; a chunk is taken while fewer than ``limit`` tokens are kept."""
    means = []
    for a, b in chunks:
        total = sum(values[a:b])  # float64 sums of float32 values
        mean = total / (b - a)
        means.append(-math.inf if math.isnan(mean) else mean)
    order = sorted(range(len(chunks)), key=lambda c: (-means[c], c))
    keep = set(forced)
    for c in order:
        a, b = chunks[c]
        if all(t in forced for t in range(a, b)):
            continue
        if len(keep) >= limit:
            break
        keep.update(range(a, b))
    kept = sorted(keep)
    return kept, [t in forced for t in kept]


# ------------------------------------------------------------------ boundaries
def crafted() -> Prompt:
    return hand_prompt(
        [
            ("<s>", "template", 0),  # 0
            ("system", "template", 0),  # 1
            ("\n", "template", 0),  # 2: role changes after it
            ("Be", "system", 0),  # 3
            (" brief", "system", 0),  # 4
            (".", "system", 0),  # 5: role changes after it
            ("</s>", "template", 0),  # 6
            ("\n", "template", 0),  # 7: the message changes after it
            ("<s>", "template", 1),  # 8
            ("user", "template", 1),  # 9
            ("\n", "template", 1),  # 10: role changes after it
            ("The", "user", 1),  # 11
            (" cat", "user", 1),  # 12
            (".", "user", 1),  # 13: a sentence ends (" It" starts with a space)
            (" It", "user", 1),  # 14
            (" is", "user", 1),  # 15
            (" 3", "user", 1),  # 16
            (".", "user", 1),  # 17: no break (no whitespace after it)
            ("5", "user", 1),  # 18
            (" m", "user", 1),  # 19
            ("!", "user", 1),  # 20: whitespace-only tokens follow
            ("\n", "user", 1),  # 21: a line ends
            ("Next", "user", 1),  # 22
            (" line", "user", 1),  # 23
            ("\n", "user", 1),  # 24: part of a blank line
            ("\n", "user", 1),  # 25: a paragraph ends
            ("Said", "user", 1),  # 26
            (' "', "user", 1),  # 27
            ("yes", "user", 1),  # 28
            ('."', "user", 1),  # 29: a sentence ends inside quotes
            (" e", "user", 1),  # 30
            (".g", "user", 1),  # 31: no break (the full stop is inside a token)
            (" this", "user", 1),  # 32
            ("? No", "user", 1),  # 33: one token holds the whitespace: no cut before it either
            (" end", "user", 1),  # 34: the role changes after it
            ("</s>", "template", 1),  # 35
        ]
    )


def test_boundaries_of_a_crafted_prompt() -> None:
    prompt = crafted()
    found = {t: b for t, b in enumerate(boundaries(prompt)) if b}
    assert found == {
        2: Boundary.MESSAGE,
        5: Boundary.MESSAGE,
        7: Boundary.MESSAGE,
        10: Boundary.MESSAGE,
        13: Boundary.SENTENCE,
        21: Boundary.LINE,
        25: Boundary.PARAGRAPH,
        29: Boundary.SENTENCE,
        34: Boundary.MESSAGE,
    }
    assert len(boundaries(prompt)) == prompt.n - 1
    assert list(boundaries(prompt)) == reference_boundaries(prompt)


def test_chunks_follow_sections_and_split_long_ones_at_lines_then_sentences() -> None:
    prompt = crafted()
    sections = StructuredChunks(KeepRate(0.5), min_size=1, max_size=100).chunks(prompt)
    cuts = [0, 3, 6, 8, 11, 26, 35, 36]  # message and paragraph breaks only: sections fit in 100
    assert sections == tuple(pairwise(cuts))
    small = StructuredChunks(KeepRate(0.5), min_size=1, max_size=8).chunks(prompt)
    # the user's first paragraph (11-26) splits at its line end (after 21), then at its sentence end
    assert (11, 14) in small and (22, 26) in small and all(b - a <= 8 for a, b in small)


def test_boundaries_of_a_real_chat_prompt(fast_tokenizer: Any) -> None:
    from specprefill_sdk.prompt import build_prompt

    text = "The cat sat. It was 3.5 m tall!\nNew line here.\n\nA new paragraph? Yes."
    prompt = build_prompt(
        fast_tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    )
    found = boundaries(prompt)
    assert list(found) == reference_boundaries(prompt)
    piece = lambda t: prompt.text[prompt.offsets[t][0] : prompt.offsets[t][1]]  # noqa: E731
    kinds = {(piece(t), piece(t + 1)): b for t, b in enumerate(found) if b and prompt.roles[t] == "user"}
    assert kinds[(".", " It")] == Boundary.SENTENCE
    assert kinds[("\n", "New")] == Boundary.LINE
    assert kinds[("\n", "A")] == Boundary.PARAGRAPH
    assert kinds[("?", " Yes")] == Boundary.SENTENCE
    assert ("3", ".") not in kinds and (".", "5") not in kinds
    assert sum(b == Boundary.MESSAGE for b in found) >= 4  # system / user / generation prompt


@pytest.fixture(scope="module")
def fast_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from specprefill_sdk.models import resolve_model_path

    return AutoTokenizer.from_pretrained(str(resolve_model_path("smollm2-135m", progress=False)))


# ------------------------------------------------------------------ merge and split
def sentence(k: int) -> list[str]:
    """``k`` tokens: ``k - 1`` words, then a full stop (the next sentence starts with a space)."""
    return [" w"] * (k - 1) + ["."]


def paragraph(*sizes: int) -> list[str]:
    return [piece for k in sizes for piece in sentence(k)] + ["\n", "\n"]


def test_short_sections_are_merged_with_the_next_and_a_short_rest_with_the_one_before() -> None:
    prompt = hand_prompt(paragraph(3) + paragraph(3) + paragraph(10) + paragraph(2))  # 5, 5, 12, 4 tokens
    assert text_chunks(prompt, 1, 64) == [5, 5, 12, 4]
    assert text_chunks(prompt, 8, 64) == [10, 16]  # 5 + 5; 12 + the short rest of 4
    assert text_chunks(prompt, 11, 64) == [26]  # 5 + 5 + 12, then the rest


def test_long_sections_split_at_the_strongest_break_nearest_the_middle() -> None:
    # one paragraph of 41 tokens: sentence ends after tokens 9, 19 and 29, a line end after token 30
    pieces = sentence(10) + sentence(10) + sentence(10) + ["\n", "w"] + sentence(10)[1:]
    prompt = hand_prompt(pieces)
    strengths = list(boundaries(prompt))
    assert [t for t, b in enumerate(strengths) if b] == [9, 19, 30]
    assert strengths[30] == Boundary.LINE
    assert text_chunks(prompt, 8, 64) == [41]  # fits: stays whole
    assert text_chunks(prompt, 8, 40) == [31, 10]  # the line end wins over the sentence nearer the middle
    assert text_chunks(prompt, 11, 40) == [20, 21]  # the line end would leave 10 < 11: best sentence end
    assert text_chunks(prompt, 8, 15) == [10, 10, 11, 10]
    even = hand_prompt([" w"] * 100)  # no break at all: even pieces, the longer ones first
    assert text_chunks(even, 8, 30) == [25, 25, 25, 25]
    assert text_chunks(hand_prompt([" w"] * 103), 8, 30) == [26, 26, 26, 25]


def random_prompt(rng: random.Random, n: int, *, words: int = 0, turns: float = 0.03, glue: float = 0.05) -> Prompt:
    """``n`` random tokens in random messages and roles: each token starts a new message with chance
    ``turns`` and is template glue with chance ``glue``. ``words`` more word tokens in the vocabulary
    make text breaks rarer (long sections, some with no usable break at all)."""
    vocabulary = [" w", "w", ".", "!", "?", " ", "\n", "\n\n", " \n", '"', '."', ")", " (", "3", ".5", ". x", "\u2028"]
    # whitespace before, in and after a newline, in one token or with the next word
    vocabulary += ["\t", "\r\n", "  ", "\u3000", " \t\n ", " \nw", "\t\n\nw"]
    vocabulary += [" w"] * words
    pieces: list[str | tuple[str, str, int]] = []
    message, role = 0, "user"
    for _ in range(n):
        if rng.random() < turns:
            message += 1
            role = rng.choice(["user", "system", "assistant"])
        pieces.append((rng.choice(vocabulary), "template" if rng.random() < glue else role, message))
    return hand_prompt(pieces, protected=[t for t in range(n) if rng.random() < 0.05])


def same_as_the_slow_reference(prompt: Prompt, lo: int, hi: int, seed: int, rng: random.Random) -> None:
    """The breaks, chunks and selections of ``prompt`` are the slow references' (random scores, some
    NaN, ties for a third of the seeds; random budgets, with and without `Protect`)."""
    n = prompt.n
    strengths = reference_boundaries(prompt)
    assert list(boundaries(prompt)) == strengths
    spans = reference_chunks(strengths, n, lo, hi)
    selector = StructuredChunks(TokenBudget(1), lo, hi)  # the budget does not change the chunks
    assert list(selector.chunks(prompt)) == spans
    lengths = [b - a for a, b in spans]
    assert text_chunks(prompt, lo, hi) == lengths
    assert sum(lengths) == n and all(x <= hi for x in lengths)
    assert all(x >= lo for x in lengths) or len(lengths) == 1
    values = torch.rand(n, generator=torch.Generator().manual_seed(seed))
    values[torch.rand(n, generator=torch.Generator().manual_seed(seed + 1)) < 0.05] = float("nan")
    if seed % 3 == 0:
        values = torch.round(values * 4) / 4  # ties
    scores = TokenScores(values)
    for inner in (KeepRate(rng.choice([0.05, 0.1, 0.3])), TokenBudget(rng.randint(1, 60))):
        plain = StructuredChunks(inner, lo, hi)
        wrapped = Protect(plain, sink=rng.randint(0, 3), tail=rng.choice([True, 5]))
        for tested in (plain, wrapped):
            chosen = tested.select(prompt, scores)
            own = Protect(KeepRate(1.0), sink=0, tail=False)  # only prompt.protected
            forced_mask = (wrapped if tested is wrapped else own).mask(prompt)
            forced = set(np.flatnonzero(forced_mask).tolist())
            count = inner.budget(prompt, values.numpy(), forced_mask).count
            if count >= n or len(spans) <= 1:
                assert chosen.dense and chosen.kept == n
                continue
            clean = [-math.inf if math.isnan(v) else v for v in values.tolist()]
            kept, protected = reference_select(spans, clean, forced, count)
            assert (list(chosen.indices), list(chosen.protected)) == (kept, protected)
            assert chosen.kept < max(count, len(forced)) + max(lengths)  # less than one chunk over


@pytest.mark.parametrize("seed", range(40))
def test_chunks_and_selection_equal_the_slow_reference(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 400)
    prompt = random_prompt(rng, n)
    lo = rng.randint(1, 12)
    hi = rng.randint(2 * lo - 1, 70) if 2 * lo - 1 <= 70 else 2 * lo - 1
    hi = max(hi, 1)
    same_as_the_slow_reference(prompt, lo, hi, seed, rng)


@pytest.mark.parametrize("seed", range(24))
def test_long_prompts_with_long_sections_equal_the_slow_reference(seed: int) -> None:
    # Sections of hundreds to thousands of tokens: many are split at once, piece after piece, some
    # into even pieces (no break leaves both sides min_size long), across dozens of messages.
    rng = random.Random(1000 + seed)
    switches = rng.choice([0.03, 0.002])
    words = rng.choice([10, 60, 400, 5000, 50000])
    prompt = random_prompt(rng, rng.randint(1000, 3000), words=words, turns=switches, glue=switches)
    lo = rng.randint(1, 12)
    hi = 2 * lo - 1 + rng.choice([0, 1, 20, 60])
    same_as_the_slow_reference(prompt, lo, hi, seed, rng)


def random_text(rng: random.Random, words: int) -> str:
    """Words and what follows them: spaces, sentence ends (some inside quotes or brackets), numbers
    such as ``3.5``, and whitespace runs of every kind, with and without newlines."""
    gaps = [" ", ". ", '." ', "!) ", "? ", "\n", ".\n\n", " \n ", "\t", "\r\n", "\u00a0", "\u2028", ",  ", "\n\n\n"]
    weights = [40, 6, 1, 1, 1, 3, 2, 1, 1, 1, 1, 1, 2, 1]
    pieces = []
    for _ in range(words):
        pieces.append(rng.choice(["cat", "sat", "the", "Mr", "3.5", "e.g", "(it", "yes", "ok."]))
        pieces += rng.choices(gaps, weights)
    return "".join(pieces)


@pytest.mark.parametrize("seed", range(8))
def test_random_chats_through_a_real_tokenizer_equal_the_slow_reference(seed: int, fast_tokenizer: Any) -> None:
    # The tokenizer's own tokens: whitespace merged into words or standing alone, punctuation
    # with the next word, chat-template glue between several messages of several roles.
    from specprefill_sdk.prompt import build_prompt

    rng = random.Random(2000 + seed)
    roles = ["system", "user", "assistant"]
    messages = [
        {"role": rng.choice(roles), "content": random_text(rng, rng.randint(5, 500))} for _ in range(rng.randint(1, 6))
    ]
    prompt = build_prompt(fast_tokenizer, messages, add_generation_prompt=rng.random() < 0.5)
    prompt = prompt.with_protected([rng.random() < 0.03 for _ in range(prompt.n)])
    lo = rng.randint(1, 12)
    hi = 2 * lo - 1 + rng.choice([0, 1, 20, 60])
    same_as_the_slow_reference(prompt, lo, hi, seed, rng)


def test_budget_is_respected_like_chunked_on_fixed_windows() -> None:
    # no break at all and 10 x 32 tokens: the text chunks are Chunked's windows, so are the selections
    prompt = hand_prompt([" w"] * 320)
    assert text_chunks(prompt, 8, 32) == [32] * 10
    for seed in range(5):
        scores = TokenScores(torch.rand(320, generator=torch.Generator().manual_seed(seed)))
        for inner in (KeepRate(0.1), KeepRate(0.15), KeepRate(0.33), TokenBudget(40), TokenBudget(64)):
            ours = StructuredChunks(inner, 8, 32).select(prompt, scores)
            fixed = Chunked(inner, 32).select(prompt.take(range(320)), scores)
            assert ours.indices == fixed.indices
            assert ours.kept >= inner.budget(prompt, None, np.zeros(320, dtype=bool)).count
    assert ceil_count(0.1 * 320) == 32


def test_a_prompt_of_one_chunk_or_within_the_budget_is_dense_without_scores() -> None:
    prompt = hand_prompt(sentence(20))
    decided = StructuredChunks(KeepRate(0.1)).decide_without_scores(prompt)
    assert decided is not None and decided.dense and "one chunk" in decided.reason
    assert StructuredChunks(KeepRate(1.0)).decide_without_scores(hand_prompt(paragraph(40) * 3)) is not None
    assert StructuredChunks(KeepRate(0.1)).decide_without_scores(hand_prompt(paragraph(40) * 3)) is None
    assert (
        StructuredChunks(Adaptive(dense_below_tokens=0)).decide_without_scores(hand_prompt(paragraph(40) * 3)) is None
    )


def test_expected_kept_bounds_what_is_kept() -> None:
    prompt = hand_prompt(paragraph(30, 20) * 10)
    selector = Protect(StructuredChunks(KeepRate(0.1)))
    bound = selector.expected_kept(prompt)
    assert bound is not None
    for seed in range(5):
        kept = selector.select(prompt, TokenScores(torch.rand(prompt.n, generator=torch.Generator().manual_seed(seed))))
        assert ceil_count(0.1 * prompt.n) <= kept.kept <= bound


def test_without_text_offsets_it_selects_as_fixed_chunks_and_says_so() -> None:
    bare = Prompt.from_token_ids(range(300)).with_protected([i % 50 == 0 for i in range(300)])
    assert not has_text_offsets(bare) and has_text_offsets(hand_prompt(sentence(3)))
    scores = TokenScores(torch.rand(300, generator=torch.Generator().manual_seed(0)))
    for selector, fixed in (
        (StructuredChunks(KeepRate(0.1)), Chunked(KeepRate(0.1), 32)),
        (Protect(StructuredChunks(TokenBudget(50), fallback_size=16)), Protect(Chunked(TokenBudget(50), 16))),
    ):
        ours, theirs = selector.select(bare, scores), fixed.select(bare, scores)
        assert (ours.indices, ours.protected, ours.chunk_size) == (theirs.indices, theirs.protected, theirs.chunk_size)
        size = theirs.chunk_size
        assert ours.reason == f"no text offsets, fixed chunks of {size}: {theirs.reason}"
        assert selector.expected_kept(bare) == fixed.expected_kept(bare)
    short = StructuredChunks(KeepRate(0.1)).decide_without_scores(Prompt.from_token_ids(range(20)))
    assert short is not None and short.dense and short.reason.startswith("no text offsets, fixed chunks of 32:")
    assert StructuredChunks(KeepRate(0.1)).chunks(Prompt.from_token_ids(range(70))) == ((0, 32), (32, 64), (64, 70))


def test_names_and_refused_arguments() -> None:
    assert StructuredChunks(KeepRate(0.1)).name == "StructuredChunks(KeepRate(0.1), 8, 64)"
    assert StructuredChunks(KeepRate(0.1), 4, 7, 16).name == "StructuredChunks(KeepRate(0.1), 4, 7, fallback_size=16)"
    with pytest.raises(InvalidRequestError, match="Protect\\(StructuredChunks") as info:
        StructuredChunks(Protect(KeepRate(0.1)))  # type: ignore[arg-type]
    assert info.value.param == "selector"
    for kwargs, param in (
        ({"min_size": 0}, "min_size"),
        ({"max_size": 0}, "max_size"),
        ({"min_size": 8, "max_size": 14}, "max_size"),
        ({"min_size": 2.5}, "min_size"),
        ({"fallback_size": 0}, "fallback_size"),
        ({"fallback_size": True}, "fallback_size"),
    ):
        with pytest.raises(InvalidRequestError) as info:
            StructuredChunks(KeepRate(0.1), **kwargs)
        assert info.value.param == param, kwargs
    StructuredChunks(KeepRate(0.1), 8, 15)  # the smallest max_size for min_size 8
    assert isinstance(StructuredChunks(KeepRate(0.1)).inner, BudgetSelector)


def test_scores_of_another_length_are_refused() -> None:
    with pytest.raises(InvalidRequestError):
        StructuredChunks(KeepRate(0.1)).select(hand_prompt(paragraph(40) * 3), TokenScores(torch.ones(5)))


# ------------------------------------------------------------------ policies
def test_policy_chunking_text_builds_structured_chunks(tmp_path: Path) -> None:
    from specprefill_sdk.policies import load_policy
    from specprefill_sdk.selection import DenseBelow

    path = tmp_path / "text.toml"
    path.write_text('[selector]\nkeep_rate = 0.2\nchunking = "text"\nmin_chunk_size = 4\nmax_chunk_size = 40\n')
    policy = load_policy(path)
    assert policy.build_selector() == DenseBelow(Protect(StructuredChunks(KeepRate(0.2), 4, 40, 32)), 256)
    assert "text chunks 4-40" in policy.summary()
    path.write_text('[selector]\nchunking = "text"\nchunk_size = 16\n')
    built = load_policy(path).with_overrides(keep_rate=0.3).build_selector()
    assert built == DenseBelow(Protect(StructuredChunks(KeepRate(0.3), 8, 64, fallback_size=16)), 256)
    path.write_text("[selector]\nchunk_size = 16\n")
    assert load_policy(path).build_selector() == DenseBelow(Protect(Chunked(KeepRate(0.1), 16)), 256)


@pytest.mark.parametrize(
    ("toml", "param", "match"),
    [
        ('chunking = "sentences"', "selector.chunking", "'fixed' or 'text'"),
        ("min_chunk_size = 4", "selector.min_chunk_size", "needs chunking = 'text'"),
        ("max_chunk_size = 40", "selector.max_chunk_size", "needs chunking = 'text'"),
        ('chunking = "text"\nchunk_size = 1', "selector.chunk_size", "contradicts chunking"),
        ('chunking = "text"\nmin_chunk_size = 40', "selector.max_chunk_size", "at least 2 \\* min_chunk_size - 1"),
        ('chunking = "text"\nmin_chunk_size = 0', "selector.min_chunk_size", "greater than or equal to 1"),
        ('chunking = "text"\nmax_chunk_size = 4.5', "selector.max_chunk_size", "valid integer"),
        ('chunking = "text"\nchunk_min = 4', "selector.chunk_min", "unknown field"),
    ],
)
def test_policy_chunking_refuses_bad_and_conflicting_options(tmp_path: Path, toml: str, param: str, match: str) -> None:
    from specprefill_sdk.errors import PolicyError
    from specprefill_sdk.policies import load_policy

    path = tmp_path / "bad.toml"
    path.write_text(f"[selector]\n{toml}\n")
    with pytest.raises(PolicyError, match=match) as info:
        load_policy(path)
    assert info.value.param == param
    assert isinstance(info.value, InvalidRequestError)


def test_an_override_to_single_tokens_replaces_text_chunking(tmp_path: Path) -> None:
    from specprefill_sdk.policies import load_policy

    # in the file, chunk_size = 1 contradicts text chunks (refused above); a request's chunk size
    # replaces them: single tokens, as asked
    path = tmp_path / "text.toml"
    path.write_text('[selector]\nchunking = "text"\n')
    single = load_policy(path).with_overrides(chunk_size=1)
    assert single.selector.chunking == "fixed" and single.selector.chunk_size == 1


# ------------------------------------------------------------------ the eval method
def test_draft_structured_method_shares_the_chunked_scorer_and_follows_it() -> None:
    from specprefill_sdk.eval.methods import METHOD_DESCRIPTIONS, method_names

    names = method_names()
    assert names.index("draft-structured") == names.index("draft-chunked") + 1
    assert "sentence" in METHOD_DESCRIPTIONS["draft-structured"]


@pytest.mark.slow
def test_draft_structured_runs_in_a_tiny_eval_on_smollm2(smollm: Any) -> None:
    from specprefill_sdk.eval import run_eval
    from specprefill_sdk.eval.harness import EvalConfig
    from specprefill_sdk.eval.methods import build_methods

    chunked, structured = build_methods(["draft-chunked", "draft-structured"], draft=smollm)
    assert structured.scorer is chunked.scorer and structured.scorer_key == chunked.scorer_key
    assert structured.selector(0.1) == Protect(StructuredChunks(KeepRate(0.1)), sink=1, tail=True)
    cfg = EvalConfig(
        tasks=("niah_single",),
        lengths=(512,),
        samples=1,
        keep_rates=(0.2,),
        methods=("draft-chunked", "draft-structured"),
        generate=False,
    )
    result = run_eval(cfg, progress=False, target=smollm)
    records = [r for r in result.records if r["method"] == "draft-structured"]
    assert len(records) == 1
    record = records[0]
    assert 0.0 <= record["recall"] <= 1.0
    assert 0.2 <= record["keep_ratio"] <= 0.2 + 64 / record["n"] + 1e-9, record
