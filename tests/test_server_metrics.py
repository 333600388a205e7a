"""``GET /metrics``: Prometheus metrics of a real `specprefill serve --metrics` process, checked against
the responses it gave; off by default (404); behind the API key when the server has keys.

The exposition is parsed with prometheus_client's own parser, as a Prometheus server would read it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_utils import ExplodingDraft, ServerProcess, serve_in_thread, start_server

from specprefill_sdk.types import Completion, Prompt, Usage

MODEL = "smollm2-135m"
KEYS = ("metrics-key-one", "metrics-key-two")


# ----------------------------------------------------------------------------- reading the exposition
def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (sample name, sorted labels) -> value."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"model_name": MODEL, **labels}.items())))
    assert key in samples, f"{name}{labels} is not in the exposition"
    return samples[key]


def _scrape(base: str, headers: dict[str, str] | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{base}/metrics", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return _samples(response.text)


def _stream_usage(base: str, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """POST a streamed request; its usage chunk and its finish reason."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{base}/v1/{path}", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1
    return chunks[-1]["usage"], finish[0]


# ----------------------------------------------------------------------------- a real process
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("metrics") / "server.log"
    # The warm-up is served before any request, and must not be counted as one. The paper policy
    # compresses these ~1,200-token prompts; the default (auto) prefills prompts under 1,024 tokens
    # whole, and this test counts compressed requests.
    proc = start_server(
        ["--model", MODEL, "--device", "cpu", "--metrics", "--warmup-tokens", "64", "--policy", "paper"], log
    )
    yield proc
    proc.stop()


@pytest.mark.slow
def test_the_metrics_count_what_the_server_answered(server: ServerProcess) -> None:
    from specprefill_sdk.eval.corpora import haystack

    base = server.base
    text = haystack(1200)
    chat = {"model": MODEL, "max_tokens": 6, "messages": [{"role": "user", "content": text + "\n\nWhat is it about?"}]}
    usages: list[dict[str, Any]] = []
    finishes: list[str] = []

    def post(path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        response = httpx.post(f"{base}/v1/{path}", json=body, headers=headers, timeout=300)
        assert response.status_code == 200, response.text
        answer = response.json()
        usages.append(answer["usage"])
        finishes.append(answer["choices"][0]["finish_reason"])
        return dict(answer)

    def stream(path: str, body: dict[str, Any]) -> None:
        usage, finish = _stream_usage(base, path, body)
        usages.append(usage)
        finishes.append(finish)

    post("chat/completions", chat)  # compressed by the server's policy
    stream("chat/completions", chat)
    post("completions", {"model": MODEL, "prompt": text, "max_tokens": 5, "specprefill": {"enabled": False}})
    # Shorter than the request's dense-below threshold: prefilled whole without the draft.
    stream("completions", {"model": MODEL, "prompt": text, "max_tokens": 4, "specprefill": {"min_prompt_tokens": 8000}})
    first = post(
        "chat/completions",
        {
            "model": MODEL,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": text[:600] + "\n\nWho wrote this?"}],
            # shorter than the policies' default dense threshold: compressed only when asked
            "specprefill": {"conversation_id": "metrics-1", "conversation_start": True, "min_prompt_tokens": 0},
        },
    )
    assert first["usage"]["specprefill"]["conversation"]["turn"] == 1
    stream(
        "chat/completions",
        {
            "model": MODEL,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "And when?"}],
            "specprefill": {"conversation_id": "metrics-1"},
        },
    )
    n = len(usages)
    assert n == 6

    samples = _scrape(base)
    # vLLM's names
    assert _value(samples, "vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert _value(samples, "vllm:generation_tokens_total") == sum(u["completion_tokens"] for u in usages)
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prompt_tokens",
        "specprefill:kept_ratio",
    ):
        assert _value(samples, f"{name}_count") == n, name
        assert _value(samples, f"{name}_bucket", le="+Inf") == n, name
    assert _value(samples, "vllm:request_prompt_tokens_sum") == sum(u["prompt_tokens"] for u in usages)
    assert _value(samples, "vllm:request_generation_tokens_sum") == sum(u["completion_tokens"] for u in usages)
    intervals = sum(max(0, u["completion_tokens"] - 1) for u in usages)
    assert _value(samples, "vllm:inter_token_latency_seconds_count") == intervals
    assert _value(samples, "vllm:request_time_per_output_token_seconds_count") == sum(
        u["completion_tokens"] > 1 for u in usages
    )
    by_reason = Counter(finishes)
    for reason in ("stop", "length"):
        assert _value(samples, "vllm:request_success_total", finished_reason=reason) == by_reason[reason]
    assert _value(samples, "vllm:request_success_total", finished_reason="abort") == 0
    # The end-to-end latency of a request holds its time to first token.
    assert _value(samples, "vllm:e2e_request_latency_seconds_sum") >= _value(
        samples, "vllm:time_to_first_token_seconds_sum"
    )
    assert _value(samples, "vllm:num_requests_running") == 0
    assert _value(samples, "vllm:num_requests_waiting") == 0
    # ours
    sp = [u["specprefill"] for u in usages]
    assert _value(samples, "specprefill:kept_tokens_total") == sum(s["kept_tokens"] for s in sp)
    assert _value(samples, "specprefill:kept_ratio_sum") == pytest.approx(
        sum(s["kept_tokens"] / u["prompt_tokens"] for s, u in zip(sp, usages, strict=True))
    )
    assert sum(s["kept_tokens"] < u["prompt_tokens"] for s, u in zip(sp, usages, strict=True)) >= 2
    scored = [s for s in sp if s["score_ms"] > 0]
    assert scored and _value(samples, "specprefill:score_time_seconds_count") == len(scored)
    assert _value(samples, "specprefill:score_time_seconds_sum") == pytest.approx(
        sum(s["score_ms"] for s in scored) / 1000.0
    )
    assert _value(samples, "specprefill:selection_time_seconds_count") == n
    assert _value(samples, "specprefill:fallbacks_total", reason="disabled") == 1
    assert _value(samples, "specprefill:fallbacks_total", reason="dense_below") == 1
    assert _value(samples, "specprefill:fallbacks_total", reason="scorer_error") == 0
    assert _value(samples, "specprefill:conversation_turns_total", strategy="incremental") == 2
    assert _value(samples, "specprefill:conversation_turns_total", strategy="recompute") == 0
    assert _value(samples, "specprefill:conversations") == 1
    assert _value(samples, "specprefill:admission_rejected_total") == 0

    # Nothing but requests moves the counters: a second scrape reads the same.
    again = _scrape(base)
    assert _value(again, "vllm:time_to_first_token_seconds_count") == n
    assert _value(again, "vllm:prompt_tokens_total") == _value(samples, "vllm:prompt_tokens_total")


