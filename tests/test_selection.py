"""Selectors: budgets, chunking, protection, the adaptive rule, composition and argument checks."""

from __future__ import annotations

import math

import pytest
import torch

from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.interfaces import Selector
from specprefill_sdk.selection import (
    TEXT_TAIL_TOKENS,
    Adaptive,
    Chunked,
    DenseBelow,
    KeepRate,
    Protect,
    TokenBudget,
)
from specprefill_sdk.types import CompressedPrompt, Message, Prompt, Selection, TokenScores


def text_prompt(n: int, *, protected: tuple[int, ...] = ()) -> Prompt:
    p = Prompt.from_token_ids(range(n))
    if protected:
        p = p.with_protected([i in protected for i in range(n)])
    return p


def chat_prompt() -> Prompt:
    """A hand-built chat prompt: system(0-9), user(10-29), assistant(30-39), user(40-59), gen prompt(60-63).

    Each message starts with 3 template tokens (the first special) and ends with 1 special token.
    """
    spans = [("system", 0, 10), ("user", 10, 30), ("assistant", 30, 40), ("user", 40, 60)]
    roles, index, special = [], [], []
    for m, (role, a, b) in enumerate(spans):
        for t in range(a, b):
            glue = t < a + 3 or t == b - 1
            roles.append("template" if glue else role)
            index.append(m)
            special.append(t == a or t == b - 1)
    for t in range(60, 64):
        roles.append("template")
        index.append(-1)
        special.append(t == 60)
    n = len(roles)
    messages = tuple(Message(role, "x") for role, _, _ in spans)
    return Prompt(
        token_ids=tuple(range(n)),
        text="c" * n,
        roles=tuple(roles),
        message_index=tuple(index),
        offsets=tuple((i, i + 1) for i in range(n)),
        special=tuple(special),
        protected=(False,) * n,
        generation_start=60,
        messages=messages,
    )


def scores_of(values: list[float] | torch.Tensor) -> TokenScores:
    return TokenScores(torch.as_tensor(values, dtype=torch.float32))


def ramp(n: int) -> TokenScores:
    """Scores that grow with the position: the best tokens are the last ones."""
    return scores_of(torch.arange(n, dtype=torch.float32))


def random_scores(n: int, seed: int = 0) -> TokenScores:
    g = torch.Generator().manual_seed(seed)
    return scores_of(torch.rand(n, generator=g))


# ---------------------------------------------------------------------------------------------- KeepRate
def test_keep_rate_keeps_ceil_of_rate_times_n_top_tokens() -> None:
    p = text_prompt(95)
    s = random_scores(95)
    sel = KeepRate(0.1).select(p, s)
    assert sel.kept == math.ceil(0.1 * 95) == 10
    top = set(torch.topk(s.values, 10).indices.tolist())
    assert set(sel.indices) == top
    assert list(sel.indices) == sorted(sel.indices)
    assert sel.requested_rate == 0.1 and not sel.dense and sel.protected_count == 0
    assert "keep-rate 0.1" in sel.reason


def test_keep_rate_ignores_floating_point_noise_in_the_ceiling() -> None:
    # 0.1 * 30 is 3.0000000000000004 in floating point; the budget is still 3 tokens.
    assert KeepRate(0.1).select(text_prompt(30), ramp(30)).indices == (27, 28, 29)


def test_keep_rate_one_is_decided_without_scores() -> None:
    p = text_prompt(50)
    sel = KeepRate(1.0).decide_without_scores(p)
    assert sel is not None and sel.dense and sel.kept == 50
    assert KeepRate(0.5).decide_without_scores(p) is None


def test_keep_rate_keeps_at_least_one_token_and_breaks_ties_by_position() -> None:
    sel = KeepRate(0.01).select(text_prompt(20), scores_of([1.0] * 20))
    assert sel.indices == (0,)


def test_nan_scores_are_never_preferred() -> None:
    values = torch.arange(10, dtype=torch.float32)
    values[3] = float("nan")
    assert 3 not in KeepRate(0.5).select(text_prompt(10), scores_of(values)).indices


def test_scores_of_the_wrong_length_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="11 scores for a prompt of 10"):
        KeepRate(0.5).select(text_prompt(10), ramp(11))


@pytest.mark.parametrize("rate", [0, 0.0, -0.1, 1.01, 2, float("nan"), float("inf"), "0.1", True, None])
def test_keep_rate_rejects_bad_rates(rate: object) -> None:
    with pytest.raises(InvalidRequestError, match="keep rate") as info:
        KeepRate(rate)  # type: ignore[arg-type]
    assert info.value.param == "keep_rate"


