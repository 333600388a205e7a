"""`tracing.setup.configure`: console and OTLP export for real, the no-op default, and its errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import specprefill_sdk
from specprefill_sdk import InvalidRequestError, Pipeline, SpecPrefillError
from specprefill_sdk.tracing.setup import KINDS, configure

sys.path.insert(0, str(Path(__file__).parent))
from test_tracing import EchoBackend, KeepQuarter, LastTokensScorer, chat_prompt

SPAN_NAMES = {"specprefill.pipeline", "specprefill.score", "specprefill.select", "chat tiny-target"}


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_METRICS_EXPORTER",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_TRACES_SAMPLER",
    ):
        monkeypatch.delenv(name, raising=False)


def run_pipeline(tracer_provider: Any, meter_provider: Any) -> Pipeline:
    pipe = Pipeline(
        LastTokensScorer(), KeepQuarter(), EchoBackend(), tracer_provider=tracer_provider, meter_provider=meter_provider
    )
    pipe.generate(chat_prompt(40), max_tokens=3)
    return pipe


def json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects printed one after another by the console exporters."""
    decoder, objects, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return objects
        obj, i = decoder.raw_decode(text, i)
        objects.append(obj)


def metric_names(metrics_json: dict[str, Any]) -> set[str]:
    return {m["name"] for rm in metrics_json["resource_metrics"] for sm in rm["scope_metrics"] for m in sm["metrics"]}


# --------------------------------------------------------------------------- console
def test_console_prints_each_span_and_the_metrics_at_shutdown() -> None:
    out = io.StringIO()
    tracer_provider, meter_provider = configure("console", out=out)
    run_pipeline(tracer_provider, meter_provider)
    spans = json_objects(out.getvalue())
    assert {s["name"] for s in spans} == SPAN_NAMES
    assert len({s["context"]["trace_id"] for s in spans}) == 1
    assert spans[-1]["name"] == "specprefill.pipeline"  # printed as each span ends: the root last
    assert spans[-1]["resource"]["attributes"]["service.name"] == "specprefill"
    inference = next(s for s in spans if s["name"] == "chat tiny-target")
    assert inference["kind"] == "SpanKind.CLIENT"
    assert inference["attributes"]["gen_ai.usage.input_tokens"] == 11

    printed = len(out.getvalue())
    meter_provider.shutdown()  # type: ignore[attr-defined]
    tracer_provider.shutdown()  # type: ignore[attr-defined]
    (metrics_json,) = json_objects(out.getvalue()[printed:])
    assert {
        "specprefill.ttft",
        "specprefill.keep_ratio",
        "specprefill.prompt_tokens",
        "specprefill.kept_tokens",
        "specprefill.score.duration",
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
    } <= metric_names(metrics_json)


def test_console_service_name_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "checkout-assistant")
    out = io.StringIO()
    tracer_provider, meter_provider = configure("console", out=out)
    run_pipeline(tracer_provider, meter_provider)
    assert {s["resource"]["attributes"]["service.name"] for s in json_objects(out.getvalue())} == {"checkout-assistant"}
    meter_provider.shutdown()  # type: ignore[attr-defined]


def test_a_signal_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    out = io.StringIO()
    tracer_provider, meter_provider = configure("console", out=out)
    run_pipeline(tracer_provider, meter_provider)
    assert out.getvalue() == ""
    meter_provider.shutdown()  # type: ignore[attr-defined]
    (metrics_json,) = json_objects(out.getvalue())
    assert "specprefill.ttft" in metric_names(metrics_json)


