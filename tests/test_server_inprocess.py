"""Server apps built in this process and served by uvicorn on 127.0.0.1: a failing draft, trace
continuation, and a bounded schemathesis run against /openapi.json.

The apps share the session's loaded SmolLM2 (no second copy of the weights).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from server_utils import ExplodingDraft, serve_in_thread

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def failing_url(backend: Any) -> Iterator[str]:
    from specprefill_sdk.server import ServerConfig, create_app

    with serve_in_thread(create_app(ServerConfig(policy="paper"), backend=backend, scorer=ExplodingDraft())) as base:
        yield base


def _question(text: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": text + "\n\nWhat is this about?"}],
    }


def test_a_failing_draft_falls_back_to_a_dense_answer(failing_url: str) -> None:
    from specprefill_sdk.eval.corpora import haystack

    body = _question(haystack(1500))  # above the policies' dense threshold: the draft runs (and fails)
    response = httpx.post(f"{failing_url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    answer = response.json()
    usage = answer["usage"]
    assert usage["specprefill"]["kept_tokens"] == usage["prompt_tokens"]
    assert usage["specprefill"]["fallback"] == "scorer_error: RuntimeError: draft exploded"
    assert answer["choices"][0]["message"]["content"]
    # The same request without compression gives the same greedy answer: the fallback is a real dense prefill.
    dense = httpx.post(
        f"{failing_url}/v1/chat/completions", json={**body, "specprefill": {"enabled": False}}, timeout=300
    ).json()
    assert dense["choices"][0]["message"]["content"] == answer["choices"][0]["message"]["content"]
    assert dense["usage"]["specprefill"]["fallback"] is None


def test_a_failing_draft_reports_the_fallback_in_the_stream_usage(failing_url: str) -> None:
    body = {
        **_question("A short note about rivers and lakes."),
        "specprefill": {"min_prompt_tokens": 0},  # a short prompt the draft scores all the same (and fails)
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{failing_url}/v1/chat/completions", json=body, timeout=300) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage = httpx.Response(200, content=events[-2]).json()["usage"]
    assert usage["specprefill"]["fallback"].startswith("scorer_error: RuntimeError")


# ----------------------------------------------------------------------------- tracing
def test_an_incoming_traceparent_is_continued_and_the_http_backend_injects_one(backend: Any) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from specprefill_sdk.backends import OpenAIBackend
    from specprefill_sdk.pipeline import Pipeline
    from specprefill_sdk.scoring import UniformScorer
    from specprefill_sdk.selection import KeepRate
    from specprefill_sdk.server import ServerConfig, create_app

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(ServerConfig(policy="dense"), backend=backend, tracer_provider=provider)
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with serve_in_thread(app) as base:
        response = httpx.post(
            f"{base}/v1/completions",
            timeout=300,
            headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
            json={"prompt": "Hello", "max_tokens": 2},
        )
        assert response.status_code == 200
        roots = [s for s in exporter.get_finished_spans() if s.name == "specprefill.pipeline"]
        assert len(roots) == 1
        assert f"{roots[0].context.trace_id:032x}" == trace_id
        assert roots[0].parent is not None and f"{roots[0].parent.span_id:016x}" == parent_id
        exporter.clear()

        # A client-side pipeline over OpenAIBackend carries its trace to the server.
        client_provider = TracerProvider()
        remote = OpenAIBackend(f"{base}/v1", model=MODEL, tokenizer=backend.tokenizer, mode="text")
        pipe = Pipeline(UniformScorer(), KeepRate(1.0), remote, tracer_provider=client_provider)
        with client_provider.get_tracer("test").start_as_current_span("caller") as caller:
            pipe.generate("Hello there", max_tokens=2)
        server_roots = [s for s in exporter.get_finished_spans() if s.name == "specprefill.pipeline"]
        assert len(server_roots) == 1
        assert server_roots[0].context.trace_id == caller.get_span_context().trace_id


# ----------------------------------------------------------------------------- schemathesis
OPERATIONS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/tokenize"),
    ("POST", "/v1/detokenize"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("GET", "/v1/conversations/{conversation_id}"),
    ("DELETE", "/v1/conversations/{conversation_id}"),
    ("GET", "/health"),
]


@pytest.fixture(scope="module")
def fuzz_schema(backend: Any) -> Iterator[Any]:
    """A small-limits app (64-token prompts, 2 new tokens) so that valid generated requests stay cheap."""
    from specprefill_sdk.server import ServerConfig, create_app

    app = create_app(
        ServerConfig(policy="paper", max_prompt_tokens=64, max_output_tokens=2, max_queue=64, max_body_bytes=64 * 1024),
        backend=backend,
    )
    with serve_in_thread(app) as base:
        yield schemathesis.openapi.from_url(f"{base}/openapi.json")


def test_schemathesis_covers_every_operation(fuzz_schema: Any) -> None:
    found = {(r.ok().method.upper(), r.ok().path) for r in fuzz_schema.get_all_operations()}
    assert found == set(OPERATIONS)


def _steer(case: Any) -> Any:
    """Point valid bodies at the served model and within the output limit, so that many reach generation."""
    if isinstance(case.body, dict):
        if case.path == "/v1/chat/completions" and not case.body.get("messages"):
            case.body["messages"] = [{"role": "user", "content": "Name a colour."}]
        if case.path == "/v1/completions" and not case.body.get("prompt"):
            case.body["prompt"] = "Colours: red, green,"
        if "model" in case.body:
            case.body["model"] = MODEL
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(case.body.get(key), int):
                case.body[key] = min(case.body[key], 2)
        options = case.body.get("specprefill")
        if isinstance(options, dict) and isinstance(options.get("look_ahead"), int):
            options["look_ahead"] = min(options["look_ahead"], 2)
    return case


# Only the bodies of POST routes have invalid inputs to generate (any string is a valid model id).
FUZZ_CASES = [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS] + [
    (m, p, GenerationMode.NEGATIVE) for m, p in OPERATIONS if m == "POST"
]


@pytest.mark.parametrize(("method", "path", "mode"), FUZZ_CASES, ids=[f"{m} {p} {g}" for m, p, g in FUZZ_CASES])
def test_schemathesis_finds_no_server_error(fuzz_schema: Any, method: str, path: str, mode: GenerationMode) -> None:
    operation = fuzz_schema[path][method]
    seen: list[int] = []
    strategy = operation.as_strategy(generation_mode=mode)
    if mode == GenerationMode.POSITIVE:
        strategy = strategy.map(_steer)

    generates = mode == GenerationMode.POSITIVE and path in ("/v1/chat/completions", "/v1/completions")

    @given(case=strategy)
    @settings(
        max_examples=12 if generates else 25,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def run(case: Any) -> None:
        response = case.call(timeout=120)
        seen.append(response.status_code)
        assert response.status_code < 500, f"{method} {path} -> {response.status_code}: {response.text[:500]}"
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    run()
    print(f"{method} {path} {mode}: statuses {sorted(Counter(seen).items())}")
    assert seen


# ----------------------------------------------------------------------------- warm-up
def test_warm_up_serves_one_prompt_within_the_limits_and_records_no_telemetry(backend: Any, caplog: Any) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from specprefill_sdk.server import ServerConfig, create_app

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with caplog.at_level("INFO", logger="specprefill_sdk.server.engine"):
        app = create_app(ServerConfig(policy="paper", warmup_tokens=300), backend=backend, tracer_provider=provider)
    done = app.state.engine.warmed_up
    assert done is not None and 250 <= done.prompt_tokens <= 300
    assert 0 < done.kept_tokens < done.prompt_tokens and done.seconds > 0
    assert f"warmed up on a {done.prompt_tokens}-token prompt" in caplog.text
    assert exporter.get_finished_spans() == ()  # the warm-up is no request
    with serve_in_thread(app) as base:
        health = httpx.get(f"{base}/health", timeout=30).json()
        assert health["warmup"]["prompt_tokens"] == done.prompt_tokens
        response = httpx.post(f"{base}/v1/completions", timeout=300, json={"prompt": "Hello", "max_tokens": 2})
        assert response.status_code == 200
    # max_prompt_tokens bounds the warm-up prompt too
    small = create_app(ServerConfig(policy="paper", max_prompt_tokens=40, warmup_tokens=300), backend=backend)
    assert small.state.engine.warmed_up.prompt_tokens <= 40


def test_warm_up_is_off_by_default_on_cpu_and_refuses_bad_values(backend: Any) -> None:
    from specprefill_sdk import InvalidRequestError, SpecPrefillError
    from specprefill_sdk.server import ServerConfig, create_app

    app = create_app(ServerConfig(policy="paper", compile=True), backend=backend)  # compile changes nothing on a CPU
    assert app.state.engine.warmed_up is None
    for bad in (-1, 2.5, True):
        with pytest.raises(InvalidRequestError, match="warmup_tokens"):
            create_app(ServerConfig(policy="paper", warmup_tokens=bad), backend=backend)  # type: ignore[arg-type]
    with pytest.raises(SpecPrefillError, match="the warm-up request failed: RuntimeError: draft exploded") as info:
        create_app(ServerConfig(policy="paper", warmup_tokens=300), backend=backend, scorer=ExplodingDraft())
    assert info.value.code == "warmup_failed"


def test_the_default_warm_up_follows_what_compiles_and_where() -> None:
    from types import SimpleNamespace

    import torch

    from specprefill_sdk import ExecutionSettings
    from specprefill_sdk.server import DEFAULT_WARMUP_TOKENS
    from specprefill_sdk.server.app import default_warmup_tokens

    def backend(device: str, compiles: bool | None) -> Any:
        # what a LocalBackend declares: its loaded model and its device
        return SimpleNamespace(loaded=None, device=torch.device(device), execution=ExecutionSettings(compile=compiles))

    compiling_scorer = SimpleNamespace(execution=ExecutionSettings(compile=True))
    plain_scorer = SimpleNamespace(execution=ExecutionSettings(compile=False))
    assert default_warmup_tokens(backend("cuda", True), None) == DEFAULT_WARMUP_TOKENS  # a given backend
    assert default_warmup_tokens(backend("cuda", False), compiling_scorer) == DEFAULT_WARMUP_TOKENS
    assert default_warmup_tokens(backend("cuda", False), None, compile=True) == DEFAULT_WARMUP_TOKENS
    assert default_warmup_tokens(backend("cuda", False), plain_scorer) == 0
    assert default_warmup_tokens(backend("cpu", True), compiling_scorer, compile=True) == 0
    # auto (the default) compiles on CUDA, so the server warms up there without being asked
    auto = SimpleNamespace(execution=ExecutionSettings())
    if "SPECPREFILL_COMPILE" not in os.environ:
        assert default_warmup_tokens(backend("cuda", None), auto) == DEFAULT_WARMUP_TOKENS
    assert default_warmup_tokens(backend("cpu", None), auto) == 0
