"""The evaluation harness: sentence splitting, task generation, metrics, reports, and an end-to-end run."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import numpy as np
import pytest

from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.eval.harness import FULL, POLICY, EvalConfig, EvalResult
from specprefill_sdk.eval.metrics import (
    contains_match,
    evidence_recall,
    exact_match,
    normalize_answer,
    token_mask_for_spans,
)
from specprefill_sdk.eval.report import load_result, markdown_report, write_report
from specprefill_sdk.eval.tasks import generate_samples, task_names
from specprefill_sdk.eval.text import sentence_spans, split_sentences
from specprefill_sdk.types import Prompt, Selection

# ----------------------------------------------------------------------------- sentences


def test_split_keeps_abbreviations_initials_and_decimals_inside_sentences():
    text = (
        "Dr. Smith paid $3.50 at 5 p.m. on Main St. yesterday. The U.S. team won! "
        'Did J. R. R. Tolkien write it? "Yes." She left.'
    )
    assert split_sentences(text) == [
        "Dr. Smith paid $3.50 at 5 p.m. on Main St. yesterday.",
        "The U.S. team won!",
        "Did J. R. R. Tolkien write it?",
        '"Yes."',
        "She left.",
    ]


def test_split_recovers_lost_line_breaks_and_spans_point_into_the_text():
    text = "It was the end of these mistakes.If you had to choose, be brief.  Then   go."
    spans = sentence_spans(text)
    assert [text[a:b] for a, b in spans] == [
        "It was the end of these mistakes.",
        "If you had to choose, be brief.",
        "Then   go.",
    ]
    assert all(text[a].strip() and text[b - 1].strip() for a, b in spans)


def test_split_does_not_break_before_lower_case():
    assert split_sentences("Say what you think; be happy. which I then put on top.") == [
        "Say what you think; be happy. which I then put on top."
    ]


# ----------------------------------------------------------------------------- tasks


@pytest.fixture(scope="module")
def fast_tokenizer():
    from transformers import AutoTokenizer

    from specprefill_sdk.models import resolve_model_path

    return AutoTokenizer.from_pretrained(str(resolve_model_path("smollm2-135m", progress=False)))


@pytest.mark.parametrize("task", task_names())
def test_tasks_hide_their_evidence_and_fit_the_length(fast_tokenizer, task):
    samples = generate_samples(task, fast_tokenizer, length=1024, count=2, seed=3)
    assert len(samples) == 2
    for s in samples:
        n = len(fast_tokenizer(s.text, add_special_tokens=False)["input_ids"])
        assert 0.8 * 1024 <= n <= 1024, n
        assert s.evidence, "every sample names its evidence"
        for a, b in s.evidence:
            assert 0 <= a < b <= s.question_span[0], "evidence lies in the context, before the question"
        q0, q1 = s.question_span
        assert s.text[q0:q1] == s.question
        evidence_text = " ".join(s.text[a:b] for a, b in s.evidence)
        if task.startswith("niah"):
            assert all(v in evidence_text for v in s.answers)
            assert s.text.count("special magic number") >= len(s.evidence) + 1
        if task == "variable_tracking":
            assert all(f"VAR {name}" in evidence_text for name in s.answers)
            assert s.info["value"] in evidence_text


def test_multikey_has_distractor_needles_outside_the_evidence(fast_tokenizer):
    s = generate_samples("niah_multikey", fast_tokenizer, length=1024, count=1, seed=0)[0]
    assert s.text.count("One of the special magic numbers for") == 4
    assert len(s.evidence) == 1


def test_squad_answer_lies_in_its_evidence_sentence(fast_tokenizer):
    for s in generate_samples("qa_squad", fast_tokenizer, length=1024, count=3, seed=1):
        evidence_text = " ".join(s.text[a:b] for a, b in s.evidence)
        assert any(answer in evidence_text for answer in s.answers)


def test_samples_are_deterministic_and_seeded(fast_tokenizer):
    a = generate_samples("niah_multivalue", fast_tokenizer, length=512, count=2, seed=7)
    b = generate_samples("niah_multivalue", fast_tokenizer, length=512, count=2, seed=7)
    c = generate_samples("niah_multivalue", fast_tokenizer, length=512, count=2, seed=8)
    assert [s.text for s in a] == [s.text for s in b]
    assert a[0].text != c[0].text
    assert a[0].text != a[1].text


def test_generate_samples_rejects_bad_input(fast_tokenizer):
    with pytest.raises(InvalidRequestError, match="unknown task"):
        generate_samples("niah_nothing", fast_tokenizer, length=1024, count=1)
    with pytest.raises(InvalidRequestError, match="length"):
        generate_samples("niah_single", fast_tokenizer, length=10, count=1)
    with pytest.raises(InvalidRequestError, match="count"):
        generate_samples("niah_single", fast_tokenizer, length=1024, count=0)


# ----------------------------------------------------------------------------- metrics


def test_contains_and_exact_match():
    assert contains_match("The special magic number is 4817203.", ("4817203",), "all")
    assert not contains_match("The number is 48172031.", ("4817203",), "all")
    assert contains_match("1234567, 7654321", ("7654321", "1234567"), "all")
    assert not contains_match("1234567 only", ("7654321", "1234567"), "all")
    assert contains_match("It was the Anglo-Saxons.", ("Anglo-Saxons", "the Anglo-Saxons"), "any")
    assert exact_match("Anglo-Saxons\nmore text", ("the Anglo-Saxons",), "any")
    assert not exact_match("The answer is Anglo-Saxons", ("Anglo-Saxons",), "any")
    assert exact_match("QLDZO, WYSSC and ZCRZE", ("ZCRZE", "QLDZO", "WYSSC"), "all")
    assert not exact_match("QLDZO, WYSSC", ("ZCRZE", "QLDZO", "WYSSC"), "all")
    assert normalize_answer("  The  Beijing, Dance-Academy! ") == "beijing dance academy"


def test_evidence_recall_counts_kept_evidence_tokens():
    prompt = Prompt(
        token_ids=tuple(range(6)),
        text="aa bb cc dd",
        roles=("text",) * 6,
        message_index=(0,) * 6,
        offsets=((0, 0), (0, 2), (3, 5), (6, 8), (9, 11), (11, 11)),
        special=(False,) * 6,
        protected=(False,) * 6,
        generation_start=6,
    )
    mask = token_mask_for_spans(prompt, [(3, 8)])
    assert mask == [False, False, True, True, False, False]
    assert token_mask_for_spans(prompt, [(0, 5)], offset=6) == [False, False, False, True, True, False]
    sel = Selection(indices=(0, 2, 4), n=6, protected=(False, False, False))
    assert evidence_recall(sel, mask) == 0.5
    assert evidence_recall(sel, [False] * 6) == 1.0
    with pytest.raises(ValueError):
        evidence_recall(sel, [True])


# ----------------------------------------------------------------------------- configuration and reports


def test_config_validation_names_the_bad_value():
    with pytest.raises(InvalidRequestError, match="unknown or no task"):
        EvalConfig(tasks=("nope",)).validate()
    with pytest.raises(InvalidRequestError, match="unknown method"):
        EvalConfig(methods=("magic",)).validate()
    for bad in ("draft-early-0", "draft-early-x", "draft-early-"):
        with pytest.raises(InvalidRequestError, match="draft-early-N"):
            EvalConfig(methods=(bad,)).validate()
    EvalConfig(methods=("draft-early", "draft-early-7")).validate()


def test_early_layer_methods_are_named_described_and_ordered():
    from specprefill_sdk.eval.methods import is_method, method_description, method_order

    assert is_method("draft-early-12") and not is_method("draft-early-012")
    assert "first 12 layers" in str(method_description("draft-early-12"))
    assert "first half" in str(method_description("draft-early"))
    order = method_order(["random", "draft-early-12", "other", "draft-early-3", "draft-chunked", "draft-early"])
    assert order == ["draft-chunked", "draft-early", "draft-early-3", "draft-early-12", "random", "other"]
    for name in ("draft-early-4-mean", "draft-early-4-content-mean", "draft-early-4-last-layer", "target-early-4"):
        assert is_method(name)
    assert "layer aggregation last-layer" in str(method_description("target-early-4-last-layer"))
    assert "target's first 4 layers" in str(method_description("target-early-4-last-layer"))
    for bad in ("draft-early-4-max", "draft-early-4-median", "target-early", "target-early-0", "draft-chunked-qmean"):
        assert not is_method(bad)
    order = method_order(["target-early-2", "draft-early-4-last-layer", "draft-early-4", "draft-early-4-mean"])
    assert order == ["draft-early-4", "draft-early-4-mean", "draft-early-4-last-layer", "target-early-2"]
    with pytest.raises(InvalidRequestError, match="keep rates"):
        EvalConfig(keep_rates=(0.0,)).validate()
    with pytest.raises(InvalidRequestError, match="lengths"):
        EvalConfig(lengths=(100,)).validate()


def _fake_result() -> EvalResult:
    cfg = EvalConfig(
        tasks=("niah_single", "qa_squad"),
        lengths=(1024,),
        samples=1,
        keep_rates=(0.1, 0.3),
        methods=("draft-chunked", "random"),
    )
    result = EvalResult(
        config=cfg,
        environment={
            "processor": "test",
            "cpu_count": 2,
            "torch": "x",
            "transformers": "y",
            "device": "cpu",
            "dtype": "bfloat16",
        },
    )
    for task in cfg.tasks:
        result.samples.append({"id": f"{task}/1024/0"})
        result.records.append(
            {
                "id": f"{task}/1024/0",
                "task": task,
                "method": FULL,
                "keep_rate": 1.0,
                "keep_ratio": 1.0,
                "recall": 1.0,
                "contains": True,
                "exact": True,
            }
        )
        for method, good in (("draft-chunked", True), ("random", False)):
            for rate in cfg.keep_rates:
                result.records.append(
                    {
                        "id": f"{task}/1024/0",
                        "task": task,
                        "method": method,
                        "keep_rate": rate,
                        "keep_ratio": rate,
                        "recall": 0.9 if good else rate,
                        "contains": good,
                        "exact": False,
                        "select_ms": 1.0,
                    }
                )
    return result


def test_summary_means_per_method_and_rate():
    summary = _fake_result().summary()
    assert summary["draft-chunked"][0.1]["recall"] == pytest.approx(0.9)
    assert summary["random"][0.3]["contains"] == 0.0
    assert summary[FULL][1.0]["contains"] == 1.0
    by_task = _fake_result().summary(by_task=True)
    assert set(by_task) == {"niah_single", "qa_squad"}
    assert by_task["qa_squad"]["random"][0.1]["count"] == 1


def test_write_report_makes_json_markdown_and_png(tmp_path):
    paths = write_report(_fake_result(), tmp_path, stem="unit", command="specprefill eval --samples 1")
    data = json.loads(paths["json"].read_text())
    assert data["summary"]["draft-chunked"]["0.1"]["recall"] == pytest.approx(0.9)
    assert data["command"] == "specprefill eval --samples 1"
    md = paths["markdown"].read_text()
    assert "| draft-chunked | 90 | 90 |" in md
    assert "| full (dense) | 100 | 100 |" in md
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "### qa_squad" in markdown_report(_fake_result())
    again = load_result(paths["json"])
    assert again.summary() == _fake_result().summary()
    assert again.config == _fake_result().config


def _seeded(seed: int, good: bool) -> EvalResult:
    """A fake run with its own seed whose draft-chunked answers are all right (``good``) or all wrong."""
    result = _fake_result()
    result.config = EvalConfig(**{**dataclasses.asdict(result.config), "seed": seed})
    result.elapsed_s = 60.0
    for r in result.records:
        if r["method"] == "draft-chunked":
            r["contains"] = good
    return result


def test_merge_pools_the_samples_of_runs_with_other_seeds(tmp_path):
    from specprefill_sdk.eval import merge_results

    merged = merge_results([_seeded(0, True), _seeded(1, False)])
    summary = merged.summary()
    assert summary["draft-chunked"][0.1]["count"] == 4 and summary["draft-chunked"][0.1]["contains"] == 0.5
    assert summary[FULL][1.0]["count"] == 4
    assert merged.config.samples == 2 and merged.elapsed_s == 120.0
    assert [src["seed"] for src in merged.sources] == [0, 1]
    ids = {r["id"] for r in merged.records}
    assert "niah_single/1024/0@seed0" in ids and "niah_single/1024/0@seed1" in ids
    md = markdown_report(merged)
    assert "seeds 0, 1" in md and "merged from 2 runs" in md
    # written and read back, a merged result merges again with a third run
    paths = write_report(merged, tmp_path, stem="both", plot=False)
    again = merge_results([load_result(paths["json"]), _seeded(2, True)])
    assert [src["seed"] for src in again.sources] == [0, 1, 2]
    assert again.summary()["draft-chunked"][0.3]["count"] == 6
    assert len({x["id"] for x in again.samples}) == len(again.samples) == 6
    alone = merge_results([_seeded(4, True)])  # a merge of one run, merged again, is not tagged twice
    assert {x["id"] for x in merge_results([alone, _seeded(5, True)]).samples} >= {"qa_squad/1024/0@seed4"}


def test_merge_refuses_other_settings_and_a_repeated_seed():
    from specprefill_sdk.eval import merge_results

    other = _seeded(1, True)
    other.config = EvalConfig(**{**dataclasses.asdict(other.config), "keep_rates": (0.1, 0.2)})
    with pytest.raises(InvalidRequestError, match="differ in keep_rates"):
        merge_results([_seeded(0, True), other])
    with pytest.raises(InvalidRequestError, match="share a seed"):
        merge_results([_seeded(3, True), _seeded(3, False)])
    with pytest.raises(InvalidRequestError, match="nothing to merge"):
        merge_results([])
    with pytest.raises(InvalidRequestError, match="not an evaluation result"):
        EvalResult.from_dict({"summary": {}})


def test_the_cli_merges_result_files(tmp_path, capsys):
    from specprefill_sdk.cli import eval as cli

    a = write_report(_seeded(0, True), tmp_path, stem="a", command="specprefill eval --seed 0", plot=False)
    b = write_report(_seeded(1, False), tmp_path, stem="b", command="specprefill eval --seed 1", plot=False)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--merge", str(a["json"]), str(b["json"]), "--out", str(tmp_path), "--name", "ab"])
    assert cli.main(args) == 0
    data = json.loads((tmp_path / "ab.json").read_text())
    assert data["summary"]["draft-chunked"]["0.1"]["contains"] == 0.5
    assert [src["command"] for src in data["sources"]] == ["specprefill eval --seed 0", "specprefill eval --seed 1"]
    assert "`specprefill eval --seed 1`" in (tmp_path / "ab.md").read_text()
    assert (tmp_path / "ab.png").exists()
    missing = parser.parse_args(["--merge", str(tmp_path / "nope.json"), "--out", str(tmp_path)])
    with pytest.raises(InvalidRequestError, match="cannot read"):
        cli.main(missing)


# ----------------------------------------------------------------------------- end to end on SmolLM2


@pytest.mark.slow
def test_eval_runs_end_to_end_on_smollm2(smollm, tmp_path):
    """The small CI configuration: one task, two keep rates, two methods, answers generated."""
    from specprefill_sdk.cli import eval as cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        [
            "--tasks",
            "niah_single",
            "--lengths",
            "512",
            "--samples",
            "1",
            "--keep-rates",
            "0.1",
            "0.5",
            "--methods",
            "draft-chunked",
            "recency",
            "--out",
            str(tmp_path),
            "--name",
            "ci",
            "--no-progress",
            "--device",
            "cpu",
            "--dtype",
            "auto",
            "--max-new-tokens",
            "12",
        ]
    )
    assert cli.main(args) == 0
    assert not (tmp_path / "ci.partial.json").exists()  # the per-sample checkpoint is gone once complete
    data = json.loads((tmp_path / "ci.json").read_text())
    records = data["records"]
    assert len(records) == 1 + 2 * 2  # the dense reference, then 2 methods x 2 rates
    for r in records:
        assert 0.0 <= r["recall"] <= 1.0
        assert isinstance(r["output"], str) and isinstance(r["contains"], bool)
        if r["method"] != FULL:
            assert r["keep_ratio"] <= r["keep_rate"] + 32 / r["n"] + 1e-6, r
    assert set(data["summary"]) == {FULL, "draft-chunked", "recency"}
    assert (tmp_path / "ci.png").exists() and (tmp_path / "ci.md").read_text().startswith("# Evaluation")
    # Draft attention must find the needle better than keeping the most recent tokens at 10%.
    s = data["summary"]
    assert s["draft-chunked"]["0.1"]["recall"] >= s["recency"]["0.1"]["recall"]


def test_policy_methods_are_named_described_and_validated(tmp_path):
    from specprefill_sdk.eval.methods import is_method, method_description, method_order, policy_of

    assert policy_of("auto") == "auto" and policy_of("policy:paper") == "paper" and policy_of("draft-chunked") is None
    assert policy_of("policy:") is None
    path = tmp_path / "mine.toml"
    path.write_text("[selector]\nkeep_rate = 0.25\n")
    assert policy_of(f"policy:{path}") == str(path) and is_method(f"policy:{path}")
    assert "the auto policy" in str(method_description("auto"))
    assert "keep 0.1" in str(method_description("policy:paper"))
    assert not is_method("policy:turbo") and not is_method("policy:" + str(tmp_path / "none.toml"))
    with pytest.raises(InvalidRequestError, match=r"policy:turbo.*policy:NAME") as info:
        EvalConfig(methods=("draft-chunked", "policy:turbo")).validate()
    assert info.value.param == "methods"
    EvalConfig(methods=("auto", "policy:paper", f"policy:{path}")).validate()
    assert method_order(["auto", "draft-chunked", "random"]) == ["draft-chunked", "random", "auto"]


def _with_policy(result: EvalResult, seed: int) -> EvalResult:
    """``result`` with an ``auto`` method measured once per sample, at the share it chose."""
    result.config = EvalConfig(
        **{**dataclasses.asdict(result.config), "methods": (*result.config.methods, "auto"), "seed": seed}
    )
    for task in result.config.tasks:
        result.records.append(
            {
                "id": f"{task}/1024/0",
                "task": task,
                "method": "auto",
                "keep_rate": POLICY,
                "keep_ratio": 0.2 if task == "niah_single" else 0.4,
                "recall": 1.0,
                "contains": seed == 0,
                "exact": False,
            }
        )
    return result


def test_a_policy_method_is_one_row_in_the_summary_report_and_merge(tmp_path):
    from specprefill_sdk.eval import merge_results

    result = _with_policy(_fake_result(), 0)
    summary = result.summary()
    assert set(summary["auto"]) == {POLICY}  # once, whatever the keep rates
    assert summary["auto"][POLICY]["keep_ratio"] == pytest.approx(0.3) and summary["auto"][POLICY]["count"] == 2
    assert result.summary(by_task=True)["qa_squad"]["auto"][POLICY]["keep_ratio"] == pytest.approx(0.4)
    paths = write_report(result, tmp_path, stem="pol")
    data = json.loads(paths["json"].read_text())
    assert data["summary"]["auto"] == {"policy": data["summary"]["auto"]["policy"]}
    assert data["summary_by_task"]["niah_single"]["auto"]["policy"]["keep_ratio"] == pytest.approx(0.2)
    md = paths["markdown"].read_text()
    assert "| auto | 30 | 100 | 100 | 0 |" in md  # kept share, recall, contains, exact
    assert "| auto | 20 | 100 | 100 | 0 |" in md  # the niah_single table
    assert not [line for line in md.splitlines() if line.startswith("| auto |") and "n/a" in line]
    assert "- `auto`: the auto policy" in md
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = load_result(paths["json"])
    assert again.summary() == summary
    merged = merge_results([again, _with_policy(_fake_result(), 1)])
    pooled = merged.summary()["auto"]
    assert set(pooled) == {POLICY} and pooled[POLICY]["count"] == 4 and pooled[POLICY]["contains"] == 0.5
    assert "| auto | 30 | 100 | 50 | 0 |" in markdown_report(merged)


@pytest.mark.slow
def test_policy_methods_run_once_with_what_users_get(smollm, tmp_path):
    """``policy:paper`` scores with draft-chunked's scorer (one pass) and keeps what draft-chunked keeps at
    the paper's rate; ``auto`` and ``policy:auto`` run once each, whatever the keep rates; --merge pools them."""
    from specprefill_sdk.cli import eval as cli
    from specprefill_sdk.policies import load_policy

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    common = ["--tasks", "niah_single", "--lengths", "512", "--samples", "1", "--keep-rates", "0.1", "0.3"]
    common += ["--methods", "draft-chunked", "policy:paper", "auto", "policy:auto", "--no-progress", "--device", "cpu"]
    common += ["--dtype", "auto", "--max-new-tokens", "4", "--out", str(tmp_path), "--no-plot"]
    for seed in (0, 1):
        assert cli.main(parser.parse_args([*common, "--seed", str(seed), "--name", f"s{seed}"])) == 0
    data = json.loads((tmp_path / "s0.json").read_text())
    by = {(r["method"], r["keep_rate"]): r for r in data["records"]}
    assert len(data["records"]) == 1 + 2 + 3  # dense, draft-chunked at 2 rates, 3 policy methods once each
    assert {rate for (m, rate) in by if m in ("policy:paper", "auto", "policy:auto")} == {POLICY}
    paper, chunked = by[("policy:paper", POLICY)], by[("draft-chunked", 0.1)]
    assert paper["kept"] == chunked["kept"] and paper["recall"] == chunked["recall"]
    assert paper["score_ms"] == chunked["score_ms"]  # the same scores: one pass for both
    # The prompt is shorter than auto's dense threshold: prefilled whole without the draft, as users get it.
    n = by[("auto", POLICY)]["n"]
    assert n < load_policy("auto").selector.dense_below_tokens
    for name in ("auto", "policy:auto"):
        r = by[(name, POLICY)]
        assert r["kept"] == n and r["score_ms"] is None and isinstance(r["output"], str)
        assert set(data["summary"][name]) == {POLICY}
    assert by[("auto", POLICY)]["output"] == by[(FULL, 1.0)]["output"]
    md = (tmp_path / "s0.md").read_text()
    assert sum(line.startswith("| auto |") for line in md.splitlines()) == 1
    merge = [str(tmp_path / "s0.json"), str(tmp_path / "s1.json"), "--out", str(tmp_path), "--name", "both"]
    assert cli.main(parser.parse_args(["--merge", *merge, "--no-plot"])) == 0
    both = json.loads((tmp_path / "both.json").read_text())
    assert both["summary"]["auto"]["policy"]["count"] == 2 and both["summary"]["draft-chunked"]["0.1"]["count"] == 2
    assert sum(line.startswith("| policy:paper |") for line in (tmp_path / "both.md").read_text().splitlines()) == 1


