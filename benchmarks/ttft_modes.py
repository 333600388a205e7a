"""The GPU TTFT grid's modes side by side: default against compiled, and each against its own dense prefill.

Reads the JSON results of ``ttft_gpu.py`` run once per ``--mode`` (``default``, ``compile``,
``eager``) over the same cells, and writes one table (``NAME.{json,md,png}``) with, per cell
(pair, n, keep, look-ahead, layers): each mode's SpecPrefill and dense milliseconds, the
default/compile ratio (target: at most `COMPILE_TOLERANCE`) and default/dense-default (target: at
most `DENSE_TOLERANCE`). A cell missing from a mode (skipped for time) is shown as missing.

Usage::

    python benchmarks/ttft_modes.py ttft_gpu_h200_default.json ttft_gpu_h200_compile.json \\
        ttft_gpu_h200_eager.json --out benchmarks/results --name ttft_modes_h200
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from _common import add_output_args, command_line, save_figure, write_results

#: Requirement (1): the default path's TTFT within this factor of the compiled path's, in every cell.
COMPILE_TOLERANCE = 1.10
#: Requirement (2): the default pipeline's TTFT at most this many times the default dense prefill's.
DENSE_TOLERANCE = 1.05

Key = tuple[str, int, float, int, int | None]


def cells_of(result: dict[str, Any]) -> dict[Key, dict[str, Any]]:
    """A mode's measured cells by (pair, n, keep, look-ahead, layers)."""
    out: dict[Key, dict[str, Any]] = {}
    for row in result.get("rows", []):
        for c in row.get("cells", []):
            if "skipped" not in c:
                out[(row["pair"], row["n"], c["keep_rate"], c["look_ahead"], c.get("layers"))] = c
    return out


def mode_of(result: dict[str, Any], path: Path) -> str:
    mode = result.get("mode")
    if mode is None:
        raise SystemExit(f"{path}: not a ttft_gpu.py result with a mode (run it with --mode)")
    return str(mode)


