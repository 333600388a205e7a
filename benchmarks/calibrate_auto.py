"""Calibrate the numbers of the ``auto`` policy (coverage, min_rate, min_tokens, max_rate) from measured accuracy.

What it does, in three steps:

1. **Accuracy targets (no model).** From the committed accuracy runs (``--accuracy``, by default
   ``benchmarks/results/quality_gpu_qwen_real{,_keep023}_{4k,8k,16k,32k}.json``: the real
   Qwen2.5-Coder 1.5B target with its 0.5B draft, methods ``full`` and ``draft-chunked`` at keep 0.1,
   0.2 and 0.3), per length L and over the tasks the dense target answers at all (mean ``contains``
   above 0; the others are listed as excluded), the mean accuracy of ``full`` and of
   ``draft-chunked`` at each keep share (each task weighted equally). ``s*(L)`` is the smallest keep
   share whose accuracy reaches ``--target`` (0.98) of dense, interpolated linearly between the
   measured shares (never below the smallest one); if no share reaches it, the largest, flagged.
   ``R*(L)`` is draft-chunked's mean evidence recall at ``s*(L)``, interpolated the same way: the
   recall that the measured accuracy needs.
2. **The grid (the draft model).** The same samples are rebuilt (same tasks, lengths, seeds and
   counts, sized by the target's tokenizer; only the tokenizer and the model configuration of the
   target are loaded) and checked against the accuracy records (every id and token count must
   match). Each prompt is scored once by the policy's own scorer (``--policy``, by default
   ``policies/auto.toml``); then each candidate of the grid (``--coverage`` x ``--min-rate`` x
   ``--min-tokens`` x ``--max-rate``) becomes the selector the policy builds with those numbers
   (`Policy.with_overrides` then `Policy.build_selector`), which selects through the library's
   compress step, and the kept share and the evidence recall (the evaluation's own
   `evidence_recall`) are recorded per sample. Selection always reads the float16 copy of the
   scores (scaled by their maximum, which changes neither the ranking nor the covered share), the
   one ``--scores-cache`` stores, so a re-run from the cache gives the same grid.
3. **The choice.** The candidate with the lowest mean kept share (lengths weighted equally) whose
   mean recall reaches ``R*(L)`` at every length and whose mean share stays under the cap
   (``--cap-short`` up to 4096 tokens, ``--cap-long`` above). Without a feasible one: the candidate
   with the largest worst-length recall margin among those within the caps (all of them, said so,
   if none is). Ties: the larger worst-length margin, then the larger coverage.

Recall and share are means over the tasks kept in step 1 (``share_all`` in the JSON covers every
task).

On the GPU (the GGUF files as in ``benchmarks/quality_gpu/README.md``; the defaults of ``--model``,
``--draft``, ``--tasks``, ``--lengths``, ``--samples``, ``--seeds`` and ``--dtype`` are read from the
accuracy files)::

    python benchmarks/calibrate_auto.py --model /tmp/qwen15.gguf --draft /tmp/qwen05.gguf \\
        --device cuda --scores-cache /tmp/auto_scores.pt --out benchmarks/results \\
        --write-policy policies/auto.toml

Again on a CPU from the cache (no draft), e.g. with another grid::

    python benchmarks/calibrate_auto.py --model /tmp/qwen15.gguf --scores-cache /tmp/auto_scores.pt \\
        --coverage 0.7 0.8 --out /tmp/calib

Writes ``NAME.json`` (configuration, environment, s*, R*, the per-length per-task table, the whole
grid, the choice and why) and ``NAME.md``; ``--write-policy PATH`` rewrites only the four numbers
under ``[selector]`` of that TOML file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import platform
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import RESULTS, ROOT, add_output_args, command_line, setup_logging, write_results

from specprefill_sdk.errors import InvalidRequestError

logger = logging.getLogger("benchmarks.calibrate_auto")

DEFAULT_ACCURACY = tuple(
    str(RESULTS / f"quality_gpu_qwen_real{part}_{size}.json")
    for part in ("", "_keep023")
    for size in ("4k", "8k", "16k", "32k")
)
DEFAULT_POLICY = str(ROOT / "policies" / "auto.toml")
#: the dense reference and the compared method of the accuracy files
FULL = "full"
METHOD = "draft-chunked"
#: the selector keys the calibration sets, in the order they are written
KEYS = ("coverage", "min_rate", "min_tokens", "max_rate")
#: prompts up to this many tokens (the requested length) fall under ``--cap-short``
SHORT_LENGTH = 4096
#: equal up to this (float noise) when ranking candidates
_EPS = 1e-9


# ----------------------------------------------------------------------------------------------
# step 1: accuracy targets


def read_accuracy(paths: Sequence[str | Path]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The shared configuration and all records of the accuracy files.

    The configuration: ``model``, ``draft``, ``tasks``, ``lengths`` (of every file), ``samples``
    (per seed), ``seeds`` and ``dtype``. Every record gets the ``seed`` its id names.

    Raises:
        InvalidRequestError: no files, a file that is not an evaluation result, or files that
            disagree on model, draft, tasks, seeds, samples per seed or dtype.
    """
    if not paths:
        raise InvalidRequestError("no accuracy files given", param="accuracy")
    config: dict[str, Any] | None = None
    lengths: set[int] = set()
    records: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise InvalidRequestError(f"cannot read accuracy file {path}: {exc}", param="accuracy") from exc
        if not isinstance(data, dict) or "config" not in data or "records" not in data:
            raise InvalidRequestError(f"{path} is not an evaluation result (config, records)", param="accuracy")
        cfg = data["config"]
        sources = data.get("sources") or [{"seed": cfg["seed"], "samples": cfg["samples"]}]
        counts = {int(s["samples"]) for s in sources}
        if len(counts) != 1:
            raise InvalidRequestError(
                f"{path}: its seeds have different sample counts {sorted(counts)}", param="accuracy"
            )
        this = {
            "model": cfg["model"],
            "draft": cfg.get("draft"),
            "tasks": list(cfg["tasks"]),
            "samples": counts.pop(),
            "seeds": sorted(int(s["seed"]) for s in sources),
            "dtype": cfg.get("dtype"),
        }
        if config is None:
            config = this
        for key, value in this.items():
            if config[key] != value:
                raise InvalidRequestError(
                    f"accuracy files disagree on {key}: {config[key]!r} and {value!r} ({path})", param="accuracy"
                )
        lengths.update(int(n) for n in cfg["lengths"])
        tagged = data.get("sources") is not None
        for r in data["records"]:
            seed = _seed_of(r["id"]) if tagged else int(cfg["seed"])
            records.append({**r, "id": r["id"] if tagged else f"{r['id']}@seed{seed}", "seed": seed})
    assert config is not None
    return {**config, "lengths": sorted(lengths)}, records


