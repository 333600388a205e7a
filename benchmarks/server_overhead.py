"""Time to first token through the HTTP server against the in-process pipeline, on the same prompt.

Both sides run the same model, dtype, device and policy on this machine: the in-process side is a
`Pipeline` from `load_pipeline`; the server side is a ``specprefill serve`` process on 127.0.0.1
driven over a kept-alive HTTP connection with a streaming chat request. TTFT is the wall time from
the call (or the request) to the first generated text. The two are measured alternately (in both
orders), so drift in the machine's load hits both alike; the overhead is the median of the paired
differences. A one-line prompt (``dense-short``) shows the server's fixed cost per request best.

Usage::

    python benchmarks/server_overhead.py                  # writes benchmarks/results/server_overhead.json
    python benchmarks/server_overhead.py --repeats 5 --chars 2000 --policies paper --out /tmp
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import socket
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from _common import RESULTS, add_dtype_arg, dtype_name, start_server, write_json

from specprefill_sdk.eval.corpora import haystack
from specprefill_sdk.models import resolve_dtype
from specprefill_sdk.policies import load_pipeline

MODEL = "smollm2-135m"
QUESTION = "In one sentence, what is this text about?"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(args: argparse.Namespace, port: int, log: Path) -> subprocess.Popen[bytes]:
    return start_server(["--model", MODEL, "--device", args.device, "--dtype", args.dtype], port, log)


def in_process_ttft(pipe: Any, messages: list[dict[str, str]]) -> tuple[float, dict[str, float]]:
    t0 = time.perf_counter()
    ttft = None
    completion = None
    for chunk in pipe.stream(messages, max_tokens=2):
        if ttft is None and chunk.text:
            ttft = (time.perf_counter() - t0) * 1000
        if chunk.completion is not None:
            completion = chunk.completion
    assert ttft is not None and completion is not None
    return ttft, {
        "score_ms": completion.timings.score,
        "prefill_ms": completion.timings.prefill,
        "kept_tokens": completion.usage.kept_tokens,
        "prompt_tokens": completion.usage.prompt_tokens,
    }


def server_ttft(http: httpx.Client, messages: list[dict[str, str]], policy: str) -> tuple[float, dict[str, float]]:
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "specprefill": {"policy": policy},
    }
    t0 = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0]["delta"].get("content") and ttft is None:
                ttft = (time.perf_counter() - t0) * 1000
            if event.get("usage"):
                usage = event["usage"]
    assert ttft is not None and usage
    sp = usage["specprefill"]
    return ttft, {
        "score_ms": sp["score_ms"],
        "prefill_ms": sp["prefill_ms"],
        "kept_tokens": sp["kept_tokens"],
        "prompt_tokens": usage["prompt_tokens"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=3000, help="essay length in characters")
    parser.add_argument("--repeats", type=int, default=9, help="timed calls per side and policy")
    parser.add_argument("--policies", nargs="+", default=["paper", "dense"], help="policies on the essay prompt")
    parser.add_argument("--short-repeats", type=int, default=21, help="timed calls per side, one-line prompt")
    parser.add_argument("--no-short", action="store_true", help="skip the one-line prompt (fixed per-request cost)")
    parser.add_argument("--device", default="cpu")
    add_dtype_arg(parser)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    essay = [{"role": "user", "content": f"{haystack(args.chars)}\n\n{QUESTION}"}]
    workloads = [(policy, policy, essay) for policy in args.policies]
    if not args.no_short:
        # A one-line prompt, dense: the model's time is small, so the server's fixed cost shows.
        workloads.append(("dense-short", "dense", [{"role": "user", "content": "Name a colour."}]))
    port = free_port()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "server_overhead_server.log"
    load_before = os.getloadavg()
    proc = serve(args, port, log)
    results: dict[str, Any] = {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
            pipes: dict[str, Any] = {}
            for label, policy, messages in workloads:
                pipe = pipes.get(policy) or load_pipeline(policy, model=MODEL, device=args.device, dtype=args.dtype)
                pipes[policy] = pipe
                in_process_ttft(pipe, messages)  # warm-up, both sides
                server_ttft(http, messages, policy)
                local_ms, remote_ms, local_info, remote_info = [], [], {}, {}
                repeats = args.short_repeats if label == "dense-short" else args.repeats
                for i in range(repeats):
                    # Alternate the order (A B, B A, ...) so neither side always runs second.
                    for side in ("local", "server") if i % 2 == 0 else ("server", "local"):
                        if side == "local":
                            ms, local_info = in_process_ttft(pipe, messages)
                            local_ms.append(ms)
                        else:
                            ms, remote_info = server_ttft(http, messages, policy)
                            remote_ms.append(ms)
                med_local, med_remote = statistics.median(local_ms), statistics.median(remote_ms)
                # Paired differences cancel the slow drift of a shared machine's load.
                paired = statistics.median(r - loc for r, loc in zip(remote_ms, local_ms, strict=True))
                results[label] = {
                    "policy": policy,
                    "repeats": repeats,
                    "in_process_ttft_ms": local_ms,
                    "server_ttft_ms": remote_ms,
                    "median_in_process_ms": med_local,
                    "median_server_ms": med_remote,
                    "overhead_ms": paired,
                    "overhead_ratio": med_remote / med_local,
                    "in_process_last": local_info,
                    "server_last": remote_info,
                }
                print(
                    f"{label}: in-process {med_local:.1f} ms, server {med_remote:.1f} ms, "
                    f"overhead (median of paired differences) {paired:+.1f} ms, "
                    f"{remote_info['kept_tokens']}/{remote_info['prompt_tokens']} tokens kept"
                )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    report = {
        "benchmark": "server_overhead",
        "what": "TTFT (call/request to first generated text), same prompt and policy; overhead_ms is the median "
        "of the paired differences server - in-process",
        "model": MODEL,
        "device": args.device,
        "dtype": dtype_name(resolve_dtype(args.dtype, args.device)),  # what both sides loaded
        "chars": args.chars,
        "workloads": {label: {"policy": policy, "messages": len(m)} for label, policy, m in workloads},
        "repeats": args.repeats,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": importlib.metadata.version("transformers"),
            "fastapi": importlib.metadata.version("fastapi"),
            "uvicorn": importlib.metadata.version("uvicorn"),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "results": results,
    }
    path = write_json(args.out, "server_overhead", report, indent=2)
    log.unlink(missing_ok=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
