"""bf16 against fp32 on this CPU: what ``dtype="auto"`` chooses, and why.

``dtype="auto"`` loads bf16 on a CPU only where it has bf16 matrix instructions
(`specprefill_sdk.models.cpu_has_native_bf16`); this script shows both dtypes on the machine it runs
on, in one process, each round timing every variant once so that changes in load touch all alike:

- ``matmul``: a 1,024 x 576 by 576 x 1,536 product (SmolLM2-135M's hidden and MLP widths), one thread;
- ``prefill``: one forward pass of a ``--tokens``-token prompt through SmolLM2-135M (the bundled model),
  with the process's torch threads.

Usage::

    python benchmarks/cpu_dtype.py                      # 512 tokens, 3 repeats, results in benchmarks/results
    python benchmarks/cpu_dtype.py --tokens 64 --repeats 1 --out /tmp/x
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import RESULTS, add_output_args, command_line, setup_logging, write_results

from specprefill_sdk.models import cpu_has_native_bf16, load_model, resolve_dtype

logger = logging.getLogger("cpu_dtype")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def _matmul(dtype: torch.dtype) -> Callable[[], Any]:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(1024, 576, generator=gen).to(dtype)
    b = torch.randn(576, 1536, generator=gen).to(dtype)

    def run() -> Any:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return a @ b
        finally:
            torch.set_num_threads(threads)

    return run


def _prefill(dtype_name: str, tokens: int) -> Callable[[], Any]:
    loaded = load_model("smollm2-135m", device="cpu", dtype=dtype_name, progress=False)
    ids = torch.randint(100, 40000, (1, tokens), generator=torch.Generator().manual_seed(0))

    def run() -> Any:
        with torch.inference_mode():
            return loaded.model(input_ids=ids, use_cache=False, logits_to_keep=1)

    return run


def measure(tokens: int, repeats: int) -> dict[str, Any]:
    """Median ms of every variant over ``repeats`` rounds, after one warm-up call each."""
    variants = {f"{kind}_{name}": make(name) for name in DTYPES for kind, make in
                (("matmul", lambda n: _matmul(DTYPES[n])), ("prefill", lambda n: _prefill(n, tokens)))}  # fmt: skip
    for fn in variants.values():
        fn()
    runs: dict[str, list[float]] = {key: [] for key in variants}
    for round_ in range(repeats):
        for key, fn in variants.items():
            runs[key].append(_timed(fn))
        logger.info("round %d of %d: %s", round_ + 1, repeats, {k: round(v[-1], 1) for k, v in runs.items()})
    medians = {key: statistics.median(values) for key, values in runs.items()}
    return {
        "command": command_line(),
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": cpu_has_native_bf16(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
            "torch": torch.__version__,
        },
        "auto_dtype": str(resolve_dtype("auto", "cpu")).removeprefix("torch."),
        "tokens": tokens,
        "repeats": repeats,
        "median_ms": medians,
        "bf16_over_fp32": {
            kind: medians[f"{kind}_bfloat16"] / medians[f"{kind}_float32"] for kind in ("matmul", "prefill")
        },
    }


def render(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# bf16 against fp32 on the CPU",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {m['processor']}, {m['cpu_count']} cores, torch {m['torch']} ({m['cpu_capability']}), "
        f"{m['torch_threads']} torch threads, load average {m['load_average']}. bf16 matrix instructions: "
        f'{"yes" if m["native_bf16"] else "no"}, so `dtype="auto"` loads **{result["auto_dtype"]}**. '
        f"Medians of {result['repeats']} round(s) (ms).",
        "",
        "| step | float32 | bfloat16 | bf16 / fp32 |",
        "| --- | ---: | ---: | ---: |",
    ]
    names = {"matmul": "1,024 x 576 by 576 x 1,536 matmul, one thread",
             "prefill": f"SmolLM2-135M forward, {result['tokens']} tokens"}  # fmt: skip
    med = result["median_ms"]
    for kind, label in names.items():
        lines.append(
            f"| {label} | {med[f'{kind}_float32']:,.1f} | {med[f'{kind}_bfloat16']:,.1f} | "
            f"{result['bf16_over_fp32'][kind]:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=512, help="prompt tokens of the prefill (default: 512)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (default: 3)")
    add_output_args(parser, "cpu_dtype", RESULTS)
    args = parser.parse_args()
    if args.tokens < 1 or args.repeats < 1:
        parser.error("--tokens and --repeats must be at least 1")
    setup_logging()
    result = measure(args.tokens, args.repeats)
    print(write_results(args.out, args.name, result, render))


if __name__ == "__main__":
    main()
