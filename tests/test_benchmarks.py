"""The GPU benchmark scripts in their CPU check modes, and the host-overhead benchmark: they run and write results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from server_utils import start_server
from transformers import AutoTokenizer

from specprefill_sdk.models import resolve_model_path

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_ttft_gpu_check_mode_writes_every_cell(tmp_path):
    _run("ttft_gpu.py", "--tiny", "--repeats", "1", "--lengths", "256", "--out", str(tmp_path))
    result = json.loads((tmp_path / "ttft_gpu_h200.json").read_text())
    cells = [c for row in result["rows"] for c in row.get("cells", [])]
    assert {(c["keep_rate"], c["look_ahead"]) for c in cells} == {(0.1, 8), (0.1, 1), (0.3, 8), (0.3, 1)}
    assert all(c["e2e_ms"] > 0 and c["ceiling"] > 0 for c in cells)
    # Without --mode: eager, against the same backend's dense pipeline.
    assert result["mode"] == "eager"
    assert all(c["speedup"] == c["dense_ms"] / c["spec_ms"] and c["fallback"] is None for c in cells)
    assert (tmp_path / "ttft_gpu_h200.md").read_text().startswith("# GPU TTFT")


def _grid(tmp_path: Path, name: str, *args: str) -> dict[str, Any]:
    common = ["--tiny", "--pairs", "llama", "--repeats", "1", "--lengths", "256", "--no-exactness"]
    _run("ttft_gpu.py", *common, "--out", str(tmp_path), "--name", name, *args)
    return json.loads((tmp_path / f"{name}.json").read_text())


def test_ttft_gpu_modes_draft_layers_and_their_comparison(tmp_path):
    grid = ["--look-aheads", "1", "--draft-layers", "1", "--keep-rates", "0.1", "0.15", "0.2", "0.3"]
    default = _grid(tmp_path, "g_default", "--mode", "default", *grid)
    compiled = _grid(tmp_path, "g_compile", "--compile", *grid)  # the alias of --mode compile
    eager = _grid(tmp_path, "g_eager", "--mode", "eager", *grid)
    assert (default["mode"], compiled["mode"], eager["mode"]) == ("default", "compile", "eager")
    want = {(r, 1, layers) for r in (0.1, 0.15, 0.2, 0.3) for layers in (None, 1)}
    for result in (default, compiled, eager):
        cells = [c for row in result["rows"] for c in row.get("cells", [])]
        assert {(c["keep_rate"], c["look_ahead"], c["layers"]) for c in cells} == want
        assert all(c["dense_ms"] > 0 and c["spec_ms"] > 0 for c in cells)
        # On a CPU no mode compiles, so none warms up at load (as load_pipeline does it).
        assert result["warmup"]["llama"]["la1"]["compiled"] is False
        assert result["warmup"]["llama"]["la1"]["warmed_up"] is False
    text = (tmp_path / "g_default.md").read_text()
    assert "| layers |" in text and "llama: worst speedup" in text
    paths = [str(tmp_path / f"g_{m}.json") for m in ("default", "compile", "eager")]
    _run("ttft_modes.py", *paths, "--out", str(tmp_path), "--name", "modes")
    combined = json.loads((tmp_path / "modes.json").read_text())
    assert combined["modes"] == ["default", "compile", "eager"]
    assert len(combined["rows"]) == len(want)
    for row in combined["rows"]:
        assert row["default_over_compile"] == row["default_ms"] / row["compile_ms"]
        assert row["default_over_dense"] == row["default_ms"] / row["default_dense_ms"]
    assert combined["default_over_compile"]["limit"] == 1.10 and combined["default_over_dense"]["limit"] == 1.05
    assert "default/compile" in (tmp_path / "modes.md").read_text() and (tmp_path / "modes.png").exists()


def test_ttft_gpu_reads_the_fallback_of_a_warmed_up_pipeline(tmp_path):
    # Warmed up, the cost model decides each prompt from timings (a tiny CPU draft as large as its
    # target, plus the look-ahead, usually loses): whichever way it went, the cell says it.
    result = _grid(
        tmp_path, "warm", "--mode", "default", "--warmup", "always", "--look-aheads", "8", "--keep-rates", "0.1"
    )
    assert result["warmup"]["llama"]["la8"]["cost_model"] is True
    # the paper preset compresses the longest CPU warm-up prompt: its overhead is measured and reported
    overhead = result["warmup"]["llama"]["la8"]["overhead_ms"]
    assert isinstance(overhead, float) and overhead >= 0.0
    assert "| overhead ms |" in (tmp_path / "warm.md").read_text()
    (cell,) = [c for row in result["rows"] for c in row.get("cells", [])]
    if cell["fallback"] is None:
        assert 0 < cell["kept_by_pipeline"] < 256, cell
    else:
        assert cell["fallback"].startswith("slower_than_dense: ") and cell["kept_by_pipeline"] == 256, cell
        assert "| slower_than_dense |" in (tmp_path / "warm.md").read_text()


def test_ttft_gpu_stops_at_its_budget_and_keeps_what_it_has(tmp_path):
    result = _grid(tmp_path, "budget", "--budget-s", "0")
    assert result["rows"] == [{"pair": "llama", "skipped": "out of time"}]
    assert "Not run (time limit): llama" in (tmp_path / "budget.md").read_text()


def test_profile_gpu_check_mode_breaks_scoring_into_phases(tmp_path):
    _run("profile_gpu.py", "--tiny", "--repeats", "1", "--out", str(tmp_path))
    result = json.loads((tmp_path / "profile_gpu_h200.json").read_text())
    phases = [d["la8_phases"] for d in result["drafts"]] + [d["la8_unfused_phases"] for d in result["drafts"]]
    assert phases and all(p["prefill_ms"] > 0 and p["steps_ms"] > 0 and p["reduce_ms"] > 0 for p in phases)
    assert all(d["fused_vs_unfused"]["same_look_ahead"] for d in result["drafts"])
    assert result["pipeline"]["e2e_ms"] > 0
    assert "## Scoring phases" in (tmp_path / "profile_gpu_h200.md").read_text()


def test_draft_engine_check_mode_times_the_plain_prefill_and_each_scorer(tmp_path):
    _run("draft_engine_gpu.py", "--tiny", "--no-vllm", "--repeats", "1", "--lengths", "256", "--out", str(tmp_path))
    result = json.loads((tmp_path / "draft_engine_gpu.json").read_text())
    assert result["engine"] is None and [r["n"] for r in result["rows"]] == [256]
    row = result["rows"][0]
    assert row["hf_prefill_ms"] > 0 and "vllm_prefill_ms" not in row
    assert set(row["score"]) == {"paper", "paper-la1", "auto-shallow"}
    assert all(e["ms"] > 0 and e["to_hf_prefill"] > 0 for e in row["score"].values())
    # the preset's scorer as users get it: two thirds of the (two-layer) draft, the deepest voting
    auto = result["scorers"]["auto-shallow"]["repr"]
    assert "look_ahead=1" in auto and "layers=1" in auto and "last-layer" in auto
    assert "| 256 |" in (tmp_path / "draft_engine_gpu.md").read_text()
    assert (tmp_path / "draft_engine_gpu.png").stat().st_size > 0


def test_served_scorer_check_times_each_condition_and_lists_the_attention_ops(tmp_path):
    _run("scorer_served_gpu.py", "--tiny", "--no-vllm", "--repeats", "1", "--lengths", "256", "--out", str(tmp_path))
    result = json.loads((tmp_path / "scorer_served_gpu.json").read_text())
    assert set(result["conditions"]) == {"alone", "alone_uncompiled", "thread"} and result["engine"] is None
    assert not result["scorers"]["scorer_uncompiled"]["compiled"]  # on the CPU neither scorer compiles
    alone, thread = result["conditions"]["alone"]["lengths"]["256"], result["conditions"]["thread"]["lengths"]["256"]
    assert alone["ms"] > 0 and thread["ms"] > 0 and "kernels" not in thread
    # the draft's two layers each ran SDPA once for the prompt, and the profile names that op
    assert any("scaled_dot_product" in k["name"] and k["calls"] >= 2 for k in alone["kernels"]), alone["kernels"]
    text = (tmp_path / "scorer_served_gpu.md").read_text()
    assert (
        "| n | alone | alone_uncompiled | thread |" in text
        and "| 256 |" in text
        and "Attention kernels of one call, alone" in text
    )
    # --vllm-first: the scorers built after vLLM's import (here none to import), timed, and nothing else
    _run(
        "scorer_served_gpu.py", "--tiny", "--vllm-first", "--repeats", "1", "--lengths", "256", "--out", str(tmp_path)
    )  # fmt: skip
    first = json.loads((tmp_path / "scorer_served_gpu.json").read_text())
    assert set(first["conditions"]) == {"built_after_vllm", "built_after_vllm_uncompiled"}
    assert first["vllm_import"].endswith("before the scorers were built")


def test_exactness_check_mode_agrees_with_the_reference_in_float32(tmp_path):
    _run("exactness_gpu.py", "--tiny", "--out", str(tmp_path))
    result = json.loads((tmp_path / "exactness_gpu_h200.json").read_text())
    fp32 = [r for r in result["rows"] if r["dtype"] == "float32"]
    assert {r["draft"] for r in fp32} == {"llama-3.2-1b", "qwen2.5-0.5b"}
    for row in fp32:
        for path in ("graph", "compiled", "modules", "eager", "unfused", "stepwise"):
            assert row[path]["same_tokens"] and row[path]["rel"] < 1e-4, (row["draft"], path, row[path])
        assert row["early"]["rel"] < 1e-4 and row["early"]["layers"] >= 1, row["early"]
    assert "smallest top-2 logit margin" in (tmp_path / "exactness_gpu_h200.md").read_text()


def test_lean_check_mode_compares_the_three_ways_of_running_the_passes(tmp_path):
    _run("lean_gpu.py", "--tiny", "--repeats", "1", "--targets", "--out", str(tmp_path))
    result = json.loads((tmp_path / "lean_gpu_h200.json").read_text())
    assert {(r["draft"], r["variant"]) for r in result["rows"]} == {
        (d, v) for d in ("llama-3.2-1b", "qwen2.5-0.5b") for v in ("modules", "lean", "compiled")
    }
    assert all(r["vs_modules"]["max_abs_diff"] == 0.0 for r in result["rows"] if "vs_modules" in r)  # CPU: bitwise
    assert {(r["target"], r["keep"]) for r in result["kept"]} >= {("llama-3.1-8b", 0.1), ("qwen2.5-32b", 0.3)}
    assert "## The targets' kept prefill" in (tmp_path / "lean_gpu_h200.md").read_text()


def test_host_overhead_benchmark_reports_each_difference(tmp_path):
    _run("host_overhead_cpu.py", "--repeats", "2", "--n", "48", "--out", str(tmp_path))
    result = json.loads((tmp_path / "host_overhead_cpu.json").read_text())
    assert set(result["overhead_ms"]) == {"score_over_draft_plain", "backend_over_kept_plain", "pipeline_over_parts"}
    assert result["layers"] == {"target": 32, "draft": 16} and result["kept"] < 48


def _script(name: str) -> Any:
    """benchmarks/NAME.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _vllm_gpu() -> Any:
    """benchmarks/vllm_gpu.py as a module (its pure helpers need no vLLM)."""
    return _script("vllm_gpu")


