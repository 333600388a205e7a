"""Pipeline call time without an OpenTelemetry SDK and with the SDK recording into memory.

Two workloads, each timed in both modes with the calls interleaved (A, B, A, B, ...) so that drift
in the machine's load hits both modes alike:

- ``stages``: in-process stages that do almost nothing (a recency scorer, a top-quarter selector, a
  backend that returns a fixed completion), so the time is the pipeline's own bookkeeping plus its
  telemetry: the upper bound of what tracing can add to a call;
- ``smollm2``: the ``paper`` policy on the bundled SmolLM2-135M (CPU): draft scoring with look-ahead,
  chunked selection, sparse prefill and one generated token, on a short essay prompt.

Modes: ``no-sdk`` (no provider given and none configured: the API's no-op tracer and meter) and
``sdk-in-memory`` (an SDK ``TracerProvider`` with a ``SimpleSpanProcessor`` into an
``InMemorySpanExporter``, and an SDK ``MeterProvider`` with an ``InMemoryMetricReader``).

Usage::

    python benchmarks/tracing_overhead.py            # writes benchmarks/results/tracing_overhead.{json,md}
    python benchmarks/tracing_overhead.py --stage-calls 500 --model-calls 10 --out /tmp
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from specprefill_sdk import (
    BackendCapabilities,
    Completion,
    CompressedPrompt,
    Pipeline,
    Prompt,
    SamplingParams,
    Selection,
    TokenScores,
    Usage,
)
from specprefill_sdk.backends.base import BackendBase
from specprefill_sdk.tracing import Telemetry, set_attributes

MODES = ("no-sdk", "sdk-in-memory")


class _RecencyScorer:
    name = "recency"
    model_name = "none"

    def score(self, prompt: Prompt) -> TokenScores:
        return TokenScores(torch.arange(prompt.n, dtype=torch.float32))

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        return [self.score(p) for p in prompts]


class _LastQuarter:
    name = "last-quarter"

    def decide_without_scores(self, prompt: Prompt) -> Selection | None:
        return None

    def select(self, prompt: Prompt, scores: TokenScores) -> Selection:
        start = prompt.n - max(1, prompt.n // 4)
        kept = tuple(range(start, prompt.n))
        return Selection(kept, prompt.n, (False,) * len(kept), requested_rate=0.25)


class _FixedBackend(BackendBase):
    capabilities = BackendCapabilities(supports_position_ids=True)
    model_name = "fixed"
    tokenizer = None
    max_context = 1 << 20

    def generate(self, prompt: CompressedPrompt, params: SamplingParams) -> Completion:
        return Completion("x", (1,), "length", Usage(prompt.n, prompt.kept, 1), model="fixed")


class _Recording:
    """SDK providers that keep every span and metric in memory."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])


