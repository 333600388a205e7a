"""benchmarks/calibrate_auto.py: the accuracy targets, the choice, the policy rewrite, and a real run on CPU."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from specprefill_sdk.errors import InvalidRequestError

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str) -> Any:
    """benchmarks/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so that worker processes find its functions by name
    spec.loader.exec_module(module)
    return module


_script("_common")  # puts benchmarks/ on the import path, as running a script does
cal = _script("calibrate_auto")


def _record(task: str, length: int, index: int, seed: int, method: str, rate: float, **fields: Any) -> dict[str, Any]:
    return {
        "id": f"{task}/{length}/{index}@seed{seed}",
        "task": task,
        "length": length,
        "n": fields.pop("n", length - 100),
        "method": method,
        "keep_rate": rate,
        "recall": fields.pop("recall", 1.0),
        **fields,
    }


def _write(
    path: Path, records: list[dict[str, Any]], *, tasks: list[str], lengths: list[int], samples: int = 1
) -> Path:
    data = {
        "config": {
            "model": "smollm2-135m",
            "draft": "smollm2-135m",
            "tasks": tasks,
            "lengths": lengths,
            "samples": 2 * samples,
            "keep_rates": sorted({r["keep_rate"] for r in records if r["method"] != "full"}),
            "methods": ["draft-chunked"],
            "generate": True,
            "seed": 0,
            "device": "cpu",
            "dtype": "float32",
            "max_new_tokens": None,
        },
        "sources": [{"seed": 0, "samples": samples}, {"seed": 1, "samples": samples}],
        "records": records,
    }
    path.write_text(json.dumps(data))
    return path


