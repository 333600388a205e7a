"""Spans, span events and metrics of pipeline calls, read back through the SDK's in-memory exporters."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
import torch
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from specprefill_sdk import (
    BackendCapabilities,
    BackendUnavailableError,
    Completion,
    CompletionChunk,
    CompressedPrompt,
    Message,
    Pipeline,
    Prompt,
    SamplingParams,
    Selection,
    TokenScores,
    Usage,
)
from specprefill_sdk.backends.base import BackendBase
from specprefill_sdk.types import Timings


# --------------------------------------------------------------------------- small stages
class LastTokensScorer:
    """Scores later tokens higher; raises when told to."""

    name = "recency"
    model_name = "tiny-draft"
    look_ahead = 4

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def score(self, prompt: Prompt) -> TokenScores:
        if self.fail:
            raise RuntimeError("draft out of memory")
        return TokenScores(torch.arange(prompt.n, dtype=torch.float32), scorer=self.name)

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        return [self.score(p) for p in prompts]


class KeepQuarter:
    """Keeps the best quarter of the tokens and always the first one (protected)."""

    name = "KeepQuarter"

    def decide_without_scores(self, prompt: Prompt) -> Selection | None:
        return None

    def select(self, prompt: Prompt, scores: TokenScores) -> Selection:
        k = max(1, prompt.n // 4)
        top = set(torch.topk(scores.values, k).indices.tolist())
        idx = tuple(sorted(top | {0}))
        return Selection(idx, prompt.n, tuple(i == 0 and 0 not in top for i in idx), requested_rate=0.25)


class EchoBackend(BackendBase):
    """Generates ``max_tokens`` fixed tokens; raises `BackendUnavailableError` when told to."""

    capabilities = BackendCapabilities(supports_position_ids=True)
    model_name = "tiny-target"
    provider_name = "tiny"
    tokenizer = None
    max_context = 4096

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.current_spans: list[Any] = []

    def _completion(self, prompt: CompressedPrompt, params: SamplingParams) -> Completion:
        ids = tuple(range(7, 7 + params.max_tokens))
        return Completion(
            " ".join("x" for _ in ids),
            ids,
            "length",
            Usage(prompt.n, prompt.kept, len(ids)),
            Timings(prefill=2.0, ttft=3.0),
            model="tiny-target-v1",
        )

    def generate(self, prompt: CompressedPrompt, params: SamplingParams) -> Completion:
        self.current_spans.append(trace.get_current_span())
        if self.fail:
            raise BackendUnavailableError("target at 127.0.0.1:9 refused the connection")
        return self._completion(prompt, params)

    def stream(self, prompt: CompressedPrompt, params: SamplingParams) -> Iterator[CompletionChunk]:
        self.current_spans.append(trace.get_current_span())
        if self.fail:
            raise BackendUnavailableError("target at 127.0.0.1:9 refused the connection")
        done = self._completion(prompt, params)
        for i, tok in enumerate(done.token_ids):
            last = i == len(done.token_ids) - 1
            yield CompletionChunk("x ", (tok,), "length" if last else None, done if last else None)


class Recorder:
    """An SDK tracer provider and meter provider that keep everything in memory."""

    def __init__(self) -> None:
        self.spans_out = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans_out))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self) -> dict[str, ReadableSpan]:
        return {s.name: s for s in self.spans_out.get_finished_spans()}

    def points(self, name: str) -> list[Any]:
        """The data points of metric ``name`` (empty if never recorded)."""
        data = self.reader.get_metrics_data()
        found = []
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found


@pytest.fixture()
def rec() -> Recorder:
    return Recorder()


def make_pipeline(rec: Recorder, *, scorer_fails: bool = False, backend_fails: bool = False) -> Pipeline:
    return Pipeline(
        LastTokensScorer(scorer_fails),
        KeepQuarter(),
        EchoBackend(backend_fails),
        tracer_provider=rec.tracer_provider,
        meter_provider=rec.meter_provider,
    )


def chat_prompt(n: int = 40) -> Prompt:
    return replace(Prompt.from_token_ids(range(100, 100 + n)), messages=(Message("user", "hi"),))


def assert_tree(spans: dict[str, ReadableSpan], inference: str) -> None:
    root = spans["specprefill.pipeline"]
    assert root.parent is None
    for name in ("specprefill.score", "specprefill.select", inference):
        assert spans[name].parent is not None and spans[name].parent.span_id == root.context.span_id, name
        assert spans[name].context.trace_id == root.context.trace_id
    # score ends before select starts, select before the inference span
    assert spans["specprefill.score"].end_time <= spans["specprefill.select"].start_time
    assert spans["specprefill.select"].end_time <= spans[inference].start_time


# --------------------------------------------------------------------------- span tree and attributes
def test_generate_span_tree_attributes_and_metrics(rec: Recorder) -> None:
    pipe = make_pipeline(rec)
    out = pipe.generate(chat_prompt(40), max_tokens=5, seed=3, stop=["\n\n"], conversation_id="conv-7")
    spans = rec.spans()
    assert set(spans) == {"specprefill.pipeline", "specprefill.score", "specprefill.select", "chat tiny-target"}
    assert_tree(spans, "chat tiny-target")

    score = spans["specprefill.score"].attributes
    assert score["specprefill.scorer"] == "recency" and score["specprefill.draft.model"] == "tiny-draft"
    assert score["specprefill.prompt_tokens"] == 40 and score["specprefill.look_ahead"] == 4

    select = spans["specprefill.select"].attributes
    assert select["specprefill.selector"] == "KeepQuarter"
    assert select["specprefill.keep_rate.requested"] == 0.25
    assert select["specprefill.kept_tokens"] == out.usage.kept_tokens == 11  # 10 best + the protected first
    assert select["specprefill.protected_tokens"] == 1
    assert select["specprefill.keep_rate.actual"] == pytest.approx(11 / 40)

    inf = spans["chat tiny-target"]
    assert inf.kind is SpanKind.CLIENT
    a = inf.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "tiny"
    assert a["gen_ai.request.model"] == "tiny-target" and a["gen_ai.response.model"] == "tiny-target-v1"
    assert a["gen_ai.usage.input_tokens"] == 11 and a["gen_ai.usage.output_tokens"] == 5
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    assert a["gen_ai.request.max_tokens"] == 5 and a["gen_ai.request.seed"] == 3
    assert a["gen_ai.request.stop_sequences"] == ("\n\n",) and a["gen_ai.request.stream"] is False
    assert a["gen_ai.conversation.id"] == "conv-7"
    assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.003)  # the backend's 3 ms
    assert "error.type" not in a and inf.status.status_code is StatusCode.UNSET

    root = spans["specprefill.pipeline"].attributes
    assert root["gen_ai.conversation.id"] == "conv-7" and root["specprefill.prompt_tokens"] == 40
    assert root["specprefill.kept_tokens"] == 11 and root["specprefill.ttft_ms"] == pytest.approx(out.timings.ttft)

    # the backend ran with the inference span current
    assert pipe.backend.current_spans[-1].get_span_context().span_id == inf.context.span_id  # type: ignore[attr-defined]

    (ttft,) = rec.points("specprefill.ttft")
    assert ttft.count == 1 and ttft.sum == pytest.approx(out.timings.ttft)
    assert ttft.attributes["gen_ai.request.model"] == "tiny-target"
    (ratio,) = rec.points("specprefill.keep_ratio")
    assert ratio.sum == pytest.approx(11 / 40)
    assert [p.value for p in rec.points("specprefill.prompt_tokens")] == [40]
    assert [p.value for p in rec.points("specprefill.kept_tokens")] == [11]
    (score_ms,) = rec.points("specprefill.score.duration")
    assert score_ms.count == 1 and score_ms.sum == pytest.approx(out.timings.score)
    assert score_ms.attributes == {"specprefill.scorer": "recency", "specprefill.draft.model": "tiny-draft"}
    assert rec.points("specprefill.fallbacks") == []
    usage = {p.attributes["gen_ai.token.type"]: p.sum for p in rec.points("gen_ai.client.token.usage")}
    assert usage == {"input": 11, "output": 5}
    (duration,) = rec.points("gen_ai.client.operation.duration")
    assert duration.count == 1 and 0 < duration.sum < 60
    assert duration.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "tiny",
        "gen_ai.request.model": "tiny-target",
    }
    assert rec.points("gen_ai.client.operation.time_to_first_chunk") == []  # streaming only


def test_text_prompt_is_a_text_completion_and_metrics_accumulate(rec: Recorder) -> None:
    pipe = make_pipeline(rec)
    pipe.generate(Prompt.from_token_ids(range(1, 81)), max_tokens=2)
    pipe.generate(Prompt.from_token_ids(range(1, 41)), max_tokens=2)
    names = [s.name for s in rec.spans_out.get_finished_spans()]
    assert names.count("text_completion tiny-target") == 2 and "conversation" not in str(names)
    assert [p.value for p in rec.points("specprefill.prompt_tokens")] == [120]
    assert [p.value for p in rec.points("specprefill.kept_tokens")] == [21 + 11]
    (ttft,) = rec.points("specprefill.ttft")
    assert ttft.count == 2
    root = next(s for s in rec.spans_out.get_finished_spans() if s.name == "specprefill.pipeline")
    assert "gen_ai.conversation.id" not in root.attributes


# --------------------------------------------------------------------------- fallbacks and errors
def test_scorer_error_falls_back_with_span_events_and_counter(rec: Recorder) -> None:
    pipe = make_pipeline(rec, scorer_fails=True)
    out = pipe.generate(chat_prompt(32), max_tokens=3)
    assert out.fallback and out.usage.kept_tokens == 32
    spans = rec.spans()
    assert_tree(spans, "chat tiny-target")
    (event,) = spans["specprefill.score"].events
    assert event.name == "specprefill.fallback"
    assert event.attributes["error.type"] == "RuntimeError"
    assert "draft out of memory" in event.attributes["specprefill.fallback.reason"]
    assert [e.name for e in spans["specprefill.pipeline"].events] == ["specprefill.fallback"]
    # a fallback is not an error: the request succeeded with a dense prefill
    assert all(s.status.status_code is StatusCode.UNSET for s in spans.values())
    select = spans["specprefill.select"].attributes
    assert select["specprefill.dense"] is True and select["specprefill.kept_tokens"] == 32
    assert spans["chat tiny-target"].attributes["gen_ai.usage.input_tokens"] == 32
    (fallbacks,) = rec.points("specprefill.fallbacks")
    assert fallbacks.value == 1
    assert fallbacks.attributes == {
        "specprefill.fallback.reason": "scorer_error",
        "gen_ai.request.model": "tiny-target",
    }


def test_backend_error_sets_error_type_and_records_the_exception(rec: Recorder) -> None:
    pipe = make_pipeline(rec, backend_fails=True)
    with pytest.raises(BackendUnavailableError):
        pipe.generate(chat_prompt(32), max_tokens=3)
    spans = rec.spans()
    assert_tree(spans, "chat tiny-target")
    for name in ("chat tiny-target", "specprefill.pipeline"):
        span = spans[name]
        assert span.status.status_code is StatusCode.ERROR, name
        assert span.attributes["error.type"] == "BackendUnavailableError"
        (exc_event,) = [e for e in span.events if e.name == "exception"]
        assert exc_event.attributes["exception.type"].endswith(".BackendUnavailableError")
        assert "refused the connection" in exc_event.attributes["exception.message"]
    for name in ("specprefill.score", "specprefill.select"):
        assert spans[name].status.status_code is StatusCode.UNSET and "error.type" not in spans[name].attributes
    (duration,) = rec.points("gen_ai.client.operation.duration")
    assert duration.attributes["error.type"] == "BackendUnavailableError"
    assert rec.points("specprefill.ttft") == [] and rec.points("gen_ai.client.token.usage") == []


def test_backend_error_in_a_stream(rec: Recorder) -> None:
    pipe = make_pipeline(rec, backend_fails=True)
    with pytest.raises(BackendUnavailableError):
        list(pipe.stream(chat_prompt(32), max_tokens=3))
    spans = rec.spans()
    assert_tree(spans, "chat tiny-target")
    assert spans["chat tiny-target"].attributes["error.type"] == "BackendUnavailableError"
    assert spans["specprefill.pipeline"].status.status_code is StatusCode.ERROR


# --------------------------------------------------------------------------- streaming
def test_stream_spans_first_chunk_and_no_leaked_context(rec: Recorder) -> None:
    pipe = make_pipeline(rec)
    tracer = rec.tracer_provider.get_tracer("caller")
    with tracer.start_as_current_span("caller") as caller:
        chunks = []
        for chunk in pipe.stream(chat_prompt(40), max_tokens=4):
            # between chunks the caller's span is current, not one of the pipeline's
            assert trace.get_current_span() is caller
            chunks.append(chunk)
    assert chunks[-1].completion is not None
    spans = rec.spans()
    inf = spans["chat tiny-target"]
    assert spans["specprefill.pipeline"].parent.span_id == caller.get_span_context().span_id
    assert inf.attributes["gen_ai.request.stream"] is True
    assert inf.attributes["gen_ai.usage.output_tokens"] == 4
    assert [e.name for e in inf.events] == ["gen_ai.first_chunk"]
    assert 0 < inf.attributes["gen_ai.response.time_to_first_chunk"] < 60
    (ttfc,) = rec.points("gen_ai.client.operation.time_to_first_chunk")
    assert ttfc.count == 1 and ttfc.sum == pytest.approx(inf.attributes["gen_ai.response.time_to_first_chunk"])
    # the backend's generator ran with the inference span current
    assert pipe.backend.current_spans[-1].get_span_context().span_id == inf.context.span_id  # type: ignore[attr-defined]


def test_closing_a_stream_early_is_a_cancellation_not_an_error(rec: Recorder) -> None:
    pipe = make_pipeline(rec)
    it = pipe.stream(chat_prompt(40), max_tokens=6)
    next(it)
    it.close()  # type: ignore[attr-defined]
    spans = rec.spans()
    assert set(spans) == {"specprefill.pipeline", "specprefill.score", "specprefill.select", "chat tiny-target"}
    for name in ("chat tiny-target", "specprefill.pipeline"):
        assert spans[name].attributes["specprefill.cancelled"] is True
        assert spans[name].status.status_code is StatusCode.UNSET and "error.type" not in spans[name].attributes
    assert rec.points("specprefill.ttft") == []


def test_async_stream_keeps_the_callers_trace_without_detach_errors(
    rec: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    pipe = make_pipeline(rec)
    tracer = rec.tracer_provider.get_tracer("caller")

    async def consume() -> tuple[int, int]:
        with tracer.start_as_current_span("request") as request:
            n = 0
            async for _ in pipe.astream(chat_prompt(40), max_tokens=4):
                n += 1
            out = await pipe.agenerate(chat_prompt(40), max_tokens=2)
            assert out.usage.completion_tokens == 2
            return n, request.get_span_context().span_id

    with caplog.at_level(logging.ERROR, logger="opentelemetry.context"):
        n, request_id = asyncio.run(consume())
    assert n == 4
    assert "Failed to detach context" not in caplog.text
    roots = [s for s in rec.spans_out.get_finished_spans() if s.name == "specprefill.pipeline"]
    assert len(roots) == 2 and all(r.parent.span_id == request_id for r in roots)
    trace_ids = {s.context.trace_id for s in rec.spans_out.get_finished_spans()}
    assert len(trace_ids) == 1


# --------------------------------------------------------------------------- batch
def test_generate_batch_has_one_inference_span_with_every_finish_reason(rec: Recorder) -> None:
    pipe = make_pipeline(rec)
    outs = pipe.generate_batch([chat_prompt(40), chat_prompt(80)], max_tokens=2)
    spans = rec.spans_out.get_finished_spans()
    names = sorted(s.name for s in spans)
    assert names == [
        "chat tiny-target",
        "specprefill.pipeline",
        "specprefill.score",
        "specprefill.select",
        "specprefill.select",
    ]
    inf = next(s for s in spans if s.name == "chat tiny-target")
    assert inf.attributes["gen_ai.response.finish_reasons"] == ("length", "length")
    assert inf.attributes["gen_ai.usage.input_tokens"] == sum(o.usage.kept_tokens for o in outs) == 11 + 21
    assert inf.attributes["gen_ai.usage.output_tokens"] == 4
    score = next(s for s in spans if s.name == "specprefill.score")
    assert score.attributes["specprefill.prompt_tokens"] == 120 and score.attributes["specprefill.batch_size"] == 2
    (ttft,) = rec.points("specprefill.ttft")
    assert ttft.count == 2


def test_compress_traces_score_and_select_only(rec: Recorder) -> None:
    pipe = make_pipeline(rec)
    compressed = pipe.compress(chat_prompt(40))
    assert compressed.kept == 11
    spans = rec.spans()
    assert set(spans) == {"specprefill.pipeline", "specprefill.score", "specprefill.select"}
    assert spans["specprefill.pipeline"].attributes["specprefill.operation"] == "compress"


# --------------------------------------------------------------------------- the real pipeline
@pytest.fixture(scope="module")
def real(smollm: Any) -> tuple[Pipeline, Recorder]:
    """The ``paper`` policy (keep rate 0.25) on SmolLM2-135M, recording into memory."""
    from specprefill_sdk import load_pipeline

    rec = Recorder()
    pipe = load_pipeline(
        "paper",
        model=smollm,
        keep_rate=0.25,
        dense_below_tokens=0,  # the essay prompt is short: compress it anyway
        tracer_provider=rec.tracer_provider,
        meter_provider=rec.meter_provider,
    )
    return pipe, rec


def essay_messages(essay: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": essay[:900] + "\n\nWhat is this text about? Answer in one sentence."}]


@pytest.mark.slow
def test_real_pipeline_spans_and_metrics(real: tuple[Pipeline, Recorder], essay: str) -> None:
    pipe, rec = real
    rec.spans_out.clear()
    out = pipe.generate(essay_messages(essay), max_tokens=3)
    n, kept = out.usage.prompt_tokens, out.usage.kept_tokens
    assert 100 < n < 400 and 0 < kept < n
    model = pipe.backend.model_name
    spans = rec.spans()
    assert set(spans) == {"specprefill.pipeline", "specprefill.score", "specprefill.select", f"chat {model}"}
    assert_tree(spans, f"chat {model}")

    score = spans["specprefill.score"].attributes
    assert score["specprefill.scorer"] == "draft-attention" and score["specprefill.draft.model"] == pipe.draft_name
    assert score["specprefill.look_ahead"] == 8 and score["specprefill.prompt_tokens"] == n
    select = spans["specprefill.select"].attributes
    assert select["specprefill.selector"] == pipe.selector.name
    assert select["specprefill.keep_rate.requested"] == 0.25
    assert select["specprefill.kept_tokens"] == kept and select["specprefill.keep_rate.actual"] == pytest.approx(
        kept / n
    )
    assert select["specprefill.protected_tokens"] >= 2  # the attention sink and the generation prompt
    inf = spans[f"chat {model}"].attributes
    assert inf["gen_ai.operation.name"] == "chat" and inf["gen_ai.provider.name"] == "transformers"
    assert inf["gen_ai.request.model"] == model
    assert inf["gen_ai.usage.input_tokens"] == kept
    assert inf["gen_ai.usage.output_tokens"] == out.usage.completion_tokens == len(out.token_ids)
    assert inf["gen_ai.response.finish_reasons"] == (out.finish_reason,)
    assert 0 < inf["gen_ai.response.time_to_first_chunk"] * 1000 <= out.timings.ttft
    # the draft's scoring happens before the target's prefill, inside the TTFT the root reports
    root = spans["specprefill.pipeline"]
    assert root.attributes["specprefill.ttft_ms"] == pytest.approx(out.timings.ttft)
    assert (spans["specprefill.score"].end_time - spans["specprefill.score"].start_time) / 1e6 <= out.timings.ttft

    (ttft,) = rec.points("specprefill.ttft")
    assert ttft.sum == pytest.approx(out.timings.ttft)
    assert [p.value for p in rec.points("specprefill.prompt_tokens")] == [n]
    assert [p.value for p in rec.points("specprefill.kept_tokens")] == [kept]
    (score_ms,) = rec.points("specprefill.score.duration")
    assert score_ms.sum == pytest.approx(out.timings.score) and score_ms.sum > 0


@pytest.mark.slow
def test_real_pipeline_stream(real: tuple[Pipeline, Recorder], essay: str) -> None:
    pipe, rec = real
    rec.spans_out.clear()
    chunks = list(pipe.stream(essay_messages(essay), max_tokens=3))
    done = chunks[-1].completion
    assert done is not None and "".join(c.text for c in chunks) == done.text
    inf = rec.spans()[f"chat {pipe.backend.model_name}"]
    assert inf.attributes["gen_ai.request.stream"] is True
    assert inf.attributes["gen_ai.usage.input_tokens"] == done.usage.kept_tokens < done.usage.prompt_tokens
    assert [e.name for e in inf.events] == ["gen_ai.first_chunk"]
    (ttfc,) = rec.points("gen_ai.client.operation.time_to_first_chunk")
    assert ttfc.sum == pytest.approx(inf.attributes["gen_ai.response.time_to_first_chunk"])