def test_prompt_protected_tokens_are_kept_by_every_selector_and_count_toward_the_budget() -> None:
    p = text_prompt(40, protected=(0, 1))
    sel = KeepRate(0.1).select(p, ramp(40))
    assert sel.indices == (0, 1, 38, 39)
    assert sel.protected == (True, True, False, False)


# ---------------------------------------------------------------------------------------------- TokenBudget
def test_token_budget_keeps_k_tokens() -> None:
    sel = TokenBudget(7).select(text_prompt(100), ramp(100))
    assert sel.indices == tuple(range(93, 100))
    assert sel.requested_rate == pytest.approx(0.07)


def test_token_budget_covering_the_prompt_skips_scoring() -> None:
    assert TokenBudget(100).decide_without_scores(text_prompt(100)) is not None
    assert TokenBudget(99).decide_without_scores(text_prompt(100)) is None


@pytest.mark.parametrize("k", [0, -3, 2.5, True, "8"])
def test_token_budget_rejects_bad_k(k: object) -> None:
    with pytest.raises(InvalidRequestError, match="token budget"):
        TokenBudget(k)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- Chunked
def test_chunked_keeps_whole_top_chunks_in_order() -> None:
    n, size = 128, 32
    values = torch.zeros(n)
    values[64:96] = 5.0  # chunk 2 is the best
    values[0:32] = 1.0  # chunk 0 second
    sel = Chunked(KeepRate(0.5), size).select(text_prompt(n), scores_of(values))
    assert sel.indices == tuple(range(0, 32)) + tuple(range(64, 96))
    assert sel.chunk_size == 32 and sel.requested_rate == 0.5
    assert "2/4 chunks" in sel.reason


