"""What the server's warm-up at start (``--warmup-tokens``) saves the first requests of a compiled server.

Two fresh processes, each with an empty inductor cache of its own (``TORCHINDUCTOR_CACHE_DIR``), build
the same server application around the same models (``ttft_gpu.py``'s Llama-3.1-8B target and
Llama-3.2-1B draft, random bf16 weights, both with ``compile=True``, the paper policy):

- ``cold``: ``create_app(ServerConfig(warmup_tokens=0), ...)``: no warm-up;
- ``warm``: ``create_app(ServerConfig(), ...)`` with its default, a warm-up of `DEFAULT_WARMUP_TOKENS` tokens on a GPU.

Each then serves the same requests on the engine's worker thread (one generated token each): two
prompts of the first length, then two of the second, whose look-ahead buffer is of another size.
Times are wall-clock: how long ``create_app`` took (loading excluded: the models are built before it)
and how long each request took.

Usage (device machine)::

    python benchmarks/warmup_gpu.py --out $OUT
    python benchmarks/warmup_gpu.py --tiny --out /tmp/warmup-check     # CPU check with tiny configs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, add_output_args, command_line, setup_logging, write_json, write_results

logger = logging.getLogger("warmup_gpu")

MODES = ("cold", "warm")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One process: build the models and the app (``args.mode``), then time the requests."""
    import torch
    from ttft_gpu import CONFIGS, PAIRS, build_model, environment, synthetic_tokenizer, tiny

    from specprefill_sdk.backends import TransformersBackend
    from specprefill_sdk.runtime import ExecutionSettings
    from specprefill_sdk.scoring import DraftAttentionScorer
    from specprefill_sdk.server import ServerConfig, create_app
    from specprefill_sdk.server.engine import RequestContext
    from specprefill_sdk.types import SamplingParams

    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    target_name, draft_name = PAIRS["llama"]
    tcfg, dcfg = CONFIGS[target_name], CONFIGS[draft_name]
    if args.tiny:
        tcfg, dcfg = tiny(tcfg), tiny(dcfg)
    vocab = min(tcfg["vocab_size"], dcfg["vocab_size"])
    tokenizer = synthetic_tokenizer(max(tcfg["vocab_size"], dcfg["vocab_size"]))
    target = build_model(target_name, tcfg, device, tokenizer)
    draft = build_model(draft_name, dcfg, device, tokenizer)
    execution = ExecutionSettings(compile=True)
    backend = TransformersBackend(target, execution=execution)
    scorer = DraftAttentionScorer(draft, look_ahead=8, pool_kernel=13, target_tokenizer=tokenizer, execution=execution)
    # the warm mode takes create_app's default, except on a CPU (the check), where the default is none
    warmup: int | None = 0 if args.mode == "cold" else (args.tiny_warmup if device.type == "cpu" else None)
    started = time.perf_counter()
    app = create_app(ServerConfig(policy="paper", warmup_tokens=warmup), backend=backend, scorer=scorer)
    start_s = time.perf_counter() - started
    engine = app.state.engine
    gen = torch.Generator().manual_seed(5)
    pipeline = engine.pipeline_for(None)
    first = SamplingParams(max_tokens=1)
    requests = []
    for n in args.lengths:
        for _ in range(2):
            ids = torch.randint(1000, vocab - 1000, (n,), generator=gen).tolist()
            text = " ".join(f"t{i}" for i in ids)

            def serve(text: str = text) -> Any:
                return pipeline.generate(text, first)

            t0 = time.perf_counter()
            completion = asyncio.run(engine.call(RequestContext(), serve))
            if device.type == "cuda":
                torch.cuda.synchronize()
            requests.append({"n": n, "kept": completion.usage.kept_tokens, "ms": (time.perf_counter() - t0) * 1000.0})
            logger.info("%s: %d-token request in %.1f ms", args.mode, n, requests[-1]["ms"])
    done = engine.warmed_up
    return {
        "mode": args.mode,
        "environment": environment(device),
        "create_app_s": start_s,
        "warmup": None
        if done is None
        else {"prompt_tokens": done.prompt_tokens, "kept_tokens": done.kept_tokens, "seconds": done.seconds},
        "requests": requests,
    }


def markdown(result: dict[str, Any]) -> str:
    runs = result["runs"]
    env = runs[0]["environment"] if runs else {}
    lines = [
        "# Server warm-up at start: the first requests of a compiled server",
        "",
        f"- machine: {env.get('gpu', env.get('device'))}, torch {env.get('torch')}, "
        f"transformers {env.get('transformers')}",
        f"- command: `{result['command']}`; each mode in a fresh process with an empty inductor cache",
        "- Llama-3.1-8B target / Llama-3.2-1B draft (random bf16 weights), compile=True, paper policy, one "
        "generated token per request",
        "",
    ]
    lengths = [r["n"] for r in runs[0]["requests"]] if runs else []
    head = " | ".join(f"request {i + 1} ({n} tokens) ms" for i, n in enumerate(lengths))
    lines += [f"| mode | create_app s | warm-up prompt tokens | warm-up s | {head} |"]
    lines += ["|---|---:|---:|---:|" + "---:|" * len(lengths)]
    for run in runs:
        w = run["warmup"]
        warm = f"{w['prompt_tokens']} | {w['seconds']:.1f}" if w else "- | -"
        cells = " | ".join(f"{r['ms']:.1f}" for r in run["requests"])
        lines.append(f"| {run['mode']} | {run['create_app_s']:.1f} | {warm} | {cells} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 6144])
    parser.add_argument("--tiny", action="store_true", help="tiny configs on CPU (a check of the script)")
    parser.add_argument("--tiny-warmup", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, default=None, help=argparse.SUPPRESS)  # set in the child
    add_output_args(parser, "warmup_gpu_h200")
    args = parser.parse_args()
    setup_logging(sys.stderr)
    if args.tiny:
        args.lengths = [n for n in args.lengths if n <= 1024] or [256, 384]
    if args.mode is not None:
        sys.stdout.write(json.dumps(child(args)) + "\n")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"benchmark": "warmup_gpu", "command": command_line(), "runs": []}
    for mode in MODES:
        with tempfile.TemporaryDirectory(prefix=f"inductor-{mode}-") as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            argv = [sys.executable, __file__, "--mode", mode, "--lengths", *map(str, args.lengths)]
            if args.tiny:
                argv += ["--tiny", "--tiny-warmup", str(args.tiny_warmup)]
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr[-4000:])
                return proc.returncode
            result["runs"].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        write_json(out, args.name, result)  # partial results survive
    sys.stdout.write(write_results(out, args.name, result, markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
