"""Pipeline(scorer, selector, backend) with the real draft scorer, selectors and TransformersBackend."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from specprefill_sdk import ContextTooLongError, Pipeline
from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.selection import Chunked, KeepRate, Protect
from specprefill_sdk.types import CompressedPrompt, Prompt, SamplingParams, TokenScores

pytestmark = pytest.mark.slow


class FailingScorer:
    """A scorer whose draft is broken: every call raises, and calls are counted."""

    name = "failing"

    def __init__(self) -> None:
        self.calls = 0

    def score(self, prompt: Prompt) -> TokenScores:
        self.calls += 1
        raise RuntimeError("draft exploded")

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        self.calls += 1
        raise RuntimeError("draft exploded")


@pytest.fixture(scope="module")
def scorer(smollm) -> DraftAttentionScorer:
    return DraftAttentionScorer(smollm, look_ahead=4)


@pytest.fixture(scope="module")
def backend(smollm, scorer) -> TransformersBackend:
    # Built after the scorer on the same model: the scorer's attention hook must stay in place.
    return TransformersBackend(smollm)


@pytest.fixture(scope="module")
def pipe(scorer, backend) -> Pipeline:
    return Pipeline(scorer, Protect(Chunked(KeepRate(0.3), 16), sink=1, tail=True), backend)


@pytest.fixture(scope="module")
def chats(essay) -> list[list[dict[str, str]]]:
    parts = [essay[:500], essay[500:1300], essay[1300:2500]]
    return [[{"role": "user", "content": f"{p}\n\nWhat is the main point of this text?"}] for p in parts]


def test_batch_of_three_equals_single_calls(pipe, chats) -> None:
    batch = pipe.generate_batch(chats, max_tokens=10)
    singles = [pipe.generate(c, max_tokens=10) for c in chats]
    lengths = [c.usage.prompt_tokens for c in singles]
    assert len(set(lengths)) == 3
    for b, s in zip(batch, singles, strict=True):
        assert b.selection is not None and s.selection is not None
        assert b.selection.indices == s.selection.indices
        assert b.usage == s.usage and b.usage.kept_tokens < b.usage.prompt_tokens
        assert b.token_ids == s.token_ids and b.text == s.text
        assert b.draft == "smollm2-135m" and b.fallback is None
        assert b.timings.score > 0 and b.timings.ttft >= b.timings.prefill


def test_pipeline_passes_selection_to_backend_at_original_positions(pipe, backend, chats) -> None:
    compressed = pipe.compress(chats[1])
    direct = backend.generate(compressed, SamplingParams(max_tokens=8))
    via_pipeline = pipe.generate(chats[1], max_tokens=8)
    assert via_pipeline.selection is not None
    assert via_pipeline.selection.indices == compressed.position_ids
    assert via_pipeline.token_ids == direct.token_ids
    assert via_pipeline.usage.kept_tokens == compressed.kept < compressed.n


def test_keep_rate_one_never_calls_the_scorer(backend, chats) -> None:
    scorer = FailingScorer()
    pipe = Pipeline(scorer, KeepRate(1.0), backend)
    completion = pipe.generate(chats[0], max_tokens=8)
    batch = pipe.generate_batch(chats[:2], max_tokens=8)
    assert scorer.calls == 0
    assert completion.fallback is None and completion.draft is None and completion.timings.score == 0
    assert completion.usage.kept_tokens == completion.usage.prompt_tokens
    dense = backend.generate(CompressedPrompt.dense(pipe.prompt(chats[0])), SamplingParams(max_tokens=8))
    assert completion.token_ids == dense.token_ids == batch[0].token_ids


def test_failing_scorer_falls_back_to_dense(backend, chats) -> None:
    scorer = FailingScorer()
    pipe = Pipeline(scorer, Chunked(KeepRate(0.2), 16), backend)
    completion = pipe.generate(chats[0], max_tokens=6)
    assert scorer.calls == 1
    assert completion.fallback is not None and "draft exploded" in completion.fallback
    assert completion.usage.kept_tokens == completion.usage.prompt_tokens
    assert completion.selection is not None and completion.selection.dense
    batch = pipe.generate_batch(chats[:2], max_tokens=6)
    assert all(c.fallback and c.usage.kept_tokens == c.usage.prompt_tokens for c in batch)
    strict = Pipeline(FailingScorer(), KeepRate(0.2), backend, fallback_on_scorer_error=False)
    with pytest.raises(RuntimeError, match="draft exploded"):
        strict.generate(chats[0], max_tokens=6)


def test_async_and_streaming_forms(pipe, chats) -> None:
    expected = pipe.generate(chats[0], max_tokens=8)

    async def main() -> tuple[str, list[str], object]:
        completion = await pipe.agenerate(chats[0], max_tokens=8)
        chunks = [chunk async for chunk in pipe.astream(chats[0], max_tokens=8)]
        return completion.text, [c.text for c in chunks], chunks[-1].completion

    text, deltas, final = asyncio.run(main())
    assert text == expected.text == "".join(deltas)
    assert final is not None and final.usage == expected.usage  # type: ignore[attr-defined]
    streamed = list(pipe.stream(chats[0], max_tokens=8))
    assert "".join(c.text for c in streamed) == expected.text
    assert streamed[-1].completion is not None and streamed[-1].completion.selection == expected.selection


def test_context_too_long_is_refused_before_scoring(backend) -> None:
    scorer = FailingScorer()
    pipe = Pipeline(scorer, KeepRate(0.1), backend)
    limit = backend.max_context
    too_long = Prompt.from_token_ids([1] * (limit - 10))
    with pytest.raises(ContextTooLongError):
        pipe.generate(too_long, max_tokens=64)
    with pytest.raises(ContextTooLongError):
        pipe.generate_batch([Prompt.from_token_ids([1, 2, 3]), too_long], max_tokens=64)
    assert scorer.calls == 0