# --------------------------------------------------------------------------- none
@pytest.mark.parametrize("env", [{}, {"OTEL_SDK_DISABLED": "true"}])
def test_none_and_sdk_disabled_give_no_op_providers(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    tracer_provider, meter_provider = configure("none" if not env else "console")
    assert isinstance(tracer_provider, trace.NoOpTracerProvider)
    assert isinstance(meter_provider, metrics.NoOpMeterProvider)
    pipe = run_pipeline(tracer_provider, meter_provider)
    seen = pipe.backend.current_spans[-1]  # type: ignore[attr-defined]
    assert not seen.is_recording() and not seen.get_span_context().is_valid


# --------------------------------------------------------------------------- OTLP
class Collector:
    """An OTLP/HTTP receiver on 127.0.0.1 that keeps the decoded export requests."""

    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.content_types: set[str] = set()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.content_types.add(self.headers["Content-Type"])
                if self.path == "/v1/traces":
                    collector.traces.append(ExportTraceServiceRequest.FromString(body))
                elif self.path == "/v1/metrics":
                    collector.metrics.append(ExportMetricsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


def test_otlp_exports_spans_and_metrics_to_the_configured_endpoint(
    collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=gateway,deployment.environment=test")
    tracer_provider, meter_provider = configure("otlp")
    run_pipeline(tracer_provider, meter_provider)
    tracer_provider.shutdown()  # type: ignore[attr-defined]
    meter_provider.shutdown()  # type: ignore[attr-defined]

    assert collector.content_types == {"application/x-protobuf"}
    spans = [s for req in collector.traces for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert {s.name for s in spans} == SPAN_NAMES
    resource = {a.key: a.value.string_value for a in collector.traces[0].resource_spans[0].resource.attributes}
    assert resource["service.name"] == "gateway" and resource["deployment.environment"] == "test"
    inference = next(s for s in spans if s.name == "chat tiny-target")
    attrs = {a.key: a.value for a in inference.attributes}
    assert attrs["gen_ai.request.model"].string_value == "tiny-target"
    assert attrs["gen_ai.usage.input_tokens"].int_value == 11
    names = {
        m.name
        for req in collector.metrics
        for rm in req.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert {"specprefill.ttft", "specprefill.kept_tokens", "gen_ai.client.token.usage"} <= names


def test_otlp_refuses_grpc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(InvalidRequestError, match="http/protobuf"):
        configure("otlp")


# --------------------------------------------------------------------------- errors
def test_unknown_kind_lists_the_valid_ones() -> None:
    with pytest.raises(InvalidRequestError) as info:
        configure("jaeger")
    assert all(k in str(info.value) for k in KINDS) and info.value.param == "otel"


@pytest.mark.parametrize(
    ("kind", "module"),
    [
        ("console", "opentelemetry.sdk.trace"),
        ("otlp", "opentelemetry.exporter.otlp.proto.http.trace_exporter"),
    ],
)
def test_a_missing_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch, kind: str, module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what an environment without the package raises
    with pytest.raises(SpecPrefillError, match=r"pip install 'specprefill-sdk\[otel\]'") as info:
        configure(kind)
    assert module in str(info.value)


# --------------------------------------------------------------------------- global providers
_NO_SDK = """
import sys, torch
from opentelemetry import trace
from specprefill_sdk import (BackendCapabilities, Completion, CompletionChunk, Pipeline, Prompt, Selection,
                             TokenScores, Usage)
from specprefill_sdk.backends.base import BackendBase

class Scorer:
    name = "recency"
    def score(self, p): return TokenScores(torch.arange(p.n, dtype=torch.float32))
    def score_batch(self, ps): return [self.score(p) for p in ps]

class Sel:
    name = "first-half"
    def decide_without_scores(self, p): return None
    def select(self, p, s): return Selection(tuple(range(p.n // 2)), p.n, (False,) * (p.n // 2))

class Back(BackendBase):
    capabilities = BackendCapabilities(supports_position_ids=True)
    model_name, tokenizer, max_context = "tiny-target", None, 4096
    seen = []
    def generate(self, cp, params):
        self.seen.append(trace.get_current_span())
        return Completion("x", (1,), "length", Usage(cp.n, cp.kept, 1))

pipe = Pipeline(Scorer(), Sel(), Back())
out = pipe.generate(Prompt.from_token_ids(range(1, 41)), max_tokens=1)
assert out.usage.kept_tokens == 20
span = Back.seen[-1]
print("recording", span.is_recording(), "valid", span.get_span_context().is_valid)
print("sdk imported", any(m.startswith("opentelemetry.sdk") for m in sys.modules))
# an incoming traceparent still reaches the backend (and so an upstream request) unchanged
from opentelemetry import context, propagate
token = context.attach(propagate.extract({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}))
pipe.generate(Prompt.from_token_ids(range(1, 41)), max_tokens=1)
context.detach(token)
seen = Back.seen[-1].get_span_context()
print("passed through", format(seen.trace_id, "032x"), format(seen.span_id, "016x"))
if sys.argv[1] == "configure-later":
    # a provider configured after the pipeline was built is picked up (the API's proxy providers)
    from specprefill_sdk.tracing.setup import configure
    configure("console", set_global=True, out=sys.stdout)
    pipe.generate(Prompt.from_token_ids(range(1, 41)), max_tokens=1)
    print("traced", Back.seen[-1].get_span_context().is_valid)
"""


def _run_no_sdk(mode: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_NO_SDK), mode], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_nothing_is_recorded_without_an_sdk() -> None:
    out = _run_no_sdk("plain")
    assert out.splitlines() == [
        "recording False valid False",
        "sdk imported False",
        "passed through 0af7651916cd43dd8448eb211c80319c b7ad6b7169203331",
    ]


def test_global_providers_set_later_are_used_by_an_existing_pipeline() -> None:
    out = _run_no_sdk("configure-later")
    assert out.splitlines()[:2] == ["recording False valid False", "sdk imported False"]
    assert "traced True" in out.splitlines()
    names = {o["name"] for o in json_objects(out.split("traced True", 1)[0].split("b7ad6b7169203331", 1)[1])}
    assert names == {"specprefill.pipeline", "specprefill.score", "specprefill.select", "text_completion tiny-target"}


# --------------------------------------------------------------------------- the command line
@pytest.mark.slow
def test_specprefill_run_otel_console_keeps_stdout_for_the_answer(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OTEL_SERVICE_NAME": "cli-check"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specprefill_sdk",
            "run",
            "--otel",
            "console",
            "--keep",
            "0.5",
            "--max-tokens",
            "2",
            "--prompt",
            "The capital of France is Paris. The capital of Italy is Rome. What is the capital of France?",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "{" not in proc.stdout and proc.stdout.strip()  # the answer alone
    spans = [
        o
        for o in json_objects(proc.stderr[proc.stderr.index("{") :].split("\nprompt tokens", 1)[0])
        if "name" in o and "context" in o
    ]
    names = {s["name"] for s in spans}
    assert {"specprefill.pipeline", "specprefill.select", "chat smollm2-135m"} <= names
    assert len({s["context"]["trace_id"] for s in spans}) == 1
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"cli-check"}


def test_specprefill_run_rejects_an_unknown_exporter() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "specprefill_sdk", "run", "--otel", "zipkin", "--prompt", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and "--otel" in proc.stderr and "console" in proc.stderr


def test_the_environment_wins_over_the_callers_default_service_name(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    tracer_provider, _ = configure("console", service_name="specprefill-server", out=out)
    tracer_provider.get_tracer("t").start_span("a").end()
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=edge-gateway,service.version=7.1")
    tracer_provider, _ = configure("console", service_name="specprefill-server", out=out)
    tracer_provider.get_tracer("t").start_span("b").end()
    first, second = (s["resource"]["attributes"] for s in json_objects(out.getvalue()))
    assert first["service.name"] == "specprefill-server" and first["service.version"] == specprefill_sdk.__version__
    assert second["service.name"] == "edge-gateway" and second["service.version"] == "7.1"