def _seed_of(record_id: str) -> int:
    match = re.search(r"@seed(\d+)$", record_id)
    if match is None:
        raise InvalidRequestError(f"record id {record_id!r} names no seed", param="accuracy")
    return int(match.group(1))


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def interpolate_share(points: Sequence[tuple[float, float, float]], target: float) -> tuple[float, float, bool]:
    """``(s*, R*, reached)`` from ``(share, accuracy, recall)`` points sorted by share.

    ``s*`` is the smallest share whose accuracy reaches ``target``, linear between the measured
    share below (which misses it) and the first that reaches it; the first measured share when that
    one already does. ``R*`` is the recall interpolated at ``s*``. If none reaches it: the largest
    share and its recall, ``reached`` False.
    """
    if not points:
        raise InvalidRequestError("no measured keep shares", param="accuracy")
    for i, (share, acc, recall) in enumerate(points):
        if acc >= target:
            if i == 0:
                return share, recall, True
            s0, a0, r0 = points[i - 1]
            t = (target - a0) / (acc - a0)
            return s0 + t * (share - s0), r0 + t * (recall - r0), True
    share, _, recall = points[-1]
    return share, recall, False


def accuracy_targets(records: Sequence[dict[str, Any]], lengths: Sequence[int], target: float) -> dict[str, Any]:
    """Step 1: per length, the included and excluded tasks, the accuracy table, ``s*`` and ``R*``."""
    out: dict[str, Any] = {}
    for length in lengths:
        rows = [r for r in records if int(r["length"]) == length]
        tasks = list(dict.fromkeys(r["task"] for r in rows))
        per_task: dict[str, Any] = {}
        for task in tasks:
            mine = [r for r in rows if r["task"] == task]
            full = [float(r["contains"]) for r in mine if r["method"] == FULL and r.get("contains") is not None]
            shares: dict[str, Any] = {}
            for rate in sorted({float(r["keep_rate"]) for r in mine if r["method"] == METHOD}):
                at = [r for r in mine if r["method"] == METHOD and float(r["keep_rate"]) == rate]
                judged = [float(r["contains"]) for r in at if r.get("contains") is not None]
                shares[f"{rate:g}"] = {
                    "contains": _mean(judged),
                    "recall": _mean([float(r["recall"]) for r in at]),
                    "count": len(at),
                }
            per_task[task] = {"full": _mean(full), "full_count": len(full), METHOD: shares}
        included = [t for t in tasks if per_task[t]["full"] > 0]
        excluded = [
            {
                "task": t,
                "reason": "no dense (full) records"
                if per_task[t]["full_count"] == 0
                else "the dense target never answers it (mean contains 0)",
            }
            for t in tasks
            if t not in included
        ]
        if not included:
            raise InvalidRequestError(f"length {length}: the dense target answers no task", param="accuracy")
        rates = sorted(
            {float(s) for t in included for s in per_task[t][METHOD]},
        )
        missing = [(t, r) for t in included for r in rates if f"{r:g}" not in per_task[t][METHOD]]
        if missing:
            raise InvalidRequestError(f"length {length}: no {METHOD} records for {missing}", param="accuracy")
        full_acc = _mean([per_task[t]["full"] for t in included])
        table = {
            f"{r:g}": {
                "contains": _mean([per_task[t][METHOD][f"{r:g}"]["contains"] for t in included]),
                "recall": _mean([per_task[t][METHOD][f"{r:g}"]["recall"] for t in included]),
            }
            for r in rates
        }
        goal = target * full_acc
        s_star, r_star, reached = interpolate_share(
            [(r, table[f"{r:g}"]["contains"], table[f"{r:g}"]["recall"]) for r in rates], goal
        )
        out[str(length)] = {
            "included": included,
            "excluded": excluded,
            "full": full_acc,
            "goal": goal,
            METHOD: table,
            "s_star": s_star,
            "r_star": r_star,
            "reached": reached,
            "per_task": per_task,
        }
    return out