@pytest.mark.slow
def test_a_stream_left_mid_way_is_running_then_counted_as_aborted(server: ServerProcess) -> None:
    base = server.base
    before = _scrape(base)
    body = {
        "model": MODEL,
        "prompt": "Once upon a time, in a land of mountains and rivers, there lived a dragon who",
        "max_tokens": 64,
        "stream": True,
        "specprefill": {"enabled": False},
    }
    seen = 0
    with httpx.Client(timeout=300) as http, http.stream("POST", f"{base}/v1/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen == 2:
                    # The gauge is read from the queue at scrape time: the open stream holds its slot.
                    assert _value(_scrape(base), "vllm:num_requests_running") == 1
                    break
    running = None
    for _ in range(600):  # bounded: the server notices the disconnect and frees the slot
        after = _scrape(base)
        running = _value(after, "vllm:num_requests_running")
        if running == 0:
            break
        time.sleep(0.1)
    assert running == 0
    aborted = _value(after, "vllm:request_success_total", finished_reason="abort")
    assert aborted == _value(before, "vllm:request_success_total", finished_reason="abort") + 1
    # An unfinished request has no end-to-end latency: the histograms count finished requests only.
    assert _value(after, "vllm:e2e_request_latency_seconds_count") == _value(
        before, "vllm:e2e_request_latency_seconds_count"
    )


# ----------------------------------------------------------------------------- apps in this process
@pytest.mark.slow
def test_metrics_are_off_by_default_with_an_openai_style_404(backend: Any) -> None:
    from specprefill_sdk.server import ServerConfig, create_app

    assert ServerConfig().metrics is False
    with serve_in_thread(create_app(ServerConfig(policy="paper"), backend=backend)) as base:
        response = httpx.get(f"{base}/metrics", timeout=30)
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["type"] == "not_found_error" and error["code"] == "metrics_disabled"
        assert "--metrics" in error["message"]
        assert "/metrics" not in httpx.get(f"{base}/openapi.json", timeout=30).json()["paths"]


@pytest.mark.slow
def test_with_api_keys_the_metrics_need_one_and_any_key_will_do(backend: Any) -> None:
    from specprefill_sdk.server import ServerConfig, create_app

    config = ServerConfig(policy="paper", api_keys=KEYS, metrics=True)
    with serve_in_thread(create_app(config, backend=backend)) as base:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEYS[0]}):
            response = httpx.get(f"{base}/metrics", headers=headers, timeout=30)
            assert response.status_code == 401, headers
            assert response.json()["error"]["code"] == "invalid_api_key"
            assert response.headers["www-authenticate"] == "Bearer"
        for key in KEYS:
            samples = _scrape(base, {"Authorization": f"Bearer {key}"})
            assert _value(samples, "vllm:time_to_first_token_seconds_count") == 0
        # The health check stays open for load balancers.
        assert httpx.get(f"{base}/health", timeout=30).status_code == 200
        assert "/metrics" in httpx.get(f"{base}/openapi.json", timeout=30).json()["paths"]
    # Off on a keyed server: a key is still asked first, so the answer does not tell a stranger whether it is on.
    with serve_in_thread(create_app(ServerConfig(policy="paper", api_keys=KEYS), backend=backend)) as base:
        assert httpx.get(f"{base}/metrics", timeout=30).status_code == 401
        response = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {KEYS[1]}"}, timeout=30)
        assert response.status_code == 404 and response.json()["error"]["code"] == "metrics_disabled"


