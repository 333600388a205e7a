"""Quickstart: ask about a fact hidden in a long essay, with dense prefill and with SpecPrefill.

Runs on the bundled SmolLM2-135M-Instruct model on CPU (the draft and the target are the same model
here, which shows the mechanics; real deployments pair a small draft with a large target).

    python examples/quickstart.py [--keep 0.1] [--chars 7000] [--max-tokens 24]
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from specprefill_sdk import Completion, Pipeline
from specprefill_sdk.eval.corpora import haystack

FACT = "The secret code of the orange lighthouse is 7193."
QUESTION = "What is the secret code of the orange lighthouse? Answer with the number only."


def build_messages(chars: int) -> list[dict[str, str]]:
    """An essay of about ``chars`` characters with FACT planted at a sentence boundary in the middle."""
    text = haystack(chars)
    cut = text.find(". ", len(text) // 2) + 2
    document = text[:cut] + FACT + " " + text[cut:]
    return [{"role": "user", "content": f"{document}\n\nQuestion: {QUESTION}"}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="target (and draft) model")
    parser.add_argument("--keep", type=float, default=0.1, help="keep rate of the SpecPrefill run")
    parser.add_argument("--chars", type=int, default=7000, help="length of the essay in characters")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args(argv)

    messages = build_messages(args.chars)
    runs: list[tuple[str, Completion]] = []
    dense = Pipeline.from_policy("paper", model=args.model, keep_rate=1.0)
    runs.append(("dense prefill", dense.generate(messages, max_tokens=args.max_tokens)))
    sparse = Pipeline.from_policy("paper", model=args.model, keep_rate=args.keep)
    runs.append((f"SpecPrefill keep {args.keep:g}", sparse.generate(messages, max_tokens=args.max_tokens)))

    console = Console()
    console.print(f"[bold]Question:[/bold] {QUESTION}  (planted fact: {FACT!r})")
    table = Table(title=f"{args.model} on CPU")
    for column in ("run", "kept / prompt tokens", "score ms", "prefill ms", "TTFT ms", "answer"):
        table.add_column(column, justify="left" if column in ("run", "answer") else "right")
    for name, c in runs:
        table.add_row(
            name,
            f"{c.usage.kept_tokens} / {c.usage.prompt_tokens}",
            f"{c.timings.score:.0f}",
            f"{c.timings.prefill:.0f}",
            f"{c.timings.ttft:.0f}",
            c.text.strip(),
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
