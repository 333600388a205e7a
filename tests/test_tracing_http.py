"""One trace across an HTTP hop: a client's span -> ``traceparent`` -> our server's pipeline spans.

The server is real: `create_app` served by uvicorn on 127.0.0.1 with an in-memory exporter, and a
``specprefill serve --otel console`` process whose printed spans are read back from its output.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import propagate
from opentelemetry.trace import SpanKind

sys.path.insert(0, str(Path(__file__).parent))
from server_utils import serve_in_thread, start_server
from test_tracing import Recorder

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name the largest planet of the solar system in one word."}]


@pytest.fixture(scope="module")
def served(smollm: Any) -> Iterator[tuple[str, str, Recorder]]:
    """Our server in a thread, recording its spans in memory: (API root, served model id, recorder)."""
    from specprefill_sdk.backends import TransformersBackend
    from specprefill_sdk.server import create_app

    rec = Recorder()
    app = create_app(
        backend=TransformersBackend(smollm), tracer_provider=rec.tracer_provider, meter_provider=rec.meter_provider
    )
    with serve_in_thread(app) as base:
        model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        yield f"{base}/v1", model, rec


def server_root(rec: Recorder) -> Any:
    (root,) = [s for s in rec.spans_out.get_finished_spans() if s.name == "specprefill.pipeline"]
    return root


def test_server_continues_the_callers_traceparent(served: tuple[str, str, Recorder]) -> None:
    api, model, server = served
    server.spans_out.clear()
    client = Recorder()
    with client.tracer_provider.get_tracer("client").start_as_current_span("ask", kind=SpanKind.CLIENT) as ask:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        response = httpx.post(
            f"{api}/chat/completions",
            json={"model": model, "messages": QUESTION, "max_tokens": 2},
            headers=headers,
            timeout=120,
        )
    assert response.status_code == 200, response.text
    assert headers["traceparent"].split("-")[1] == format(ask.get_span_context().trace_id, "032x")
    root = server_root(server)
    assert root.context.trace_id == ask.get_span_context().trace_id
    assert root.parent is not None and root.parent.is_remote
    assert root.parent.span_id == ask.get_span_context().span_id
    # every span the server recorded for this request belongs to the caller's trace
    server_spans = server.spans_out.get_finished_spans()
    assert {s.name for s in server_spans} >= {"specprefill.pipeline", f"chat {model}"}
    assert {s.context.trace_id for s in server_spans} == {ask.get_span_context().trace_id}


def test_a_request_without_traceparent_starts_a_new_trace(served: tuple[str, str, Recorder]) -> None:
    api, model, server = served
    server.spans_out.clear()
    response = httpx.post(
        f"{api}/chat/completions", json={"model": model, "messages": QUESTION, "max_tokens": 1}, timeout=120
    )
    assert response.status_code == 200, response.text
    root = server_root(server)
    assert root.parent is None and root.context.is_valid


def test_openai_backend_carries_the_client_pipelines_trace_to_the_server(
    served: tuple[str, str, Recorder], smollm: Any
) -> None:
    from specprefill_sdk import load_pipeline
    from specprefill_sdk.backends import OpenAIBackend

    api, model, server = served
    server.spans_out.clear()
    client = Recorder()
    backend = OpenAIBackend(api, model=model, tokenizer=smollm.tokenizer, mode="text")
    pipe = load_pipeline(
        "paper",
        model=smollm,
        backend=backend,
        tracer_provider=client.tracer_provider,
        meter_provider=client.meter_provider,
    )
    out = pipe.generate(QUESTION, max_tokens=2)
    assert out.usage.completion_tokens >= 1
    client_spans = client.spans()
    inference = client_spans[f"chat {model}"]
    assert inference.kind is SpanKind.CLIENT
    assert inference.attributes["gen_ai.provider.name"] == "openai"
    assert inference.attributes["server.address"] == "127.0.0.1"
    assert inference.attributes["server.port"] == int(api.rsplit(":", 1)[1].split("/")[0])
    root = server_root(server)
    # the server's pipeline is a child of the client's inference span: one trace over both processes' work
    assert root.context.trace_id == client_spans["specprefill.pipeline"].context.trace_id
    assert root.parent is not None and root.parent.span_id == inference.context.span_id


def _printed_spans(text: str) -> list[dict[str, Any]]:
    """The span objects the console exporter printed, picked out of a log with other lines in it."""
    decoder, spans, i = json.JSONDecoder(), [], 0
    while (i := text.find('{\n    "name": ', i)) >= 0:
        obj, end = decoder.raw_decode(text, i)
        spans.append(obj)
        i = end
    return spans


def test_serve_with_otel_console_prints_spans_of_the_callers_trace(tmp_path: Path) -> None:
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    server = start_server(["--otel", "console", "--max-concurrency", "1"], tmp_path / "server.log")
    try:
        model = httpx.get(f"{server.api}/models", timeout=30).json()["data"][0]["id"]
        response = httpx.post(
            f"{server.api}/chat/completions",
            json={"model": model, "messages": QUESTION, "max_tokens": 1},
            headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
            timeout=120,
        )
        assert response.status_code == 200, response.text
    finally:
        server.stop()
    spans = _printed_spans(server.log())
    ours = [s for s in spans if s["context"]["trace_id"] == f"0x{trace_id}"]
    assert {s["name"] for s in ours} >= {"specprefill.pipeline", f"chat {model}"}, server.log()[-3000:]
    (root,) = [s for s in ours if s["name"] == "specprefill.pipeline"]
    assert root["resource"]["attributes"]["service.name"] == "specprefill-server"
    # walking up from the pipeline's root span (through the web framework's server spans, when it
    # records them) ends at the caller's span
    by_id = {s["context"]["span_id"]: s for s in ours}
    span, chain = root, [root["name"]]
    while span["parent_id"] in by_id:
        span = by_id[span["parent_id"]]
        chain.append(span["name"])
    assert span["parent_id"] == f"0x{parent_id}", chain