@pytest.mark.slow
def test_a_failing_draft_counts_as_a_scorer_error_fallback(backend: Any) -> None:
    from specprefill_sdk.eval.corpora import haystack
    from specprefill_sdk.server import ServerConfig, create_app

    config = ServerConfig(policy="paper", metrics=True)
    with serve_in_thread(create_app(config, backend=backend, scorer=ExplodingDraft())) as base:
        body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": haystack(1500)}]}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["specprefill"]["fallback"].startswith("scorer_error")
        samples = _scrape(base)
        assert _value(samples, "specprefill:fallbacks_total", reason="scorer_error") == 1
        assert _value(samples, "specprefill:fallbacks_total", reason="dense_below") == 0
        assert _value(samples, "vllm:time_to_first_token_seconds_count") == 1


# ----------------------------------------------------------------------------- the parts, without a server
def test_the_queue_gauges_and_refusals_are_read_at_scrape_time() -> None:
    from specprefill_sdk.server.errors import OverloadedError
    from specprefill_sdk.server.limits import Admission
    from specprefill_sdk.server.metrics import ServerMetrics
    from specprefill_sdk.server.sessions import ConversationStore

    async def scenario() -> None:
        admission = Admission(max_concurrency=1, max_queue=1)
        metrics = ServerMetrics(MODEL, admission, ConversationStore(60.0, 4), max_model_len=2048)
        running = await admission.acquire()
        queued = asyncio.ensure_future(admission.acquire())
        for _ in range(100):  # bounded: the queued acquire starts waiting within a few loop turns
            if admission.stats().waiting == 1:
                break
            await asyncio.sleep(0)
        with pytest.raises(OverloadedError):
            await admission.acquire()
        samples = _samples(metrics.exposition().decode())
        assert _value(samples, "vllm:num_requests_running") == 1
        assert _value(samples, "vllm:num_requests_waiting") == 1
        assert _value(samples, "specprefill:admission_rejected_total") == 1
        admission.release(running)
        ticket = await queued
        assert ticket.waited > 0
        samples = _samples(metrics.exposition().decode())
        assert _value(samples, "vllm:num_requests_waiting") == 0
        assert _value(samples, "vllm:num_requests_running") == 1
        admission.release(ticket)

    asyncio.run(scenario())