def test_the_steady_rate_of_a_burst_ignores_where_the_deadline_falls():
    module = _vllm_gpu()
    # the first tokens of the H200 run in benchmarks/results/vllm_gpu.json
    vanilla = [1.49, 2.68, 3.87, 5.07]
    assert abs(module.steady_rate(vanilla) - 3 / 3.58) < 1e-9
    assert abs(module.steady_rate([*vanilla[:3], 4.76]) - 3 / 3.27) < 1e-9
    assert module.steady_rate([1.0]) is None and module.steady_rate([]) is None


def test_a_ttft_row_takes_medians_and_the_ceiling_of_the_same_runs():
    module = _vllm_gpu()
    parts = [
        {"score": 30.0, "select": 1.0, "prefill": 10.0, "total": 42.0, "kept": 100},
        {"score": 32.0, "select": 2.0, "prefill": 12.0, "total": 47.0, "kept": 100},
        {"score": 31.0, "select": 1.5, "prefill": 9.0, "total": 41.0, "kept": 100},
    ]
    row = module.ttft_row(4096, [120.0, 130.0, 125.0], parts)
    assert (row["vanilla_ttft_ms"], row["specprefill_ttft_ms"], row["draft_score_ms"]) == (125.0, 42.0, 31.0)
    assert row["ceiling"] == round(125 / (31 + 10), 2) and row["speedup"] == round(125 / 42, 2)
    assert row["share_of_ceiling"] == round((125 / 42) / (125 / 41), 3) and row["reps"] == 3 and row["kept"] == 100


