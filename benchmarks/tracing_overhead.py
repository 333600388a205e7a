"""Pipeline call time without an OpenTelemetry SDK and with the SDK recording into memory.

Three modes, timed with their calls interleaved (modes shuffled in every round) so that drift in the
machine's load hits all of them alike:

- ``null``: the pipeline's telemetry replaced by plain Python objects whose calls do nothing: the
  baseline of a pipeline without any OpenTelemetry calls;
- ``no-sdk``: the shipped default, no provider given and none configured: every span and metric call
  goes to the OpenTelemetry API's no-op implementation;
- ``sdk-in-memory``: an SDK ``TracerProvider`` with a ``SimpleSpanProcessor`` into an
  ``InMemorySpanExporter`` and an SDK ``MeterProvider`` with an ``InMemoryMetricReader``.

Two workloads:

- ``stages``: in-process stages that do almost nothing (a recency scorer, a last-quarter selector, a
  backend that returns a fixed completion) on a 256-token prompt, so that the time is the pipeline's
  own bookkeeping plus its telemetry: the upper bound of what tracing adds to a call;
- ``smollm2``: the ``paper`` policy on the bundled SmolLM2-135M (CPU, ``--dtype``, by default ``auto``):
  draft scoring with look-ahead, chunked selection, sparse prefill and one generated token, on a short
  chat prompt.

Usage::

    python benchmarks/tracing_overhead.py            # writes benchmarks/results/tracing_overhead.{json,md}
    python benchmarks/tracing_overhead.py --stage-calls 500 --model-calls 0 --out /tmp
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
from _common import RESULTS, add_dtype_arg, dtype_name, write_results
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN, Span

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

MODES = ("null", "no-sdk", "sdk-in-memory")


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


class _NullInstrument:
    def record(self, amount: float, attributes: Any = None) -> None:
        pass

    def add(self, amount: float, attributes: Any = None) -> None:
        pass


class _NullSpanScope:
    def __enter__(self) -> Span:
        return INVALID_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


class _NullTelemetry:
    """What `Pipeline.generate` calls on its telemetry, doing nothing at all (the baseline)."""

    _scope = _NullSpanScope()

    def __init__(self) -> None:
        for name in ("ttft", "score_time", "keep_ratio", "prompt_tokens", "kept_tokens", "fallbacks",
                     "operation_duration", "token_usage", "time_to_first_chunk"):  # fmt: skip
            setattr(self, name, _NullInstrument())

    def span(self, name: str, attributes: Any = None, kind: Any = None) -> _NullSpanScope:
        return self._scope


class _Recording:
    """SDK providers that keep every span and metric in memory."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])


def _three_pipelines(build: Callable[..., Pipeline]) -> tuple[dict[str, Pipeline], _Recording]:
    rec = _Recording()
    null = build()
    null.telemetry = _NullTelemetry()  # type: ignore[assignment]
    pipes = {
        "null": null,
        "no-sdk": build(),
        "sdk-in-memory": build(tracer_provider=rec.tracer_provider, meter_provider=rec.meter_provider),
    }
    return pipes, rec


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
    null, plain, traced = (modes[m]["median_ms"] for m in MODES)
    return {
        "name": name,
        "description": description,
        "modes": modes,
        "spans_per_call": spans_per_call,
        "no_sdk_vs_null_ms": plain - null,
        "no_sdk_vs_null_pct": 100.0 * (plain - null) / null,
        "sdk_vs_no_sdk_ms": traced - plain,
        "sdk_vs_no_sdk_pct": 100.0 * (traced - plain) / plain,
    }


def _run(pipes: dict[str, Pipeline], rec: _Recording, prompt: Any, n: int, warmup: int) -> tuple[Any, int]:
    params = SamplingParams(max_tokens=1)

    def caller(pipe: Pipeline) -> Callable[[], Any]:
        return lambda: pipe.generate(prompt, params)

    times = _time_interleaved(
        {mode: caller(pipe) for mode, pipe in pipes.items()},
        n,
        warmup=warmup,
        between=rec.spans.clear,
    )
    rec.spans.clear()
    pipes["sdk-in-memory"].generate(prompt, params)
    return times, len(rec.spans.get_finished_spans())


def bench_stages(n: int) -> dict[str, Any]:
    def build(**providers: Any) -> Pipeline:
        return Pipeline(_RecencyScorer(), _LastQuarter(), _FixedBackend(), **providers)

    pipes, rec = _three_pipelines(build)
    times, spans = _run(pipes, rec, Prompt.from_token_ids(range(1, 257)), n, warmup=50)
    return _workload("stages", "256-token prompt, no-op stages: the pipeline's own work", times, spans)