# ----------------------------------------------------------------------------------------------
# step 2: the samples, the scores and the grid


def target_tokenizer(model: str) -> tuple[Any, int]:
    """The target's tokenizer and context length, without loading its weights (a GGUF is converted once)."""
    from transformers import AutoConfig, AutoTokenizer

    from specprefill_sdk.models import resolve_model_path, text_config

    source = resolve_model_path(model, progress=True)
    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    config = AutoConfig.from_pretrained(str(source), local_files_only=True)
    # the same context length as `LoadedModel.max_context`, which sizes the evaluation's prompts
    max_context = int(getattr(text_config(config), "max_position_embeddings", 0) or 2048)
    return tokenizer, max_context


def rebuild_cases(
    tokenizer: Any, max_context: int, tasks: Sequence[str], lengths: Sequence[int], samples: int, seeds: Sequence[int]
) -> list[Any]:
    """The evaluation's cases (prompt, evidence mask) for every seed, ids tagged ``@seedN`` as merged runs are."""
    from specprefill_sdk.eval.harness import EvalConfig, _build_case, _make_samples

    cases = []
    for seed in seeds:
        config = EvalConfig(tasks=tuple(tasks), lengths=tuple(lengths), samples=samples, seed=seed)
        config.validate()
        for sample in _make_samples(config, tokenizer, max_context):
            case = _build_case(tokenizer, sample)
            cases.append((f"{sample.sample_id}@seed{seed}", case))
    return cases