def test_each_app_has_its_own_registry() -> None:
    from specprefill_sdk.server.limits import Admission
    from specprefill_sdk.server.metrics import ServerMetrics
    from specprefill_sdk.server.sessions import ConversationStore

    def fresh() -> ServerMetrics:
        return ServerMetrics(MODEL, Admission(), ConversationStore(60.0, 4), max_model_len=2048)

    one, two = fresh(), fresh()  # a second one would raise "Duplicated timeseries" in a shared registry
    completion = Completion("hi", (1, 2), "stop", Usage(prompt_tokens=10, kept_tokens=4, completion_tokens=2))
    one.finished(completion, e2e_s=0.5, queued_s=0.1)
    assert _value(_samples(one.exposition().decode()), "vllm:prompt_tokens_total") == 10
    assert _value(_samples(two.exposition().decode()), "vllm:prompt_tokens_total") == 0


def test_the_time_to_first_token_starts_at_the_arrival() -> None:
    from specprefill_sdk.server.limits import Admission
    from specprefill_sdk.server.metrics import ServerMetrics
    from specprefill_sdk.server.sessions import ConversationStore
    from specprefill_sdk.types import Timings

    metrics = ServerMetrics(MODEL, Admission(), ConversationStore(60.0, 4), max_model_len=2048)
    # 3 s from arrival to end; the model work took the last 2 s, its first token came after 0.5 s of it.
    timings = Timings(ttft=500.0, total=2000.0)
    usage = Usage(prompt_tokens=10, kept_tokens=10, completion_tokens=4)
    metrics.finished(Completion("abc", (1, 2, 3, 4), "length", usage, timings), e2e_s=3.0, queued_s=0.75)
    samples = _samples(metrics.exposition().decode())
    assert _value(samples, "vllm:time_to_first_token_seconds_sum") == pytest.approx(1.5)
    assert _value(samples, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(3.0)
    assert _value(samples, "vllm:request_queue_time_seconds_sum") == pytest.approx(0.75)
    # 1.5 s of decoding over 3 intervals
    assert _value(samples, "vllm:inter_token_latency_seconds_count") == 3
    assert _value(samples, "vllm:inter_token_latency_seconds_sum") == pytest.approx(1.5)
    assert _value(samples, "vllm:request_time_per_output_token_seconds_sum") == pytest.approx(0.5)
    assert _value(samples, "vllm:request_success_total", finished_reason="length") == 1
    assert _value(samples, "specprefill:score_time_seconds_count") == 0  # the draft never ran


def test_dense_below_decisions_are_told_apart_from_a_dense_policy() -> None:
    from specprefill_sdk.selection import Adaptive, DenseBelow, KeepRate
    from specprefill_sdk.server.metrics import fallback_reason

    prompt = Prompt.from_token_ids(list(range(40)))

    def answered(selector: Any) -> Completion:
        selection = selector.decide_without_scores(prompt)
        assert selection is not None and selection.dense
        usage = Usage(prompt_tokens=40, kept_tokens=selection.kept, completion_tokens=1)
        return Completion("x", (1,), "stop", usage, selection=selection)

    assert fallback_reason(answered(DenseBelow(KeepRate(0.1), tokens=100))) == "dense_below"
    assert fallback_reason(answered(Adaptive(dense_below_tokens=100))) == "dense_below"
    assert fallback_reason(answered(KeepRate(1.0))) is None  # the dense policy compressed as asked
    assert fallback_reason(answered(KeepRate(1.0)), disabled=True) == "disabled"
    failed = Completion("x", (1,), "stop", Usage(40, 40, 1), fallback="scorer_error: RuntimeError: boom")
    assert fallback_reason(failed) == "scorer_error"


def test_the_switch_is_read_from_the_environment_and_the_command_line() -> None:
    import argparse

    from specprefill_sdk.cli import serve
    from specprefill_sdk.errors import InvalidRequestError
    from specprefill_sdk.server import ServerConfig

    assert ServerConfig.from_env({"SPECPREFILL_METRICS": "1"}).metrics is True
    assert ServerConfig.from_env({"SPECPREFILL_METRICS": "no"}).metrics is False
    with pytest.raises(InvalidRequestError, match="SPECPREFILL_METRICS"):
        ServerConfig.from_env({"SPECPREFILL_METRICS": "sometimes"})
    with pytest.raises(InvalidRequestError, match="metrics"):
        ServerConfig(metrics="yes")  # type: ignore[arg-type]
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.config_from_args(parser.parse_args(["--metrics"]), environ={}).metrics is True
    assert serve.config_from_args(parser.parse_args([]), environ={}).metrics is False