def test_chunk_count_is_ceil_of_chunks_times_rate() -> None:
    # 10 chunks of 32 at rate 0.15 -> ceil(1.5) = 2 chunks.
    sel = Chunked(KeepRate(0.15), 32).select(text_prompt(320), random_scores(320))
    assert sel.kept == 64
    chunks = {i // 32 for i in sel.indices}
    assert len(chunks) == 2
    assert set(sel.indices) == {i for c in chunks for i in range(c * 32, c * 32 + 32)}


def test_chunk_score_is_the_mean_not_the_sum_nor_the_max() -> None:
    # Chunks of unequal size, or the sum would rank them as the mean does: [0, 32) holds one
    # outstanding token (sum 41, max 10, mean 1.28), the short last chunk [32, 40) eight good ones
    # (sum 16, max 2, mean 2). Only the mean picks the short chunk.
    values = torch.ones(40)
    values[5] = 10.0
    values[32:40] = 2.0
    sel = Chunked(KeepRate(0.5), 32).select(text_prompt(40), scores_of(values))
    assert sel.indices == tuple(range(32, 40))


def test_partial_last_chunk_is_scored_by_its_own_tokens() -> None:
    # 70 tokens: chunks [0,32), [32,64), [64,70). The short last chunk has the highest mean only if
    # it is not padded with zeros (6 tokens of 3.0 -> mean 3.0; padded it would be 0.56).
    values = torch.full((70,), 1.0)
    values[64:70] = 3.0
    sel = Chunked(KeepRate(0.2), 32).select(text_prompt(70), scores_of(values))
    # ceil(3 chunks * 0.2) = 1 chunk: the partial one.
    assert sel.indices == tuple(range(64, 70))


def test_partial_last_chunk_counts_as_one_chunk_of_the_budget() -> None:
    values = torch.zeros(70)
    values[64:70] = 3.0
    values[0:32] = 2.0
    # ceil(3 * 0.6) = 2 chunks: the partial chunk and chunk 0, not a third chunk to make up tokens.
    sel = Chunked(KeepRate(0.6), 32).select(text_prompt(70), scores_of(values))
    assert sel.indices == tuple(range(0, 32)) + tuple(range(64, 70))


def test_prompt_shorter_than_one_chunk_is_dense_without_scores() -> None:
    sel = Chunked(KeepRate(0.1), 32).decide_without_scores(text_prompt(20))
    assert sel is not None and sel.dense and sel.kept == 20 and sel.chunk_size == 32
    assert Chunked(KeepRate(0.1), 32).decide_without_scores(text_prompt(400)) is None


def test_chunked_token_budget_and_size_one_equal_token_level() -> None:
    p, s = text_prompt(200), random_scores(200, seed=3)
    assert Chunked(KeepRate(0.1), 1).select(p, s).indices == KeepRate(0.1).select(p, s).indices
    values = torch.zeros(200)
    values[100:164] = 1.0
    sel = Chunked(TokenBudget(64), 32).select(p, scores_of(values))
    assert sel.indices == tuple(range(96, 160))  # ceil(64 / 32) = 2 chunks
    assert Chunked(TokenBudget(65), 32).select(p, s).kept >= 65  # rounded up to whole chunks


def test_chunked_rejects_non_budget_inner_and_bad_size() -> None:
    with pytest.raises(InvalidRequestError, match="Protect\\(Chunked"):
        Chunked(Protect(KeepRate(0.1)))  # type: ignore[arg-type]
    for size in (0, -1, 2.0, True):
        with pytest.raises(InvalidRequestError, match="chunk size"):
            Chunked(KeepRate(0.1), size)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- Protect
def test_protect_defaults_keep_the_sink_and_the_generation_prompt() -> None:
    p = chat_prompt()
    s = random_scores(p.n, seed=1)
    sel = Protect(KeepRate(0.1)).select(p, s)
    assert 0 in sel.indices
    assert set(range(60, 64)) <= set(sel.indices)
    by_index = dict(zip(sel.indices, sel.protected, strict=True))
    assert all(by_index[i] for i in (0, 60, 61, 62, 63))


def test_protected_tokens_count_toward_the_budget() -> None:
    p = chat_prompt()  # 64 tokens; protected: 1 sink + 4 generation-prompt tokens
    sel = Protect(KeepRate(0.25)).select(p, ramp(p.n))
    assert sel.kept == 16
    assert sel.protected_count == 5
    # The inner selector filled the other 11 with the best unprotected tokens (the ramp's top).
    assert tuple(i for i, pr in zip(sel.indices, sel.protected, strict=True) if not pr) == tuple(range(49, 60))


def test_protection_wins_over_a_too_small_budget() -> None:
    p = chat_prompt()
    sel = Protect(TokenBudget(2), roles=("system",)).select(p, ramp(p.n))
    system = [i for i, r in enumerate(p.roles) if r == "system"]
    assert set(sel.indices) == {0, *system, 60, 61, 62, 63}
    assert all(sel.protected)


def test_protect_always_keeps_sink_and_tail_whatever_the_scores() -> None:
    for seed in range(5):
        for inner in (KeepRate(0.05), Chunked(KeepRate(0.05), 8), TokenBudget(1), Adaptive(dense_below_tokens=0)):
            p = chat_prompt()
            values = random_scores(p.n, seed=seed).values
            values[0] = -100.0
            values[60:] = -100.0
            sel = Protect(inner, sink=2).select(p, scores_of(values))
            assert {0, 1, 60, 61, 62, 63} <= set(sel.indices), inner.name


def test_plain_text_tail_keeps_the_last_tokens() -> None:
    p = text_prompt(100)
    values = torch.arange(100, 0, -1, dtype=torch.float32)  # best tokens first
    sel = Protect(KeepRate(0.2)).select(p, scores_of(values))
    assert set(range(100 - TEXT_TAIL_TOKENS, 100)) <= set(sel.indices)
    assert sel.kept == 20
    sel = Protect(KeepRate(0.2), tail=3).select(p, scores_of(values))
    assert {97, 98, 99} <= set(sel.indices) and 96 not in sel.indices
    sel = Protect(KeepRate(0.2), sink=0, tail=False).select(p, scores_of(values))
    assert sel.indices == tuple(range(20)) and sel.protected_count == 0


def test_protect_roles_last_user_turn_spans_and_special_tokens() -> None:
    p = chat_prompt()
    low = scores_of(torch.zeros(p.n))
    sel = Protect(KeepRate(0.01), sink=0, tail=False, last_user_turn=True).select(p, low)
    assert set(range(40, 60)) <= set(sel.indices)
    assert not set(range(10, 30)) & set(sel.indices)  # the earlier user turn is not protected
    sel = Protect(KeepRate(0.01), sink=0, tail=False, roles=["assistant"]).select(p, low)
    assert set(sel.indices) == {33, 34, 35, 36, 37, 38}
    sel = Protect(KeepRate(0.01), sink=0, tail=False, spans=[(12, 15)]).select(p, low)
    assert set(sel.indices) == {12, 13, 14}
    sel = Protect(KeepRate(0.01), sink=0, tail=False, special_tokens=True).select(p, low)
    glue = {i for i in range(p.n) if p.roles[i] == "template" or p.special[i]}
    assert set(sel.indices) == glue


def test_protect_marks_dense_decisions_and_full_protection() -> None:
    p = chat_prompt()
    sel = Protect(KeepRate(1.0)).decide_without_scores(p)
    assert sel is not None and sel.dense and sel.kept == p.n
    assert sel.protected_count == 5
    short = text_prompt(4)
    sel = Protect(KeepRate(0.1)).decide_without_scores(short)  # the 8-token tail covers it all
    assert sel is not None and sel.dense and all(sel.protected)
    assert Protect(KeepRate(0.1)).decide_without_scores(text_prompt(100)) is None


def test_protect_wraps_any_selector_by_union() -> None:
    class LastToken:
        name = "LastToken"

        def select(self, prompt: Prompt, scores: TokenScores) -> Selection:
            return Selection((prompt.n - 1,), prompt.n, (False,), reason="last")

        def decide_without_scores(self, prompt: Prompt) -> Selection | None:
            return None

    sel = Protect(LastToken(), tail=False).select(text_prompt(10), ramp(10))
    assert sel.indices == (0, 9) and sel.protected == (True, False) and sel.reason == "last"
    sel = Protect(DenseBelow(LastToken(), 5), tail=False).select(text_prompt(10), ramp(10))
    assert sel.indices == (0, 9) and sel.protected == (True, False)
    assert DenseBelow(LastToken(), 5).select(text_prompt(10), ramp(10)).indices == (9,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sink": -1}, "sink"),
        ({"sink": 1.5}, "sink"),
        ({"tail": -2}, "tail"),
        ({"roles": [1]}, "roles"),
        ({"spans": [(5, 2)]}, "span"),
        ({"spans": [(1, 2, 3)]}, "span"),
        ({"spans": "0-5"}, "spans"),
        ({"last_user_turn": "yes"}, "last_user_turn"),
    ],
)
def test_protect_rejects_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        Protect(KeepRate(0.1), **kwargs)  # type: ignore[arg-type]


