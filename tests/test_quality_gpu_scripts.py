"""benchmarks/quality_gpu/report.py and depth.py: joins by sample, means, speedups, depth tables, real inputs."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _script(name: str) -> Any:
    """benchmarks/quality_gpu/NAME.py as a module (it puts benchmarks/ on the import path itself)."""
    spec = importlib.util.spec_from_file_location(
        f"quality_gpu_{name}", ROOT / "benchmarks" / "quality_gpu" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _script("report")
depth = _script("depth")

A, C, B = "niah_single", "niah_multivalue", "qa_squad"  # the report's task order: A, C, B


def _rec(task: str, index: int, method: str, rate: float | None, length: int = 4096, **fields: Any) -> dict[str, Any]:
    """One ``specprefill eval`` record (its id without the seed, as a single-seed file writes it)."""
    return {
        "id": f"{task}/{length}/{index}",
        "task": task,
        "length": length,
        "n": fields.pop("n", length - 100),
        "method": method,
        "keep_rate": rate,
        "keep_ratio": fields.pop("keep_ratio", 1.0 if rate is None else rate),
        **fields,
    }


def _write(path: Path, seed: int, records: list[dict[str, Any]], **extra: Any) -> None:
    path.write_text(json.dumps({"config": {"seed": seed, **extra.pop("config", {})}, "records": records, **extra}))


# dense's answers per (task, seed): A always, B on seed 0 index 0 only, C never
DENSE = {(A, 0): (1, 1), (B, 0): (1, 0), (C, 0): (0, 0), (A, 1): (1, 1), (B, 1): (0, 0), (C, 1): (0, 0)}
# the policy's kept shares per (task, seed); C's are left out with C
AUTO_SHARES = {(A, 0): (0.2, 0.4), (A, 1): (1.0, 0.1), (B, 0): (0.3, 0.15), (B, 1): (0.05, 0.25), (C, 0): (0.5, 0.5)}


def _dense(seed: int) -> list[dict[str, Any]]:
    return [
        _rec(t, i, "full", 1.0, contains=bool(DENSE[t, seed][i]), recall=1.0, n=4000 + i)
        for t in (A, B, C)
        for i in (0, 1)
    ]


def _raw(tmp_path: Path) -> Path:
    """Three files of one run at 4096 tokens on two seeds; the dense rows of seed 0 are in two of them."""
    raw = tmp_path / "raw"
    raw.mkdir()
    chunked = {(A, 0): (1, 0), (A, 1): (1, 1), (B, 0): (0, 0), (B, 1): (1, 0), (C, 0): (1, 0), (C, 1): (0, 0)}
    e0 = _dense(0) + [
        _rec(t, i, "draft-chunked", 0.1, contains=bool(chunked[t, 0][i])) for t in (A, B, C) for i in (0, 1)
    ]
    e0 += [_rec(t, i, "auto", None, contains=True, keep_ratio=AUTO_SHARES[t, 0][i]) for t in (A, B, C) for i in (0, 1)]
    e1 = _dense(1) + [
        _rec(t, i, "draft-chunked", 0.1, contains=bool(chunked[t, 1][i])) for t in (A, B, C) for i in (0, 1)
    ]
    e1 += [_rec(t, i, "auto", None, contains=False, keep_ratio=AUTO_SHARES[t, 1][i]) for t in (A, B) for i in (0, 1)]
    # a second run on seed 0 only, with dense again: keep 0.2, the early exit and two methods with no grid cell
    k0 = _dense(0)
    k0 += [
        _rec(t, i, "draft-chunked", 0.2, contains=(t, i) in {(A, 0), (A, 1), (B, 0)}) for t in (A, B, C) for i in (0, 1)
    ]
    k0 += [_rec(t, i, m, 0.1, contains=True) for m in ("draft-early-16", "llmlingua") for t in (A, B) for i in (0, 1)]
    k0 += [_rec(A, 0, "target-early-14-last-layer", 0.1, contains=True)]
    _write(raw / "e_4096_s0.json", 0, e0)
    _write(raw / "e_4096_s1.json", 1, e1)
    _write(raw / "k_4096_s0.json", 0, k0)
    _write(raw / "x_4096_s0.partial.json", 0, [_rec(A, 0, "draft-chunked", 0.5, contains=True)])
    (raw / "notes.json").write_text(json.dumps({"rows": []}))  # not an eval result: skipped
    return raw


def _grid(path: Path) -> Path:
    """A ttft_gpu.py result: the 4000-token row is the nearest to 4096; the 8192 one must not be used."""
    la8 = [(0.1, 2.0), (0.2, 1.6), (0.3, 1.5)]
    rows: list[dict[str, Any]] = [{"pair": "p", "exactness": {}}]
    for n, scale in ((4000, 1.0), (8192, 10.0)):
        cells = [{"keep_rate": k, "look_ahead": 8, "layers": None, "speedup": s * scale} for k, s in la8]
        cells += [
            {"keep_rate": 0.1, "look_ahead": 1, "layers": None, "speedup": 2.5 * scale},
            {"keep_rate": 0.1, "look_ahead": 1, "layers": 16, "speedup": 3.0 * scale},
            {"keep_rate": 0.2, "look_ahead": 1, "layers": 16, "speedup": None},
        ]
        rows.append({"n": n, "cells": cells})
    path.write_text(json.dumps({"rows": rows}))
    return path


def _table(tmp_path: Path) -> dict[str, Any]:
    records, files = report.load_records(_raw(tmp_path))
    assert files == ["e_4096_s0.json", "e_4096_s1.json", "k_4096_s0.json"]
    return report.tabulate(report.dedupe(records))["4096"]


def test_report_dedupes_dense_and_keeps_the_seeds_apart(tmp_path):
    records, _ = report.load_records(_raw(tmp_path))
    assert {r["sample"] for r in records if r["method"] == "full"} == {
        f"{t}/4096/{i}@seed{s}" for t in (A, B, C) for i in (0, 1) for s in (0, 1)
    }
    deduped = report.dedupe(records)
    assert len(records) - len(deduped) == 6  # seed 0's dense rows, written twice
    block = report.tabulate(deduped)["4096"]
    full = block["cells"]["full@1"]
    assert full["samples_per_task"] == [4] and full["keep"] == "1"
    assert block["cells"]["auto@policy"]["keep"] == "policy"
    assert block["prompt_n"] == {"mean": 4000.5, "min": 4000, "max": 4001}


def test_report_leaves_out_a_task_dense_never_answers_and_compares_on_the_same_samples(tmp_path):
    block = _table(tmp_path)
    assert block["tasks"] == [A, C, B] and block["answered"] == [A, B] and list(block["excluded"]) == [C]
    cells = block["cells"]
    # dense over all four samples of A and B: A 4/4, B 1/4
    assert cells["full@1"]["per_task"][B]["contains"] == 0.25
    assert cells["full@1"]["accuracy"] == pytest.approx((1.0 + 0.25) / 2)
    assert cells["full@1"]["relative"] == pytest.approx(1.0)
    # keep 0.1 on both seeds: A 3/4, B 1/4 (its one C answer counts in the C column, not in the mean)
    chunked = cells["draft-chunked@0.1"]
    assert chunked["per_task"][C]["contains"] == 0.25
    assert chunked["accuracy"] == pytest.approx(0.5)
    assert chunked["relative"] == pytest.approx(0.5 / 0.625)
    # keep 0.2 ran on seed 0 only: A 2/2, B 1/2, and dense on those samples is A 2/2, B 1/2 too, so 1.0 and
    # not 0.75 / 0.625 (dense over both seeds)
    k2 = cells["draft-chunked@0.2"]
    assert k2["accuracy"] == pytest.approx(0.75) and k2["samples_per_task"] == [2]
    assert k2["relative"] == pytest.approx(1.0)
    # a method that saw only A: both means over A alone
    assert cells["target-early-14-last-layer@0.1"]["relative"] == pytest.approx(1.0)
    # the policy's shares of the kept tasks only, and its mean kept share is a mean of task means
    auto = cells["auto@policy"]
    assert sorted(auto["keep_ratios"]) == sorted(v for k, vs in AUTO_SHARES.items() if k[0] != C for v in vs)
    assert auto["keep_ratio"] == pytest.approx(((0.2 + 0.4 + 1.0 + 0.1) / 4 + (0.3 + 0.15 + 0.05 + 0.25) / 4) / 2)
    assert auto["accuracy"] == pytest.approx(0.5) and auto["relative"] == pytest.approx(0.5 / 0.625)


def test_report_without_dense_has_no_relative(tmp_path):
    rows = [dict(r, sample=f"{r['id']}@seed0") for r in [_rec(A, 0, "draft-chunked", 0.1, contains=True)]]
    block = report.tabulate(rows)["4096"]
    assert block["answered"] == [] and block["cells"]["draft-chunked@0.1"]["relative"] is None


def test_report_speedups_from_the_grid(tmp_path):
    grid = report.speed_cells(json.loads(_grid(tmp_path / "grid.json").read_text()))
    assert grid[(4000, 0.1, 1, 16)] == 3.0 and (4000, 0.2, 1, 16) not in grid  # a cell with no speedup
    table = {"4096": _table(tmp_path)}
    speed = report.speedups(table, grid, {"auto": (8, None)})["4096"]
    assert speed["full@1"] == {"speedup": 1.0, "grid_n": 4000}
    assert speed["draft-chunked@0.1"] == {"speedup": 2.0, "grid_n": 4000}
    assert speed["draft-chunked@0.2"]["speedup"] == 1.6
    assert speed["draft-early-16@0.1"]["speedup"] == 3.0  # look-ahead 1, the draft's first 16 layers
    assert "llmlingua@0.1" not in speed and "target-early-14-last-layer@0.1" not in speed
    # each kept sample's speedup on the curve (0.1, 2.0) (0.2, 1.6) (0.3, 1.5) (1.0, 1.0), clamped below 0.1:
    # shares 0.2 0.4 1.0 0.1 0.3 0.15 0.05 0.25 -> 1.6, 1.5 - 0.5 * 0.1 / 0.7 = 10/7, 1.0, 2.0, 1.5, 1.8, 2.0, 1.55
    auto = speed["auto@policy"]
    inverse = [1 / 1.6, 0.7, 1.0, 0.5, 1 / 1.5, 1 / 1.8, 0.5, 1 / 1.55]
    assert auto["interpolated"] is True and auto["grid_n"] == 4000
    assert auto["speedup"] == pytest.approx(8 / sum(inverse))
    # a policy's cost is given, never guessed from its name
    assert "auto@policy" not in report.speedups(table, grid)["4096"]
    assert report.speedups(table, {}) == {}


def test_report_interpolation_and_method_cells():
    curve = [(0.3, 1.5), (0.1, 2.0), (1.0, 1.0)]
    assert report._interpolate(curve, 0.05) == 2.0 and report._interpolate(curve, 1.0) == 1.0
    assert report._interpolate(curve, 0.2) == pytest.approx(1.75)
    assert report._interpolate(curve, 0.65) == pytest.approx(1.25)
    assert report._cell_for("draft-early-16") == (1, 16) and report._cell_for("draft-early-12-mean") == (1, 12)
    assert report._cell_for("draft-chunked-la1") == (1, None)
    assert {report._cell_for(m) for m in report.SAME_COST_AS_CHUNKED} == {(8, None)}
    assert report._cell_for("auto") is None and report._cell_for("auto", {"auto": (1, 16)}) == (1, 16)
    assert report._parse_cell("1:16") == (1, 16) and report._parse_cell("8:all") == (8, None)
    assert report._pair("policy:/a=b.toml=1:16", "--cost") == ("policy:/a=b.toml", "1:16")
    for bad in ("16", "x:16", "1:some", "1:"):
        with pytest.raises(ValueError, match="LOOKAHEAD:LAYERS"):
            report._parse_cell(bad)
    assert report._cell_for("llmlingua") is None and report._cell_for("target-early-14") is None
    assert report.rate_label({"keep_rate": 0.25}) == "0.25" and report.rate_label({"keep_rate": "auto"}) == "policy"


def test_report_main_writes_json_markdown_and_plot(tmp_path):
    raw = _raw(tmp_path)
    out = tmp_path / "out"
    grid = str(_grid(tmp_path / "grid.json"))
    assert report.main([str(raw), "--ttft", grid, "--cost", "auto=8:all", "--out", str(out), "--name", "q"]) == 0
    result = json.loads((out / "q.json").read_text())
    assert result["files"] == ["e_4096_s0.json", "e_4096_s1.json", "k_4096_s0.json"]
    assert result["speedups"]["4096"]["draft-chunked@0.1"]["speedup"] == 2.0
    text = (out / "q.md").read_text()
    assert f"Left out of the means: `{C}`" in text
    auto = result["speedups"]["4096"]["auto@policy"]["speedup"]
    assert "| auto | policy |" in text and f"{auto:.2f}x*" in text
    llmlingua = next(line for line in text.splitlines() if line.startswith("| llmlingua |"))
    assert llmlingua.split("|")[-3].strip() == ""  # no speedup column value
    # rows: dense first, then keep 0.1 and 0.2 of the chunked draft, then the default policy
    methods = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert methods[1:5] == ["full", "draft-chunked", "draft-chunked", "auto"]
    assert (out / "q_frontier.png").stat().st_size > 0
    # without a grid: no speedups and no plot
    assert report.main([str(raw), "--out", str(tmp_path / "plain"), "--name", "q"]) == 0
    assert json.loads((tmp_path / "plain" / "q.json").read_text())["speedups"] == {}
    assert not (tmp_path / "plain" / "q_frontier.png").exists()
    # a renamed method is reported, and costed, under its new name
    renamed = tmp_path / "renamed"
    argv = [str(raw), "--ttft", grid, "--label", "auto=auto-before", "--cost", "auto-before=8:all"]
    assert report.main([*argv, "--out", str(renamed), "--name", "q"]) == 0
    result = json.loads((renamed / "q.json").read_text())
    assert "auto@policy" not in result["lengths"]["4096"]["cells"]
    assert result["speedups"]["4096"]["auto-before@policy"]["speedup"] == pytest.approx(auto)


def test_report_main_refuses_malformed_label_and_cost(tmp_path, capsys):
    raw = _raw(tmp_path)
    for flag, value in (("--cost", "auto"), ("--cost", "auto=fast"), ("--label", "=x")):
        with pytest.raises(SystemExit) as excinfo:
            report.main([str(raw), flag, value, "--out", str(tmp_path / "out")])
        assert excinfo.value.code == 2 and flag in capsys.readouterr().err


def test_report_main_refuses_a_folder_without_results(tmp_path, capsys):
    with pytest.raises(SystemExit) as excinfo:
        report.main([str(tmp_path), "--out", str(tmp_path / "out")])
    assert excinfo.value.code == 2 and "no evaluation result files" in capsys.readouterr().err


def _depth_files(tmp_path: Path) -> list[Path]:
    """Two seeds' recall-only files; one method did not reach seed 0's second qa_squad sample."""
    methods = ["draft-early-12", "draft-early-12-mean", "draft-early-4-last-layer", "draft-early-4-content-mean"]
    methods += ["target-early-7", "full", "draft-chunked", "draft-early-16-bogus"]
    value = {m: 0.1 * (k + 1) for k, m in enumerate(methods)}
    files = []
    for seed, samples in ((0, [(A, 0), (A, 1), (B, 0), (B, 1)]), (1, [(A, 0)])):
        records = []
        for m in methods:
            for t, i in samples:
                if (m, seed, t, i) == ("draft-early-12-mean", 0, B, 1):
                    continue
                recall = 1.0 if (seed, t, i) == (0, B, 1) else value[m]
                records.append(_rec(t, i, m, 0.1, length=8192, recall=recall))
        # the first method's own values, to check one mean by hand
        for r in records:
            if r["method"] == "draft-early-12":
                r["recall"] = {(0, A, 0): 0.5, (0, A, 1): 1.0, (0, B, 0): 0.0, (0, B, 1): 0.9, (1, A, 0): 0.25}[
                    seed, r["task"], int(r["id"].rsplit("/", 1)[1])
                ]
        config = {"model": "t.gguf", "draft": "d.gguf", "lengths": [8192], "keep_rates": [0.1], "tasks": [A, B]}
        path = tmp_path / f"r_8192_s{seed}.partial.json"
        _write(path, seed, records, config=config, partial=True)
        files.append(path)
    return files


def test_depth_counts_only_the_samples_every_method_scored(tmp_path):
    records, config = depth.load(_depth_files(tmp_path))
    assert config["model"] == "t.gguf"
    result = depth.table(records)
    assert result["samples"] == 4 and result["samples_per_task"] == {A: 3, B: 1}
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"draft-early-12", "draft-early-12-mean", "draft-early-4-last-layer"} | {
        "draft-early-4-content-mean",
        "target-early-7",
    }
    first = rows["draft-early-12"]
    assert first["recall"] == pytest.approx((0.5 + 1.0 + 0.0 + 0.25) / 4) and first["samples"] == 4
    assert first["per_task"] == {A: pytest.approx(1.75 / 3), B: 0.0}
    # the sample one method missed (recall 1.0 everywhere else) is in no mean
    assert rows["draft-early-12-mean"]["recall"] == pytest.approx(0.2)
    assert rows["target-early-7"]["recall"] == pytest.approx(0.5)


def test_depth_parses_model_depth_and_aggregation_and_orders_rows(tmp_path):
    records, _ = depth.load(_depth_files(tmp_path))
    rows = depth.table(records)["rows"]
    assert [(r["model"], r["layers"], r["aggregation"]) for r in rows] == [
        ("draft", 4, "content-mean"),
        ("draft", 4, "last-layer"),
        ("draft", 12, "max"),
        ("draft", 12, "mean"),
        ("target", 7, "max"),
    ]


def test_depth_main_writes_json_markdown_and_plot(tmp_path):
    files = _depth_files(tmp_path)
    out = tmp_path / "out"
    assert depth.main([*map(str, files), "--out", str(out), "--name", "d"]) == 0
    result = json.loads((out / "d.json").read_text())
    assert result["seeds"] == [0, 1] and result["config"]["lengths"] == [8192]
    assert result["command"].endswith(" ".join(map(str, files)))
    text = (out / "d.md").read_text()
    assert "| aggregation | 4 | 12 |" in text and "| aggregation | 7 |" in text
    assert f"| max |  | {(0.5 + 1.0 + 0.0 + 0.25) / 4:.3f} |" in text
    assert f"4 samples scored by every method: {A} 3, {B} 1" in text
    assert (out / "d.png").stat().st_size > 0


def test_depth_main_refuses_files_without_depth_methods(tmp_path, capsys):
    path = tmp_path / "e.json"
    _write(path, 0, [_rec(A, 0, "full", 1.0, recall=1.0), _rec(A, 0, "draft-early-x", 0.1, recall=1.0)])
    with pytest.raises(SystemExit) as excinfo:
        depth.main([str(path), "--out", str(tmp_path / "out")])
    assert excinfo.value.code == 2 and "no draft-early-N or target-early-N records" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_report_on_the_committed_run(tmp_path):
    raw = RESULTS / "quality_gpu_qwen_real_v2_raw"
    ttft = RESULTS / "ttft_gpu_h200_real_default.json"
    # that run's auto scored with the whole draft and look-ahead 8
    argv = [str(raw), "--ttft", str(ttft), "--cost", "auto=8:all", "--out", str(tmp_path), "--name", "v2"]
    assert report.main(argv) == 0
    result = json.loads((tmp_path / "v2.json").read_text())
    assert {"4096", "8192"} <= set(result["lengths"])
    for length, block in result["lengths"].items():
        cells = block["cells"]
        assert cells["full@1"]["relative"] == pytest.approx(1.0)
        assert cells["auto@policy"]["keep"] == "policy"
        auto = result["speedups"][length]["auto@policy"]
        assert auto["interpolated"] is True and auto["grid_n"] == int(length)
        assert set(block["answered"]) | set(block["excluded"]) == set(block["tasks"])
        for cell in cells.values():
            assert 0.0 <= cell["accuracy"] <= 1.0 and all(0.0 < s <= 1.0 for s in cell["keep_ratios"])
    # the committed tables came from these files
    committed = json.loads((RESULTS / "quality_gpu_qwen_real_v2.json").read_text())
    for length, block in committed["lengths"].items():
        for key, cell in block["cells"].items():
            mine = result["lengths"][length]["cells"][key]
            assert mine["accuracy"] == pytest.approx(cell["accuracy"]), (length, key)
            assert (mine["relative"] is None) == (cell["relative"] is None), (length, key)
            if cell["relative"] is not None:
                assert mine["relative"] == pytest.approx(cell["relative"]), (length, key)
    assert (tmp_path / "v2.md").exists() and (tmp_path / "v2_frontier.png").exists()


def test_depth_on_the_committed_run(tmp_path):
    files = sorted((RESULTS / "quality_gpu_depth_raw").glob("*.partial.json"))
    assert depth.main([*map(str, files), "--out", str(tmp_path), "--name", "depth"]) == 0
    result = json.loads((tmp_path / "depth.json").read_text())
    assert result["samples"] == sum(result["samples_per_task"].values()) > 0
    assert list(result["samples_per_task"]) == sorted(result["samples_per_task"])
    assert {r["model"] for r in result["rows"]} == {"draft", "target"}
    for r in result["rows"]:
        assert r["samples"] == result["samples"] and 0.0 <= r["recall"] <= 1.0
    committed = {r["method"]: r for r in json.loads((RESULTS / "quality_gpu_depth_recall.json").read_text())["rows"]}
    assert [r["method"] for r in result["rows"]] == list(committed)
    for r in result["rows"]:
        assert r["recall"] == pytest.approx(committed[r["method"]]["recall"]) and not math.isnan(r["recall"])
