"""What the benchmark scripts share: the import path, the output flags, timing, and writing results.

Importing this module puts the repository root first on ``sys.path`` (so a script run as
``python benchmarks/x.py`` imports this checkout's ``specprefill_sdk``) and ``benchmarks/`` next (so
scripts can import each other's helpers). Results are written the same way everywhere: ``NAME.json``
(indent 1, a final newline), ``NAME.md`` and, where a script plots, ``NAME.png``.

Example::

    from _common import ROOT, add_output_args, command_line, median_ms, setup_logging, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser, "host_overhead_cpu")
    args = parser.parse_args()
    result = {"command": command_line(), "ms": median_ms(work, repeats=5)}
    write_results(args.out, args.name, result, markdown)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# Each script names the passes it times ("lean", "compiled", ...): compiled only where it asks for
# compile=True, as before compiling became the default on CUDA. SPECPREFILL_COMPILE=1 (or auto) in
# the environment measures the library's default instead.
os.environ.setdefault("SPECPREFILL_COMPILE", "0")

for _path in (ROOT / "benchmarks", ROOT):  # ROOT ends up first
    if str(_path) in sys.path:
        sys.path.remove(str(_path))
    sys.path.insert(0, str(_path))

logger = logging.getLogger("benchmarks")


def start_server(
    args: list[str], port: int, log: Path, *, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.Popen[bytes]:
    """``specprefill serve ARGS`` on 127.0.0.1:``port`` (output in ``log``), once ``/health`` answers 200."""
    import httpx

    cmd = [sys.executable, "-m", "specprefill_sdk", "serve", *args]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=str(cwd), env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.terminate()
    raise TimeoutError("the server did not start")


def use_tree(tree: str | Path) -> Path:
    """Import the library from another checkout ``tree`` (first on ``sys.path``), to time it "before"."""
    path = Path(tree).resolve()
    if str(path) in sys.path:
        sys.path.remove(str(path))
    sys.path.insert(0, str(path))
    return path


__all__ = [
    "RESULTS",
    "ROOT",
    "add_dtype_arg",
    "add_output_args",
    "command_line",
    "dtype_name",
    "median_ms",
    "save_figure",
    "setup_logging",
    "start_server",
    "use_tree",
    "write_json",
    "write_results",
]


def add_output_args(parser: argparse.ArgumentParser, name: str, out: str | Path = RESULTS) -> None:
    """``--out`` (the results folder) and ``--name`` (the results' file stem)."""
    parser.add_argument("--out", default=str(out), help=f"results folder (default: {out})")
    parser.add_argument("--name", default=name, help=f"file stem of the results (default: {name})")


def add_dtype_arg(parser: argparse.ArgumentParser) -> None:
    """``--dtype``, by default ``auto``: what the library loads on this machine (`resolve_dtype`)."""
    parser.add_argument(
        "--dtype",
        default="auto",
        help="the models' dtype (default: auto, what a user gets: bf16 on a CPU with bf16 matrix instructions, "
        "else float32)",
    )


def dtype_name(dtype: Any) -> str:
    """A loaded dtype as the results name it: ``bfloat16``, ``float32``."""
    return str(dtype).removeprefix("torch.")


def setup_logging(stream: Any = None) -> None:
    """INFO-level logging with timestamps, as every script logs its progress."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=stream)


def command_line() -> str:
    """How the script was run, for the results (``python benchmarks/x.py --flag ...``)."""
    return "python " + " ".join(sys.argv)


def median_ms(fn: Callable[[], Any], repeats: int, warmup: int = 0) -> float:
    """The median wall time of ``fn()`` in milliseconds over ``repeats`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) * 1000)
    return statistics.median(runs)


def write_json(out: str | Path, name: str, result: Any, indent: int = 1) -> Path:
    """``out/NAME.json`` (the folder is made if needed); called again as rows arrive, partial results survive."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(result, indent=indent) + "\n")
    return path


def save_figure(fig: Any, path: str | Path) -> None:
    """Save a matplotlib figure as every script does (tight layout unless it has its own, 120 dpi) and close it."""
    import matplotlib.pyplot as plt

    if fig.get_layout_engine() is None:  # a constrained figure has placed its legend outside already
        fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(
    out: str | Path,
    name: str,
    result: Any,
    markdown: Callable[[Any], str] | None = None,
    plot: Callable[[Any, Path], None] | None = None,
    *,
    indent: int = 1,
) -> str:
    """Write ``NAME.json``, ``NAME.md`` (from ``markdown(result)``) and ``NAME.png`` (``plot(result, path)``).

    Returns the markdown ("" without ``markdown``). Without matplotlib the plot is skipped with a warning.
    """
    write_json(out, name, result, indent=indent)
    folder = Path(out)
    text = markdown(result) if markdown is not None else ""
    if markdown is not None:
        (folder / f"{name}.md").write_text(text)
    if plot is not None:
        try:
            plot(result, folder / f"{name}.png")
        except ImportError:
            logger.warning("matplotlib is missing: no plot")
    return text
