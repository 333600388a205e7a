"""CPU cost of draft-attention scoring against a plain draft prefill (SmolLM2-135M, 2K tokens).

Timed in one process after one warm-up each, median of ``--repeats`` rounds; every round runs each
variant once, so that changes in machine load touch all of them alike:

- ``prefill``: one plain forward pass of the prompt through the draft (KV cache written, last logits);
- ``prefill_and_look_ahead``: that prefill plus 7 greedy decode steps, without scoring: what the
  look-ahead itself costs;
- ``score_look_ahead_8`` / ``score_look_ahead_1``: `DraftAttentionScorer.score` with the paper's
  look-ahead of 8 and with the last prompt token only.

``overhead`` = score time / the matching unscored run: the price of reading the attention.

Usage::

    python benchmarks/scoring_cpu.py                    # 2048 tokens, bf16, 5 repeats
    python benchmarks/scoring_cpu.py --dtype float32 --tokens 1024 --repeats 3 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import RESULTS, add_dtype_arg, dtype_name, write_json

from specprefill_sdk.eval.corpora import haystack
from specprefill_sdk.models import LoadedModel, cache_argument, load_model
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.types import Prompt


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall ms, process CPU ms) of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - w0) * 1000.0, (time.process_time() - c0) * 1000.0


@torch.inference_mode()
def _prefill(loaded: LoadedModel, ids: torch.Tensor, steps: int = 0) -> None:
    from transformers import DynamicCache

    model = loaded.model
    cache = {cache_argument(model): DynamicCache(config=model.config)}
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache)
    for _ in range(steps):
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        out = model(input_ids=token, use_cache=True, logits_to_keep=1, **cache)


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=2048)
    add_dtype_arg(parser)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS / "scoring_cpu.json"))
    args = parser.parse_args()

    loaded = load_model(args.model, device="cpu", dtype=args.dtype, progress=False)
    ids = build_prompt(loaded.tokenizer, haystack(args.tokens * 6)).token_ids[: args.tokens]
    if len(ids) < args.tokens:
        raise SystemExit(f"only {len(ids)} tokens of text")
    prompt = Prompt.from_token_ids(ids)
    tensor = prompt.ids_tensor()[None]
    scorer = DraftAttentionScorer(loaded)
    load_before = _load()
    runs = {
        "prefill": lambda: _prefill(loaded, tensor),
        "prefill_and_look_ahead": lambda: _prefill(loaded, tensor, steps=7),
        "score_look_ahead_8": lambda: scorer.score(prompt),
        "score_look_ahead_1": lambda: scorer.with_options(look_ahead=1).score(prompt),
    }
    for fn in runs.values():
        fn()  # warm-up
    # Round-robin: each repeat runs every variant once, so a change in machine load hits all of them.
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            w, c = _timed(fn)
            wall[name].append(w)
            cpu[name].append(c)
    results: dict[str, Any] = {}
    for name in runs:
        median = statistics.median(wall[name])
        results[name] = {
            "median_ms": round(median, 1),
            "runs_ms": [round(t, 1) for t in wall[name]],
            "median_cpu_ms": round(statistics.median(cpu[name]), 1),
        }
        print(f"{name:24s} {median:9.1f} ms wall {results[name]['median_cpu_ms']:9.1f} ms cpu", flush=True)
    med = {k: v["median_ms"] for k, v in results.items()}
    report = {
        "benchmark": "scoring_cpu",
        "model": args.model,
        "dtype": dtype_name(loaded.dtype),
        "tokens": args.tokens,
        "repeats": args.repeats,
        "look_ahead": 8,
        "pool_kernel": 13,
        "results": results,
        "ratios": {
            "score_8_over_prefill": round(med["score_look_ahead_8"] / med["prefill"], 3),
            "score_8_over_prefill_and_look_ahead": round(med["score_look_ahead_8"] / med["prefill_and_look_ahead"], 3),
            "score_1_over_prefill": round(med["score_look_ahead_1"] / med["prefill"], 3),
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "processor": platform.processor(),
            "load_average_before": load_before,
            "load_average_after": _load(),
        },
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
    }
    out = write_json(Path(args.out).parent, Path(args.out).stem, report, indent=2)
    print(json.dumps(report["ratios"]), "->", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
