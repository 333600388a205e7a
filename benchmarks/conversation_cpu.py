"""CPU benchmark of multi-turn conversations: what each strategy prefills and how long each turn takes.

A five-turn conversation over a long document with two facts hidden in it. Turn 1 asks about the
first paragraph (the facts are not needed, so a compressed prompt drops them); turns 2, 4 and 5 ask
for the facts; turn 3 is small talk. Each conversation runs once per strategy, with the real SmolLM2
as draft and target by default (``--draft`` and ``--target`` choose others):

- ``uncompressed``: keep everything, prefill the whole history every turn (no cache between turns);
- ``uncompressed-cached``: keep everything, reuse the cache (only new tokens are prefilled), as a
  chat server with prefix caching does;
- ``recompute``, ``incremental``, ``refresh``, ``refresh-approx``: `Conversation` strategies over
  ``Protect(Chunked(KeepRate(rate), 32))`` with the draft-attention scorer (``refresh-approx`` is
  refresh with ``recompute_stale=False``).

Per turn: prompt tokens, tokens in the target's cache for the prompt, target tokens prefilled, draft
tokens prefilled, time to first token, turn time, and whether the answer holds the asked fact.

Usage::

    python benchmarks/conversation_cpu.py                    # 2 documents, keep 0.2, 16 new tokens a turn
    python benchmarks/conversation_cpu.py --docs 1 --out /tmp/x
    python benchmarks/conversation_cpu.py --draft qwen2.5-coder-0.5b --target qwen2.5-coder-1.5b --docs 1
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _common import RESULTS, add_dtype_arg, dtype_name, save_figure, setup_logging, write_results

from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.eval.corpora import haystack
from specprefill_sdk.models import load_model
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.scoring import DraftAttentionScorer, UniformScorer
from specprefill_sdk.selection import Chunked, KeepRate, Protect

logger = logging.getLogger("conversation_cpu")

FACTS = (
    ("The secret code for the vault is 7419. ", "7419"),
    ("The board meeting was moved to Thursday afternoon. ", "Thursday"),
)
TURNS = (
    ("\n\nIn one sentence, what is the first paragraph about?", None),
    ("What is the secret code for the vault?", "7419"),
    ("Thanks. Say your first answer again in five words.", None),
    ("On which day is the board meeting now?", "Thursday"),
    ("What was the secret code again?", "7419"),
)
STRATEGIES = ("uncompressed", "uncompressed-cached", "recompute", "incremental", "refresh", "refresh-approx")


def document(index: int, chars: int) -> str:
    """Essay text of about ``chars`` characters (a different stretch per index) with both facts inside."""
    text = haystack(chars * (index + 1))[chars * index :]
    first = text.index(". ", len(text) // 3) + 2
    second = text.index(". ", 2 * len(text) // 3) + 2
    return text[:first] + FACTS[0][0] + text[first:second] + FACTS[1][0] + text[second:]


def run_conversation(pipe: Pipeline, strategy: str, doc: str, max_tokens: int) -> list[dict[str, Any]]:
    kind = {"uncompressed": "recompute", "uncompressed-cached": "incremental", "refresh-approx": "refresh"}
    conv = pipe.conversation(strategy=kind.get(strategy, strategy), recompute_stale=strategy != "refresh-approx")
    rows = []
    for turn, (question, expected) in enumerate(TURNS, start=1):
        message = doc + question if turn == 1 else question
        started = time.perf_counter()
        completion = conv.send(message, max_tokens=max_tokens)
        wall = (time.perf_counter() - started) * 1000.0
        stats = conv.turns[-1]
        fact_kept = None
        if expected is not None:
            # Which share of the asked fact's tokens the target held when it answered.
            prompt = pipe.prompt(list(conv.history[:-1]))
            fact = next(text for text, answer in FACTS if answer == expected)
            start = prompt.text.index(fact)
            tokens = [i for i, (a, b) in enumerate(prompt.offsets) if b > start and a < start + len(fact)]
            kept = set(completion.selection.indices) if completion.selection is not None else set()
            fact_kept = sum(i in kept for i in tokens) / len(tokens)
        rows.append(
            {
                "turn": turn,
                "prompt_tokens": stats.prompt_tokens,
                "kept_tokens": stats.kept_tokens,
                "prefilled_tokens": stats.prefilled_tokens,
                "reused_tokens": stats.reused_tokens,
                "evicted_tokens": stats.evicted_tokens,
                "draft_tokens": stats.draft_tokens,
                "score_ms": completion.timings.score,
                "prefill_ms": completion.timings.prefill,
                "ttft_ms": completion.timings.ttft,
                "turn_ms": wall,
                "answer": completion.text,
                "expected": expected,
                "correct": None if expected is None else expected in completion.text,
                "fact_kept": fact_kept,
            }
        )
        logger.info("%s turn %d: %s", strategy, turn, rows[-1])
    return rows


def summarize(results: dict[str, list[list[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    summary: dict[str, dict[str, Any]] = {}
    for strategy, convs in results.items():
        turns = len(convs[0])
        per_turn = []
        for t in range(turns):
            rows = [c[t] for c in convs]
            per_turn.append(
                {
                    key: statistics.mean(r[key] for r in rows)
                    for key in (
                        "prompt_tokens",
                        "kept_tokens",
                        "prefilled_tokens",
                        "draft_tokens",
                        "ttft_ms",
                        "turn_ms",
                    )
                }
            )
        checks = [r["correct"] for c in convs for r in c if r["correct"] is not None]
        shares = [r["fact_kept"] for c in convs for r in c if r["fact_kept"] is not None]
        summary[strategy] = {
            "per_turn": per_turn,
            "prefilled_total": sum(t["prefilled_tokens"] for t in per_turn),
            "draft_total": sum(t["draft_tokens"] for t in per_turn),
            "ttft_later_turns_ms": statistics.mean(t["ttft_ms"] for t in per_turn[1:]),
            "fact_answers": f"{sum(checks)}/{len(checks)}",
            "fact_tokens_kept": statistics.mean(shares),
        }
    return summary


def markdown(meta: dict[str, Any], summary: dict[str, dict[str, Any]]) -> str:
    lines = [
        "# Multi-turn conversations on CPU",
        "",
        f"Draft {meta['draft']}, target {meta['target']} ({meta['dtype']}, {meta['threads']} CPU thread(s), "
        f"{meta['docs']} conversation(s) of {len(TURNS)} turns, keep rate {meta['keep_rate']}, chunks of 32, "
        f"{meta['max_tokens']} new tokens per turn, greedy). Means over conversations.",
        "",
        "| strategy | target tokens prefilled (turns 1-5) | total | draft tokens (total) | TTFT turns 2-5 (ms) "
        "| fact tokens held | fact answers |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        per = " / ".join(f"{t['prefilled_tokens']:.0f}" for t in s["per_turn"])
        lines.append(
            f"| {name} | {per} | {s['prefilled_total']:.0f} | {s['draft_total']:.0f} | "
            f"{s['ttft_later_turns_ms']:.0f} | {s['fact_tokens_kept']:.0%} | {s['fact_answers']} |"
        )
    lines += [
        "",
        "Time to first token per turn (ms):",
        "",
        "| strategy | " + " | ".join(f"turn {i}" for i in range(1, len(TURNS) + 1)) + " |",
        "|---|" + "---|" * len(TURNS),
    ]
    for name, s in summary.items():
        lines.append(f"| {name} | " + " | ".join(f"{t['ttft_ms']:.0f}" for t in s["per_turn"]) + " |")
    prompt = summary[next(iter(summary))]["per_turn"]
    lines += [
        "",
        "Prompt tokens per turn: " + " / ".join(f"{t['prompt_tokens']:.0f}" for t in prompt) + ".",
        "",
        f"Machine: {meta['machine']}; load average at start {meta['load_average']}.",
        "",
    ]
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    for name, s in summary.items():
        turns = range(1, len(s["per_turn"]) + 1)
        axes[0].plot(turns, [t["prefilled_tokens"] for t in s["per_turn"]], marker="o", label=name)
        axes[1].plot(turns, [t["ttft_ms"] for t in s["per_turn"]], marker="o", label=name)
    axes[0].set(title="target tokens prefilled per turn", xlabel="turn", ylabel="tokens", yscale="log")
    axes[1].set(title="time to first token per turn", xlabel="turn", ylabel="time to first token (ms)", yscale="log")
    for ax in axes:
        ax.set_xticks(range(1, len(TURNS) + 1))
    # One legend below both panels: inside the left one it covered the uncompressed line.
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=9, frameon=False)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=2, help="conversations (different documents)")
    parser.add_argument("--chars", type=int, default=4000, help="characters of essay per document")
    parser.add_argument("--keep-rate", type=float, default=0.2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    add_dtype_arg(parser)
    parser.add_argument("--target", default="smollm2-135m", help="target model spec")
    parser.add_argument("--draft", default=None, help="draft model spec (default: the target)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    setup_logging()
    torch.set_num_threads(args.threads)

    loaded = load_model(args.target, device="cpu", dtype=args.dtype, progress=False)
    draft = loaded if args.draft in (None, args.target) else load_model(args.draft, device="cpu", dtype=args.dtype)
    backend = TransformersBackend(loaded)
    scorer = DraftAttentionScorer(draft, target_tokenizer=loaded.tokenizer)
    compressed = Pipeline(scorer, Protect(Chunked(KeepRate(args.keep_rate), 32), sink=1, tail=True), backend)
    dense = Pipeline(UniformScorer(), KeepRate(1.0), backend)
    docs = [document(i, args.chars) for i in range(args.docs)]
    meta = {
        "target": loaded.name,
        "draft": draft.name,
        "docs": args.docs,
        "chars": args.chars,
        "keep_rate": args.keep_rate,
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "dtype": dtype_name(loaded.dtype),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}",
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }
    # Warm-up: the first forward passes of a process are slower.
    dense.generate("Hello there, how are you?", max_tokens=2)
    results: dict[str, list[list[dict[str, Any]]]] = {}
    for strategy in args.strategies:
        pipe = dense if strategy.startswith("uncompressed") else compressed
        results[strategy] = [run_conversation(pipe, strategy, doc, args.max_tokens) for doc in docs]
    summary = summarize(results)
    stem = "conversation_cpu" if loaded.name == draft.name == "smollm2-135m" else f"conversation_cpu_{loaded.name}"
    result = {"meta": meta, "summary": summary, "runs": results}
    text = write_results(
        args.out, stem, result, lambda r: markdown(r["meta"], r["summary"]), lambda r, path: plot(r["summary"], path)
    )
    print(text)


if __name__ == "__main__":
    main()