def test_protect_accepts_a_single_role_name() -> None:
    assert Protect(KeepRate(0.1), roles="system").roles == ("system",)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- Adaptive
def test_adaptive_is_dense_below_the_threshold_without_scores() -> None:
    sel = Adaptive(dense_below_tokens=100).decide_without_scores(text_prompt(99))
    assert sel is not None and sel.dense and sel.kept == 99
    assert Adaptive(dense_below_tokens=100).decide_without_scores(text_prompt(100)) is None


def test_adaptive_keeps_the_smallest_set_covering_the_mass() -> None:
    values = torch.full((200,), 0.01)
    values[[10, 50, 90, 130]] = 10.0  # 4 tokens hold 40/(40+1.96) = 95% of the mass
    sel = Adaptive(coverage=0.9, min_rate=0.01, max_rate=0.5, dense_below_tokens=0).select(
        text_prompt(200), scores_of(values)
    )
    assert sel.indices == (10, 50, 90, 130)
    assert sel.requested_rate == pytest.approx(4 / 200)


def test_adaptive_respects_its_bounds() -> None:
    peaked = torch.zeros(200)
    peaked[7] = 1.0
    sel = Adaptive(coverage=0.9, min_rate=0.1, max_rate=0.5, dense_below_tokens=0).select(
        text_prompt(200), scores_of(peaked)
    )
    assert sel.kept == 20 and 7 in sel.indices and "min_rate" in sel.reason
    flat = torch.ones(200)
    sel = Adaptive(coverage=0.9, min_rate=0.1, max_rate=0.3, dense_below_tokens=0).select(
        text_prompt(200), scores_of(flat)
    )
    assert sel.kept == 60 and "max_rate" in sel.reason
    zero = torch.zeros(200)
    sel = Adaptive(coverage=0.9, min_rate=0.1, max_rate=0.3, dense_below_tokens=0).select(
        text_prompt(200), scores_of(zero)
    )
    assert sel.kept == 60


def test_adaptive_keep_count_grows_with_flatter_scores() -> None:
    sel = Adaptive(coverage=0.8, min_rate=0.01, max_rate=1.0, dense_below_tokens=0)
    p = text_prompt(300)
    kept = []
    for temperature in (0.05, 0.5, 5.0):
        values = torch.softmax(random_scores(300, seed=2).values / temperature, dim=0)
        kept.append(sel.select(p, scores_of(values)).kept)
    assert kept[0] < kept[1] < kept[2]


def test_adaptive_measures_mass_without_the_protected_tokens() -> None:
    # A huge sink score would cover 90% alone; protected, it is left out of the mass.
    values = torch.ones(200)
    values[0] = 1e6
    sel = Protect(Adaptive(coverage=0.5, min_rate=0.01, max_rate=1.0, dense_below_tokens=0), tail=False)
    out = sel.select(text_prompt(200), scores_of(values))
    assert out.kept == 1 + 100


