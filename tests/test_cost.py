"""Fast by default and never slower than dense: the compile switch's resolution and the cost model's check.

The resolution of ``compile=None`` is tested with device strings (no GPU needed). The cost model is
tested against costs computed by hand; the pipeline's check runs the real SmolLM2 draft and target
with costs given by hand (measured ones vary from run to run), and `Pipeline.warmup` measures real
ones on the CPU.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from specprefill_sdk import ExecutionSettings, InvalidRequestError, Pipeline
from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.cost import (
    OVERHEAD_MAX_TOKENS,
    SLOWER_THAN_DENSE,
    CostCurve,
    CostDecision,
    CostModel,
    OverheadReport,
    overhead_length,
    warmup_lengths,
)
from specprefill_sdk.interfaces import Calibrated, KeepEstimating
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.runtime.settings import COMPILE_ENV, compile_enabled
from specprefill_sdk.scoring import DraftAttentionScorer, UniformScorer
from specprefill_sdk.selection import Adaptive, Chunked, DenseBelow, KeepRate, Protect, TokenBudget
from specprefill_sdk.types import Prompt

# ----------------------------------------------------------------------------- compile=None: auto


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3", torch.device("cuda", 1)])
def test_auto_compile_is_on_for_cuda_devices(device: Any, monkeypatch) -> None:
    assert compile_enabled(None, device, environ={}) is True
    assert compile_enabled(True, device, environ={}) is True
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    assert ExecutionSettings().compiles(device)  # the process's environment, when none is given
    monkeypatch.setenv(COMPILE_ENV, "0")
    assert not ExecutionSettings().compiles(device) and ExecutionSettings(compile=True).compiles(device)


@pytest.mark.parametrize("device", ["cpu", "mps", "mps:0", torch.device("cpu"), "meta"])
def test_auto_compile_is_off_elsewhere_and_true_changes_nothing_there(device: Any) -> None:
    for value in (None, True, False):
        assert compile_enabled(value, device, environ={}) is False
    assert not ExecutionSettings().compiles(device)


def test_compile_is_turned_off_by_false_by_the_variable_and_by_lean_off() -> None:
    assert ExecutionSettings().compile is None  # auto is the default
    assert compile_enabled(False, "cuda", environ={}) is False
    for off in ("0", "false", "No", " off "):
        assert compile_enabled(None, "cuda", environ={COMPILE_ENV: off}) is False
    for on in ("1", "true", "auto", ""):
        assert compile_enabled(None, "cuda", environ={COMPILE_ENV: on}) is True
    # an explicit setting wins over the variable
    assert compile_enabled(True, "cuda", environ={COMPILE_ENV: "0"}) is True
    with pytest.raises(InvalidRequestError, match=COMPILE_ENV):
        compile_enabled(None, "cuda", environ={COMPILE_ENV: "sometimes"})
    with pytest.raises(InvalidRequestError, match="compile must be True, False or None"):
        ExecutionSettings(compile="yes")  # type: ignore[arg-type]
    assert not ExecutionSettings(lean=False).compiles("cpu")  # compiled passes are lean ones


def test_the_cli_and_the_server_config_take_compile_on_off_and_auto() -> None:
    import argparse

    from specprefill_sdk.cli._args import add_model_options
    from specprefill_sdk.server import ServerConfig

    parser = argparse.ArgumentParser()
    add_model_options(parser, compile_help="compile")
    assert parser.parse_args([]).compile is None
    assert parser.parse_args(["--compile"]).compile is True
    assert parser.parse_args(["--no-compile"]).compile is False
    assert ServerConfig().compile is None
    assert ServerConfig.from_env({"SPECPREFILL_COMPILE": "0"}).compile is False
    assert ServerConfig.from_env({"SPECPREFILL_COMPILE": "auto"}).compile is None
    with pytest.raises(InvalidRequestError, match="compile"):
        ServerConfig(compile="sometimes")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the cost model


def test_a_curve_fitted_to_exact_points_is_that_curve_and_never_negative() -> None:
    exact = CostCurve(12.0, 0.05, 1e-6)
    fitted = CostCurve.fit([(n, exact(n)) for n in (256, 1024, 4096)])
    for n in (100, 2000, 32768):
        assert math.isclose(fitted(n), exact(n), rel_tol=1e-6)
    # a time that falls with length cannot give a negative term: the fit keeps the terms >= 0
    falling = CostCurve.fit([(100, 50.0), (1000, 40.0), (10000, 45.0)])
    assert min(falling.a, falling.b, falling.c) >= 0 and falling(0) == 0.0
    line = CostCurve.fit([(100, 11.0), (1000, 20.0)])
    assert math.isclose(line.a, 10.0) and math.isclose(line.b, 0.01) and line.c == 0.0
    for bad in ([], [(0, 1.0)], [(10, -1.0)], [(10, math.nan)]):
        with pytest.raises(InvalidRequestError):
            CostCurve.fit(bad)
    with pytest.raises(InvalidRequestError, match="cost coefficient b"):
        CostCurve(1.0, -0.5, 0.0)


def test_the_decision_against_hand_computed_costs() -> None:
    # dense prefill: 5 ms + 0.02 ms a token; scoring: 40 ms (look-ahead) + 0.004 ms a token
    model = CostModel(prefill=CostCurve(5.0, 0.02, 0.0), score=CostCurve(40.0, 0.004, 0.0))
    short = model.decide(1000, kept=100)  # 44 + 7 = 51 ms against 25 ms
    assert (short.score_ms, short.kept_ms, short.dense_ms) == pytest.approx((44.0, 7.0, 25.0))
    assert short.dense and short.reason.startswith(SLOWER_THAN_DENSE + ":")
    assert "100 kept tokens" in short.reason and "1000 tokens" in short.reason
    long = model.decide(8000, kept=800)  # 72 + 21 = 93 ms against 165 ms
    assert (long.score_ms, long.kept_ms, long.dense_ms) == pytest.approx((72.0, 21.0, 165.0)) and not long.dense
    # kept a tenth: 45 + 0.006 n against 5 + 0.02 n, even at n = 40 / 0.014 = 2857.1
    assert model.decide(2850, kept=285).dense  # 62.1 ms against 62.0
    assert not model.decide(2860, kept=286).dense  # 62.16 ms against 62.2
    assert CostModel(prefill=CostCurve(0, 1, 0), score=CostCurve(0, 0.5, 0)).decide(100, kept=50).dense  # equal
    # a quadratic term: attention of the kept tokens costs their square, not the prompt's
    quadratic = CostModel(prefill=CostCurve(0.0, 0.0, 1e-4), score=CostCurve(0.0, 0.0, 5e-5))
    verdict = quadratic.decide(1000, kept=500)  # 50 + 25 = 75 ms against 100 ms
    assert verdict.kept_ms == pytest.approx(25.0) and not verdict.dense
    assert model.decide(10, kept=50).kept == 10  # never more kept than the prompt has


def test_the_overhead_is_counted_and_flips_the_decision_at_its_boundary() -> None:
    # 0.5 ms and 1 ms a token: exact in binary, so the sums are exact too
    model = CostModel(prefill=CostCurve(0.0, 1.0, 0.0), score=CostCurve(0.0, 0.5, 0.0))
    assert model.overhead_ms == 0.0  # the default: the constructor without it works as before
    plain = model.decide(100, kept=20)  # 50 + 20 = 70 ms against 100 ms
    assert plain.overhead_ms == 0.0 and not plain.dense and "overhead" not in plain.reason
    for overhead, dense in ((29.75, False), (30.0, True), (30.25, True), (0.0, False)):
        verdict = replace(model, overhead_ms=overhead).decide(100, kept=20)
        assert verdict.overhead_ms == overhead
        assert verdict.dense is dense is (50.0 + 20.0 + overhead >= 100.0)
    reason = replace(model, overhead_ms=30.0).decide(100, kept=20).reason
    assert reason == (
        f"{SLOWER_THAN_DENSE}: scoring 50.0 ms + prefill of 20 kept tokens 20.0 ms + overhead 30.0 ms "
        ">= dense prefill of 100 tokens 100.0 ms (estimated)"
    )
    # a decision built without the overhead, as before
    assert CostDecision(n=10, kept=1, dense_ms=5.0, score_ms=3.0, kept_ms=2.0).dense
    for bad in (-1.0, math.nan, math.inf, True, "1"):
        with pytest.raises(InvalidRequestError, match="overhead_ms") as info:
            CostModel(prefill=CostCurve(0, 1, 0), score=CostCurve(0, 1, 0), overhead_ms=bad)  # type: ignore[arg-type]
        assert info.value.param == "overhead_ms"


def test_the_overhead_report_and_the_length_it_is_measured_at() -> None:
    assert OverheadReport(n=64, kept=16, request_ms=30.0, estimated_ms=12.5).overhead_ms == 17.5
    assert OverheadReport(n=64, kept=16, request_ms=10.0, estimated_ms=12.5).overhead_ms == 0.0  # never negative
    assert overhead_length([1024, 4096, 16384]) == 4096 == OVERHEAD_MAX_TOKENS
    assert overhead_length([128, 512, 1024]) == 1024
    assert overhead_length([16384, 32768]) == 16384  # all above the cap: the shortest
    assert overhead_length([100, 200, 300], cap=250) == 200
    assert overhead_length([]) is None


def test_warmup_lengths_default_by_device_capped_by_the_context() -> None:
    assert warmup_lengths("cuda:0", 100_000) == (1024, 4096, 16384)
    assert warmup_lengths("cpu", 100_000) == (128, 512, 1024)
    assert warmup_lengths("cuda", 2048) == (1024, 2048)
    assert warmup_lengths("cpu", 100, [64, 64, 300]) == (64, 100)
    for bad in ([0], [2.5], [True], []):
        with pytest.raises(InvalidRequestError, match="lengths"):
            warmup_lengths("cpu", 100, bad)  # type: ignore[arg-type]


def test_selectors_say_how_many_tokens_they_keep_before_scoring() -> None:
    prompt = Prompt.from_token_ids(range(1000))
    assert isinstance(KeepRate(0.1), KeepEstimating)
    assert KeepRate(0.1).expected_kept(prompt) == 100
    assert TokenBudget(64).expected_kept(prompt) == 64
    assert Chunked(KeepRate(0.1), 32).expected_kept(prompt) == 4 * 32  # ceil(32 chunks * 0.1) = 4 chunks
    assert Adaptive(max_rate=0.3, dense_below_tokens=0).expected_kept(prompt) == 300  # at most max_rate
    assert Chunked(Adaptive(max_rate=0.3, dense_below_tokens=0), 32).expected_kept(prompt) == 10 * 32
    assert DenseBelow(KeepRate(0.1), tokens=2000).expected_kept(prompt) == 1000
    assert DenseBelow(KeepRate(0.1), tokens=10).expected_kept(prompt) == 100
    assert Protect(KeepRate(0.1), sink=150, tail=False).expected_kept(prompt) == 150  # protected count toward it
    assert Protect(KeepRate(0.01), sink=4, tail=False).expected_kept(prompt) == 10


# ----------------------------------------------------------------------------- the pipeline's check


@pytest.fixture(scope="module")
def stages(smollm) -> tuple[DraftAttentionScorer, TransformersBackend]:
    # stages of this module's own: the costs set here must not reach other modules' pipelines
    scorer = DraftAttentionScorer(smollm, look_ahead=2)
    return scorer, TransformersBackend(smollm)


@pytest.fixture(scope="module")
def long_prompt(tokenizer, essay) -> Prompt:
    return build_prompt(tokenizer, [{"role": "user", "content": essay[:1500] + "\n\nWhat is this about?"}])


#: A target whose prefill costs 1 ms a token and a draft that costs 0.05 ms a token (pays), or
#: 2 s whatever the prompt (never pays at these lengths).
CHEAP_DRAFT = CostCurve(0.0, 0.05, 0.0)
SLOW_DRAFT = CostCurve(2000.0, 0.0, 0.0)
TARGET = CostCurve(0.0, 1.0, 0.0)


def _set_costs(stages: tuple[Any, Any], score: CostCurve | None, prefill: CostCurve | None) -> None:
    scorer, backend = stages
    scorer.cost, backend.cost = score, prefill


def test_the_pipeline_prefills_densely_and_says_why_when_scoring_would_not_pay(stages, long_prompt) -> None:
    scorer, backend = stages
    reader = InMemoryMetricReader()
    selector = Protect(Chunked(KeepRate(0.1), 32))
    pipe = Pipeline(scorer, selector, backend, meter_provider=MeterProvider(metric_readers=[reader]))
    assert isinstance(scorer, Calibrated) and isinstance(backend, Calibrated)
    _set_costs(stages, None, None)
    assert pipe.cost_model is None  # nothing measured: no check, as before
    assert pipe.generate(long_prompt, max_tokens=2).fallback is None
    _set_costs(stages, SLOW_DRAFT, TARGET)
    assert pipe.cost_model == CostModel(prefill=TARGET, score=SLOW_DRAFT)
    answer = pipe.generate(long_prompt, max_tokens=2)
    assert answer.fallback is not None and answer.fallback.startswith(SLOWER_THAN_DENSE)
    assert f"dense prefill of {long_prompt.n} tokens" in answer.fallback
    assert answer.usage.kept_tokens == answer.usage.prompt_tokens == long_prompt.n
    assert answer.timings.score == 0.0  # the draft did not run
    assert answer.selection is not None and answer.selection.reason == "slower than dense"
    points = [
        p
        for m in reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics
        if m.name == "specprefill.fallbacks"
        for p in m.data.data_points
    ]
    assert [(p.attributes["specprefill.fallback.reason"], p.value) for p in points] == [(SLOWER_THAN_DENSE, 1)]
    # the batch form checks each prompt the same way
    batch = pipe.generate_batch([long_prompt, long_prompt], max_tokens=2)
    assert all(c.fallback and c.fallback.startswith(SLOWER_THAN_DENSE) for c in batch)


def test_compression_goes_ahead_where_it_pays_or_when_the_check_is_off(stages, long_prompt) -> None:
    scorer, backend = stages
    selector = Protect(Chunked(KeepRate(0.1), 32))
    _set_costs(stages, CHEAP_DRAFT, TARGET)
    paying = Pipeline(scorer, selector, backend).generate(long_prompt, max_tokens=2)
    assert paying.fallback is None and paying.usage.kept_tokens < long_prompt.n and paying.timings.score > 0
    _set_costs(stages, SLOW_DRAFT, TARGET)
    forced = Pipeline(scorer, selector, backend, dense_when_slower=False).generate(long_prompt, max_tokens=2)
    assert forced.fallback is None and forced.usage.kept_tokens < long_prompt.n
    assert forced.usage.kept_tokens == paying.usage.kept_tokens

    # a selector that cannot say how much it keeps before scoring is not checked
    class Opaque:
        name = "opaque"

        def decide_without_scores(self, prompt: Prompt) -> None:
            return None

        def select(self, prompt: Prompt, scores: Any) -> Any:
            return selector.select(prompt, scores)

    assert Pipeline(scorer, Opaque(), backend).generate(long_prompt, max_tokens=2).fallback is None
    with pytest.raises(InvalidRequestError, match="dense_when_slower"):
        Pipeline(scorer, selector, backend, dense_when_slower="no")  # type: ignore[arg-type]
    _set_costs(stages, None, None)


def test_load_pipeline_passes_the_switch_and_the_server_reports_the_reason(smollm) -> None:
    from specprefill_sdk.policies import load_pipeline
    from specprefill_sdk.server.metrics import FALLBACK_REASONS, fallback_reason
    from specprefill_sdk.types import Completion, Timings, Usage

    assert load_pipeline("paper", model=smollm).dense_when_slower
    assert not load_pipeline("paper", model=smollm, dense_when_slower=False).dense_when_slower
    assert load_pipeline("paper", model=smollm).warmed_up is None  # nothing compiles on a CPU: no warm-up
    with pytest.raises(InvalidRequestError, match="warmup"):
        load_pipeline("paper", model=smollm, warmup="yes")  # type: ignore[arg-type]
    completion = Completion(
        text="",
        token_ids=(),
        finish_reason="length",
        usage=Usage(prompt_tokens=3, kept_tokens=3, completion_tokens=0),
        timings=Timings(),
        fallback=f"{SLOWER_THAN_DENSE}: scoring 1 ms ...",
    )
    assert SLOWER_THAN_DENSE in FALLBACK_REASONS and fallback_reason(completion) == SLOWER_THAN_DENSE


def test_warmup_measures_both_stages_on_the_cpu_and_turns_the_check_on(smollm, long_prompt, caplog) -> None:
    from specprefill_sdk.policies import load_pipeline

    caplog.set_level("INFO", logger="specprefill_sdk")
    pipe = load_pipeline("paper", model=smollm, look_ahead=2)
    assert pipe.cost_model is None
    # short lengths: the test measures that it measures, not what the CPU costs
    report = pipe.warmup(lengths=[16, 48])
    assert report.backend is not None and report.scorer is not None and not report.compiled
    assert report.backend.cost.points[0][0] == 16 and [n for n, _ in report.scorer.cost.points] == [16, 48]
    assert report.seconds >= report.backend.seconds > 0
    assert pipe.cost_model == CostModel(prefill=report.backend.cost, score=report.scorer.cost)
    assert "warmed up TransformersBackend" in caplog.text and "scoring" in caplog.text
    # the paper preset prefills prompts this short densely: no compressed request to time
    assert report.overhead is None
    # at load: a stage that has warmed up already is not run again
    again = load_pipeline("paper", backend=pipe.backend, scorer=pipe.scorer, warmup=True)
    assert again.warmed_up is not None and again.warmed_up.backend is report.backend
    assert again.cost_model == pipe.cost_model  # the stages are shared: so are their costs
    # the server reports what the stages' warm-ups cost at load
    import httpx
    from server_utils import serve_in_thread

    from specprefill_sdk.server import ServerConfig, create_app

    app = create_app(ServerConfig(policy="paper", warmup_tokens=0), backend=pipe.backend, scorer=pipe.scorer)
    with serve_in_thread(app) as base:
        health = httpx.get(f"{base}/health", timeout=30).json()
    expected = report.backend.seconds + report.scorer.seconds
    assert health["load_warmup_seconds"] == pytest.approx(expected, abs=1e-3)
    # a pipeline over stages without a warm-up of their own measures nothing
    plain = Pipeline(UniformScorer(), pipe.selector, pipe.backend)
    assert plain.warmup().scorer is None and plain.cost_model is None


def test_warmup_measures_the_overhead_of_a_compressed_request_and_decide_counts_it(
    stages: tuple[DraftAttentionScorer, TransformersBackend], long_prompt: Prompt, caplog: pytest.LogCaptureFixture
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    scorer, backend = stages
    caplog.set_level("INFO", logger="specprefill_sdk")
    reader, exporter, tracer = InMemoryMetricReader(), InMemorySpanExporter(), TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    selector = KeepRate(0.25)
    meter = MeterProvider(metric_readers=[reader])
    pipe = Pipeline(scorer, selector, backend, tracer_provider=tracer, meter_provider=meter)
    try:
        report = pipe.warmup(lengths=[16, 64])
        overhead = report.overhead
        assert overhead is not None
        # the longest warm-up length (under the cap) at which the selector scores, as the selector keeps
        assert (overhead.n, overhead.kept) == (64, selector.expected_kept(Prompt.from_token_ids(range(64))))
        assert overhead.request_ms > 0
        assert scorer.cost is not None and backend.cost is not None
        assert overhead.estimated_ms == pytest.approx(scorer.cost(64) + backend.cost(overhead.kept))
        assert overhead.overhead_ms == max(0.0, overhead.request_ms - overhead.estimated_ms) >= 0.0
        assert pipe.cost_model is not None and pipe.cost_model.overhead_ms == overhead.overhead_ms
        assert f"a compressed request of 64 tokens took {overhead.request_ms:.1f} ms" in caplog.text
        # the warm-up's request is no request: no spans, no metrics
        data = reader.get_metrics_data()
        assert data is None or not any(sm.metrics for rm in data.resource_metrics for sm in rm.scope_metrics)
        assert exporter.get_finished_spans() == ()

        # decide counts it: costs under which compressing pays, then an overhead that outweighs the saving
        _set_costs(stages, CHEAP_DRAFT, TARGET)
        kept = selector.expected_kept(long_prompt)
        assert kept is not None
        saving = TARGET(long_prompt.n) - CHEAP_DRAFT(long_prompt.n) - TARGET(kept)
        huge = replace(overhead, request_ms=overhead.estimated_ms + saving + 1.0)
        pipe.warmed_up = replace(report, overhead=huge)
        assert pipe.cost_model is not None and pipe.cost_model.overhead_ms == pytest.approx(saving + 1.0)
        answer = pipe.generate(long_prompt, max_tokens=2)
        assert answer.fallback is not None and answer.fallback.startswith(SLOWER_THAN_DENSE)
        assert f"+ overhead {saving + 1.0:.1f} ms" in answer.fallback
        assert answer.usage.kept_tokens == long_prompt.n and answer.timings.score == 0.0
        just_below = replace(overhead, request_ms=overhead.estimated_ms + saving - 1.0)
        pipe.warmed_up = replace(report, overhead=just_below)
        assert pipe.generate(long_prompt, max_tokens=2).fallback is None

        # not measured where the check is off
        off = Pipeline(scorer, selector, backend, dense_when_slower=False)
        assert off.warmup().overhead is None and off.cost_model is not None and off.cost_model.overhead_ms == 0.0
    finally:
        _set_costs(stages, None, None)