def test_the_correctness_stage_records_the_references_logit_lead_where_the_tokens_differ(smollm, monkeypatch):
    import torch

    from specprefill_sdk.types import CompressedPrompt, Prompt, Selection

    module = _script("vllm_serve_gpu")
    monkeypatch.setattr(module, "DEVICE", "cpu")
    net, tok = smollm.model, smollm.tokenizer
    ids = tok("The capital of France is Paris. The capital of Italy is")["input_ids"]
    prompt = Prompt.from_token_ids(ids)
    kept = (0, *range(4, len(ids)))
    # kept tokens at their original positions, as a selection leaves them
    compressed = CompressedPrompt.from_selection(prompt, Selection(kept, n=len(ids), protected=(False,) * len(kept)))
    want: list[int] = []
    with torch.inference_mode():
        for step in range(3):
            positions = [*compressed.position_ids, *range(compressed.n, compressed.n + step)]
            logits = net(input_ids=torch.tensor([[*compressed.token_ids, *want]]),
                         position_ids=torch.tensor([positions])).logits[0, -1].float()  # fmt: skip
            want.append(int(logits.argmax()))
    other = int(logits.argsort()[-2])  # the runner-up at the last step
    got = [*want[:2], other]
    row = module.with_margin({"case": "c"}, net, compressed, want, got)
    # the greedy token's lead over the runner-up at step 2, from a forward at the same positions
    assert row["reference_margin"] == round(float(logits[want[2]] - logits[other]), 4)
    assert row["reference_margin"] >= 0
    assert "reference_margin" not in module.with_margin({}, net, compressed, want, want)
    assert "reference_margin" not in module.with_margin({}, net, compressed, want, want[:2])  # a shorter answer


def test_a_served_answer_counts_as_equal_only_with_the_references_selection():
    from specprefill_sdk.types import CompressedPrompt, Prompt, Selection

    module = _script("vllm_serve_gpu")
    prompt = Prompt.from_token_ids(list(range(10, 30)))
    compressed = CompressedPrompt.from_selection(prompt, Selection((0, 3, 4, 19), n=20, protected=(False,) * 4))

    def usage(positions: Any) -> dict[str, Any]:
        return {"specprefill": {"kept_tokens": 4, "kept_positions": positions}}

    same = module.with_selection({"equal": True}, usage([0, 3, 4, 19]), compressed)
    assert same == {"equal": True, "same_selection": True}
    # as many tokens, other positions: the same answer proves nothing
    other = module.with_selection({"equal": True}, usage([0, 3, 5, 19]), compressed)
    assert other == {"equal": False, "same_selection": False}
    # a server that did not say what it kept
    assert module.with_selection({"equal": True}, {}, compressed)["equal"] is False


@pytest.mark.slow
def test_the_cpu_dtype_benchmark_times_both_dtypes_and_names_the_one_auto_loads(tmp_path):
    from specprefill_sdk.models import cpu_has_native_bf16

    _run("cpu_dtype.py", "--tokens", "8", "--repeats", "1", "--out", str(tmp_path), "--name", "x")
    result = json.loads((tmp_path / "x.json").read_text())
    assert set(result["median_ms"]) == {f"{k}_{d}" for k in ("matmul", "prefill") for d in ("float32", "bfloat16")}
    assert all(ms > 0 for ms in result["median_ms"].values())
    assert result["machine"]["native_bf16"] == cpu_has_native_bf16()
    assert result["auto_dtype"] == ("bfloat16" if cpu_has_native_bf16() else "float32")
    table = (tmp_path / "x.md").read_text()
    assert f"loads **{result['auto_dtype']}**" in table and table.count("\n| ") == 4  # header, rule, two steps