@pytest.mark.slow
def test_a_policy_file_scoring_with_its_own_settings_keeps_its_own_share(smollm, tmp_path):
    """A policy that compresses this prompt (dense_below_tokens = 0), scorer settings other than
    draft-chunked's: its own scorer, its adaptive share within its bounds."""
    from specprefill_sdk.eval import run_eval
    from specprefill_sdk.eval.methods import build_methods

    path = tmp_path / "wide.toml"
    path.write_text(
        "[scorer]\nlook_ahead = 2\npool_kernel = 5\n"
        "[selector]\nkind = 'adaptive'\ncoverage = 0.5\nmin_rate = 0.2\nmax_rate = 0.4\n"
        "dense_below_tokens = 0\nchunk_size = 8\n[protect]\nsink = 1\ntail = true\n"
    )
    cfg = EvalConfig(
        tasks=("niah_single",),
        lengths=(512,),
        samples=1,
        keep_rates=(0.1, 0.3),
        methods=("draft-chunked", f"policy:{path}"),
        generate=False,
    )
    result = run_eval(cfg, progress=False, target=smollm)
    (mine,) = [r for r in result.records if r["method"] == f"policy:{path}"]
    chunked = [r for r in result.records if r["method"] == "draft-chunked"]
    assert mine["keep_rate"] == POLICY and mine["score_ms"] is not None
    assert mine["score_ms"] is not None and chunked[0]["score_ms"] is not None
    methods = build_methods(["draft-chunked", "policy:paper", f"policy:{path}"], draft=smollm)
    assert methods[1].scorer is methods[0].scorer and methods[1].scorer_key == methods[0].scorer_key
    own = methods[2].scorer
    assert methods[2].scorer_key == "draft-la2-pool5" != methods[0].scorer_key
    assert (own.look_ahead, own.pool_kernel) == (2, 5) and own.loaded is smollm  # type: ignore[union-attr]
    assert 0.2 * mine["n"] - 8 <= mine["kept"] <= 0.4 * mine["n"] + 8