def check_cases(cases: Sequence[tuple[str, Any]], records: Sequence[dict[str, Any]]) -> None:
    """Every rebuilt sample is one of the accuracy files' (same id, same token count) and none is missing.

    Raises:
        InvalidRequestError: the samples differ (another tokenizer, task text or configuration).
    """
    expected: dict[str, int] = {}
    for r in records:
        if expected.setdefault(r["id"], int(r["n"])) != int(r["n"]):
            raise InvalidRequestError(f"the accuracy files give {r['id']} two token counts", param="accuracy")
    built = {sid: case.prompt.n for sid, case in cases}
    problems = [f"{sid}: not in the accuracy files" for sid in built if sid not in expected]
    problems += [
        f"{sid}: {built[sid]} tokens here, {expected[sid]} in the accuracy files"
        for sid in built
        if sid in expected and built[sid] != expected[sid]
    ]
    problems += [f"{sid}: in the accuracy files, not rebuilt" for sid in expected if sid not in built]
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise InvalidRequestError(
            "the rebuilt samples differ from the accuracy files' (is --model the same target tokenizer, and "
            f"the task text the same?): {shown}",
            param="model",
        )


def to_half(values: Any) -> Any:
    """The float16 copy of a sample's scores that selection reads, scaled so the largest is 1."""
    import torch

    v = values.detach().float().cpu()
    finite = torch.isfinite(v)
    top = float(v[finite].abs().max()) if bool(finite.any()) else 0.0
    return (v / top if top > 0 else v).to(torch.float16)


def scorer_settings(policy: Any) -> dict[str, Any]:
    """What the scores depend on besides the draft: the policy's scorer section."""
    return dict(policy.scorer.model_dump())


def load_scores(path: Path, cases: Sequence[tuple[str, Any]], expect: dict[str, Any]) -> dict[str, Any] | None:
    """The cached scores when ``path`` holds every case's, made with the same scorer and draft; else None."""
    import torch

    if not path.exists():
        return None
    data = torch.load(path, weights_only=False)
    if data.get("scorer") != expect["scorer"] or data.get("draft") != expect["draft"]:
        raise InvalidRequestError(
            f"{path} holds scores of another scorer or draft ({data.get('scorer')}, {data.get('draft')}); "
            "delete it or name another --scores-cache",
            param="scores_cache",
        )
    scores = data["scores"]
    missing = [sid for sid, case in cases if sid not in scores or len(scores[sid]) != case.prompt.n]
    if missing:
        raise InvalidRequestError(
            f"{path} lacks the scores of {len(missing)} samples (e.g. {missing[0]}); delete it to rescore",
            param="scores_cache",
        )
    logger.info("scores of %d samples read from %s", len(cases), path)
    return {sid: scores[sid] for sid, _ in cases}


def score_cases(cases: Sequence[tuple[str, Any]], scorer: Any) -> dict[str, Any]:
    """Each prompt scored once by ``scorer``; the float16 copies (`to_half`)."""
    from rich.progress import track

    out = {}
    for sid, case in track(cases, description="scoring"):
        out[sid] = to_half(scorer.score(case.prompt).values)
    return out


