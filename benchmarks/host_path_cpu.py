"""The server's host time around scoring and the kept prefill: tokenizing, the Prompt, the request path (CPU).

On a GPU, a 32K-token request spends its time to first token in two model steps (draft scoring, the
kept prefill) and in the host work around them. This benchmark measures that host work on the CPU
with the bundled SmolLM2 tokenizer (the one the GPU serving runs use):

- ``prompt``: at 8K, 16K and 32K tokens, the tokenizer's own encoding (Rust, the floor) against
  `build_prompt` for the same text (plain text and one chat message), the least process CPU time of
  ``--repeats`` calls (CPU time, not wall time: on a shared machine the wall time counts others' work);
- ``server``: a ``specprefill serve`` process (transformers engine, SmolLM2, float32) answering a
  streamed ``/v1/completions`` text request of about ``--server-tokens`` tokens (SmolLM2's context is
  8192), scored by the draft's first layer (``--options``) so that the CPU's model steps stay short.
  ``client_host_ms`` is the client's time to the first token minus the server's own ``score_ms`` and
  ``prefill_ms``: everything the server does around the two model steps, loopback HTTP included.
  The stage fields of ``usage.specprefill`` (``tokenize_ms``, ``queue_ms``, ...) are recorded where
  the served tree reports them.

``--tree PATH`` imports and serves another checkout (e.g. the main branch) to measure "before".

Usage::

    python benchmarks/host_path_cpu.py                            # results/host_path_cpu.{json,md}
    python benchmarks/host_path_cpu.py --tree ../checkout-before --name host_path_cpu_before
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import ROOT, add_output_args, command_line, start_server, use_tree, write_results
from _stream import stream_completion

MODEL = "smollm2-135m"
LENGTHS = (8192, 16384, 32768)
STAGES = ("tokenize_ms", "queue_ms", "select_ms", "submit_ms", "ttft_ms", "server_ms", "host_ms")


def text_of(tokenizer: Any, haystack: Any, tokens: int) -> str:
    """Essay text that the tokenizer reads as exactly ``tokens`` tokens (with its special tokens)."""
    text = haystack(tokens * 6)
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    special = len(tokenizer("x", add_special_tokens=True)["input_ids"]) - len(
        tokenizer("x", add_special_tokens=False)["input_ids"]
    )
    return text[: enc["offset_mapping"][tokens - 1 - special][1]]


def best_ms(fn: Any, repeats: int) -> float:
    """The least CPU time of ``fn()`` in ms: on a shared machine, wall time also counts others' work."""
    fn()
    runs = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        runs.append((time.process_time() - t0) * 1000)
    return min(runs)


def prompt_costs(args: argparse.Namespace) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    from specprefill_sdk.eval.corpora import haystack
    from specprefill_sdk.models import resolve_model_path
    from specprefill_sdk.prompt import build_prompt

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(MODEL, progress=False)))
    rows = []
    for n in LENGTHS:
        text = text_of(tokenizer, haystack, n)
        chat = [{"role": "user", "content": text}]
        row = {
            "tokens": build_prompt(tokenizer, text).n,
            "chars": len(text),
            "encode_ms": best_ms(lambda t=text: tokenizer.backend_tokenizer.encode(t), args.repeats),
            "text_ms": best_ms(lambda t=text: build_prompt(tokenizer, t), args.repeats),
            "chat_ms": best_ms(lambda c=chat: build_prompt(tokenizer, c), args.repeats),
        }
        rows.append(row)
        print(f"prompt {row['tokens']}: encode {row['encode_ms']:.1f} ms, ", end="")
        print(f"text {row['text_ms']:.1f}, chat {row['chat_ms']:.1f}")
    return rows


def serve(tree: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """The server of checkout ``tree`` (its own package first on the path)."""
    args = ["--model", MODEL, "--dtype", "float32", "--device", "cpu", "--warmup-tokens", "256"]
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return start_server(args, port, log, cwd=tree, env=env, timeout=600)


def one_request(http: Any, text: str, options: dict[str, Any]) -> dict[str, Any]:
    body = {
        "specprefill": options,
        "model": MODEL,
        "prompt": text,
        "max_tokens": 2,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    ttft, usage = stream_completion(http, "/v1/completions", body)
    sp = usage["specprefill"]
    row = {"client_ttft_ms": ttft, "prompt_tokens": usage["prompt_tokens"], "kept_tokens": sp["kept_tokens"]}
    row.update({k: sp[k] for k in ("score_ms", "prefill_ms", *STAGES) if sp.get(k) is not None})
    row["client_host_ms"] = ttft - sp["score_ms"] - sp["prefill_ms"]
    return row


def server_costs(args: argparse.Namespace, tree: Path) -> dict[str, Any]:
    import socket

    import httpx
    from transformers import AutoTokenizer

    from specprefill_sdk.eval.corpora import haystack
    from specprefill_sdk.models import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(MODEL, progress=False)))
    text = text_of(tokenizer, haystack, args.server_tokens)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    log = Path(args.out) / f"{args.name}_server.log"
    proc = serve(tree, port, log)
    rows = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
            one_request(http, text, args.options)  # warm-up
            for _ in range(args.server_repeats):
                rows.append(one_request(http, text, args.options))
                print({k: round(v, 1) if isinstance(v, float) else v for k, v in rows[-1].items()})
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    log.unlink(missing_ok=True)
    keys = [k for k in rows[0] if isinstance(rows[0][k], float)]
    return {"runs": rows, "median": {k: statistics.median(r[k] for r in rows) for k in keys}}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Host time around scoring and the kept prefill ({result['tree']})",
        "",
        f"- machine: {result['machine']}",
        f"- command: `{result['command']}`",
        "",
        f"## Building the Prompt (SmolLM2 tokenizer), least CPU time of {result['repeats']} calls",
        "",
        "| tokens | characters | tokenizer encode ms | build_prompt text ms | build_prompt chat ms "
        "| text - encode ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["prompt"]:
        lines.append(
            f"| {r['tokens']} | {r['chars']} | {r['encode_ms']:.1f} | {r['text_ms']:.1f} | {r['chat_ms']:.1f} "
            f"| {r['text_ms'] - r['encode_ms']:.1f} |"
        )
    server = result.get("server")
    if server:
        med = server["median"]
        lines += [
            "",
            f"## Through the server: a streamed text completion of {server['runs'][0]['prompt_tokens']} tokens, "
            f"median of {len(server['runs'])} (wall time; specprefill {json.dumps(result['options'])})",
            "",
            "| field | ms |",
            "|---|---:|",
        ]
        lines += [f"| {k} | {v:.1f} |" for k, v in med.items()]
        lines += ["", "`client_host_ms` = client TTFT - score_ms - prefill_ms."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to import and serve")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--server-tokens", type=int, default=8000)
    parser.add_argument("--server-repeats", type=int, default=5)
    parser.add_argument(
        "--options",
        type=json.loads,
        default={"layers": 1, "look_ahead": 1},
        help="the requests' specprefill object (default: a one-layer draft, so the CPU's model steps stay short)",
    )
    parser.add_argument("--no-server", action="store_true")
    add_output_args(parser, "host_path_cpu")
    args = parser.parse_args()
    tree = use_tree(args.tree)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    result: dict[str, Any] = {
        "benchmark": "host_path_cpu",
        "command": command_line(),
        "tree": tree.name,
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
        "repeats": args.repeats,
        "options": args.options,
        "prompt": prompt_costs(args),
    }
    if not args.no_server:
        result["server"] = server_costs(args, tree)
    print(write_results(args.out, args.name, result, markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
