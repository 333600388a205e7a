"""Host time the SDK adds to the plain forward passes that bound SpecPrefill (CPU, tiny models).

On a GPU, short prompts are host-bound: the host launches kernels more slowly than the GPU runs them,
so every microsecond of Python per operation shows in the time to first token. This benchmark makes
the models so small (real Llama-3.1-8B / Llama-3.2-1B layer counts, hidden size 32) that a forward
pass costs almost nothing but its host work, and compares on one CPU thread:

- ``draft plain`` / ``score``: a plain draft forward against `DraftAttentionScorer.score` (look-ahead 1);
- ``kept plain`` / ``kept backend``: a plain forward of the kept tokens at their positions against
  `TransformersBackend.generate(max_tokens=1)`;
- ``e2e``: `Pipeline.generate(max_tokens=1)` against the sum of its parts.

Usage::

    python benchmarks/host_overhead_cpu.py                       # results/host_overhead_cpu.{json,md}
    python benchmarks/host_overhead_cpu.py --repeats 50 --n 128
"""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Any

import torch
from _common import add_output_args, command_line, median_ms, write_results
from ttft_gpu import CONFIGS, build_model, plain_forward, selector, synthetic_tokenizer, tiny

from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.types import CompressedPrompt, Prompt, SamplingParams


def small(name: str) -> dict[str, Any]:
    """The real layer count of ``name`` with tiny matrices: the host's share of a forward pass."""
    config = tiny(CONFIGS[name])
    config.update(
        num_hidden_layers=CONFIGS[name]["num_hidden_layers"], hidden_size=32, intermediate_size=32, head_dim=16
    )
    return config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64, help="prompt tokens")
    parser.add_argument("--repeats", type=int, default=30)
    add_output_args(parser, "host_overhead_cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    tokenizer = synthetic_tokenizer(4096)
    target = build_model("llama-3.1-8b layers, tiny", small("llama-3.1-8b"), cpu, tokenizer)
    draft = build_model("llama-3.2-1b layers, tiny", small("llama-3.2-1b"), cpu, tokenizer)
    backend = TransformersBackend(target)
    scorer = DraftAttentionScorer(draft, look_ahead=1, pool_kernel=13, target_tokenizer=tokenizer)
    pipe = Pipeline(scorer, selector(0.1), backend)
    gen = torch.Generator().manual_seed(0)
    prompt = Prompt.from_token_ids(torch.randint(10, 4000, (args.n,), generator=gen).tolist())
    ids = torch.tensor(prompt.token_ids)
    kept = CompressedPrompt.from_selection(prompt, selector(0.1).select(prompt, scorer.score(prompt)))
    kids, kpos = torch.tensor(kept.token_ids), torch.tensor(kept.position_ids)
    first = SamplingParams(max_tokens=1)
    scores = scorer.score(prompt)
    r = args.repeats
    ms = {
        "draft_plain": median_ms(lambda: plain_forward(draft, ids), r, warmup=1),
        "score": median_ms(lambda: scorer.score(prompt), r, warmup=1),
        "select": median_ms(lambda: selector(0.1).select(prompt, scores), r, warmup=1),
        "kept_plain": median_ms(lambda: plain_forward(target, kids, kpos), r, warmup=1),
        "kept_backend": median_ms(lambda: backend.generate(kept, first), r, warmup=1),
        "e2e": median_ms(lambda: pipe.generate(prompt, first), r, warmup=1),
    }
    result = {
        "benchmark": "host_overhead_cpu",
        "command": command_line(),
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__, "threads": 1},
        "n": args.n,
        "kept": kept.kept,
        "layers": {"target": target.model.config.num_hidden_layers, "draft": draft.model.config.num_hidden_layers},
        "median_ms": ms,
        "overhead_ms": {
            "score_over_draft_plain": ms["score"] - ms["draft_plain"],
            "backend_over_kept_plain": ms["kept_backend"] - ms["kept_plain"],
            "pipeline_over_parts": ms["e2e"] - (ms["score"] + ms["select"] + ms["kept_backend"]),
        },
    }
    over = result["overhead_ms"]
    lines = [
        "# Host time the SDK adds to plain forward passes (CPU, one thread, tiny matrices)",
        "",
        f"- command: `{result['command']}`; medians of {r} calls; torch {torch.__version__}",
        f"- prompt {args.n} tokens, {kept.kept} kept; target {result['layers']['target']} layers, "
        f"draft {result['layers']['draft']} layers, hidden size 32",
        "",
        "| draft plain | score | select | kept plain | kept backend | e2e | score - draft | backend - kept | "
        "pipeline - parts |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {ms['draft_plain']:.2f} | {ms['score']:.2f} | {ms['select']:.2f} | {ms['kept_plain']:.2f} "
        f"| {ms['kept_backend']:.2f} | {ms['e2e']:.2f} | {over['score_over_draft_plain']:+.2f} "
        f"| {over['backend_over_kept_plain']:+.2f} | {over['pipeline_over_parts']:+.2f} |",
        "",
    ]
    sys.stdout.write(write_results(args.out, args.name, result, lambda _: "\n".join(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
