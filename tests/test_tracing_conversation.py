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
