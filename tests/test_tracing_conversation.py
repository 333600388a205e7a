"""Every conversation turn is traced and carries gen_ai.conversation.id, whatever the strategy."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("strategy", ["recompute", "incremental", "refresh"])
def test_each_turn_has_a_pipeline_and_an_inference_span(smollm: Any, essay: str, strategy: str) -> None:
    from specprefill_sdk import load_pipeline

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    pipe = load_pipeline("paper", model=smollm, keep_rate=0.3, tracer_provider=provider)
    conv = pipe.conversation(strategy=strategy)
    conv.send(essay[:700] + "\n\nWhat is this about?", max_tokens=4)
    conv.send("Say it shorter.", max_tokens=4)

    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.name == "specprefill.pipeline"]
    inference = [s for s in spans if s.name.startswith("chat ")]
    assert len(roots) == 2 and len(inference) == 2
    for root, inf in zip(roots, inference, strict=True):
        assert root.attributes["gen_ai.conversation.id"] == conv.id
        assert inf.attributes["gen_ai.conversation.id"] == conv.id
        assert inf.parent is not None and inf.parent.span_id == root.context.span_id
        assert inf.attributes["gen_ai.usage.output_tokens"] >= 1
        assert 0 < inf.attributes["gen_ai.usage.input_tokens"] <= root.attributes["specprefill.prompt_tokens"]


@pytest.mark.parametrize("strategy", ["incremental", "refresh"])
def test_turns_that_reuse_caches_trace_the_compress_step_and_record_metrics(
    smollm: Any, essay: str, strategy: str
) -> None:
    from test_tracing import Recorder

    from specprefill_sdk import load_pipeline

    rec = Recorder()
    pipe = load_pipeline(
        "paper",
        model=smollm,
        keep_rate=0.3,
        dense_below_tokens=0,  # the first turn is short: scored all the same
        tracer_provider=rec.tracer_provider,
        meter_provider=rec.meter_provider,
    )
    conv = pipe.conversation(strategy=strategy)
    conv.send(essay[:700] + "\n\nWhat is this about?", max_tokens=4)
    # Long enough that the new turn alone spans several chunks: the incremental turn scores it too.
    conv.send(essay[700:1400] + "\n\nAnd this?", max_tokens=4)

    spans = rec.spans_out.get_finished_spans()
    roots = [s for s in spans if s.name == "specprefill.pipeline"]
    assert len(roots) == 2
    assert all(t.draft_tokens > 0 for t in conv.turns)
    for root in roots:
        assert root.attributes["specprefill.conversation.strategy"] == strategy
        children = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id}
        assert {"specprefill.score", "specprefill.select"} <= set(children)
        score = children["specprefill.score"].attributes
        assert score["specprefill.scorer"] == "draft-attention"
        assert score["specprefill.draft.model"] == pipe.draft_name
        assert score["specprefill.look_ahead"] == 8
        assert children["specprefill.select"].attributes["specprefill.kept_tokens"] >= 1
        assert children["specprefill.score"].end_time <= children[f"chat {pipe.backend.model_name}"].start_time

    # The same metrics as single requests.
    (score_time,) = rec.points("specprefill.score.duration")
    assert score_time.count == 2
    (ttft,) = rec.points("specprefill.ttft")
    assert ttft.count == 2
    assert sum(p.count for p in rec.points("gen_ai.client.operation.duration")) == 2
    (kept,) = rec.points("specprefill.kept_tokens")
    assert kept.value == sum(t.kept_tokens for t in conv.turns)
    (prompt_tokens,) = rec.points("specprefill.prompt_tokens")
    assert prompt_tokens.value == sum(t.prompt_tokens for t in conv.turns)
