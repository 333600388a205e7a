"""Evidence recall by scoring depth and layer aggregation, from recall-only evaluation files.

Reads ``specprefill eval --no-generate`` results (complete or ``.partial.json`` files of an
interrupted run) whose methods are ``draft-early-N[-AGG]`` and ``target-early-N[-AGG]``, and writes one
table and one plot: the share of the evidence tokens kept at keep 0.1 when the first N layers score,
for each way of reducing their attention (``max`` over layers and heads, ``mean``, ``content-mean``,
``last-layer``: only layer N votes). Only samples that every method scored count, so each cell is
over the same prompts.

Usage::

    python benchmarks/quality_gpu/depth.py RAW_FILES... --out benchmarks/results --name quality_gpu_depth_recall
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import save_figure, write_json

_NAME = re.compile(r"(draft|target)-early-(\d+)(?:-(mean|content-mean|last-layer))?")
AGGREGATIONS = ("max", "mean", "content-mean", "last-layer")


def load(paths: list[Path]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records of every file (sample ids tagged with the file's seed) and the first file's config."""
    records: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    for path in paths:
        data = json.loads(path.read_text())
        config = config or data["config"]
        seed = data["config"]["seed"]
        records += [{**r, "sample": f"{r['id']}@seed{seed}"} for r in data["records"]]
    return records, config


def table(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (model, depth, aggregation): mean recall over the samples every method scored, and per task."""
    methods = {r["method"] for r in records if _NAME.fullmatch(r["method"])}
    by_method: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        if r["method"] in methods:
            by_method[r["method"]][r["sample"]] = r
    # sorted, so that the sums and the task counts come out in the same order on every run
    common = sorted(set.intersection(*(set(v) for v in by_method.values()))) if by_method else []
    rows = []
    for method, samples in by_method.items():
        match = _NAME.fullmatch(method)
        assert match is not None
        per_task: dict[str, list[float]] = defaultdict(list)
        for sample in common:
            per_task[samples[sample]["task"]].append(float(samples[sample]["recall"]))
        values = [v for vs in per_task.values() for v in vs]
        rows.append(
            {
                "method": method,
                "model": match.group(1),
                "layers": int(match.group(2)),
                "aggregation": match.group(3) or "max",
                "recall": sum(values) / len(values) if values else None,
                "per_task": {t: sum(v) / len(v) for t, v in sorted(per_task.items())},
                "samples": len(values),
            }
        )
    rows.sort(key=lambda r: (r["model"], r["layers"], AGGREGATIONS.index(r["aggregation"])))
    tasks: dict[str, int] = defaultdict(int)
    for sample in common:
        tasks[next(iter(by_method.values()))[sample]["task"]] += 1
    return {"rows": rows, "samples": len(common), "samples_per_task": dict(sorted(tasks.items()))}


def markdown(result: dict[str, Any], command: str) -> str:
    lines = [
        "# Evidence recall by scoring depth and aggregation (keep 0.1)",
        "",
        f"- command: `{command}`",
        f"- model pair: {result['config']['model']} (target) / {result['config']['draft']} (draft); "
        f"length {result['config']['lengths']}; seeds of the files: {result['seeds']}",
        f"- {result['samples']} samples scored by every method: "
        + ", ".join(f"{t} {n}" for t, n in result["samples_per_task"].items()),
        "- recall: the share of the evidence tokens that the selection keeps (look-ahead 1, pool 13, chunks of 32); "
        "random selection keeps about 0.1",
        "",
    ]
    for model in ("draft", "target"):
        rows = [r for r in result["rows"] if r["model"] == model]
        if not rows:
            continue
        depths = sorted({r["layers"] for r in rows})
        lines += [f"## the {model}'s first N layers", "", "| aggregation | " + " | ".join(map(str, depths)) + " |"]
        lines.append("|---|" + "---:|" * len(depths))
        for agg in AGGREGATIONS:
            cells = {r["layers"]: r["recall"] for r in rows if r["aggregation"] == agg}
            if cells:
                lines.append(f"| {agg} | " + " | ".join(f"{cells[d]:.3f}" if d in cells else "" for d in depths) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in ("draft", "target") if any(r["model"] == m for r in result["rows"])]
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for agg in AGGREGATIONS:
            pts = sorted(
                (r["layers"], r["recall"]) for r in result["rows"] if r["model"] == model and r["aggregation"] == agg
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=agg)
        ax.axhline(0.1, color="gray", lw=0.8, ls=":", label="random (keep 0.1)")
        ax.set_title(f"the {model}'s first N layers score")
        ax.set_xlabel("N (layers that run)")
        ax.set_ylabel("evidence recall at keep 0.1")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="recall-only eval result files (.json or .partial.json)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--name", default="quality_gpu_depth_recall")
    args = parser.parse_args(argv)
    records, config = load(args.files)
    result = table(records)
    if not result["rows"]:
        parser.error("no draft-early-N or target-early-N records in these files")
    result["config"] = {k: config.get(k) for k in ("model", "draft", "lengths", "keep_rates", "tasks")}
    result["seeds"] = sorted({json.loads(p.read_text())["config"]["seed"] for p in args.files})
    command = "python benchmarks/quality_gpu/depth.py " + " ".join(str(p) for p in args.files)
    write_json(args.out, args.name, {**result, "command": command})
    (args.out / f"{args.name}.md").write_text(markdown(result, command) + "\n")
    plot(result, args.out / f"{args.name}.png")
    print(f"wrote {args.out / args.name}.json / .md / .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
