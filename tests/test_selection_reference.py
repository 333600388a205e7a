"""The selectors' numpy arithmetic selects exactly what their torch code selected (`selection_reference`).

Every comparison is of whole `Selection` objects: the kept indices element for element, which of them
were protected, the dense flag, the rates and the reason text.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from selection_reference import chunk_means as reference_chunk_means
from selection_reference import protect_mask, reference_select

from specprefill_sdk.policies import load_policy
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.selection import (
    Adaptive,
    Chunked,
    DenseBelow,
    KeepRate,
    Protect,
    StructuredChunks,
    TokenBudget,
)
from specprefill_sdk.selection.base import BudgetSelector, row_sums, total
from specprefill_sdk.selection.chunked import chunk_means
from specprefill_sdk.types import Message, Prompt, TokenScores

RATES = (0.01, 0.05, 0.1, 0.12, 0.25, 0.3, 0.5, 0.9, 1.0)
LENGTHS = (1, 2, 5, 31, 32, 33, 63, 64, 65, 100, 257, 1000, 1023, 1024, 1025, 2049, 3001)
KINDS = ("uniform", "wide", "ties", "equal", "zeros", "special", "negative")


def values_of(kind: str, n: int, rng: np.random.Generator) -> torch.Tensor:
    """Scores of one kind: real-valued noise, ties, constants, or with NaN, +-inf, -0.0 and negatives."""
    if kind == "uniform":
        v = rng.random(n, dtype=np.float32)
    elif kind == "wide":  # magnitudes over many decades: the order of a sum's additions shows in its last bit
        v = np.exp(rng.normal(0.0, 12.0, n)).astype(np.float32)
    elif kind == "ties":
        v = np.round(rng.random(n) * 4).astype(np.float32) / 4
    elif kind == "equal":
        v = np.full(n, 0.37, dtype=np.float32)
    elif kind == "zeros":
        v = np.zeros(n, dtype=np.float32)
        v[rng.random(n) < 0.5] = -0.0
    elif kind == "special":
        v = rng.random(n, dtype=np.float32)
        for value, share in ((np.nan, 0.05), (np.inf, 0.01), (-np.inf, 0.01), (-0.0, 0.05), (0.0, 0.05)):
            v[rng.random(n) < share] = value
    else:
        v = rng.normal(0.0, 1.0, n).astype(np.float32)
    return torch.from_numpy(v)


def budgets(rng: random.Random) -> list[BudgetSelector]:
    low = rng.choice([0.01, 0.05, 0.12])
    adaptive = Adaptive(
        coverage=rng.choice([0.05, 0.3, 0.6, 0.9, 1.0]),
        min_rate=low,
        max_rate=rng.choice([low, 0.3, 0.5, 1.0]),
        dense_below_tokens=rng.choice([0, 0, 100, 1024]),
        min_tokens=rng.choice([0, 10, 1024]),
    )
    return [KeepRate(rng.choice(RATES)), TokenBudget(rng.choice([1, 7, 64, 500])), adaptive]


def wrappings(inner: BudgetSelector, rng: random.Random) -> list[object]:
    size = rng.choice([1, 7, 32, 64])
    chunked = Chunked(inner, size)
    protect = {"sink": rng.choice([0, 1, 4]), "tail": rng.choice([True, False, 3])}
    return [
        inner,
        chunked,
        StructuredChunks(inner, fallback_size=size),
        Protect(chunked, **protect),
        Protect(inner, **protect),
        DenseBelow(Protect(chunked, **protect), rng.choice([0, 50, 1024])),
        Protect(Protect(chunked, sink=2, tail=False), sink=0, tail=5),
    ]


def same(selector: object, prompt: Prompt, scores: TokenScores) -> None:
    assert selector.select(prompt, scores) == reference_select(selector, prompt, scores), selector  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", range(40))
def test_random_scores_and_selectors_select_as_the_torch_code(seed: int) -> None:
    rng, pick = np.random.default_rng(seed), random.Random(seed)
    for n in LENGTHS:
        scores = TokenScores(values_of(KINDS[(seed + n) % len(KINDS)], n, rng))
        prompt = Prompt.from_token_ids(range(n))
        if seed % 2:  # some tokens protected by the caller
            prompt = prompt.with_protected((rng.random(n) < 0.03).tolist())
        for inner in budgets(pick):
            for selector in wrappings(inner, pick):
                same(selector, prompt, scores)


@pytest.mark.parametrize("kind", KINDS)
def test_every_keep_rate_and_chunk_size_selects_as_the_torch_code(kind: str) -> None:
    n = 1000  # not a multiple of 32 or 64: a shorter last chunk
    scores = TokenScores(values_of(kind, n, np.random.default_rng(7)))
    prompt = Prompt.from_token_ids(range(n))
    for rate in (*RATES, 0.02, 0.07, 0.15, 0.2, 0.33, 0.4, 0.6, 0.7, 0.8, 0.99):
        for size in (1, 2, 31, 32, 33, 64, 999, 1000, 1001):
            same(Chunked(KeepRate(rate), size), prompt, scores)
        same(KeepRate(rate), prompt, scores)
        same(Protect(Chunked(KeepRate(rate), 32), sink=1, tail=True), prompt, scores)


@pytest.mark.parametrize("kind", KINDS)
def test_the_adaptive_rule_selects_as_the_torch_code(kind: str) -> None:
    rng = np.random.default_rng(11)
    for n in (40, 1023, 1024, 2500):
        scores = TokenScores(values_of(kind, n, rng))
        prompt = Prompt.from_token_ids(range(n)).with_protected((rng.random(n) < 0.02).tolist())
        for coverage in (0.01, 0.1, 0.3, 0.6, 0.9, 0.99, 1.0):
            for min_rate, max_rate in ((0.01, 0.05), (0.05, 0.5), (0.12, 0.3), (0.3, 0.3), (0.5, 1.0)):
                for min_tokens in (0, 1024):
                    inner = Adaptive(coverage, min_rate, max_rate, dense_below_tokens=0, min_tokens=min_tokens)
                    same(inner, prompt, scores)
                    same(Protect(Chunked(inner, 32), sink=1, tail=True), prompt, scores)


@pytest.mark.parametrize("n", [32_767, 32_768, 40_000, 70_001])
@pytest.mark.parametrize("kind", ["uniform", "wide", "special"])
def test_long_prompts_select_as_the_torch_code_with_its_thread_pool(n: int, kind: str) -> None:
    # Past 32,768 elements torch splits its ops over its threads; the chunk sums are cut into pieces here.
    scores = TokenScores(values_of(kind, n, np.random.default_rng(n)))
    prompt = Prompt.from_token_ids(range(n))
    for name in ("paper", "auto", "conservative"):
        same(load_policy(name).build_selector(), prompt, scores)
    same(Chunked(Adaptive(0.9, 0.05, 0.5, dense_below_tokens=0), 32), prompt, scores)
    same(StructuredChunks(KeepRate(0.1)), prompt, scores)


def test_chunk_sums_in_pieces_are_torch_s_sums_of_the_whole_table_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    for n, size in ((100_000, 32), (70_001, 7), (70_001, 1), (40_000, 64), (3 * 32_768, 32_768), (80_000, 40_000)):
        values = values_of("wide", n, rng)
        ours = chunk_means(values.numpy(), size)
        theirs = reference_chunk_means(values, size).numpy()
        assert ours.tobytes() == theirs.tobytes(), (n, size)
        chunks = -(-n // size)
        table = np.zeros(chunks * size)
        table[:n] = values.numpy()
        table = table.reshape(chunks, size)
        assert row_sums(table).tobytes() == torch.from_numpy(table).sum(dim=1).numpy().tobytes()
        if size in (7, 32):  # the data can tell two orders of addition apart: numpy's own sums differ
            assert (table.sum(axis=1) != row_sums(table)).any()


def test_a_total_up_to_torch_s_grain_is_torch_s_sum() -> None:
    rng = np.random.default_rng(5)
    for n in (1, 1000, 32_767, 32_768):
        mass = values_of("wide", n, rng).to(torch.float64)
        assert total(mass.numpy()) == float(mass.sum())


def test_scores_of_other_dtypes_and_layouts_select_as_the_torch_code() -> None:
    base = values_of("uniform", 4000, np.random.default_rng(2))
    prompt = Prompt.from_token_ids(range(2000))
    selector = load_policy("paper").build_selector()
    for values in (base[::2], base[:2000].to(torch.bfloat16), base[:2000].clone().requires_grad_(True)):
        scores = TokenScores(values)
        same(selector, prompt, scores)


def test_protect_masks_of_a_chat_prompt_are_the_torch_masks(smollm_fp32) -> None:
    messages = [
        Message("system", "You answer questions about the essay."),
        Message("user", "Here is an essay. " * 30),
        Message("assistant", "I have read it."),
        Message("user", "What is it about? Answer in one line."),
    ]
    prompt = build_prompt(smollm_fp32.tokenizer, messages)
    n = prompt.n
    scores = TokenScores(values_of("ties", n, np.random.default_rng(9)))
    options = [
        {"roles": ("system",)},
        {"last_user_turn": True},
        {"special_tokens": True},
        {"spans": ((0, 40), (200, 260))},
        {"sink": 0, "tail": False, "roles": ("system", "assistant"), "special_tokens": True},
        {"tail": 4, "last_user_turn": True, "spans": ((100, 101),)},
    ]
    for option in options:
        for inner in (KeepRate(0.1), Chunked(KeepRate(0.2), 16), StructuredChunks(TokenBudget(40))):
            selector = Protect(inner, **option)  # type: ignore[arg-type]
            assert selector.mask(prompt).tolist() == protect_mask(selector, prompt).tolist()
            same(selector, prompt, scores)
            same(DenseBelow(selector, n + 1), prompt, scores)


@pytest.fixture(scope="module")
def draft_scored(smollm_fp32, essay) -> tuple[Prompt, TokenScores]:
    """An essay and a question in SmolLM2's chat template, scored by the SmolLM2 draft (the paper's scorer)."""
    from specprefill_sdk.scoring.draft_attention import DraftAttentionScorer

    prompt = build_prompt(smollm_fp32.tokenizer, [Message("user", essay + "\n\nWhat is the essay about?")])
    return prompt, DraftAttentionScorer(smollm_fp32).score(prompt)


def test_real_draft_scores_select_as_the_torch_code(draft_scored: tuple[Prompt, TokenScores]) -> None:
    prompt, scores = draft_scored
    assert prompt.n > 1024 and bool(torch.isfinite(scores.values).all())
    for name in ("paper", "auto", "conservative", "dense"):
        policy = load_policy(name)
        same(policy.build_selector(), prompt, scores)
        if policy.selector.dense_below_tokens:  # the same policy on a prompt it would otherwise keep whole
            same(policy.with_overrides(dense_below_tokens=0).build_selector(), prompt, scores)
    for rate in RATES:
        for size in (1, 16, 32, 64):
            same(Protect(Chunked(KeepRate(rate), size), sink=1, tail=True), prompt, scores)
        same(Protect(StructuredChunks(KeepRate(rate)), sink=1, tail=True), prompt, scores)
    for coverage in (0.3, 0.6, 0.9, 1.0):
        inner = Adaptive(coverage, 0.05, 0.5, dense_below_tokens=0, min_tokens=128)
        same(Protect(Chunked(inner, 32), sink=1, tail=True), prompt, scores)
        same(Protect(StructuredChunks(inner), last_user_turn=False, special_tokens=True), prompt, scores)
