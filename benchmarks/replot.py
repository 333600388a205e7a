"""Redraw committed plots from their committed JSON, with the scripts' current plotting code; nothing is re-run.

Each ``NAME.png`` in ``benchmarks/results/`` whose ``NAME.json`` sits beside it is drawn again by the
code that made it: `specprefill_sdk.eval.report.plot_report` for evaluations (``eval_*``,
``quality_gpu_*``), and the ``plot`` function of ``ttft_gpu.py``, ``ttft_cpu.py`` and
``conversation_cpu.py``. The JSON and markdown files are left as they are.

Usage::

    python benchmarks/replot.py                      # every plot the scripts below draw
    python benchmarks/replot.py ttft_gpu_h200 eval_qwen2.5-coder_accuracy_18   # some, by name
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import RESULTS, setup_logging


def _eval(json_path: Path, png: Path) -> None:
    from specprefill_sdk.eval.report import load_result, plot_report

    plot_report(load_result(json_path), png)


def _script(module: str, part: Callable[[dict[str, Any]], Any] = lambda r: r) -> Callable[[Path, Path], None]:
    def draw(json_path: Path, png: Path) -> None:
        plot = __import__(module).plot
        plot(part(json.loads(json_path.read_text(encoding="utf-8"))), png)

    return draw


#: File-name prefix -> how a plot of that family is drawn from its JSON (the first prefix that matches).
PLOTTERS: dict[str, Callable[[Path, Path], None]] = {
    "eval_": _eval,
    "quality_gpu_": _eval,
    "ttft_gpu_": _script("ttft_gpu"),
    "ttft_cpu_": _script("ttft_cpu"),
    "conversation_cpu": _script("conversation_cpu", lambda r: r["summary"]),
}


def plotter(name: str) -> Callable[[Path, Path], None] | None:
    return next((draw for prefix, draw in PLOTTERS.items() if name.startswith(prefix)), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="result names (file stems); default: every plot drawn here")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of JSON and PNG files")
    args = parser.parse_args()
    setup_logging()
    pngs = [args.results / f"{n}.png" for n in args.names] or sorted(args.results.glob("*.png"))
    for png in pngs:
        draw = plotter(png.stem)
        source = png.with_suffix(".json")
        if draw is None or not source.exists():
            if args.names:
                parser.error(f"{png.stem}: no JSON beside it or no plotting code for it here")
            continue
        draw(source, png)
        print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