def candidates(grid: dict[str, Sequence[float]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values that is a valid selector (``min_rate <= max_rate``)."""
    out = []
    for combo in itertools.product(*(grid[k] for k in KEYS)):
        values = dict(zip(KEYS, combo, strict=True))
        if values["min_rate"] <= values["max_rate"]:
            out.append(values)
    return out


def evaluate_grid(
    cases: Sequence[tuple[str, Any]],
    scores: dict[str, Any],
    policy: Any,
    grid: Sequence[dict[str, Any]],
    *,
    progress: bool = True,
    workers: int = 1,
) -> list[dict[str, Any]]:
    """Per sample and candidate: the kept share and the evidence recall of the policy's selector.

    ``workers`` > 1 spreads the prompts over that many processes (each selection runs on one core);
    the rows come back in the order of ``cases`` either way.
    """
    from rich.progress import Progress

    done: dict[str, list[dict[str, Any]]] = {}
    with Progress(disable=not progress) as bar:
        task = bar.add_task("selecting", total=len(cases))
        if workers <= 1:
            _init_worker(policy, grid, threads=False)
            for sid, case in cases:
                done[sid] = _select_prompt(sid, case, scores[sid])
                bar.advance(task)
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            # spawn, not fork: the parent may hold a CUDA context, which a forked child cannot use
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(
                workers, mp_context=context, initializer=_init_worker, initargs=(policy, grid)
            ) as pool:
                futures = {pool.submit(_select_prompt, sid, case, scores[sid]): sid for sid, case in cases}
                for future in as_completed(futures):
                    done[futures[future]] = future.result()
                    bar.advance(task)
    return [row for sid, _ in cases for row in done[sid]]


#: the selectors of the grid, built once per process by `_init_worker`
_SELECTORS: list[Any] = []
_SCORER_NAME = ""


def _init_worker(policy: Any, grid: Sequence[dict[str, Any]], threads: bool = True) -> None:
    global _SCORER_NAME
    if threads:
        import torch

        torch.set_num_threads(1)  # one selection per process: the processes share the cores
    _SELECTORS[:] = [policy.with_overrides(**values).build_selector() for values in grid]
    _SCORER_NAME = policy.scorer.kind


def _select_prompt(sid: str, case: Any, values: Any) -> list[dict[str, Any]]:
    """Every candidate's selection of one prompt from its (float16) scores: share and evidence recall."""
    from specprefill_sdk.eval.metrics import evidence_recall
    from specprefill_sdk.pipeline import compress_prompts
    from specprefill_sdk.types import TokenScores

    given = [TokenScores(values=values.float(), scorer=_SCORER_NAME)]
    rows = []
    for index, selector in enumerate(_SELECTORS):
        # the compress step that the evaluation and the pipeline run, with the scores given
        (comp,) = compress_prompts(
            [case.prompt], _NoScorer(), selector, fallback_on_scorer_error=False, score=_given(given)
        )
        rows.append(
            {
                "candidate": index,
                "id": sid,
                "task": case.sample.task,
                "length": case.sample.length,
                "share": comp.selection.keep_ratio,
                "recall": evidence_recall(comp.selection, case.evidence),
            }
        )
    return rows


def _given(scores: list[Any]) -> Any:
    """The ``score`` callback of `compress_prompts` that hands over ``scores``."""

    def score(indices: list[int]) -> list[Any]:
        return scores

    return score


class _NoScorer:
    """Stands in for the scorer in `compress_prompts`, which receives the scores ready-made."""

    name = "cached-scores"

    def score(self, prompt: Any) -> Any:
        raise AssertionError("the scores are given")

    def score_batch(self, prompts: Sequence[Any]) -> list[Any]:
        raise AssertionError("the scores are given")


def summarise_grid(
    grid: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], targets: dict[str, Any]
) -> list[dict[str, Any]]:
    """Per candidate and length: mean share and recall over the included tasks (tasks weighted equally)."""
    by: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["candidate"], int(r["length"]), r["task"]), []).append(r)
    out = []
    for index, values in enumerate(grid):
        lengths: dict[str, Any] = {}
        for length, target in targets.items():
            tasks = [t for t in target["per_task"] if (index, int(length), t) in by]
            included = [t for t in target["included"] if t in tasks]
            lengths[length] = {
                "share": _mean([_mean([r["share"] for r in by[(index, int(length), t)]]) for t in included]),
                "recall": _mean([_mean([r["recall"] for r in by[(index, int(length), t)]]) for t in included]),
                "share_all": _mean([_mean([r["share"] for r in by[(index, int(length), t)]]) for t in tasks]),
            }
        out.append({**values, "lengths": lengths})
    return out


# ----------------------------------------------------------------------------------------------
# step 3: the choice


def cap_for(length: int, cap_short: float, cap_long: float) -> float:
    """The share cap of a prompt length: ``cap_short`` up to `SHORT_LENGTH` tokens, else ``cap_long``."""
    return cap_short if length <= SHORT_LENGTH else cap_long


def assess(
    summary: Sequence[dict[str, Any]], r_star: dict[str, float], cap_short: float, cap_long: float
) -> list[dict[str, Any]]:
    """Each candidate with its mean share, worst recall margin and whether it meets R* and the caps."""
    out = []
    for c in summary:
        per = c["lengths"]
        margins = {L: per[L]["recall"] - r_star[L] for L in r_star}
        out.append(
            {
                **c,
                "mean_share": _mean([per[L]["share"] for L in r_star]),
                "min_margin": min(margins.values()),
                "within_caps": all(per[L]["share"] <= cap_for(int(L), cap_short, cap_long) + _EPS for L in r_star),
                "meets_recall": all(m >= -_EPS for m in margins.values()),
            }
        )
    return out


def _q(x: float) -> float:
    return round(x / _EPS) * _EPS


