"""Selector boundaries, each on both sides: the dense-below threshold at exactly N tokens (every path
that decides it), and an integer ``tail`` of `Protect` (0, 1, N, on plain text and on chat prompts)."""

from __future__ import annotations

import pytest
import torch
from test_selection import chat_prompt, ramp, scores_of, text_prompt

from specprefill_sdk.selection import TEXT_TAIL_TOKENS, Adaptive, Chunked, DenseBelow, KeepRate, Protect, TokenBudget

N = 40


# ----------------------------------------------------------------------------- dense below N tokens
@pytest.mark.parametrize(
    "make",
    [
        lambda: DenseBelow(KeepRate(0.1), N),
        lambda: DenseBelow(Chunked(KeepRate(0.1), 4), N),
        lambda: DenseBelow(Protect(KeepRate(0.1), sink=0, tail=False), N),
        lambda: Adaptive(min_rate=0.05, max_rate=0.1, dense_below_tokens=N),
        lambda: Chunked(Adaptive(min_rate=0.05, max_rate=0.1, dense_below_tokens=N), 4),
        lambda: Protect(Adaptive(min_rate=0.05, max_rate=0.1, dense_below_tokens=N), sink=0, tail=False),
    ],
    ids=["below", "below-chunked", "below-protect", "adaptive", "chunked-adaptive", "protect-adaptive"],
)
def test_dense_below_n_tokens_means_n_minus_one_is_dense_and_n_is_not(make: object) -> None:
    selector = make()  # type: ignore[operator]
    below, at = text_prompt(N - 1), text_prompt(N)
    # Without scores: one token short of N is decided dense, N itself needs the draft.
    decided = selector.decide_without_scores(below)
    assert decided is not None and decided.dense and decided.kept == N - 1
    assert selector.decide_without_scores(at) is None
    # With scores (a pipeline that scored anyway, or a caller calling select directly): the same line.
    assert selector.select(below, ramp(N - 1)).dense
    chosen = selector.select(at, ramp(N))
    assert not chosen.dense and chosen.kept <= N // 2


def test_dense_below_inside_protect_fills_at_exactly_n() -> None:
    # The fill path (a Protect around the threshold) decides the same line as select.
    selector = Protect(DenseBelow(KeepRate(0.1), N), sink=1, tail=False)
    assert selector.select(text_prompt(N - 1), ramp(N - 1)).dense
    at = selector.select(text_prompt(N), ramp(N))
    assert not at.dense and at.kept == 4 and 0 in at.indices


def test_dense_below_zero_never_decides_dense() -> None:
    assert DenseBelow(KeepRate(0.5), 0).decide_without_scores(text_prompt(1)) is not None  # KeepRate: 1 of 1
    assert DenseBelow(KeepRate(0.5), 0).decide_without_scores(text_prompt(4)) is None
    assert Adaptive(dense_below_tokens=0).decide_without_scores(text_prompt(4)) is None


# ----------------------------------------------------------------------------- integer tail
def _protected(selector: Protect, prompt: object) -> set[int]:
    mask = selector.mask(prompt)  # type: ignore[arg-type]
    return {int(i) for i in torch.nonzero(mask).flatten()}


@pytest.mark.parametrize(("tail", "kept"), [(0, set()), (1, {99}), (2, {98, 99}), (3, {97, 98, 99})])
def test_an_integer_tail_keeps_exactly_that_many_last_tokens_of_plain_text(tail: int, kept: set[int]) -> None:
    assert _protected(Protect(KeepRate(0.1), sink=0, tail=tail), text_prompt(100)) == kept


def test_tail_true_keeps_the_text_tail_and_false_keeps_none() -> None:
    p = text_prompt(100)
    assert _protected(Protect(KeepRate(0.1), sink=0, tail=True), p) == set(range(100 - TEXT_TAIL_TOKENS, 100))
    assert _protected(Protect(KeepRate(0.1), sink=0, tail=False), p) == set()


@pytest.mark.parametrize(
    ("tail", "kept"),
    [
        (True, {60, 61, 62, 63}),  # the generation prompt only: no 8-token text tail on a chat prompt
        (False, set()),
        (0, {60, 61, 62, 63}),
        (1, {60, 61, 62, 63}),
        (6, {58, 59, 60, 61, 62, 63}),  # the generation prompt and the last 6 tokens
    ],
)
def test_an_integer_tail_on_a_chat_prompt_adds_to_the_generation_prompt(tail: bool | int, kept: set[int]) -> None:
    assert _protected(Protect(KeepRate(0.1), sink=0, tail=tail), chat_prompt()) == kept


def test_an_integer_tail_counts_toward_the_budget() -> None:
    # 100 tokens, the best scores first: a budget of 10 keeps the 2 tail tokens and the 8 best others.
    values = torch.arange(100, 0, -1, dtype=torch.float32)
    sel = Protect(TokenBudget(10), sink=0, tail=2).select(text_prompt(100), scores_of(values))
    assert sel.indices == (*range(8), 98, 99)
    assert sel.protected_count == 2