def _time_interleaved(
    calls: dict[str, Callable[[], Any]], n: int, warmup: int, between: Callable[[], None]
) -> dict[str, list[float]]:
    """Milliseconds per call for each mode, modes shuffled within each round."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    times: dict[str, list[float]] = {mode: [] for mode in calls}
    rng = random.Random(0)
    order = list(calls)
    for _ in range(n):
        rng.shuffle(order)
        for mode in order:
            between()
            t0 = time.perf_counter()
            calls[mode]()
            times[mode].append((time.perf_counter() - t0) * 1000.0)
    return times


def _summary(times: list[float]) -> dict[str, float]:
    q = statistics.quantiles(times, n=10)
    return {
        "median_ms": statistics.median(times),
        "p10_ms": q[0],
        "p90_ms": q[-1],
        "mean_ms": statistics.fmean(times),
        "calls": len(times),
    }


def _workload(name: str, description: str, times: dict[str, list[float]], spans_per_call: int) -> dict[str, Any]:
    modes = {mode: _summary(t) for mode, t in times.items()}
    base, traced = modes["no-sdk"]["median_ms"], modes["sdk-in-memory"]["median_ms"]
    return {
        "name": name,
        "description": description,
        "modes": modes,
        "spans_per_call": spans_per_call,
        "overhead_ms": traced - base,
        "overhead_pct": 100.0 * (traced - base) / base,
    }


def bench_stages(n: int) -> dict[str, Any]:
    rec = _Recording()
    plain = Pipeline(_RecencyScorer(), _LastQuarter(), _FixedBackend())
    traced = Pipeline(
        _RecencyScorer(),
        _LastQuarter(),
        _FixedBackend(),
        tracer_provider=rec.tracer_provider,
        meter_provider=rec.meter_provider,
    )
    prompt = Prompt.from_token_ids(range(1, 257))
    params = SamplingParams(max_tokens=1)
    times = _time_interleaved(
        {"no-sdk": lambda: plain.generate(prompt, params), "sdk-in-memory": lambda: traced.generate(prompt, params)},
        n,
        warmup=50,
        between=rec.spans.clear,
    )
    rec.spans.clear()
    traced.generate(prompt, params)
    spans = len(rec.spans.get_finished_spans())
    return _workload(
        "stages", "256-token prompt, no-op stages: the pipeline's own work and its telemetry", times, spans
    )


def bench_noop_telemetry(rounds: int = 30, per_round: int = 1000) -> dict[str, Any]:
    """Microseconds spent in the telemetry calls of one `generate` when no SDK is configured.

    Replays what a traced `generate` does (four spans with their attributes, ten metric records)
    against a `Telemetry` built from the API's default no-op providers.
    """
    tel = Telemetry()
    attrs = {f"specprefill.attribute_{i}": i for i in range(12)}
    metric = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}

    def one() -> None:
        with tel.span("specprefill.pipeline", attrs) as root:
            with tel.span("specprefill.score", attrs):
                pass
            tel.score_time.record(1.0, metric)
            with tel.span("specprefill.select", attrs) as select:
                set_attributes(select, attrs)
            with tel.span("chat m", attrs, kind=SpanKind.CLIENT) as inference:
                tel.operation_duration.record(0.1, metric)
                tel.ttft.record(1.0, metric)
                tel.keep_ratio.record(0.1, metric)
                tel.prompt_tokens.add(100, metric)
                tel.kept_tokens.add(10, metric)
                tel.token_usage.record(10, metric)
                tel.token_usage.record(1, metric)
                set_attributes(inference, attrs)
            set_attributes(root, attrs)

    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(per_round):
            one()
        per_call.append((time.perf_counter() - t0) * 1e6 / per_round)
    return {"median_us": statistics.median(per_call), "rounds": rounds, "calls_per_round": per_round}


def bench_smollm2(n: int) -> dict[str, Any]:
    from specprefill_sdk import load_model, load_pipeline
    from specprefill_sdk.eval.corpora import haystack

    lm = load_model("smollm2-135m", device="cpu", dtype="bfloat16", progress=False)
    rec = _Recording()
    plain = load_pipeline("paper", model=lm)
    traced = load_pipeline("paper", model=lm, tracer_provider=rec.tracer_provider, meter_provider=rec.meter_provider)
    messages = [{"role": "user", "content": haystack(1200) + "\n\nIn one word, what is this text about?"}]
    prompt_tokens = plain.prompt(messages).n
    params = SamplingParams(max_tokens=1)
    with torch.inference_mode():
        times = _time_interleaved(
            {
                "no-sdk": lambda: plain.generate(messages, params),
                "sdk-in-memory": lambda: traced.generate(messages, params),
            },
            n,
            warmup=3,
            between=rec.spans.clear,
        )
        rec.spans.clear()
        traced.generate(messages, params)
    spans = len(rec.spans.get_finished_spans())
    return _workload(
        "smollm2",
        f"paper policy on SmolLM2-135M (CPU, bf16), {prompt_tokens}-token chat prompt, 1 generated token",
        times,
        spans,
    )


def _environment() -> dict[str, Any]:
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "opentelemetry-api": version("opentelemetry-api"),
        "opentelemetry-sdk": version("opentelemetry-sdk"),
        "date": time.strftime("%Y-%m-%d"),
    }


def _markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [
        "# Tracing overhead",
        "",
        "Pipeline call time without an OpenTelemetry SDK (`no-sdk`: the API's no-op providers) and with",
        "the SDK recording every span and metric into memory (`sdk-in-memory`). Calls of both modes are",
        "interleaved; times are wall-clock milliseconds per `Pipeline.generate` call.",
        "",
        f"Machine: {env['processor']}, {env['cpu_count']} CPUs, torch {env['torch']} ({env['torch_threads']} "
        f"threads), Python {env['python']}, opentelemetry-sdk {env['opentelemetry-sdk']}; {env['date']}.",
        "",
        "| workload | mode | calls | median ms | p10 ms | p90 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for w in result["workloads"]:
        for mode in MODES:
            m = w["modes"][mode]
            lines.append(
                f"| {w['name']} | {mode} | {m['calls']} | {m['median_ms']:.3f} | {m['p10_ms']:.3f} | "
                f"{m['p90_ms']:.3f} |"
            )
    lines += [
        "",
        "| workload | what is timed | spans per call | overhead of the SDK (median) |",
        "| --- | --- | ---: | ---: |",
    ]
    for w in result["workloads"]:
        lines.append(
            f"| {w['name']} | {w['description']} | {w['spans_per_call']} | "
            f"{w['overhead_ms'] * 1000:+.0f} µs ({w['overhead_pct']:+.2f} %) |"
        )
    noop = result["noop_telemetry"]["median_us"]
    lines += [
        "",
        f"Without an SDK, the telemetry calls of one `generate` (four no-op spans with their attributes, ten "
        f"no-op metric records) take {noop:.1f} µs in all"
        + "".join(
            f"; {100 * noop / 1000 / w['modes']['no-sdk']['median_ms']:.3g} % of a {w['name']} call"
            for w in result["workloads"]
        )
        + ".",
        "",
        "Regenerate with `python benchmarks/tracing_overhead.py`.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--stage-calls", type=int, default=3000, help="timed calls per mode, no-op stages")
    parser.add_argument("--model-calls", type=int, default=40, help="timed calls per mode, SmolLM2 pipeline")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results",
        help="folder for tracing_overhead.json and tracing_overhead.md",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    workloads = [bench_stages(args.stage_calls)]
    if args.model_calls > 0:
        workloads.append(bench_smollm2(args.model_calls))
    result = {
        "benchmark": "tracing_overhead",
        "environment": _environment(),
        "noop_telemetry": bench_noop_telemetry(),
        "workloads": workloads,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tracing_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "tracing_overhead.md").write_text(_markdown(result))
    sys.stdout.write(_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
