"""What slows the draft's scorer in the served process: a worker thread, vLLM's import, an idle vLLM engine beside it.

The served runs of `vllm_serve_gpu.py` time the draft's scoring in `specprefill serve --engine vllm` above
what the same scorer takes alone through `TransformersBackend` (`docs/benchmarks.md`). The server differs
from those runs in three ways, each timed here on its own, in one process on one GPU, with the scorer the
server builds (`load_pipeline` with the given policy, default execution settings: compiled and warmed up at
load on CUDA):

- ``alone``: ``scorer.score(prompt)`` on the main thread;
- ``thread``: the same call from one worker thread, as the server's scoring queue makes it;
- ``vllm_imported``: after ``import vllm.platforms.cuda``, which turns cuDNN attention off for the whole
  process (``torch.backends.cuda.enable_cudnn_sdp(False)``); the scorer asks for its kernels per call;
- ``beside_engine`` and ``beside_engine_thread``: with a vLLM engine of the target (random weights, idle)
  holding ``--gpu-memory-utilization`` of the GPU, as the served runs' engine does (``--no-engine``: not run);
- ``built_after_vllm`` (``--vllm-first``, alone): the scorers built and compiled after vLLM's import, as the
  server builds them; the other conditions build them before it, so their compiled passes are traced with
  cuDNN attention on.

Each condition but the threaded ones also times a second scorer on the same draft built with
``ExecutionSettings(compile=False)`` (``*_uncompiled``): the served run before compiling became the default
scored faster than the runs after it.

For ``alone``, ``vllm_imported``, ``built_after_vllm`` and ``beside_engine`` one call per length also runs
under torch's profiler, which lists the attention kernels that ran and their device time (CPU ops in
``--tiny`` mode), and ``cudnn_sdp_enabled`` records the process's cuDNN attention flag in each condition.
Medians of ``--repeats`` calls after one.

Usage (device machine, vLLM importable)::

    python benchmarks/scorer_served_gpu.py --pair llama --lengths 32768 16384 8192 --out $OUT
    python benchmarks/scorer_served_gpu.py --pair llama --lengths 32768 8192 --vllm-first --out $OUT
    python benchmarks/scorer_served_gpu.py --tiny --no-vllm --lengths 256 --out /tmp/check   # CPU check
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# The server's default (auto: compiled on CUDA), which `_common` would otherwise turn off for this process.
os.environ.setdefault("SPECPREFILL_COMPILE", "")

import torch
from _common import command_line, write_results
from draft_engine_gpu import add_engine_args, parse_engine_args, start_engine
from ttft_gpu import CONFIGS, PAIRS, Bench, build_model, synthetic_tokenizer, tiny
from ttft_gpu import environment as device_environment

from specprefill_sdk.policies import load_pipeline
from specprefill_sdk.runtime.settings import ExecutionSettings
from specprefill_sdk.types import Prompt

logger = logging.getLogger("scorer_served_gpu")

#: Names of the attention kernels and ops in a profile (lower case): cuDNN's, flash's, the efficient one's.
ATTENTION_MARKS = ("attention", "fmha", "flash", "cudnn", "sdpa", "sdp_")
#: The conditions in the order they run (the engine's need vLLM), each but the threaded ones also uncompiled.
CONDITIONS = (
    "alone",
    "alone_uncompiled",
    "thread",
    "vllm_imported",
    "vllm_imported_uncompiled",
    "built_after_vllm",
    "built_after_vllm_uncompiled",
    "beside_engine",
    "beside_engine_uncompiled",
    "beside_engine_thread",
)
PROFILED = (
    "alone",
    "alone_uncompiled",
    "vllm_imported",
    "built_after_vllm",
    "beside_engine",
    "beside_engine_uncompiled",
)


def attention_kernels(device: torch.device, fn: Callable[[], Any]) -> list[dict[str, Any]]:
    """The attention kernels (CUDA) or ops (CPU) one call of ``fn`` ran: name, calls and total ms, longest first."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    rows = []
    for event in prof.key_averages():
        name = str(event.key)
        if not any(mark in name.lower() for mark in ATTENTION_MARKS):
            continue
        us = event.device_time_total if device.type == "cuda" else event.cpu_time_total
        if us > 0:
            rows.append({"name": name[:160], "calls": int(event.count), "ms": round(us / 1000.0, 3)})
    return sorted(rows, key=lambda r: -r["ms"])[:8]


def cudnn_sdp_enabled() -> bool:
    return bool(torch.backends.cuda.cudnn_sdp_enabled())