@pytest.mark.slow
def test_eval_is_deterministic_for_a_seed(smollm):
    from specprefill_sdk.eval import run_eval

    cfg = EvalConfig(
        tasks=("niah_multikey",),
        lengths=(512,),
        samples=1,
        keep_rates=(0.2,),
        methods=("draft-pooled", "draft-early", "draft-early-6", "random"),
        generate=False,
        seed=5,
    )
    seen: list[int] = []
    a = run_eval(cfg, progress=False, target=smollm, on_sample=lambda so_far: seen.append(len(so_far.records)))
    assert seen == [len(a.records)]  # one sample: one checkpoint, holding all of its records
    b = run_eval(cfg, progress=False, target=smollm)
    strip = [{k: v for k, v in r.items() if not k.endswith("_ms")} for r in a.records]
    assert strip == [{k: v for k, v in r.items() if not k.endswith("_ms")} for r in b.records]
    assert all(not math.isnan(r["recall"]) for r in a.records)
    assert {r["method"] for r in a.records} >= {"draft-early", "draft-early-6"}
    with pytest.raises(InvalidRequestError, match="has 30 layers"):
        run_eval(
            EvalConfig(tasks=cfg.tasks, lengths=cfg.lengths, samples=1, methods=("draft-early-31",)), target=smollm
        )