def _synthetic(
    full: dict[str, list[bool]], chunked: dict[float, dict[str, tuple[list[bool], float]]], length: int = 4096
) -> list[dict[str, Any]]:
    """Records with per-task ``contains`` lists (one entry per sample, seeds 0 and 1 alternating) and a recall."""
    rows = []
    for task, hits in full.items():
        for i, hit in enumerate(hits):
            rows.append(_record(task, length, i // 2, i % 2, "full", 1.0, contains=hit))
    for rate, by_task in chunked.items():
        for task, (hits, recall) in by_task.items():
            for i, hit in enumerate(hits):
                rows.append(_record(task, length, i // 2, i % 2, "draft-chunked", rate, contains=hit, recall=recall))
    return rows


# ---------------------------------------------------------------------------------------------- step 1


def test_interpolation_is_linear_between_the_share_that_misses_and_the_one_that_reaches():
    points = [(0.1, 0.0, 0.5), (0.2, 0.75, 0.7), (0.3, 1.0, 0.9)]
    s, r, reached = cal.interpolate_share(points, 0.735)
    # by hand: 0.735 lies 0.98 of the way from 0.0 to 0.75
    assert reached and s == pytest.approx(0.1 + 0.98 * 0.1) and r == pytest.approx(0.5 + 0.98 * 0.2)
    # reaching the goal exactly counts; the first share is never extrapolated below
    assert cal.interpolate_share(points, 0.0) == (0.1, 0.5, True)
    assert cal.interpolate_share(points, 1.0) == (0.3, 0.9, True)
    # not reached: the largest share, flagged
    assert cal.interpolate_share(points, 1.01) == (0.3, 0.9, False)


def test_targets_from_files_exclude_tasks_the_dense_target_never_answers(tmp_path):
    rows = _synthetic(
        full={"a": [True, True], "b": [True, False], "c": [False, False]},
        chunked={
            0.1: {"a": ([False, False], 0.4), "b": ([False, False], 0.6), "c": ([True, True], 0.0)},
            0.2: {"a": ([True, True], 0.6), "b": ([True, False], 0.8), "c": ([True, True], 0.0)},
            0.3: {"a": ([True, True], 0.8), "b": ([True, True], 1.0), "c": ([True, True], 0.0)},
        },
    )
    path = _write(tmp_path / "acc.json", rows, tasks=["a", "b", "c"], lengths=[4096])
    config, records = cal.read_accuracy([path])
    assert config["seeds"] == [0, 1] and config["samples"] == 1 and config["lengths"] == [4096]
    t = cal.accuracy_targets(records, config["lengths"], 0.98)["4096"]
    assert t["included"] == ["a", "b"]
    assert [e["task"] for e in t["excluded"]] == ["c"] and "never answers" in t["excluded"][0]["reason"]
    # dense over a and b: (1 + 0.5) / 2; draft-chunked: 0, 0.75, 1.0 (c is left out though it "answers")
    assert t["full"] == pytest.approx(0.75)
    assert [v["contains"] for v in t["draft-chunked"].values()] == pytest.approx([0.0, 0.75, 1.0])
    assert t["reached"] and t["s_star"] == pytest.approx(0.198) and t["r_star"] == pytest.approx(0.5 + 0.98 * 0.2)


def test_98_percent_of_dense_is_enough_and_an_unreachable_length_is_flagged(tmp_path):
    # 49 of 50 right at keep 0.1 is exactly 0.98 of a dense 50 of 50
    hits = [True] * 49 + [False]
    rows = _synthetic(
        full={"a": [True] * 50},
        chunked={0.1: {"a": (hits, 0.7)}, 0.2: {"a": ([True] * 50, 0.9)}},
    )
    rows += _synthetic(
        full={"a": [True] * 50},
        chunked={0.1: {"a": ([False] * 50, 0.3)}, 0.2: {"a": ([True] * 48 + [False] * 2, 0.6)}},
        length=8192,
    )
    path = _write(tmp_path / "acc.json", rows, tasks=["a"], lengths=[4096, 8192], samples=25)
    config, records = cal.read_accuracy([path])
    targets = cal.accuracy_targets(records, config["lengths"], 0.98)
    short, long = targets["4096"], targets["8192"]
    assert (short["s_star"], short["reached"]) == (0.1, True) and short["r_star"] == pytest.approx(0.7)
    assert (long["s_star"], long["reached"]) == (0.2, False) and long["r_star"] == pytest.approx(0.6)
    assert "not reached" in cal.markdown(
        {
            "command": "x",
            "config": {**config, "target": 0.98, "policy": "p"},
            "targets": targets,
            "choice": {"coverage": 0.8, "min_rate": 0.1, "min_tokens": 0, "max_rate": 0.3, "why": "w"},
            "top": [],
        }
    )


def test_files_that_disagree_are_refused(tmp_path):
    rows = _synthetic(full={"a": [True, True]}, chunked={0.1: {"a": ([True, True], 1.0)}})
    one = _write(tmp_path / "one.json", rows, tasks=["a"], lengths=[4096])
    other = _write(tmp_path / "two.json", rows, tasks=["a", "b"], lengths=[4096])
    with pytest.raises(InvalidRequestError, match="disagree on tasks"):
        cal.read_accuracy([one, other])
    with pytest.raises(InvalidRequestError, match="no accuracy files"):
        cal.read_accuracy([])


# ---------------------------------------------------------------------------------------------- step 3


def _cand(coverage: float, shares: tuple[float, float], recalls: tuple[float, float]) -> dict[str, Any]:
    return {
        "coverage": coverage,
        "min_rate": 0.1,
        "min_tokens": 0,
        "max_rate": 0.3,
        "lengths": {
            "4096": {"share": shares[0], "recall": recalls[0]},
            "8192": {"share": shares[1], "recall": recalls[1]},
        },
    }


R_STAR = {"4096": 0.8, "8192": 0.85}


def _choose(cands: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    return cal.choose(cal.assess(cands, R_STAR, 0.30, 0.15))


def test_the_cheapest_feasible_candidate_is_chosen():
    cands = [
        _cand(0.9, (0.25, 0.14), (0.95, 0.95)),  # feasible, mean share 0.195
        _cand(0.8, (0.20, 0.10), (0.85, 0.90)),  # feasible, mean share 0.15: the choice
        _cand(0.5, (0.10, 0.05), (0.70, 0.95)),  # cheaper but misses R* at 4096
        _cand(0.6, (0.10, 0.16), (0.90, 0.95)),  # cheaper but over the long cap
    ]
    best, why = _choose(cands)
    assert best["coverage"] == 0.8 and "lowest mean kept share" in why


def test_ties_go_to_the_larger_margin_then_the_larger_coverage():
    same = ((0.20, 0.10), (0.85, 0.90))
    best, _ = _choose([_cand(0.7, *same), _cand(0.9, same[0], (0.90, 0.95)), _cand(0.95, *same)])
    assert best["coverage"] == 0.9  # the same mean share; worst margin 0.10 against 0.05
    best, _ = _choose([_cand(0.7, *same), _cand(0.95, *same), _cand(0.8, *same)])
    assert best["coverage"] == 0.95


def test_without_a_feasible_candidate_the_largest_worst_margin_within_the_caps_wins():
    cands = [
        _cand(0.5, (0.10, 0.05), (0.60, 0.80)),  # worst margin -0.20
        _cand(0.6, (0.20, 0.10), (0.75, 0.83)),  # worst margin -0.05: the choice
        _cand(0.9, (0.40, 0.30), (0.99, 0.99)),  # over the caps
    ]
    best, why = _choose(cands)
    assert best["coverage"] == 0.6 and "no candidate reaches R*" in why
    # none within the caps: the caps are ignored, and the reason says so
    best, why = _choose([_cand(0.5, (0.4, 0.3), (0.6, 0.8)), _cand(0.6, (0.5, 0.4), (0.7, 0.8))])
    assert best["coverage"] == 0.6 and "caps ignored" in why


# ---------------------------------------------------------------------------------------------- the policy file


def test_the_rewrite_changes_the_four_numbers_and_keeps_everything_else(tmp_path):
    text = (ROOT / "policies" / "auto.toml").read_text()
    values = {"coverage": 0.65, "min_rate": 0.07, "min_tokens": 1536, "max_rate": 0.25}
    new = cal.rewrite_policy(text, values)
    old_lines, new_lines = text.splitlines(), new.splitlines()
    changed = [(a, b) for a, b in zip(old_lines, new_lines, strict=True) if a != b]
    assert sorted(b for _, b in changed) == sorted(
        ["coverage = 0.65", "min_rate = 0.07", "min_tokens = 1536", "max_rate = 0.25"]
    )
    assert [line for line in new_lines if line.startswith("#")] == [
        line for line in text.splitlines() if line.startswith("#")
    ]
    path = tmp_path / "auto.toml"
    path.write_text(text)
    cal.write_policy(path, values)
    from specprefill_sdk.policies import load_policy

    s = load_policy(path).selector
    assert (s.coverage, s.min_rate, s.min_tokens, s.max_rate) == (0.65, 0.07, 1536, 0.25)
    assert s.dense_below_tokens == 1024 and s.chunk_size == 32


def test_the_rewrite_keeps_a_trailing_comment_and_refuses_a_missing_or_doubled_key():
    text = "[scorer]\ncoverage = 3\n[selector]\ncoverage = 0.8  # why\nmin_rate = 0.1\n"
    assert (
        cal.rewrite_policy(text, {"coverage": 0.9})
        == "[scorer]\ncoverage = 3\n[selector]\ncoverage = 0.9  # why\nmin_rate = 0.1\n"
    )
    with pytest.raises(InvalidRequestError, match="max_rate appears 0 times"):
        cal.rewrite_policy(text, {"max_rate": 0.3})
    with pytest.raises(InvalidRequestError, match="min_rate appears 2 times"):
        cal.rewrite_policy(text + "min_rate = 0.2\n", {"min_rate": 0.3})


# ---------------------------------------------------------------------------------------------- end to end


LENGTH = 512
TASKS = ("niah_single", "qa_squad")


@pytest.fixture(scope="module")
def accuracy_file(tmp_path_factory: pytest.TempPathFactory, smollm: Any) -> Path:
    """Accuracy records for the harness's own samples (ids, token counts, recall), with made-up answers."""
    from specprefill_sdk.eval import EvalConfig, merge_results, run_eval

    runs = [
        run_eval(
            EvalConfig(
                model="smollm2-135m",
                tasks=TASKS,
                lengths=(LENGTH,),
                samples=1,
                keep_rates=(0.1, 0.3),
                methods=("draft-chunked",),
                generate=False,
                seed=seed,
                device="cpu",
                dtype="auto",
            ),
            progress=False,
            target=smollm,
            draft=smollm,
        )
        for seed in (0, 1)
    ]
    data = merge_results(runs).to_dict()
    records = data["records"]
    for r in records:
        r["contains"] = r["keep_rate"] > 0.2 or r["task"] == "niah_single"
    records += [
        {**r, "method": "full", "keep_rate": 1.0, "recall": 1.0, "contains": True}
        for r in records
        if r["keep_rate"] == 0.1
    ]
    path = tmp_path_factory.mktemp("acc") / "acc.json"
    path.write_text(json.dumps(data))
    return path


def _policy_copy(tmp_path: Path) -> Path:
    path = tmp_path / "auto.toml"
    shutil.copy(ROOT / "policies" / "auto.toml", path)
    # prompts of 512 tokens: below the shipped dense threshold, so lower it to let the selector act
    path.write_text(path.read_text().replace("dense_below_tokens = 1024", "dense_below_tokens = 256"))
    return path


@pytest.mark.slow
def test_a_real_run_on_cpu_scores_selects_chooses_and_writes_the_policy(tmp_path, accuracy_file, smollm, monkeypatch):
    import torch

    from specprefill_sdk.eval.harness import EvalConfig, _build_case, _make_samples
    from specprefill_sdk.selection import Adaptive, Protect, StructuredChunks
    from specprefill_sdk.types import TokenScores

    policy = _policy_copy(tmp_path)
    before = policy.read_text()
    cache = tmp_path / "scores.pt"
    argv = [
        "--accuracy", str(accuracy_file), "--policy", str(policy), "--device", "cpu", "--dtype", "auto",
        "--coverage", "0.5", "0.9", "--min-rate", "0.05", "--min-tokens", "0", "--max-rate", "0.4",
        "--cap-short", "0.5", "--scores-cache", str(cache), "--no-progress", "--workers", "1",
        "--out", str(tmp_path / "out"), "--write-policy", str(policy),
    ]  # fmt: skip
    result = cal.main(argv)
    written = json.loads((tmp_path / "out" / "auto_calibration.json").read_text())
    assert written["config"]["seeds"] == [0, 1] and written["config"]["samples"] == 1
    assert [(c["coverage"], c["max_rate"]) for c in written["grid"]] == [(0.5, 0.4), (0.9, 0.4)]
    assert "## Top 10 candidates" in (tmp_path / "out" / "auto_calibration.md").read_text()

    # the grid against a by-hand selection of the same float16 scores
    scores = torch.load(cache, weights_only=False)["scores"]
    assert all(v.dtype == torch.float16 for v in scores.values()) and len(scores) == 4
    for cand in written["grid"]:
        shares, recalls = [], []
        for seed in (0, 1):
            config = EvalConfig(tasks=TASKS, lengths=(LENGTH,), samples=1, seed=seed)
            for sample in _make_samples(config, smollm.tokenizer, smollm.max_context):
                case = _build_case(smollm.tokenizer, sample)
                selector = Protect(
                    StructuredChunks(Adaptive(cand["coverage"], 0.05, 0.4, dense_below_tokens=256, min_tokens=0)),
                    sink=1,
                    tail=True,
                )
                values = scores[f"{sample.sample_id}@seed{seed}"].float()
                sel = selector.select(case.prompt, TokenScores(values=values))
                evidence = [i for i, e in enumerate(case.evidence) if e]
                kept = set(sel.indices)
                shares.append(len(kept) / case.prompt.n)
                recalls.append(sum(1 for i in evidence if i in kept) / len(evidence))
        got = cand["lengths"][str(LENGTH)]
        assert got["share"] == pytest.approx(sum(shares) / 4) and got["recall"] == pytest.approx(sum(recalls) / 4)

    # the policy file: the chosen numbers, nothing else changed
    chosen = result["choice"]
    after = policy.read_text()
    assert f"coverage = {chosen['coverage']!r}" in after and f"max_rate = {chosen['max_rate']!r}" in after
    assert "min_tokens = 0" in after and "min_rate = 0.05" in after
    assert len(after.splitlines()) == len(before.splitlines())
    assert [line for line in after.splitlines() if line.startswith("#")] == [
        line for line in before.splitlines() if line.startswith("#")
    ]

    # again from the cache, the prompts spread over two processes: the same grid, and no scorer is built
    from specprefill_sdk.policies import Policy

    def no_scorer(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the cached scores should be used")

    monkeypatch.setattr(Policy, "build_scorer", no_scorer)
    again = cal.main([*argv[:-2], "--workers", "2", "--out", str(tmp_path / "again")])
    assert again["grid"] == result["grid"]


@pytest.mark.slow
def test_samples_that_differ_from_the_accuracy_files_are_refused(tmp_path, accuracy_file):
    data = json.loads(accuracy_file.read_text())
    changed = data["records"][0]["id"]
    for r in data["records"]:
        r["n"] += r["id"] == changed
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    argv = ["--accuracy", str(bad), "--policy", str(_policy_copy(tmp_path)), "--out", str(tmp_path), "--no-progress"]
    with pytest.raises(InvalidRequestError, match=f"differ from the accuracy files.*{changed}: .* tokens here"):
        cal.main(argv)
    with pytest.raises(InvalidRequestError, match="--samples 3 differs"):
        cal.main([*argv, "--samples", "3"])