def import_vllm_platform() -> str:
    """Import vLLM's CUDA platform module (it turns cuDNN attention off), or say why it could not be."""
    try:
        import vllm.platforms.cuda  # noqa: F401
    except Exception as exc:  # no vLLM, or no CUDA for it
        return f"not imported: {type(exc).__name__}: {exc}"
    return "imported"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every condition in turn, every length in each: the scorer's median ms and, where profiled, its kernels."""
    device = torch.device("cpu" if args.tiny else "cuda")
    target_name, draft_name = PAIRS[args.pair]
    config = tiny(CONFIGS[draft_name]) if args.tiny else dict(CONFIGS[draft_name])
    vocab = int(config["vocab_size"])
    # As the server does: vLLM is imported before the draft is built and its passes compiled.
    first_import = import_vllm_platform() if args.vllm_first else None
    draft = build_model(draft_name, config, device, synthetic_tokenizer(vocab))
    started = time.perf_counter()
    scorer = load_pipeline(args.policy, model=draft, draft=draft).scorer
    built_s = time.perf_counter() - started
    started = time.perf_counter()
    uncompiled = load_pipeline(args.policy, model=draft, draft=draft, execution=ExecutionSettings(compile=False)).scorer
    scorers = {"": (scorer, built_s), "_uncompiled": (uncompiled, time.perf_counter() - started)}
    result: dict[str, Any] = {
        "command": command_line(),
        "draft": f"{draft_name} architecture, random weights, bf16" + (" (tiny)" if args.tiny else ""),
        "policy": args.policy,
        "scorer": repr(scorer),
        "scorers": {
            f"scorer{suffix}": {"compiled": bool(getattr(s, "compiled", False)), "build_and_warmup_s": round(t, 1)}
            for suffix, (s, t) in scorers.items()
        },
        "environment": device_environment(device),
        "engine": None,
        "conditions": {},
    }
    gen = torch.Generator().manual_seed(7)
    prompts = {
        n: Prompt.from_token_ids(torch.randint(1000, vocab - 1000, (n,), generator=gen).tolist()) for n in args.lengths
    }
    bench = Bench(device, args.repeats, deadline=float("inf"))
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scoring")

    def run(condition: str, threaded: bool = False, suffix: str = "") -> None:
        condition += suffix
        score = scorers[suffix][0].score
        rows: dict[str, Any] = {}
        for n, prompt in prompts.items():

            def call(prompt: Prompt = prompt) -> Any:
                return pool.submit(score, prompt).result() if threaded else score(prompt)

            ms, runs = bench.median(call)
            row: dict[str, Any] = {"ms": ms, "runs": runs}
            if condition in PROFILED:
                row["kernels"] = attention_kernels(device, call)
            rows[str(n)] = row
            logger.info("%s n=%d: %.1f ms", condition, n, ms)
        result["conditions"][condition] = {"cudnn_sdp_enabled": cudnn_sdp_enabled(), "lengths": rows}
        write_results(args.out, args.name, result, markdown)

    try:
        if first_import is not None:
            result["vllm_import"] = f"{first_import}, before the scorers were built"
            run("built_after_vllm")
            run("built_after_vllm", suffix="_uncompiled")
            return result
        run("alone")
        run("alone", suffix="_uncompiled")
        run("thread", threaded=True)
        if args.no_vllm:
            return result
        result["vllm_import"] = import_vllm_platform()
        if result["vllm_import"] != "imported":
            return result
        run("vllm_imported")
        run("vllm_imported", suffix="_uncompiled")
        if args.no_engine:
            return result
        target = dict(CONFIGS[target_name])
        engine, startup = start_engine(target, max(args.lengths) + 256, args.gpu_memory_utilization)
        result["engine"] = {
            "target": f"{target_name} architecture, random weights (load_format dummy), idle",
            "startup_s": round(startup, 1),
            "gpu_memory_utilization": args.gpu_memory_utilization,
        }
        run("beside_engine")
        run("beside_engine", suffix="_uncompiled")
        run("beside_engine_thread", threaded=True)
        del engine
    finally:
        pool.shutdown()
    return result


def markdown(result: dict[str, Any]) -> str:
    """One table of median ms (a row per length, a column per condition), then the profiled kernels."""
    conditions = [c for c in CONDITIONS if c in result["conditions"]]
    lengths = sorted({int(n) for c in conditions for n in result["conditions"][c]["lengths"]}, reverse=True)
    lines = [
        "# The draft's scorer in the served process's conditions",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Draft: {result['draft']}; policy `{result['policy']}`; scorer `{result['scorer']}` "
        f"({json.dumps(result['scorers'])}); {json.dumps(result['environment'])}.",
    ]
    if result.get("vllm_import"):
        lines.append(f"vLLM's CUDA platform: {result['vllm_import']}.")
    if result.get("engine"):
        lines.append(f"vLLM engine beside it: {json.dumps(result['engine'])}.")
    lines += [
        "",
        "Median ms of `scorer.score(prompt)`:",
        "",
        "| n | " + " | ".join(conditions) + " |",
        "|---:|" + "---:|" * len(conditions),
    ]
    for n in lengths:
        cells = [
            f"{result['conditions'][c]['lengths'].get(str(n), {}).get('ms', float('nan')):.1f}" for c in conditions
        ]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    flags = ", ".join(f"{c} {result['conditions'][c]['cudnn_sdp_enabled']}" for c in conditions)
    lines += ["", f"cuDNN attention enabled in the process (outside the scorer's calls): {flags}.", ""]
    for c in conditions:
        for n, row in result["conditions"][c]["lengths"].items():
            if "kernels" not in row:
                continue
            lines += [f"Attention kernels of one call, {c}, n = {n}:", "", "| kernel | calls | ms |", "|---|---:|---:|"]
            lines += [f"| `{k['name']}` | {k['calls']} | {k['ms']:.3f} |" for k in row["kernels"]] or ["| none | | |"]
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="llama", help="the draft, and the engine's target")
    parser.add_argument("--policy", default="paper", help="the policy whose scorer is timed (default: paper)")
    parser.add_argument("--no-engine", action="store_true", help="stop after vLLM's import (no engine beside)")
    parser.add_argument(
        "--vllm-first", action="store_true", help="import vLLM before building the scorers, time them, and stop"
    )
    add_engine_args(parser, [32768, 16384, 8192], 0.8, "scorer_served_gpu")
    args = parse_engine_args(parser, argv)
    write_results(args.out, args.name, measure(args), markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
