"""`compress_prompts`: the one score -> fallback -> select step that every driver calls."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from test_tracing import KeepQuarter, LastTokensScorer

from specprefill_sdk import InvalidRequestError, Prompt, Selection, TokenScores
from specprefill_sdk.pipeline import compress_prompts


class CountingScorer(LastTokensScorer):
    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.error = error
        self.calls: list[tuple[str, int]] = []

    def score(self, prompt: Prompt) -> TokenScores:
        self.calls.append(("score", 1))
        if self.error is not None:
            raise self.error
        return super().score(prompt)

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        self.calls.append(("score_batch", len(prompts)))
        return [super(CountingScorer, self).score(p) for p in prompts]


class DenseBelow20(KeepQuarter):
    name = "DenseBelow20"

    def decide_without_scores(self, prompt: Prompt) -> Selection | None:
        return Selection.keep_all(prompt.n, reason="short") if prompt.n < 20 else None


def prompts() -> list[Prompt]:
    return [Prompt.from_token_ids(range(100, 100 + n)) for n in (40, 8, 80)]


def test_prompts_decided_without_scores_skip_the_scorer() -> None:
    scorer = CountingScorer()
    comps = compress_prompts(prompts(), scorer, DenseBelow20(), batch=True)
    assert scorer.calls == [("score_batch", 2)]
    assert [c.compressed.kept for c in comps] == [11, 8, 21]
    assert comps[1].selection.reason == "short" and comps[1].score_ms == 0.0
    assert comps[0].score_ms > 0 and comps[0].fallback is None
    scorer.calls.clear()
    compress_prompts(prompts(), scorer, DenseBelow20())
    assert scorer.calls == [("score", 1), ("score", 1)]


def test_a_failing_scorer_falls_back_to_dense_with_one_reason() -> None:
    comps = compress_prompts(prompts(), CountingScorer(RuntimeError("draft out of memory")), DenseBelow20())
    assert [c.compressed.is_dense for c in comps] == [True, True, True]
    assert comps[0].fallback == comps[2].fallback == "scorer_error: RuntimeError: draft out of memory"
    assert comps[0].selection.reason == "fallback" and comps[1].fallback is None
    with pytest.raises(RuntimeError):
        compress_prompts(prompts(), CountingScorer(RuntimeError("x")), DenseBelow20(), fallback_on_scorer_error=False)
    with pytest.raises(InvalidRequestError):
        compress_prompts(prompts(), CountingScorer(InvalidRequestError("bad ids")), DenseBelow20())


def test_a_driver_can_score_another_prompt_than_the_one_it_selects_from() -> None:
    asked: list[list[int]] = []

    def score(indices: list[int]) -> list[TokenScores]:
        asked.append(indices)
        return [TokenScores(-torch.arange(80, dtype=torch.float32))]  # the first tokens win

    scorer = CountingScorer()
    (comp,) = compress_prompts([prompts()[2]], scorer, KeepQuarter(), score=score)
    assert asked == [[0]] and scorer.calls == []
    assert comp.selection.indices == tuple(range(20))