def test_adaptive_negative_scores_are_shifted() -> None:
    values = -torch.ones(100)
    values[[3, 4]] = 0.0  # after the shift only these two carry mass
    sel = Adaptive(coverage=0.9, min_rate=0.01, max_rate=1.0, dense_below_tokens=0).select(
        text_prompt(100), scores_of(values)
    )
    assert sel.indices == (3, 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"coverage": 0}, "coverage"),
        ({"coverage": 1.5}, "coverage"),
        ({"min_rate": 0}, "min_rate"),
        ({"max_rate": 2}, "max_rate"),
        ({"min_rate": 0.6, "max_rate": 0.5}, "must not exceed"),
        ({"dense_below_tokens": -1}, "dense_below_tokens"),
    ],
)
def test_adaptive_rejects_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        Adaptive(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- composition
def test_paper_composition_keeps_chunks_and_protected_tokens_within_budget() -> None:
    n = 1000
    p = text_prompt(n)
    s = random_scores(n, seed=5)
    sel = Protect(Chunked(KeepRate(0.1), 32)).select(p, s)
    # 32 chunks -> ceil(3.2) = 4 chunks = 128 tokens of budget; 9 protected tokens use 9 of them.
    assert sel.protected_count == 1 + TEXT_TAIL_TOKENS
    assert 0 in sel.indices and n - 1 in sel.indices
    unprotected = [i for i, pr in zip(sel.indices, sel.protected, strict=True) if not pr]
    chunks = {i // 32 for i in unprotected}
    assert len(chunks) == 4  # 3 chunks fill 96 + 9 = 105 < 128 tokens; the 4th reaches the budget
    assert sel.chunk_size == 32 and sel.requested_rate == 0.1
    compressed = CompressedPrompt.from_selection(p, sel)
    assert compressed.position_ids == sel.indices


def test_chunks_already_protected_whole_are_not_chosen_again() -> None:
    values = torch.zeros(40)
    values[32:40] = 9.0  # the partial last chunk is the best, but the tail protects all of it
    sel = Protect(Chunked(KeepRate(0.5), 32), sink=0, tail=8).select(text_prompt(40), scores_of(values))
    # ceil(2 * 0.5) = 1 chunk = 32 tokens of budget; the 8 protected use 8; chunk 0 is added.
    assert sel.indices == tuple(range(40))
    assert sel.protected_count == 8


def test_chunked_with_protection_without_any_protected_token_matches_plain_chunked() -> None:
    p, s = text_prompt(500), random_scores(500, seed=9)
    plain = Chunked(KeepRate(0.2), 16).select(p, s)
    wrapped = Protect(Chunked(KeepRate(0.2), 16), sink=0, tail=False).select(p, s)
    assert plain.indices == wrapped.indices


def test_nested_protect_and_dense_below() -> None:
    p = chat_prompt()
    sel = Protect(Protect(KeepRate(0.1), roles=("system",)), last_user_turn=True).select(p, ramp(p.n))
    system = {i for i, r in enumerate(p.roles) if r == "system"}
    assert system | set(range(40, 64)) | {0} <= set(sel.indices)
    dense = DenseBelow(Protect(KeepRate(0.1)), 100)
    decided = dense.decide_without_scores(p)
    assert decided is not None and decided.dense and decided.protected_count == 5
    assert DenseBelow(Protect(KeepRate(0.1)), 10).decide_without_scores(p) is None
    assert DenseBelow(Protect(KeepRate(0.1)), 10).select(p, ramp(p.n)).kept == math.ceil(6.4)


def test_selectors_satisfy_the_protocol_and_have_names() -> None:
    selectors = [
        KeepRate(0.1),
        TokenBudget(8),
        Adaptive(),
        Chunked(KeepRate(0.1), 32),
        Protect(Chunked(Adaptive(), 16), roles=("system",)),
        DenseBelow(KeepRate(0.2), 64),
    ]
    for s in selectors:
        assert isinstance(s, Selector)
    assert selectors[3].name == "Chunked(KeepRate(0.1), 32)"
    assert selectors[4].name.startswith("Protect(Chunked(Adaptive(") and "roles=('system',)" in selectors[4].name


def test_empty_prompt_gives_an_empty_selection() -> None:
    p = text_prompt(0)
    empty = TokenScores(torch.zeros(0))
    for s in (KeepRate(0.1), Chunked(KeepRate(0.1)), Protect(KeepRate(0.5))):
        sel = s.decide_without_scores(p) or s.select(p, empty)
        assert sel.kept == 0 and sel.n == 0
