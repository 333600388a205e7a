"""Where compression starts to pay on CPU: the ``paper`` policy against dense prefill, by prompt length.

The prompt length below which the presets prefill densely (``dense_below_tokens``) comes from this
script. For chat prompts of growing length (a system message, a user message of real essay text
and a question, in the model's chat template), in one process, median of ``--repeats`` interleaved
runs:

- ``dense``: the ``dense`` policy (every token prefilled, the draft never runs), TTFT of
  ``generate(max_tokens=1)``;
- ``paper``: the ``paper`` policy with ``dense_below_tokens=0`` (score + select + kept prefill +
  first token), the same call;
- ``same answer``: whether greedy answers of ``--answer-tokens`` tokens are identical under both.

Short chats (a question of a few words, no document) are also answered under both policies, to show
whether compression changes the answer where a prompt has nothing to spare.

Usage::

    python benchmarks/dense_threshold_cpu.py --threads 1              # smollm2-135m as target and draft
    python benchmarks/dense_threshold_cpu.py --threads 1 --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b
    python benchmarks/dense_threshold_cpu.py --lengths 64 256 --repeats 1 --out /tmp/x   # a quick check
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import sys
import time
from typing import Any

import torch
from _common import add_output_args, command_line, setup_logging, write_results

from specprefill_sdk.eval.corpora import haystack
from specprefill_sdk.models import load_model
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.policies import load_pipeline
from specprefill_sdk.prompt import build_prompt

logger = logging.getLogger("dense_threshold_cpu")

SYSTEM = "You are a helpful assistant."
QUESTION = "\n\nIn one sentence, what is the text above about?"
SHORT_CHATS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for sleeping better.",
    "What is 12 times 7?",
    "Translate 'good morning' into Spanish.",
    "Name a famous painting by Leonardo da Vinci.",
    "Explain what a prime number is in one sentence.",
    "Suggest a name for a black cat.",
)


def chat(tokenizer: Any, length: int) -> tuple[list[dict[str, str]], int]:
    """Messages whose chat-template prompt is about ``length`` tokens, and their exact length."""
    messages: list[dict[str, str]] = []
    chars = max(16, length * 4)
    n = 0
    for _ in range(12):  # a few rounds of proportional correction reach the length closely
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": haystack(chars) + QUESTION}]
        n = build_prompt(tokenizer, messages).n
        if abs(n - length) <= max(2, length // 50):
            break
        chars = max(16, int(chars * length / n))
    return messages, n


def ttft(pipe: Pipeline, messages: Any) -> tuple[float, float]:
    """Wall and process CPU milliseconds to the first token (with one torch thread, CPU time is the
    single-core compute time, whatever else runs on the machine)."""
    c0 = time.process_time()
    wall = float(pipe.generate(messages, max_tokens=1).timings.ttft)
    return wall, (time.process_time() - c0) * 1000.0


def answer(pipe: Pipeline, messages: Any, tokens: int) -> tuple[str, int, int]:
    out = pipe.generate(messages, max_tokens=tokens)
    return out.text, out.usage.kept_tokens, out.usage.prompt_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="the target")
    parser.add_argument("--draft", default=None, help="the draft (default: the target, one copy of the weights)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 768, 1024, 1536, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--answer-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    add_output_args(parser, "dense_threshold_cpu")
    args = parser.parse_args()
    setup_logging(sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load_model(args.model, device="cpu")
    draft = loaded if args.draft is None else load_model(args.draft, device="cpu")
    dense = load_pipeline("dense", model=loaded)
    paper = load_pipeline("paper", model=loaded, draft=draft, dense_below_tokens=0)
    tok = loaded.tokenizer
    for pipe in (dense, paper):  # warm-up: first calls pay for allocations and lazy set-up
        pipe.generate(chat(tok, 256)[0], max_tokens=2)

    rows: list[dict[str, Any]] = []
    for length in args.lengths:
        messages, n = chat(tok, length)
        runs: dict[str, list[tuple[float, float]]] = {"dense": [], "paper": []}
        for _ in range(args.repeats):  # interleaved, so that load from elsewhere hits both alike
            runs["dense"].append(ttft(dense, messages))
            runs["paper"].append(ttft(paper, messages))
        wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        d_text, _, _ = answer(dense, messages, args.answer_tokens)
        p_text, kept, _ = answer(paper, messages, args.answer_tokens)
        row = {
            "n": n,
            "kept": kept,
            "dense_ms": wall["dense"],
            "paper_ms": wall["paper"],
            "dense_cpu_ms": cpu["dense"],
            "paper_cpu_ms": cpu["paper"],
            "same_answer": d_text == p_text,
            "dense_answer": d_text,
            "paper_answer": p_text,
        }
        row["speedup"] = row["dense_ms"] / row["paper_ms"]
        row["cpu_speedup"] = row["dense_cpu_ms"] / row["paper_cpu_ms"]
        logger.info(
            "n=%d kept=%d dense %.1f ms paper %.1f ms (%.2fx); CPU %.1f / %.1f ms (%.2fx); same=%s",
            n,
            kept,
            row["dense_ms"],
            row["paper_ms"],
            row["speedup"],
            row["dense_cpu_ms"],
            row["paper_cpu_ms"],
            row["cpu_speedup"],
            row["same_answer"],
        )
        rows.append(row)

    short: list[dict[str, Any]] = []
    for question in SHORT_CHATS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        d_text, _, n = answer(dense, messages, args.answer_tokens)
        p_text, kept, _ = answer(paper, messages, args.answer_tokens)
        short.append(
            {
                "question": question,
                "n": n,
                "kept": kept,
                "same_answer": d_text == p_text,
                "dense_answer": d_text,
                "paper_answer": p_text,
            }
        )
        logger.info("short n=%d kept=%d same=%s", n, kept, d_text == p_text)

    result = {
        "command": command_line(),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "model": args.model,
        "draft": args.draft or args.model,
        "repeats": args.repeats,
        "answer_tokens": args.answer_tokens,
        "rows": rows,
        "short_chats": short,
    }
    write_results(args.out, args.name, result, markdown)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Dense threshold on CPU: `{result['model']}` target, `{result['draft']}` draft",
        "",
        f"`{result['command']}`; torch {result['machine']['torch']}, {result['machine']['threads']} threads, "
        f"median of {result['repeats']}.",
        "",
        "| n | kept (paper) | dense TTFT ms | paper TTFT ms | speedup | dense CPU ms | paper CPU ms | CPU speedup "
        "| same answer |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['n']} | {r['kept']} | {r['dense_ms']:.1f} | {r['paper_ms']:.1f} | {r['speedup']:.2f}x | "
            f"{r['dense_cpu_ms']:.1f} | {r['paper_cpu_ms']:.1f} | {r['cpu_speedup']:.2f}x | "
            f"{'yes' if r['same_answer'] else 'no'} |"
        )
    lines += [
        "",
        "Short chats (no document):",
        "",
        "| n | kept (paper) | same answer | question |",
        "|---:|---:|:---:|---|",
    ]
    for r in result["short_chats"]:
        lines.append(f"| {r['n']} | {r['kept']} | {'yes' if r['same_answer'] else 'no'} | {r['question']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
