"""Selector boundaries, each on both sides: the dense-below threshold at exactly N tokens (every path
that decides it), and an integer ``tail`` of `Protect` (0, 1, N, on plain text and on chat prompts)."""

from __future__ import annotations

import numpy as np
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
    return set(np.flatnonzero(mask).tolist())


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


# ----------------------------------------------------------------------------- adaptive budget edges
def _adaptive(**options: float) -> Adaptive:
    return Adaptive(**{"coverage": 0.9, "min_rate": 0.01, "max_rate": 1.0, "dense_below_tokens": 0, **options})


def test_adaptive_keeps_a_single_token_when_one_holds_the_mass() -> None:
    # min_rate 0.01 of 50 tokens rounds up to 1: the floor is one token, not two.
    values = torch.zeros(50)
    values[17] = 1.0
    sel = _adaptive(coverage=0.5).select(text_prompt(50), scores_of(values))
    assert sel.indices == (17,)
    assert "raised" not in sel.reason and "capped" not in sel.reason


def test_adaptive_notes_a_raise_to_min_rate_only_when_it_raised() -> None:
    values = torch.zeros(20)
    values[[3, 4]] = 1.0  # two tokens hold all the mass; min_rate 0.1 of 20 is also two
    exact = _adaptive(min_rate=0.1).select(text_prompt(20), scores_of(values))
    assert exact.kept == 2 and "raised" not in exact.reason
    raised = _adaptive(min_rate=0.2).select(text_prompt(20), scores_of(values))
    assert raised.kept == 4 and "raised to min_rate 0.2" in raised.reason


def test_adaptive_counts_the_one_token_left_after_the_forced_ones() -> None:
    # Nine of ten tokens are protected: the tenth is needed to cover the (unforced) mass.
    prompt = text_prompt(10, protected=tuple(range(9)))
    sel = _adaptive().select(prompt, ramp(10))
    assert sel.kept == 10


def test_adaptive_with_every_token_protected_keeps_them_all() -> None:
    prompt = text_prompt(6, protected=tuple(range(6)))
    sel = _adaptive(max_rate=0.5).select(prompt, ramp(6))
    assert sel.kept == 6 and all(sel.protected)


def test_adaptive_shifts_negative_scores_even_beside_a_nan() -> None:
    # NaN becomes -inf and is ignored; the finite scores are shifted so the smallest is 0: the three
    # tokens at -1 then hold all the mass. Without the shift the mass would be negative (keep max_rate).
    values = torch.full((20,), -10.0)
    values[[2, 9, 15]] = -1.0
    values[5] = float("nan")
    sel = _adaptive().select(text_prompt(20), scores_of(values))
    assert sel.indices == (2, 9, 15)


def test_adaptive_coverage_one_keeps_only_the_tokens_with_mass() -> None:
    # Exactly representable sums: a coverage of 1.0 is reached at the third token, not missed by rounding.
    values = torch.zeros(20)
    values[[1, 8, 13]] = torch.tensor([1.0, 2.0, 4.0])
    sel = _adaptive(coverage=1.0).select(text_prompt(20), scores_of(values))
    assert sel.indices == (1, 8, 13)


def test_a_tiny_keep_rate_still_keeps_one_chunk() -> None:
    # ceil(10 chunks x 1e-12) is taken as 0 by the rounding tolerance; the floor is one chunk.
    sel = Chunked(KeepRate(1e-12), 4).select(text_prompt(40), ramp(40))
    assert sel.indices == (36, 37, 38, 39)


def test_protect_names_only_the_options_that_differ_from_the_defaults() -> None:
    assert Protect(KeepRate(0.1)).name == "Protect(KeepRate(0.1))"
    assert Protect(KeepRate(0.1), sink=2).name == "Protect(KeepRate(0.1), sink=2)"
    # 1 == True in Python, but an integer tail of 1 is not the default tail: it is named.
    assert Protect(KeepRate(0.1), tail=1).name == "Protect(KeepRate(0.1), tail=1)"


@pytest.mark.parametrize(("n", "min_tokens", "kept"), [(100, 30, 30), (100, 5, 10), (100, 80, 50), (40, 30, 20)])
def test_adaptive_min_tokens_floor_below_the_ceiling(n: int, min_tokens: int, kept: int) -> None:
    # Scores concentrated on one token: coverage alone would keep 1 (plus nothing forced).
    values = torch.zeros(n)
    values[3] = 1.0
    selector = Adaptive(coverage=0.5, min_rate=0.1, max_rate=0.5, dense_below_tokens=0, min_tokens=min_tokens)
    selection = selector.select(text_prompt(n), scores_of(values))
    assert selection.kept == kept
    assert 3 in selection.indices
    if min_tokens > 0.1 * n and kept < 0.5 * n:
        assert "raised to min_tokens" in selection.reason and "capped" not in selection.reason
    if min_tokens > 0.5 * n:  # the floor passes the ceiling, which wins: the reason says both
        assert f"raised to min_tokens {min_tokens}, capped at max_rate 0.5" in selection.reason


def test_adaptive_min_tokens_refused_when_negative() -> None:
    from specprefill_sdk.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as info:
        Adaptive(min_tokens=-1)
    assert info.value.param == "min_tokens"
