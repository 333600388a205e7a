"""Quickstart: find a number hidden in a long essay, with dense prefill and with SpecPrefill.

Runs on the bundled SmolLM2-135M-Instruct on CPU. The draft and the target are the same model here,
so a draft that reads the whole model would cost as much as the dense prefill it saves; the draft
scores with its first ``--layers`` layers only (of 30; only those run), with one query, the prompt's
last token. That query looks for what comes next, so the prompt ends where the answer starts
("Answer: The special magic number for ... is:"): the layers that match the question's words to the
planted fact then point at it, and the kept tenth of the prompt holds it.

Dense and SpecPrefill run in alternation, ``--repeats`` times each after a warm-up (the first passes
of a process are slower); the table shows the median times, each run's answer and whether they match.

    python examples/quickstart.py [--chars 8000] [--keep 0.1] [--layers 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from specprefill_sdk import Completion, Pipeline
from specprefill_sdk.eval.corpora import haystack
from specprefill_sdk.models import load_model

KEY = "orange-lighthouse"
NUMBER = "7193"
FACT = f"The special magic number for {KEY} is: {NUMBER}."
QUESTION = f"What is the special magic number for {KEY} mentioned in the text?"
ANSWER_START = f"Answer: The special magic number for {KEY} is:"


def build_prompt(chars: int) -> str:
    """An essay of about ``chars`` characters, FACT planted at the sentence boundary in its middle, the question."""
    text = haystack(chars)
    cut = text.find(". ", len(text) // 2) + 2
    return f"{text[:cut]}{FACT} {text[cut:]}\n\n{QUESTION}\n{ANSWER_START}"


def run_both(
    dense: Pipeline, sparse: Pipeline, prompt: str, repeats: int, max_tokens: int
) -> dict[str, list[Completion]]:
    """Dense and SpecPrefill, alternately, ``repeats`` times each: both see the same load on a shared machine."""
    runs: dict[str, list[Completion]] = {"dense": [], "specprefill": []}
    for _ in range(repeats):
        runs["dense"].append(dense.generate(prompt, max_tokens=max_tokens))
        runs["specprefill"].append(sparse.generate(prompt, max_tokens=max_tokens))
    return runs


def median(runs: list[Completion], field: str) -> float:
    return statistics.median(getattr(c.timings, field) for c in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="target (and draft) model")
    parser.add_argument("--chars", type=int, default=8000, help="length of the essay in characters")
    parser.add_argument("--keep", type=float, default=0.1, help="keep rate of the SpecPrefill run")
    parser.add_argument("--layers", type=int, default=8, help="draft layers that score (look-ahead 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each, medians shown")
    parser.add_argument("--max-tokens", type=int, default=6, help="tokens to generate (the answer is a number)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's, the cores)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    console = Console()
    t0 = time.perf_counter()
    loaded = load_model(args.model, progress=False)
    load_s = time.perf_counter() - t0
    dense = Pipeline.from_policy("dense", model=loaded)
    # dense_below_tokens=0: the warm-up prompt below is short and must reach the draft too.
    sparse = Pipeline.from_policy(
        "paper", model=loaded, keep_rate=args.keep, look_ahead=1, layers=args.layers, dense_below_tokens=0
    )
    prompt = build_prompt(args.chars)
    load = os.getloadavg()[0]  # other processes on the cores lengthen every time below
    run_both(dense, sparse, build_prompt(min(args.chars, 1200)), 1, 1)  # warm-up, not shown
    runs = run_both(dense, sparse, prompt, args.repeats, args.max_tokens)

    d, s = runs["dense"][-1], runs["specprefill"][-1]
    answers = {c.text.strip() for c in runs["dense"] + runs["specprefill"]}
    same = len(answers) == 1
    dense_ttft, sparse_ttft = median(runs["dense"], "ttft"), median(runs["specprefill"], "ttft")

    console.print(f"[bold]Question:[/bold] {QUESTION}  (planted: {FACT!r}, the prompt ends with {ANSWER_START!r})")
    title = (
        f"{loaded.name}, {str(loaded.model.dtype).removeprefix('torch.')} on {loaded.device.type} "
        f"({os.cpu_count()} cores, {torch.get_num_threads()} torch "
        f"threads, load average {load:.1f}; loaded in {load_s:.1f} s); median of {args.repeats} runs"
    )
    table = Table(title=title)
    for column in ("run", "kept / prompt tokens", "draft scoring ms", "prefill ms", "TTFT ms", "answer"):
        table.add_column(column, justify="left" if column in ("run", "answer") else "right")
    for name, key, c in (
        ("dense prefill", "dense", d),
        (f"SpecPrefill keep {args.keep:g}, first {args.layers} draft layers", "specprefill", s),
    ):
        table.add_row(
            name,
            f"{c.usage.kept_tokens} / {c.usage.prompt_tokens}",
            f"{median(runs[key], 'score'):.0f}",
            f"{median(runs[key], 'prefill'):.0f}",
            f"{median(runs[key], 'ttft'):.0f}",
            c.text.strip(),
        )
    console.print(table)
    console.print(
        f"TTFT {dense_ttft:.0f} ms dense -> {sparse_ttft:.0f} ms SpecPrefill "
        f"(draft scoring {median(runs['specprefill'], 'score'):.0f} ms + kept prefill "
        f"{median(runs['specprefill'], 'prefill'):.0f} ms): [bold]{dense_ttft / sparse_ttft:.2f}x[/bold] faster, "
        f"{s.usage.kept_tokens} of {s.usage.prompt_tokens} tokens prefilled; "
        f"same answer in every run: [bold]{'yes' if same else 'no'}[/bold]"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