def test_no_dense_skips_only_the_full_answers(smollm):
    from specprefill_sdk.eval import merge_results, run_eval

    common = {"tasks": ("niah_single",), "lengths": (256,), "samples": 1, "keep_rates": (0.3,), "seed": 3}
    cfg = EvalConfig(methods=("recency",), max_new_tokens=4, **common)
    with_dense = run_eval(cfg, progress=False, target=smollm)
    without = run_eval(dataclasses.replace(cfg, dense=False), progress=False, target=smollm)
    assert [r["method"] for r in with_dense.records] == ["full", "recency"]
    assert [r["method"] for r in without.records] == ["recency"]
    strip = [{k: v for k, v in r.items() if not k.endswith("_ms")} for r in without.records]
    assert strip == [{k: v for k, v in r.items() if not k.endswith("_ms")} for r in with_dense.records[1:]]
    with pytest.raises(InvalidRequestError, match="differ in dense"):
        merge_results([with_dense, dataclasses.replace(without, config=dataclasses.replace(without.config, seed=4))])


@pytest.mark.slow
def test_new_scoring_methods_build_and_run_on_smollm2(smollm):
    from specprefill_sdk.eval import run_eval
    from specprefill_sdk.eval.methods import build_methods

    names = ("target-early-4-last-layer", "draft-early-4-mean", "draft-early-4", "draft-chunked-qmax")
    built = {m.name: m for m in build_methods(names, draft=smollm, target=smollm)}
    assert len({m.scorer_key for m in built.values()}) == 4  # each aggregation scores on its own
    early, qmax = built["target-early-4-last-layer"].scorer, built["draft-chunked-qmax"].scorer
    assert (early.layers, early.aggregation, early.look_ahead, early.pool_kernel) == (4, "last-layer", 1, 13)
    assert (qmax.queries, qmax.look_ahead, qmax.pool_kernel) == ("max", 8, 13)
    assert built["draft-early-4-mean"].scorer.aggregation == "mean"
    assert built["draft-early-4"].scorer.aggregation == "max"
    with pytest.raises(InvalidRequestError, match="need the target") as err:
        build_methods(["target-early-4"], draft=smollm)
    assert err.value.param == "target"
    cfg = EvalConfig(
        tasks=("niah_single",),
        lengths=(256,),
        samples=1,
        keep_rates=(0.3,),
        methods=names[:2] + names[3:],
        generate=False,
    )
    result = run_eval(cfg, progress=False, target=smollm)
    assert {r["method"] for r in result.records} >= set(cfg.methods)
    assert all(0 <= r["recall"] <= 1 for r in result.records)


@pytest.mark.slow
def test_llmlingua_selector_keeps_forced_tokens_and_aligns(smollm, tokenizer):
    pytest.importorskip("llmlingua")
    from specprefill_sdk.eval.lingua import LLMLinguaSelector
    from specprefill_sdk.prompt import build_prompt

    text = "The quick brown fox jumps over the lazy dog near the river bank. " * 6
    prompt = build_prompt(tokenizer, text)
    forced = np.zeros(prompt.n, dtype=bool)
    forced[0] = forced[-3:] = True
    lingua = LLMLinguaSelector(smollm)
    sel = lingua.select(prompt, context=(0, len(text)), rate=0.3, forced=forced)
    assert {0, prompt.n - 1} <= set(sel.indices)
    assert 3 < sel.kept < prompt.n
    assert lingua.last_match == 1.0
