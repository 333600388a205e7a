"""Accuracy tables, targets and the speed/quality frontier of a real-weight GPU evaluation.

Reads the raw result files of one evaluation run on the device (``specprefill eval`` JSON, one file
per (length, seed, group of tasks or methods), all on the same samples of each seed) and joins their
records by sample: every method is compared with the dense target on the very samples it saw.

- Accuracy is ``contains`` (the reference answer appears in the output), per task, length and method.
- A task on which the dense target scores 0 at a length is shown but left out of that length's means:
  no selection can keep an answer the target never gives.
- ``relative`` = a method's mean accuracy over the kept tasks divided by dense's.
- With ``--ttft FILE`` (a ``benchmarks/ttft_gpu.py`` result on the same model pair and GPU, default
  mode), each method gets its measured TTFT speedup against dense at its cell (keep share, look-ahead,
  draft depth); a policy that picks its share per prompt gets the speedup interpolated at its mean kept
  share between the measured shares, and the table says so. One frontier plot per length.
- A policy method's cost cell is not in its name (``auto`` is whatever ``policies/auto.toml`` held when
  the run was made, ``policy:PATH`` any file), so it is given: ``--cost METHOD=LOOKAHEAD:LAYERS``
  (``LAYERS`` a count or ``all``); a policy without one gets no speedup.
- ``--label OLD=NEW`` renames a method as it is read (a policy file's path, or a default that has
  changed since the run), before ``--cost`` applies.

Usage::

    python benchmarks/quality_gpu/report.py RAW_DIR --ttft ttft_gpu_h200_real_default.json \\
        --cost auto=8:all --out benchmarks/results --name quality_gpu_qwen_real_v2
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import save_figure, write_json

#: methods whose TTFT is the paper cell's: they change only how the kept tokens are chosen
SAME_COST_AS_CHUNKED = ("draft-chunked", "draft-structured", "draft-chunked-qmax")
DEFAULT_POLICY = "auto"
TARGET_PAPER = 0.95
TARGET_DEFAULT = 0.98


def rate_label(record: dict[str, Any]) -> str:
    """The keep column of a record: its fixed keep rate, or ``policy`` for a method that picks its own."""
    rate = record.get("keep_rate")
    if rate is None or isinstance(rate, str):
        return "policy"
    return f"{float(rate):g}"


def load_records(raw: Path, labels: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Every record of every result file under ``raw``, with the file's seed folded into the sample id.

    ``labels`` renames methods (old name -> new name) as they are read.
    """
    labels = labels or {}
    records: list[dict[str, Any]] = []
    files: list[str] = []
    for path in sorted(raw.glob("*.json")):
        if path.name.endswith(".partial.json"):
            continue
        data = json.loads(path.read_text())
        if "records" not in data or "config" not in data:
            continue
        seed = data["config"]["seed"]
        files.append(path.name)
        for r in data["records"]:
            # a merged file's ids already carry their seed (``...@seed1``)
            sample = r["id"] if "@seed" in r["id"] else f"{r['id']}@seed{seed}"
            records.append({**r, "sample": sample, "method": labels.get(r["method"], r["method"])})
    return records, files