def bench_smollm2(n: int, dtype: str = "auto") -> dict[str, Any]:
    from specprefill_sdk import load_model, load_pipeline
    from specprefill_sdk.eval.corpora import haystack

    lm = load_model("smollm2-135m", device="cpu", dtype=dtype, progress=False)
    pipes, rec = _three_pipelines(lambda **providers: load_pipeline("paper", model=lm, **providers))
    messages = [{"role": "user", "content": haystack(600) + "\n\nIn one word, what is this text about?"}]
    prompt_tokens = pipes["no-sdk"].prompt(messages).n
    with torch.inference_mode():
        times, spans = _run(pipes, rec, messages, n, warmup=2)
    return _workload(
        "smollm2",
        f"paper policy on SmolLM2-135M (CPU, {dtype_name(lm.dtype)}), {prompt_tokens}-token chat prompt, 1 generated "
        "token",
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
        "load_average_1m_at_start": os.getloadavg()[0],
    }


def _markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [
        "# Tracing overhead",
        "",
        "Wall-clock milliseconds per `Pipeline.generate` call in three modes, their calls interleaved:",
        "`null` (the pipeline's telemetry calls go to plain Python objects that do nothing: no",
        "OpenTelemetry at all), `no-sdk` (the default: no SDK configured, the OpenTelemetry API's no-op",
        "providers) and `sdk-in-memory` (the SDK recording every span and metric into memory).",
        "",
        f"Machine: {env['processor']}, {env['cpu_count']} CPUs, torch {env['torch']} ({env['torch_threads']} "
        f"threads), Python {env['python']}, opentelemetry-sdk {env['opentelemetry-sdk']}; {env['date']}; "
        f"load average {env['load_average_1m_at_start']:.1f} when the run started (the machine is shared).",
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
        "| workload | what is timed | spans per call | no-sdk vs null (median) | sdk-in-memory vs no-sdk (median) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for w in result["workloads"]:
        lines.append(
            f"| {w['name']} | {w['description']} | {w['spans_per_call']} | "
            f"{_delta(w['no_sdk_vs_null_ms'])} ({w['no_sdk_vs_null_pct']:+.2f} %) | "
            f"{_delta(w['sdk_vs_no_sdk_ms'])} ({w['sdk_vs_no_sdk_pct']:+.2f} %) |"
        )
    by_name = {w["name"]: w for w in result["workloads"]}
    if "stages" in by_name:
        cost = by_name["stages"]["no_sdk_vs_null_ms"]
        text = (
            f"Without an SDK, the OpenTelemetry calls of one `generate` cost {_delta(cost).lstrip('+')} "
            "(stages workload, `no-sdk` minus `null`)"
        )
        model = by_name.get("smollm2")
        if model:
            plain = model["modes"]["no-sdk"]
            text += (
                f": {100 * cost / plain['median_ms']:.2g} % of the median SmolLM2 call ({plain['median_ms']:,.0f} ms)"
            )
            medians = [m["median_ms"] for m in model["modes"].values()]
            spread = min(m["p90_ms"] - m["p10_ms"] for m in model["modes"].values())
            if max(medians) - min(medians) < spread:
                text += (
                    f". On the SmolLM2 workload the medians of the three modes lie within "
                    f"{max(medians) - min(medians):,.0f} ms of each other, less than the p10–p90 spread of any "
                    f"one mode (at least {spread:,.0f} ms): no difference is measurable there"
                )
        lines += ["", text + "."]
    lines += ["", "Regenerate with `python benchmarks/tracing_overhead.py`.", ""]
    return "\n".join(lines)


def _delta(ms: float) -> str:
    return f"{ms:+,.1f} ms" if abs(ms) >= 1 else f"{ms * 1000:+.1f} µs"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--stage-calls", type=int, default=3000, help="timed calls per mode, no-op stages")
    parser.add_argument("--model-calls", type=int, default=40, help="timed calls per mode, SmolLM2 pipeline")
    add_dtype_arg(parser)
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help="folder for tracing_overhead.json and tracing_overhead.md",
    )
    parser.add_argument("--render", type=Path, metavar="JSON", help="only rewrite the markdown from a results JSON")
    args = parser.parse_args(argv)
    # the markdown quotes quantiles of each mode's times, which need two calls at least
    if args.stage_calls < 2 or args.model_calls == 1 or args.model_calls < 0:
        parser.error("--stage-calls must be 2 or more, --model-calls 0 (no SmolLM2 workload) or 2 or more")
    if args.render:
        result = json.loads(args.render.read_text())
        (args.render.parent / "tracing_overhead.md").write_text(_markdown(result))
        sys.stdout.write(_markdown(result))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    environment = _environment()
    workloads = [bench_stages(args.stage_calls)]
    if args.model_calls > 0:
        workloads.append(bench_smollm2(args.model_calls, args.dtype))
    result = {"benchmark": "tracing_overhead", "environment": environment, "workloads": workloads}
    sys.stdout.write(write_results(args.out, "tracing_overhead", result, _markdown, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