def compare(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The combined cells of ``results`` (mode -> ttft_gpu.py result) and the checks of the default mode."""
    by_mode = {mode: cells_of(r) for mode, r in results.items()}
    keys = list(dict.fromkeys(k for cells in by_mode.values() for k in cells))
    rows = []
    for key in keys:
        pair, n, keep, la, layers = key
        row: dict[str, Any] = {"pair": pair, "n": n, "keep_rate": keep, "look_ahead": la, "layers": layers}
        for mode, cells in by_mode.items():
            c = cells.get(key)
            row[f"{mode}_ms"] = c["spec_ms"] if c else None
            row[f"{mode}_dense_ms"] = c["dense_ms"] if c else None
            row[f"{mode}_fallback"] = c.get("fallback") if c else None
        default, compiled, dense = row.get("default_ms"), row.get("compile_ms"), row.get("default_dense_ms")
        row["default_over_compile"] = default / compiled if default and compiled else None
        row["default_over_dense"] = default / dense if default and dense else None
        rows.append(row)

    def worst(field: str, limit: float) -> dict[str, Any] | None:
        values = [r for r in rows if r[field] is not None]
        if not values:
            return None
        top = max(values, key=lambda r: r[field])
        return {
            "value": top[field],
            "limit": limit,
            "ok": all(r[field] <= limit for r in values),
            "cells_over": sum(r[field] > limit for r in values),
            "cell": {k: top[k] for k in ("pair", "n", "keep_rate", "look_ahead", "layers")},
        }

    return {
        "modes": list(results),
        "rows": rows,
        "default_over_compile": worst("default_over_compile", COMPILE_TOLERANCE),
        "default_over_dense": worst("default_over_dense", DENSE_TOLERANCE),
        "warmup_s": {mode: _warmup_total(r) for mode, r in results.items()},
    }


def _warmup_total(result: dict[str, Any]) -> dict[str, float]:
    return {pair: w.get("total_s", math.nan) for pair, w in result.get("warmup", {}).items()}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def markdown(result: dict[str, Any]) -> str:
    modes = result["modes"]
    lines = [
        "# GPU TTFT by mode: default, compiled, eager",
        "",
        f"- command: `{result['command']}`; sources: " + ", ".join(f"`{s}`" for s in result["sources"]),
        f"- default/compile: the default pipeline's TTFT over the compiled one's (target <= {COMPILE_TOLERANCE}); "
        f"default/dense: over the default mode's dense prefill (target <= {DENSE_TOLERANCE})",
        "",
        "| pair | n | keep | look-ahead | layers | "
        + " | ".join(f"{m} ms | {m} dense ms" for m in modes)
        + " | default/compile | default/dense |",
        "|---|---:|---:|---:|---:|" + "---:|---:|" * len(modes) + "---:|---:|",
    ]
    for r in result["rows"]:
        times = " | ".join(f"{_ms(r[f'{m}_ms'])} | {_ms(r[f'{m}_dense_ms'])}" for m in modes)
        lines.append(
            f"| {r['pair']} | {r['n']} | {r['keep_rate']:g} | {r['look_ahead']} | {r['layers'] or 'all'} | {times} "
            f"| {_ratio(r['default_over_compile'])} | {_ratio(r['default_over_dense'])} |"
        )
    lines.append("")
    for field, what in (("default_over_compile", "default/compile"), ("default_over_dense", "default/dense")):
        w = result[field]
        if w is None:
            lines.append(f"- {what}: not measured (a mode is missing)")
            continue
        cell = w["cell"]
        lines.append(
            f"- {what}: worst {w['value']:.3f} ({cell['pair']} n={cell['n']} keep {cell['keep_rate']:g} "
            f"look-ahead {cell['look_ahead']} layers {cell['layers'] or 'all'}); "
            + ("every cell within " if w["ok"] else f"{w['cells_over']} cell(s) over ")
            + f"{w['limit']}"
        )
    for mode, pairs in result["warmup_s"].items():
        for pair, seconds in pairs.items():
            lines.append(f"- building the stages, {mode}, {pair}: {seconds:.1f} s")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """Per pair, default/compile and default/dense against n, one line per (keep, look-ahead, layers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = list(dict.fromkeys(r["pair"] for r in result["rows"]))
    if not pairs:
        return
    fig, axes = plt.subplots(2, len(pairs), figsize=(6.2 * len(pairs), 7.5), squeeze=False, layout="constrained")
    for j, pair in enumerate(pairs):
        rows = [r for r in result["rows"] if r["pair"] == pair]
        combos = list(dict.fromkeys((r["keep_rate"], r["look_ahead"], r["layers"]) for r in rows))
        for i, field, limit in (
            (0, "default_over_compile", COMPILE_TOLERANCE),
            (1, "default_over_dense", DENSE_TOLERANCE),
        ):
            ax = axes[i][j]
            for k, combo in enumerate(combos):
                points = [
                    (r["n"], r[field])
                    for r in rows
                    if (r["keep_rate"], r["look_ahead"], r["layers"]) == combo and r[field]
                ]
                if points:
                    keep, la, layers = combo
                    label = f"keep {keep:g}, la {la}" + ("" if layers is None else f", {layers} layers")
                    ax.plot(*zip(*points, strict=True), "-o", color=plt.get_cmap("tab10")(k % 10), label=label)
            ax.axhline(limit, color="black", linestyle=":")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("prompt tokens")
            ax.set_ylabel(field.replace("_", " ") + f" (dotted: {limit})")
            ax.set_title(pair, fontsize=10)
            ax.grid(True, alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4), fontsize=9, frameon=False)
    save_figure(fig, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="ttft_gpu.py JSON results, one per mode")
    add_output_args(parser, "ttft_modes_h200")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    for path in args.results:
        data = json.loads(path.read_text(encoding="utf-8"))
        mode = mode_of(data, path)
        if mode in results:
            parser.error(f"two results of mode {mode!r}: give one file per mode")
        results[mode] = data
    combined = compare(results)
    combined.update(command=command_line(), sources=[str(p) for p in args.results])
    sys.stdout.write(write_results(args.out, args.name, combined, markdown, plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