def rank(assessed: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Best first: feasible ones by lowest mean share, then the rest within the caps, then the others,
    each of the last two by largest worst margin; ties by larger margin, then larger coverage."""

    def key(c: dict[str, Any]) -> tuple[Any, ...]:
        feasible = c["within_caps"] and c["meets_recall"]
        group = 0 if feasible else 1 if c["within_caps"] else 2
        primary = _q(c["mean_share"]) if feasible else -_q(c["min_margin"])
        secondary = -_q(c["min_margin"]) if feasible else _q(c["mean_share"])
        return (group, primary, secondary, -c["coverage"])

    return sorted(assessed, key=key)


def choose(assessed: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """The chosen candidate and why (`rank`'s first, with the rule that picked it)."""
    if not assessed:
        raise InvalidRequestError("the grid is empty", param="coverage")
    best = rank(assessed)[0]
    if best["within_caps"] and best["meets_recall"]:
        why = (
            "the lowest mean kept share among the candidates that reach R*(L) and stay within the caps at every length"
        )
    elif best["within_caps"]:
        why = (
            "no candidate reaches R*(L) at every length within the caps: the largest worst-length recall "
            "margin among those within the caps"
        )
    else:
        why = "no candidate stays within the caps at every length: the largest worst-length recall margin, caps ignored"
    return best, why


# ----------------------------------------------------------------------------------------------
# the policy file


def _format(key: str, value: float) -> str:
    return str(int(value)) if key == "min_tokens" else repr(float(value))


def rewrite_policy(text: str, values: dict[str, Any]) -> str:
    """``text`` (a policy TOML) with the numbers of ``values`` set under ``[selector]``, the rest untouched.

    Raises:
        InvalidRequestError: a key that is not under ``[selector]`` exactly once.
    """
    lines = text.splitlines(keepends=True)
    section = None
    found: dict[str, list[int]] = {k: [] for k in values}
    pattern = re.compile(r"^(\s*)([A-Za-z_]+)(\s*=\s*)([^#\s]+)(.*)$", re.DOTALL)
    for i, line in enumerate(lines):
        header = re.match(r"^\s*\[([^\]]+)\]", line)
        if header:
            section = header.group(1).strip()
            continue
        match = pattern.match(line)
        if section == "selector" and match and match.group(2) in values:
            found[match.group(2)].append(i)
    for key, where in found.items():
        if len(where) != 1:
            raise InvalidRequestError(
                f"{key} appears {len(where)} times under [selector] of the policy file; expected once", param=key
            )
        match = pattern.match(lines[where[0]])
        assert match is not None
        indent, name, eq, _, rest = match.groups()
        lines[where[0]] = f"{indent}{name}{eq}{_format(key, values[key])}{rest}"
    return "".join(lines)


def write_policy(path: Path, values: dict[str, Any]) -> str:
    """Rewrite the policy file at ``path`` (`rewrite_policy`), check that it still loads, return the new text."""
    from specprefill_sdk.policies import load_policy

    text = rewrite_policy(path.read_text(), values)
    path.write_text(text)
    load_policy(path)
    return text


# ----------------------------------------------------------------------------------------------
# the report


def markdown(result: dict[str, Any]) -> str:
    """The s*/R* table, the chosen numbers and the top 10 candidates."""
    lengths = list(result["targets"])
    lines = [
        "# Calibration of the auto policy",
        "",
        f"`{result['command']}`",
        "",
        f"Target {result['config']['model']}, draft {result['config']['draft']}; {result['config']['samples']} "
        f"samples per task, length and seed (seeds {result['config']['seeds']}); policy {result['config']['policy']}. "
        f"s* is the smallest {METHOD} keep share reaching {result['config']['target']:g} of dense accuracy, "
        "R* its evidence recall.",
        "",
        "| length | tasks | dense | "
        + " | ".join(f"keep {s}" for s in result["targets"][lengths[0]][METHOD])
        + " | s* | R* |",
        "|---:|---|---:|" + "---:|" * len(result["targets"][lengths[0]][METHOD]) + "---:|---:|",
    ]
    for L in lengths:
        t = result["targets"][L]
        flag = "" if t["reached"] else " (not reached)"
        cells = " | ".join(f"{v['contains']:.3f}" for v in t[METHOD].values())
        lines.append(
            f"| {L} | {len(t['included'])} | {t['full']:.3f} | {cells} | {t['s_star']:.3f}{flag} | {t['r_star']:.3f} |"
        )
    excluded = [f"{e['task']} at {L} ({e['reason']})" for L in lengths for e in result["targets"][L]["excluded"]]
    lines += ["", "Excluded: " + ("; ".join(excluded) if excluded else "none") + ".", ""]
    c = result["choice"]
    lines += [
        "## Chosen",
        "",
        ", ".join(f"{k} = {_format(k, c[k])}" for k in KEYS) + f": {c['why']}.",
        "",
        "## Top 10 candidates",
        "",
        "| coverage | min_rate | min_tokens | max_rate | mean share | min margin | feasible | "
        + " | ".join(f"{L} share/recall" for L in lengths)
        + " |",
        "|---:|---:|---:|---:|---:|---:|---|" + "---:|" * len(lengths),
    ]
    for cand in result["top"]:
        per = " | ".join(f"{cand['lengths'][L]['share']:.3f} / {cand['lengths'][L]['recall']:.3f}" for L in lengths)
        feasible = "yes" if cand["within_caps"] and cand["meets_recall"] else "no"
        lines.append(
            f"| {cand['coverage']:g} | {cand['min_rate']:g} | {cand['min_tokens']} | {cand['max_rate']:g} | "
            f"{cand['mean_share']:.3f} | {cand['min_margin']:+.3f} | {feasible} | {per} |"
        )
    return "\n".join(lines) + "\n"


def environment(device: str) -> dict[str, Any]:
    """Versions and the machine."""
    import os

    import torch
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_count": os.cpu_count(),
        "device": device,
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


# ----------------------------------------------------------------------------------------------


def _resolve(given: Any, from_files: Any, name: str) -> Any:
    if given is None:
        return from_files
    if given != from_files:
        raise InvalidRequestError(
            f"--{name} {given} differs from the accuracy files' {from_files}: the calibration must use their samples",
            param=name.replace("-", "_"),
        )
    return given


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the calibration (the command line); returns the result written."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accuracy", nargs="+", default=list(DEFAULT_ACCURACY), help="accuracy results (JSON)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="the policy whose scorer and selector are used")
    parser.add_argument("--model", default=None, help="the target (its tokenizer sizes the samples)")
    parser.add_argument("--draft", default=None, help="the draft that scores")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--tasks", nargs="+", default=None)
    parser.add_argument("--lengths", nargs="+", type=int, default=None)
    parser.add_argument("--samples", type=int, default=None, help="samples per task, length and seed")
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--target", type=float, default=0.98, help="share of dense accuracy to reach")
    parser.add_argument("--coverage", nargs="+", type=float, default=[0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
    parser.add_argument("--min-rate", nargs="+", type=float, default=[0.05, 0.08, 0.1, 0.12])
    parser.add_argument("--min-tokens", nargs="+", type=int, default=[0, 512, 768, 1024, 1536, 2048])
    parser.add_argument("--max-rate", nargs="+", type=float, default=[0.2, 0.3, 0.4])
    parser.add_argument("--cap-short", type=float, default=0.30, help=f"share cap up to {SHORT_LENGTH} tokens")
    parser.add_argument("--cap-long", type=float, default=0.15, help=f"share cap above {SHORT_LENGTH} tokens")
    parser.add_argument("--scores-cache", type=Path, default=None, help="float16 scores: reused when present")
    parser.add_argument("--write-policy", type=Path, default=None, help="rewrite this policy file's four numbers")
    parser.add_argument(
        "--workers", type=int, default=None, help="processes that select (default: the CPU count, at most 16)"
    )
    parser.add_argument("--no-progress", action="store_true")
    add_output_args(parser, "auto_calibration")
    args = parser.parse_args(argv)
    setup_logging()
    started = time.perf_counter()
    if not 0 < args.target <= 1:
        raise InvalidRequestError(f"--target {args.target} must lie in (0, 1]", param="target")

    from specprefill_sdk.policies import load_policy

    config, records = read_accuracy(args.accuracy)
    tasks = _resolve(args.tasks, config["tasks"], "tasks")
    lengths = _resolve(sorted(args.lengths) if args.lengths else None, config["lengths"], "lengths")
    samples = _resolve(args.samples, config["samples"], "samples")
    seeds = _resolve(sorted(args.seeds) if args.seeds else None, config["seeds"], "seeds")
    dtype = _resolve(args.dtype, config["dtype"], "dtype")
    model = args.model or config["model"]
    draft = args.draft or config["draft"] or model
    for name, given, recorded in (("model", model, config["model"]), ("draft", draft, config["draft"] or model)):
        if given != recorded:
            # paths differ between machines; the id and token count check below catches another tokenizer
            logger.warning("--%s %s is not the accuracy files' %s", name, given, recorded)

    targets = accuracy_targets(records, lengths, args.target)
    for L, t in targets.items():
        logger.info(
            "length %s: dense %.3f, s* %.3f%s, R* %.3f; excluded %s",
            L,
            t["full"],
            t["s_star"],
            "" if t["reached"] else " (not reached)",
            t["r_star"],
            [e["task"] for e in t["excluded"]] or "none",
        )

    policy = load_policy(args.policy)
    grid = candidates(
        {"coverage": args.coverage, "min_rate": args.min_rate, "min_tokens": args.min_tokens, "max_rate": args.max_rate}
    )
    for values in grid:  # refuse a bad value before any model runs
        policy.with_overrides(**values).build_selector()

    tokenizer, max_context = target_tokenizer(model)
    cases = rebuild_cases(tokenizer, max_context, tasks, lengths, samples, seeds)
    check_cases(cases, records)
    logger.info("%d samples rebuilt; ids and token counts match the accuracy files", len(cases))

    expect = {"scorer": scorer_settings(policy), "draft": draft}
    scores = load_scores(args.scores_cache, cases, expect) if args.scores_cache else None
    if scores is None:
        import torch

        scorer = policy.build_scorer(draft, device=args.device, dtype=dtype, target_tokenizer=tokenizer)
        with torch.inference_mode():
            scores = score_cases(cases, scorer)
        if args.scores_cache:
            args.scores_cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save({**expect, "scores": scores}, args.scores_cache)
            logger.info("scores saved to %s", args.scores_cache)

    import os

    workers = args.workers if args.workers is not None else min(16, os.cpu_count() or 1)
    if workers < 1:
        raise InvalidRequestError(f"--workers {workers} must be >= 1", param="workers")
    rows = evaluate_grid(cases, scores, policy, grid, progress=not args.no_progress, workers=workers)
    summary = summarise_grid(grid, rows, targets)
    assessed = assess(summary, {L: t["r_star"] for L, t in targets.items()}, args.cap_short, args.cap_long)
    best, why = choose(assessed)
    chosen = {k: best[k] for k in KEYS}
    result = {
        "command": command_line(),
        "config": {
            "accuracy": [str(p) for p in args.accuracy],
            "policy": str(args.policy),
            "model": model,
            "draft": draft,
            "device": args.device,
            "dtype": dtype,
            "tasks": list(tasks),
            "lengths": list(lengths),
            "samples": samples,
            "seeds": list(seeds),
            "target": args.target,
            "cap_short": args.cap_short,
            "cap_long": args.cap_long,
            "short_length": SHORT_LENGTH,
            "grid": {
                "coverage": args.coverage,
                "min_rate": args.min_rate,
                "min_tokens": args.min_tokens,
                "max_rate": args.max_rate,
            },
            "scores_cache": None if args.scores_cache is None else str(args.scores_cache),
            "workers": workers,
        },
        "environment": environment(args.device),
        "elapsed_s": 0.0,
        "s_star": {L: t["s_star"] for L, t in targets.items()},
        "r_star": {L: t["r_star"] for L, t in targets.items()},
        "targets": targets,
        "choice": {
            **chosen,
            "why": why,
            "lengths": best["lengths"],
            "mean_share": best["mean_share"],
            "min_margin": best["min_margin"],
            "feasible": best["within_caps"] and best["meets_recall"],
        },
        "feasible_count": sum(1 for c in assessed if c["within_caps"] and c["meets_recall"]),
        "top": rank(assessed)[:10],
        "grid": assessed,
    }
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(write_results(args.out, args.name, result, markdown))
    if args.write_policy is not None:
        write_policy(args.write_policy, chosen)
        print(f"{args.write_policy}: " + ", ".join(f"{k} = {_format(k, chosen[k])}" for k in KEYS))
    return result


if __name__ == "__main__":
    main()