def dedupe(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (sample, method, keep): the dense row ran in several files on the same samples."""
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in records:
        seen.setdefault((r["sample"], r["method"], rate_label(r)), r)
    return list(seen.values())


def tabulate(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per length: tasks, per (method, keep) the per-task accuracy, recall, kept share and counts."""
    by_length: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_length[int(r["length"])].append(r)
    out: dict[str, Any] = {}
    for length, rows in sorted(by_length.items()):
        tasks = sorted({r["task"] for r in rows}, key=_task_order)
        cells: dict[str, dict[str, Any]] = {}
        for r in rows:
            key = f"{r['method']}@{rate_label(r)}"
            cell = cells.setdefault(key, {"method": r["method"], "keep": rate_label(r), "tasks": {}})
            t = cell["tasks"].setdefault(r["task"], {"contains": [], "recall": [], "keep_ratio": [], "samples": []})
            t["contains"].append(1.0 if r.get("contains") else 0.0)
            t["recall"].append(float(r["recall"]) if r.get("recall") is not None else math.nan)
            t["keep_ratio"].append(float(r["keep_ratio"]))
            t["samples"].append(r["sample"])
        for cell in cells.values():
            cell["shares"] = {t: list(d["keep_ratio"]) for t, d in cell["tasks"].items()}
            cell["seen"] = {t: list(d["samples"]) for t, d in cell["tasks"].items()}
            cell["per_task"] = {
                t: {k: _mean(v) for k, v in d.items() if k != "samples"} | {"count": len(d["contains"])}
                for t, d in cell.pop("tasks").items()
            }
        dense = cells.get("full@1")
        answered = [t for t in tasks if dense and _mean([dense["per_task"].get(t, {}).get("contains", 0.0)]) > 0]
        dense_by_sample = {
            r["sample"]: 1.0 if r.get("contains") else 0.0
            for r in rows
            if r["method"] == "full" and rate_label(r) == "1"
        }
        for cell in cells.values():
            _summarise(cell, answered, dense_by_sample)
        ns = [int(r["n"]) for r in rows if r["method"] == "full"]
        out[str(length)] = {
            "tasks": tasks,
            "answered": answered,
            "excluded": {t: "the dense target scores 0 on it at this length" for t in tasks if t not in answered},
            "prompt_n": {"mean": _mean([float(n) for n in ns]), "min": min(ns, default=0), "max": max(ns, default=0)},
            "cells": cells,
        }
    return out


def _summarise(cell: dict[str, Any], answered: list[str], dense: dict[str, float]) -> None:
    """Means over the tasks dense answers; ``relative`` against dense on those tasks and the cell's own samples.

    ``dense`` maps a sample to dense's ``contains`` on it: a method run on fewer samples than dense
    (one seed of two) is compared with dense's accuracy on those samples, not on all of dense's.
    """
    per_task = cell["per_task"]
    kept = [t for t in answered if t in per_task]
    cell["accuracy"] = _mean([per_task[t]["contains"] for t in kept])
    cell["keep_ratio"] = _mean([per_task[t]["keep_ratio"] for t in kept])
    shares = cell.pop("shares")
    cell["keep_ratios"] = [v for t in kept for v in shares[t]]
    cell["recall"] = _mean([per_task[t]["recall"] for t in kept])
    seen = cell.pop("seen")
    dense_acc = _mean([_mean([dense[s] for s in seen[t] if s in dense]) for t in kept])
    cell["relative"] = cell["accuracy"] / dense_acc if dense_acc and not math.isnan(dense_acc) else None
    cell["samples_per_task"] = sorted({int(per_task[t]["count"]) for t in per_task})


def _task_order(task: str) -> int:
    order = ["niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "qa_squad", "qa_hotpot"]
    return order.index(task) if task in order else len(order)


def _mean(values: list[float]) -> float:
    finite = [float(v) for v in values if not (isinstance(v, float) and math.isnan(v))]
    return sum(finite) / len(finite) if finite else math.nan


def _pct(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{100 * value:.0f}"


def markdown(table: dict[str, Any], speed: dict[str, Any], files: list[str], title: str) -> str:
    """Per length: the per-task accuracy table, the means, dense-relative accuracy, kept share, speedup."""
    lines = [f"# {title}", "", f"Joined from {len(files)} result files of one run on the same samples.", ""]
    for length, block in table.items():
        tasks = block["tasks"]
        n = block["prompt_n"]
        lines += [f"## {length} tokens (prompt n: mean {n['mean']:.0f}, min {n['min']}, max {n['max']})", ""]
        if block["excluded"]:
            left = ", ".join(f"`{t}` ({why})" for t, why in block["excluded"].items())
            lines += [f"Left out of the means: {left}.", ""]
        head = (
            "| method | keep | " + " | ".join(tasks) + " | mean | vs dense | kept | recall | speedup | samples/task |"
        )
        lines += [head, "|---|---:|" + "---:|" * (len(tasks) + 6)]
        for key, cell in sorted(block["cells"].items(), key=lambda kv: _cell_order(kv[1])):
            pt = cell["per_task"]
            cells = [_pct(pt[t]["contains"]) if t in pt else "" for t in tasks]
            sp = speed.get(length, {}).get(key)
            sp_text = "" if sp is None else f"{sp['speedup']:.2f}x{'*' if sp.get('interpolated') else ''}"
            rel = "" if cell["relative"] is None else f"{100 * cell['relative']:.0f}%"
            counts = "/".join(str(c) for c in cell["samples_per_task"])
            lines.append(
                f"| {cell['method']} | {cell['keep']} | "
                + " | ".join(cells)
                + f" | {_pct(cell['accuracy'])} | {rel} | {100 * cell['keep_ratio']:.1f}% | {_pct(cell['recall'])} | "
                f"{sp_text} | {counts} |"
            )
        lines.append("")
    lines += [
        (
            "`*`: a policy's speedup from the measured shares: each sample's TTFT interpolated at its own kept "
            "share (a dense prompt at 1.0x), then the mean TTFT against dense."
        ),
        "",
    ]
    return "\n".join(lines)


def _cell_order(cell: dict[str, Any]) -> tuple[int, str, str]:
    first = {"full": 0, "draft-chunked": 1, DEFAULT_POLICY: 2}
    return (first.get(cell["method"], 3), cell["method"], cell["keep"])


def speed_cells(ttft: dict[str, Any]) -> dict[tuple[int, float, int, int | None], float]:
    """(length, keep, look-ahead, draft layers) -> measured TTFT speedup against dense, from a grid result."""
    out: dict[tuple[int, float, int, int | None], float] = {}
    for row in ttft.get("rows", []):
        for cell in row.get("cells", []):
            if cell.get("speedup") is None:
                continue
            key = (int(row["n"]), float(cell["keep_rate"]), int(cell["look_ahead"]), cell.get("layers"))
            out[key] = float(cell["speedup"])
    return out


Cell = tuple[int, int | None]


def _cell_for(method: str, costs: dict[str, Cell] | None = None) -> Cell | None:
    """The grid cell (look-ahead, draft layers) whose cost a method has, or None when the grid has none.

    ``costs`` gives the cells of policy methods (``--cost``); a fixed method's cell follows from its name.
    """
    if costs and method in costs:
        return costs[method]
    if method in SAME_COST_AS_CHUNKED:
        return (8, None)
    if method == "draft-chunked-la1":
        return (1, None)
    if method.startswith("draft-early-"):
        return (1, int(method.split("-")[2]))
    return None


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    points = sorted(points)
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def speedups(
    table: dict[str, Any],
    grid: dict[tuple[int, float, int, int | None], float],
    costs: dict[str, Cell] | None = None,
) -> dict[str, Any]:
    """Per length and table cell: the measured speedup of its grid cell (a policy: interpolated at its share)."""
    out: dict[str, Any] = {}
    lengths = sorted({k[0] for k in grid})
    for length, block in table.items():
        if not lengths:
            break
        n = min(lengths, key=lambda m: abs(m - int(length)))
        row: dict[str, Any] = {}
        for key, cell in block["cells"].items():
            if cell["method"] == "full":
                row[key] = {"speedup": 1.0, "grid_n": n}
                continue
            where = _cell_for(cell["method"], costs)
            if where is None:
                continue
            look_ahead, layers = where
            if cell["keep"] == "policy":
                pts = [(k[1], v) for k, v in grid.items() if k[0] == n and k[2] == look_ahead and k[3] == layers]
                if pts:
                    # Dense prompts cost what dense costs: (1.0, 1.0x) closes the curve. The mean TTFT over the
                    # samples, relative to dense, is the mean of 1/speedup at each sample's own kept share.
                    curve = [*pts, (1.0, 1.0)]
                    relative = [1.0 / _interpolate(curve, share) for share in cell["keep_ratios"]]
                    row[key] = {"speedup": len(relative) / sum(relative), "grid_n": n, "interpolated": True}
            else:
                value = grid.get((n, float(cell["keep"]), look_ahead, layers))
                if value is not None:
                    row[key] = {"speedup": value, "grid_n": n}
        out[length] = row
    return out


def plot_frontier(table: dict[str, Any], speed: dict[str, Any], path: Path, title: str) -> None:
    """One panel per length: accuracy relative to dense against the measured TTFT speedup."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [length for length in table if speed.get(length)]
    if not lengths:
        return
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 4.0), squeeze=False)
    for ax, length in zip(axes[0], lengths, strict=True):
        for key, cell in table[length]["cells"].items():
            sp = speed[length].get(key)
            if sp is None or cell["relative"] is None:
                continue
            default = cell["method"] == DEFAULT_POLICY
            ax.scatter(
                sp["speedup"],
                100 * cell["relative"],
                s=80 if default else 30,
                marker="*" if default else "o",
                color="crimson" if default else "steelblue",
                zorder=3,
            )
            label = cell["method"] if cell["keep"] in ("policy", "1") else f"{cell['method']} {cell['keep']}"
            ax.annotate(
                label, (sp["speedup"], 100 * cell["relative"]), fontsize=6, xytext=(3, 3), textcoords="offset points"
            )
        ax.axhline(100 * TARGET_DEFAULT, color="crimson", lw=0.8, ls="--")
        ax.axhline(100 * TARGET_PAPER, color="gray", lw=0.8, ls=":")
        ax.set_title(f"{int(length) // 1024}K tokens", fontsize=10)
        ax.set_xlabel("TTFT speedup vs dense (measured)")
        ax.set_ylabel("accuracy, % of dense")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def _pair(text: str, flag: str) -> tuple[str, str]:
    """``KEY=VALUE`` split at its last ``=`` (a method name may hold ``=``, a value never does)."""
    key, sep, value = text.rpartition("=")
    if not sep or not key or not value:
        raise ValueError(f"{flag} {text!r}: expected KEY=VALUE")
    return key, value


def _parse_cell(text: str) -> Cell:
    """``LOOKAHEAD:LAYERS`` (``LAYERS`` a count or ``all``) as a grid cell."""
    look_ahead, sep, layers = text.partition(":")
    if not sep or not look_ahead.isdigit() or not (layers == "all" or layers.isdigit()):
        raise ValueError(f"--cost cell {text!r}: expected LOOKAHEAD:LAYERS, e.g. 1:16 or 8:all")
    return (int(look_ahead), None if layers == "all" else int(layers))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", type=Path, help="folder of the run's raw eval result files")
    parser.add_argument("--ttft", type=Path, help="ttft_gpu.py result (default mode) on the same pair and GPU")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--name", default="quality_gpu_qwen_real_v2")
    parser.add_argument("--title", default="Real-weight quality on one H200: Qwen2.5-Coder-1.5B target, 0.5B draft")
    parser.add_argument(
        "--label", action="append", default=[], metavar="OLD=NEW", help="rename a method as it is read (repeatable)"
    )
    parser.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="METHOD=LOOKAHEAD:LAYERS",
        help="the grid cell of a policy method, e.g. auto=1:16 or auto=8:all (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        labels = dict(_pair(text, "--label") for text in args.label)
        costs = {method: _parse_cell(cell) for method, cell in (_pair(text, "--cost") for text in args.cost)}
    except ValueError as exc:
        parser.error(str(exc))
    records, files = load_records(args.raw, labels)
    if not records:
        parser.error(f"no evaluation result files in {args.raw}")
    table = tabulate(dedupe(records))
    grid = speed_cells(json.loads(args.ttft.read_text())) if args.ttft else {}
    speed = speedups(table, grid, costs)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out, args.name, {"files": files, "lengths": table, "speedups": speed})
    (args.out / f"{args.name}.md").write_text(markdown(table, speed, files, args.title) + "\n")
    plot_frontier(table, speed, args.out / f"{args.name}_frontier.png", args.title)
    print(f"wrote {args.out / args.name}.json / .md" + (" and the frontier plot" if speed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