@pytest.mark.slow
def test_the_batch_scores_check_compares_each_prompt_alone_and_in_batches(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    source = Path(resolve_model_path("smollm2-135m"))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tok / name).write_bytes((source / name).read_bytes())
    _run("serve_gpu/2026-12-07/batch_scores_gpu.py", str(tmp_path / "out"), str(tok), "tiny")
    result = json.loads((tmp_path / "out" / "batch_scores_gpu.json").read_text())
    rows = result["rows"]
    assert result["device"] == "cpu" and len(rows) == 12
    assert sum("alone after" in r["case"] for r in rows) == 4 and sum("padded batch" in r["case"] for r in rows) == 4
    for r in rows:
        assert r["scores_equal"] == (r["max_score_diff"] == 0.0)
        # equal scores select the same tokens
        assert r["selection_equal"] or not r["scores_equal"]
    table = (tmp_path / "out" / "batch_scores_gpu.md").read_text()
    assert table.startswith("# A prompt's draft scores") and table.count("\n| ") == 14  # the header, its rule, 12 rows


def test_the_serving_sweep_takes_the_highest_rate_below_which_every_rate_met_the_service_level(tmp_path):
    module = _script("vllm_serve_gpu")

    def row(rate: float, p90: float) -> dict[str, Any]:
        return {"rate": rate, "prompts": 12, "median_ttft_ms": p90 / 2, "p90_ttft_ms": p90, "within_slo": p90 <= 2400}

    # a rate that met the level above one that missed it does not count: the level was already lost
    assert module.max_rate_within([row(0.25, 1900), row(0.4, 3000), row(0.6, 2300)]) == 0.25
    assert module.max_rate_within([row(1.5, 1500), row(0.75, 600)]) == 1.5  # in rate order, not run order
    assert module.max_rate_within([row(0.2, 2500)]) is None
    results = {
        "stages": {
            "correctness": {
                "model": "m",
                "checks": [
                    {"case": "pre-compressed #0", "equal": False, "first_divergence": 3, "reference_margin": 0.0625},
                    {"case": "selection #0", "equal": False, "first_divergence": 0, "kept": 16, "reference_kept": 150},
                    {"case": "selection #1", "equal": True, "first_divergence": None, "same_selection": True},
                ],
            },
            "sweep_llama": {
                "target": "t",
                "draft": "d",
                "lengths": {
                    "32768": {
                        "vanilla_unloaded": {"median_ttft_ms": 1200},
                        "slo_p90_ttft_ms": 2400,
                        "vanilla": [row(0.25, 1900)],
                        "ours": [row(0.75, 600), row(1.5, 1500)],
                        "max_rate_vanilla": 0.25,
                        "max_rate_ours": 1.5,
                        "rate_ratio": 6.0,
                    },
                    "16384": {
                        "vanilla_unloaded": {"median_ttft_ms": 500},
                        "slo_p90_ttft_ms": 1000,
                        "components": {"prompt_tokens": 16384, "kept_tokens": 4915, "score_ms": 90, "prefill_ms": 400},
                        "vanilla": [row(0.5, 3000)],
                        "ours": [row(1.0, 900), row(1.25, 2500)],
                    },
                    "8192": {
                        "vanilla_unloaded": {"median_ttft_ms": 400},
                        "slo_p90_ttft_ms": 2400,
                        "vanilla": [row(0.5, 1000), row(0.75, 2600)],
                        "ours": [row(1.5, 1200), row(2.0, 3000)],
                    },
                },
            },
        }
    }
    text = module.render(results)
    assert "Where the unloaded TTFT goes" not in text  # no text probe in this run
    assert "| pre-compressed #0 | no | 3 | 0.062 | - | - |" in text
    assert "| selection #0 | no | 0 | - | 16 / 150 | - |" in text
    assert "| selection #1 | yes | - | - | - | yes |" in text
    assert "| 32,768 | 1,200 ms | 2,400 ms |" in text
    # every vanilla rate met the level: it fails at its capacity at the latest, 1 / 1.2 s
    # (no ratio of maxima: neither server missed a rate, so neither maximum was found)
    assert "| 0.25 / 0.83 | 1.50 / - | - | 1.80x |" in text
    # its one rate missed the level: its maximum is below that rate, whatever ours is
    assert "| 30.0% | 90 + 400 ms |" in text and "| - / 0.50 | 1.00 / 1.25 | - | 2.00x |" in text
    # both servers missed a rate above their highest one met: the ratio of the two maxima too
    assert "| 0.50 / 0.75 | 1.50 / 2.00 | 3.00x | 2.00x |" in text
    assert module.vanilla_ceiling({"vanilla": [], "vanilla_unloaded": {}}) is None
    assert text.count("| 32,768 | ours |") == 2
    module.plot(results, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_the_serving_sweep_brackets_each_maximum_until_its_ends_are_close():
    module = _script("vllm_serve_gpu")
    slo = 2000.0

    def sweep(start: float, maximum: float) -> list[dict[str, Any]]:
        """A server whose p90 meets the level up to ``maximum`` req/s, swept as `sweep_server` sweeps."""
        # 0.6 x the level at 0.8 of the maximum
        return module.sweep_rates(lambda rate: {"rate": rate, "p90_ttft_ms": 1500 * rate / maximum}, start, slo, 1e9)

    rows = sweep(0.3, 1.23)
    rates = [r["rate"] for r in rows]
    assert rates[:3] == pytest.approx([0.3, 0.45, 0.675])  # rising x1.5 while far under the level
    high = module.max_rate_within(rows)
    low = min(r["rate"] for r in rows if not r["within_slo"])
    assert high <= 1.23 * 4 / 3 < low and low / high <= module.BRACKET  # its maximum, bracketed closely
    assert len(rows) < module.MAX_RATES
    # a first rate missed: down by 1.5, then bracketed from there
    rows = sweep(2.0, 1.23)
    assert [r["within_slo"] for r in rows[:2]] == [False, True] and rows[1]["rate"] == pytest.approx(2.0 / 1.5)
    # two rates missed without one met, or the first missed three-fold: the sweep stops
    assert module.next_rate([{"rate": 2.0, "p90_ttft_ms": 2500, "within_slo": False},
                             {"rate": 1.33, "p90_ttft_ms": 2100, "within_slo": False}], slo) is None  # fmt: skip
    assert module.next_rate([{"rate": 2.0, "p90_ttft_ms": 6500, "within_slo": False}], slo) is None
    # a rate met above one missed (noise) does not narrow the bracket
    noisy = [
        {"rate": 1.0, "p90_ttft_ms": 1500, "within_slo": True},
        {"rate": 1.5, "p90_ttft_ms": 2100, "within_slo": False},
        {"rate": 1.8, "p90_ttft_ms": 1900, "within_slo": True},
    ]
    assert module.next_rate(noisy, slo) == pytest.approx((1.0 * 1.5) ** 0.5)


def test_the_serving_plots_legend_names_every_server_when_the_last_panel_lacks_one(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    module = _script("vllm_serve_gpu")
    row = {"rate": 0.5, "prompts": 12, "median_ttft_ms": 500, "p90_ttft_ms": 900, "within_slo": True}
    lengths = {
        "32768": {"slo_p90_ttft_ms": 2400, "vanilla": [row], "ours": [{**row, "rate": 1.5}]},
        "16384": {"slo_p90_ttft_ms": 1000, "vanilla": [row]},  # our sweep of this length did not run
    }
    closed: list[Any] = []
    monkeypatch.setattr(plt, "close", closed.append)  # keep the figure to read its legend
    module.plot({"stages": {"sweep_llama": {"target": "t", "lengths": lengths}}}, tmp_path / "sweep.png")
    labels = {t.get_text() for t in closed[0].axes[-1].get_legend().get_texts()}
    assert labels == {
        "vllm serve p50",
        "vllm serve p90",
        "specprefill serve --engine vllm p50",
        "specprefill serve --engine vllm p90",
        "service level (p90)",
    }


def test_the_serving_probe_prints_the_median_of_each_stage_field_of_its_text_requests():
    module = _script("vllm_serve_gpu")
    # the first request warms up and is left out; a field missing from one request is not a median
    rows = [
        {"server_ms": 900.0, "tokenize_ms": 80.0, "admit_ms": 3.0},
        {"server_ms": 500.0, "tokenize_ms": 60.0, "admit_ms": 1.0},
        {"server_ms": 520.0, "tokenize_ms": 70.0},
        {"server_ms": 510.0, "tokenize_ms": 65.0, "admit_ms": 2.0},
    ]
    medians = module._medians(rows)
    assert medians == {"server_ms": 510.0, "tokenize_ms": 65.0}
    lengths = {"8192": {"components": {"text": {"client_ttft_ms": 300.0, "tokenize_ms": 20.0}}}, "32768": {}}
    lengths["32768"]["components"] = {"text": {"client_ttft_ms": 630.0, "tokenize_ms": 65.0, "host_ms": 230.0}}
    table = "\n".join(module._stage_table(lengths))
    assert "| field | 8,192 | 32,768 |" in table
    assert "| tokenize_ms | 20.0 | 65.0 |" in table and "| host_ms | - | 230.0 |" in table
    assert table.index("client_ttft_ms") < table.index("tokenize_ms") < table.index("host_ms")


def test_the_serving_sweep_gives_each_length_an_equal_share_and_prints_both_servers_ids_and_text_ttft():
    module = _script("vllm_serve_gpu")
    lengths = [32768, 16384, 8192]
    assert module._budget_share(560.0, lengths, 32768) == 560.0 / 3
    assert module._budget_share(300.0, lengths, 16384) == 150.0  # what is left, over the lengths still to sweep
    assert module._budget_share(100.0, lengths, 8192) == 100.0
    rows = {
        "32768": {
            "vanilla_probe": {"ids": {"client_ttft_ms": 4500.0}, "text": {"client_ttft_ms": 4560.0}},
            "components": {"client_ttft_ms": 600.0, "text": {"client_ttft_ms": 650.0}},
        },
        "8192": {"vanilla_probe": {"ids": {"client_ttft_ms": 900.0}}},
        "4096": {},
    }
    table = "\n".join(module._host_table(rows))
    assert "| request | 32,768 | 8,192 |" in table  # a length without probes gets no column
    assert "| vllm serve, ids | 4,500.0 | 900.0 |" in table and "| ours, text | 650.0 | - |" in table
    assert module._host_table({"8192": {}}) == []


def test_the_server_path_benchmark_times_each_step_with_a_real_tokenizer(tmp_path):
    _run(
        "server_path_cpu.py",
        "--tokens",
        "2048",
        "--repeats",
        "1",
        "--tokenizers",
        "smollm2-135m",
        "--busy",
        "1",
        "--out",
        str(tmp_path),
    )
    result = json.loads((tmp_path / "server_path_cpu.json").read_text())
    assert result["busy"] == 1
    (row,) = result["rows"]
    assert row["tokens"] == 2048 and 0 < row["kept"] < 2048
    steps = ("parse_ms", "tokenize_ms", "queue_idle_ms", "select_ms", "compress_ms", "layout_ms", "first_chunk_ms")
    assert all(row[k] > 0 for k in steps)
    assert row["sum_ms"] == sum(row[k] for k in steps)
    text = (tmp_path / "server_path_cpu.md").read_text()
    assert "| tokenize (build_prompt + vocabulary check) |" in text and "smollm2-135m (2,048 tokens) ms" in text
    assert row["select_default_ms"] > 0 and "| select (auto selector, the default policy) |" in text
    assert "- 1 CPU-bound processes ran beside the measurement" in text
    assert row["tokenize_whole_ms"] > 0 and "| tokenize, the text in one encode call" in text
    # a 2K-token text is cut or not by its length and this machine's cores: the report says which
    assert row["pieces"] >= 1 and f"Pieces the text is encoded in: smollm2-135m {row['pieces']}." in text


def test_the_serving_real_weight_stage_counts_agreement_per_task_and_lists_each_divergence():
    module = _script("vllm_serve_gpu")

    def row(task: str, i: int, equal: bool, served: bool, kept: int = 100) -> dict[str, Any]:
        return {
            "id": f"{task}/8192/{i}", "task": task, "prompt_tokens": 8100, "kept_reference": 100,
            "kept_served": kept, "equal_tokens": equal, "first_divergence": None if equal else 4,
            "contains_reference": True, "contains_served": served, "exact_reference": False,
            "exact_served": False, **({} if equal else {"reference_margin": 0.0625}),
        }  # fmt: skip

    rows = [
        row("niah_single", 0, True, True),
        row("niah_single", 1, False, False, kept=99),
        row("qa_squad", 0, True, True),
    ]
    real = {"tasks": ["niah_single", "qa_squad"], "lengths": [8192], "samples_per_task": 2, "seed": 7, "rows": rows}
    text = module.render({"stages": {"real": real}})
    assert "| niah_single | 2 | 2/2 | 1/2 | 0/2 | 0/2 | 1/2 | 1/2 |" in text
    assert "| qa_squad | 1 | 1/1 | 1/1 | 0/1 | 0/1 | 1/1 | 1/1 |" in text
    assert "| all | 3 | 3/3 | 2/3 | 0/3 | 0/3 | 2/3 | 2/3 |" in text
    assert "| niah_single/8192/1 | 8,100 | 100 / 99 | 4 | 0.062 |" in text
    # the GPU the run recorded names it; a file from before it was recorded ran on an H200
    assert text.startswith("# `specprefill serve --engine vllm` against vanilla `vllm serve` (one NVIDIA H200)")
    other = module.render({"stages": {"real": real}, "gpu": "NVIDIA H100 80GB HBM3"})
    assert other.splitlines()[0].endswith("(one NVIDIA H100 80GB HBM3)")


def test_warmup_check_mode_times_a_cold_and_a_warm_server(tmp_path):
    _run("warmup_gpu.py", "--tiny", "--out", str(tmp_path))
    result = json.loads((tmp_path / "warmup_gpu_h200.json").read_text())
    runs = {run["mode"]: run for run in result["runs"]}
    assert set(runs) == {"cold", "warm"}
    assert runs["cold"]["warmup"] is None
    assert 200 <= runs["warm"]["warmup"]["prompt_tokens"] <= 256
    for run in runs.values():
        assert [r["n"] for r in run["requests"]] == [256, 256, 384, 384]
        assert all(r["ms"] > 0 and 0 < r["kept"] < r["n"] for r in run["requests"])
    assert "| warm |" in (tmp_path / "warmup_gpu_h200.md").read_text()


def test_host_conversions_benchmark_times_both_ways(tmp_path):
    args = ["--n", "256", "--kept", "64", "--number", "2", "--repeat", "1", "--out", str(tmp_path)]
    _run("host_conversions_cpu.py", *args)
    result = json.loads((tmp_path / "host_conversions_cpu.json").read_text())
    assert len(result["rows"]) == 4
    assert all(r["python_us"] > 0 and r["sdk_us"] > 0 for r in result["rows"])
    assert "| backend inputs, 64 kept ids and positions |" in (tmp_path / "host_conversions_cpu.md").read_text()


def test_the_shared_helper_writes_json_markdown_and_plot(tmp_path):
    common = _script("_common")
    plotted: list[Path] = []
    text = common.write_results(
        tmp_path / "new", "x", {"a": 1}, lambda r: f"# {r['a']}\n", lambda r, path: plotted.append(path)
    )
    assert text == "# 1\n" and (tmp_path / "new" / "x.md").read_text() == text
    assert (tmp_path / "new" / "x.json").read_text() == '{\n "a": 1\n}\n'
    assert plotted == [tmp_path / "new" / "x.png"]
    calls: list[int] = []
    assert common.median_ms(lambda: calls.append(1), repeats=3, warmup=2) >= 0 and len(calls) == 5
    assert str(ROOT) == sys.path[0]  # the checkout's specprefill_sdk comes first


def test_the_scripts_share_their_boilerplate():
    # vllm_*.py run inside vLLM's own process layout (they write the plugin's package metadata for
    # vLLM's workers) and keep their set-up
    scripts = [p for p in sorted((ROOT / "benchmarks").glob("*.py")) if not p.name.startswith("_")]  # helpers
    for script in (p for p in scripts if not p.name.startswith("vllm_")):
        text = script.read_text()
        assert "from _common import" in text, script.name
        assert "sys.path.insert" not in text and ".write_text(json.dumps(" not in text, script.name


def test_the_serving_benchmark_gives_our_server_its_policy_and_the_server_takes_that_command_line():
    module = _script("vllm_serve_gpu")
    cmd = module.ours_cmd(Path("/m/target"), Path("/m/draft"), "t", 8502, 33024, ["--load-format", "dummy"])
    # the server's own default policy is not the one the targets are stated for: it is always named
    assert cmd[cmd.index("--policy") + 1] == "paper" and cmd[-2:] == ["--load-format", "dummy"]
    assert cmd[-6:-2] == module.ENGINE  # the correctness and real stages cut the engine options off the end
    assert "paper (keep 0.1, chunks of 32, look-ahead 8)" in module._policy_label()
    from specprefill_sdk.cli import build_parser, serve

    parser, subs = build_parser()
    serve.add_arguments(subs["serve"])
    args = parser.parse_args(cmd[cmd.index("serve") :])
    assert args.policy == "paper" and args.engine == "vllm" and args.max_model_len == 33024


def test_the_attention_lengths_check_mode_times_each_kernel_and_each_scorer_setting_at_new_lengths(tmp_path):
    _run("attention_lengths_gpu.py", "--tiny", "--lengths", "256", "--repeats", "2", "--out", str(tmp_path))
    result = json.loads((tmp_path / "attention_lengths_gpu.json").read_text())
    kernels = {r["kernel"]: r for r in result["kernels"]}
    assert set(kernels) == {"cudnn", "flash", "efficient", "math"}
    # the CPU has no cuDNN: the row says so instead of a time
    assert "error" in kernels["cudnn"] and kernels["math"]["new_ms"] > 0 and len(kernels["math"]["new_runs_ms"]) == 2
    orders = {r["order"]: r for r in result["scorer"]}
    assert orders["cudnn first, unpadded"]["kernels"][0] == "cudnn" and orders["flash first"]["kernels"][0] == "flash"
    assert orders["cudnn first, buckets of 256"]["bucket"] == 256 and orders["cudnn first, unpadded"]["bucket"] == 1
    row = orders["flash first"]
    assert row["new_extra_ms"] == row["new_ms"] - row["repeat_ms"] and row["n"] == 256
    text = (tmp_path / "attention_lengths_gpu.md").read_text()
    assert "| cudnn | 256 | not offered" in text and "| flash first (flash, efficient, math) | 256 |" in text


@pytest.mark.slow
def test_the_serving_probes_read_the_stage_times_of_a_real_server(tmp_path):
    """The ceiling's probe against a real `specprefill serve` (SmolLM2 on the CPU): ids and text, every stage field."""
    module = _script("vllm_serve_gpu")
    server = start_server(["--device", "cpu", "--warmup-tokens", "0", "--policy", "paper"], tmp_path / "server.log")
    try:
        target = SimpleNamespace(base=server.base)
        tokenizer = tmp_path / "tok"
        AutoTokenizer.from_pretrained(str(resolve_model_path("smollm2-135m", progress=False))).save_pretrained(
            tokenizer
        )
        result = module.probe_components(target, 1200, "smollm2-135m", tokenizer, reps=2)
    finally:
        server.stop()
    for row in (result, result["text"]):
        assert 0 < row["kept_tokens"] < row["prompt_tokens"] and row["client_ttft_ms"] > 0
        assert all(row[k] > 0 for k in ("score_ms", "prefill_ms", "server_ms", "ttft_ms"))
    # the ids go through as sent; the text is the tokenizer's reading of their decoded text
    assert result["prompt_tokens"] == 1200 and result["text"]["prompt_tokens"] == 1200


def test_the_serving_probes_text_is_as_long_as_the_ids_as_the_server_counts_it():
    """The text probe's prompt fills the same attention bucket as the ids probe's: ``length`` tokens, not one fewer."""
    module = _script("vllm_serve_gpu")
    tok = AutoTokenizer.from_pretrained(str(resolve_model_path("smollm2-135m", progress=False)))
    for length in (1200, 4096):
        for seed in range(3):
            text = module._text_of(tok, module.random_ids(length, seed=seed), length)
            assert len(tok.encode(text)) == length, (length, seed)


def test_a_serving_run_without_sweeps_plots_each_lengths_unloaded_ttft_in_its_parts(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    module = _script("vllm_serve_gpu")
    row = {
        "vanilla": [],
        "ours": [],
        "vanilla_unloaded": {"median_ttft_ms": 1300.0},
        "ours_unloaded": {"median_ttft_ms": 400.0},
        "components": {"score_ms": 290.0, "prefill_ms": 80.0},
        "ceiling": 1300.0 / 370.0,
        "share_of_ceiling": (1300.0 / 400.0) / (1300.0 / 370.0),
    }
    lengths = {"32768": row, "8192": {"vanilla_unloaded": {"median_ttft_ms": 240.0}}}  # ours did not run at 8K
    closed: list[Any] = []
    monkeypatch.setattr(plt, "close", closed.append)
    module.plot({"stages": {"sweep_llama": {"target": "t, random", "lengths": lengths}}}, tmp_path / "u.png")
    (ax,) = closed[0].axes  # one panel: the length without our run has none
    heights = [(round(p.get_x() + p.get_width() / 2), p.get_y(), p.get_height()) for p in ax.patches]
    # vanilla's bar, then ours stacked: scoring, kept prefill, and what is left of its TTFT
    assert heights == [(0, 0.0, 1300.0), (1, 0.0, 290.0), (1, 290.0, 80.0), (1, 370.0, 30.0)]
    assert ax.get_title() == "32,768-token prompts\n3.25x, 92.5% of the 3.51x ceiling"
    assert (tmp_path / "u.png").stat().st_size > 0


def test_the_serving_probes_of_two_lengths_share_no_prefix():
    """A shorter probe that began a longer one would be served from vLLM's prefix cache."""
    module = _script("vllm_serve_gpu")
    short, long = (module._probe_bodies(n, "m", 2) for n in (8192, 32768))
    for a, b in zip(short, long, strict=True):
        assert len(a["prompt"]) == 8192 and a["prompt"][:64] != b["prompt"][:64]
    assert short[0]["prompt"][:64] != short[1]["prompt"][:64]


def test_the_serving_sweep_reads_each_servers_own_account_of_a_run_from_its_metrics():
    from specprefill_sdk.server.limits import Admission
    from specprefill_sdk.server.metrics import ServerMetrics
    from specprefill_sdk.server.sessions import ConversationStore
    from specprefill_sdk.types import Completion, Timings, Usage

    module = _script("vllm_serve_gpu")
    metrics = ServerMetrics("m", Admission(), ConversationStore(60.0, 4), max_model_len=40000)
    usage = Usage(prompt_tokens=8000, kept_tokens=800, completion_tokens=4)
    metrics.finished(Completion("a", (1, 2, 3, 4), "length", usage, Timings(ttft=300.0, total=600.0, score=50.0)),
                     e2e_s=0.6, queued_s=0.0)  # fmt: skip
    before = module.series_values(metrics.exposition().decode())
    # the run: two requests, 0.2 s and 0.4 s to the first token (0.1 s of each before the model work)
    for ttft, score in ((100.0, 40.0), (300.0, 60.0)):
        usage = Usage(prompt_tokens=8192, kept_tokens=820, completion_tokens=4)
        timings = Timings(ttft=ttft, total=ttft + 300.0, score=score)
        metrics.finished(Completion("b", (1, 2, 3, 4), "length", usage, timings), e2e_s=0.1 + ttft / 1000 + 0.3,
                         queued_s=0.05)  # fmt: skip
    side = module.server_side(before, module.series_values(metrics.exposition().decode()))
    assert side["requests"] == 2 and side["prompt_tokens"] == 8192 and side["kept_tokens"] == 820
    assert side["ttft_ms"] == pytest.approx(300.0) and side["queue_ms"] == pytest.approx(50.0)
    assert side["score_ms"] == pytest.approx(50.0)
    assert module.server_side(before, before) == {}  # no request in between
    lengths = {
        "8192": {
            "vanilla_unloaded": {"median_ttft_ms": 900.0, "server_side": {"ttft_ms": 880.0, "prompt_tokens": 8192}},
            "ours_unloaded": {"median_ttft_ms": 180.0, "server_side": side},
            "policies": {
                "auto": {
                    "text": {
                        "prompt_tokens": 8192,
                        "kept_tokens": 1024,
                        "score_ms": 55.0,
                        "prefill_ms": 90.0,
                        "tokenize_ms": 9.5,
                        "select_ms": 3.25,
                        "server_ms": 160.0,
                    },
                    "unloaded": {"median_ttft_ms": 170.0},
                    "unloaded_speedup": 900.0 / 170.0,
                }
            },
        },
        "4096": {"vanilla_unloaded": {"median_ttft_ms": 400.0}},
    }
    table = "\n".join(module._server_side_table(lengths))
    assert "| field | 8,192 |" in table  # a length no server counted gets no column
    assert "| vanilla: server TTFT, mean | 880.0 |" in table and "| ours: server TTFT, mean | 300.0 |" in table
    assert "| ours: draft scoring, mean | 50.0 |" in table
    policies = "\n".join(module._policies_table(lengths))
    assert "| 8,192 | `auto` | 170 ms | 5.29x | 12.5% | 55 + 90 ms | 9.5 | 3.2 | 160.0 |" in policies
    assert module._policies_table({"8192": {}}) == []


@pytest.mark.slow
def test_the_cpu_benchmarks_load_what_auto_loads_and_say_which(tmp_path):
    from specprefill_sdk.models import resolve_dtype

    auto = str(resolve_dtype("auto", "cpu")).removeprefix("torch.")
    _run("scoring_cpu.py", "--tokens", "64", "--repeats", "1", "--out", str(tmp_path / "scoring.json"))
    assert json.loads((tmp_path / "scoring.json").read_text())["dtype"] == auto
    _run(
        "scoring_cpu.py", "--tokens", "64", "--repeats", "1", "--dtype", "bfloat16", "--out", str(tmp_path / "bf.json")
    )
    assert json.loads((tmp_path / "bf.json").read_text())["dtype"] == "bfloat16"  # asked for, taken
