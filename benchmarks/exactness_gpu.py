"""Exactness of the GPU scoring paths against the slow reference, in float32 and in bf16.

For each draft architecture (random weights), one prompt of random ids, look-ahead 8, scored by:

- ``graph``: `DraftAttentionScorer` as shipped (fixed buffers, CUDA graph, fused RMSNorm, lean passes);
- ``compiled``: the same with ``compile=True`` (element-wise work fused by `torch.compile`, CUDA only);
- ``modules``: the CUDA graph with the passes run through transformers' modules (``ExecutionSettings(lean=False)``);
- ``eager``: the shipped path without the CUDA graph;
- ``unfused``: the CUDA graph with transformers' own RMSNorm (``ExecutionSettings(fused_norms=False)``);
- ``stepwise``: step-by-step decoding over a growing cache (the path of windowed drafts);
- ``early``: look-ahead 1 with the draft's first half of its layers only (``layers=depth // 2``: the
  forward pass stops there), against the reference restricted to the same layers;
- ``reference``: `reference_draft_attention_scores` (eager attention, whole-sequence recompute).

Each is compared with the reference: the largest score difference relative to the largest score, and
whether the look-ahead tokens are the same. In float32 every path must agree with the reference; in
bf16 a greedy look-ahead token may flip where the draft's two best logits are closer than bf16's
rounding, so the report also gives the smallest top-2 logit margin of the reference's look-ahead.

Usage::

    python benchmarks/exactness_gpu.py --out $OUT          # on the H200
    python benchmarks/exactness_gpu.py --tiny --out /tmp/x # a CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch
from _common import add_output_args, write_results
from ttft_gpu import CONFIGS, build_model, report_header, start_run, synthetic_tokenizer, tiny

from specprefill_sdk.runtime import ExecutionSettings
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.scoring.draft_attention import reference_draft_attention_scores
from specprefill_sdk.types import Prompt

DRAFTS = ("llama-3.2-1b", "qwen2.5-0.5b")
LOOK_AHEAD = 8


def smallest_margin(loaded: Any, ids: list[int], continuation: list[int]) -> float:
    """The smallest gap between the two best logits over the reference's greedy look-ahead decisions.

    Computed as the reference decides: with eager attention (in bf16 the SDPA kernels round
    differently, and their margins differ from the reference's).
    """
    model = loaded.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        sequence = torch.tensor([ids + continuation], device=loaded.device)
        with torch.inference_mode():
            logits = model(input_ids=sequence, use_cache=False).logits[0, len(ids) - 1 :].float()
    finally:
        model.set_attn_implementation(previous)
    top = logits.topk(2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min())


def compare(loaded: Any, tokenizer: Any, n: int) -> dict[str, Any]:
    vocab = loaded.model.config.vocab_size
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(1000 if vocab > 5000 else 10, vocab - 10, (n,), generator=gen).tolist()
    prompt = Prompt.from_token_ids(ids)
    graph = DraftAttentionScorer(loaded, look_ahead=LOOK_AHEAD, target_tokenizer=tokenizer)
    eager = graph.with_options(execution=ExecutionSettings(cuda_graph=False))
    unfused = DraftAttentionScorer(
        loaded, look_ahead=LOOK_AHEAD, target_tokenizer=tokenizer, execution=ExecutionSettings(fused_norms=False)
    )
    stepwise = graph.with_options()
    stepwise._fixed_buffers = False
    compiled = DraftAttentionScorer(
        loaded, look_ahead=LOOK_AHEAD, target_tokenizer=tokenizer, execution=ExecutionSettings(compile=True)
    )
    modules = DraftAttentionScorer(
        loaded, look_ahead=LOOK_AHEAD, target_tokenizer=tokenizer, execution=ExecutionSettings(lean=False)
    )
    expected, continuation = reference_draft_attention_scores(loaded, ids, look_ahead=LOOK_AHEAD)
    peak = float(expected.abs().max())
    row: dict[str, Any] = {"n": n, "dtype": str(loaded.dtype).removeprefix("torch."), "reference_peak": peak}
    paths = {"graph": graph, "compiled": compiled, "modules": modules, "eager": eager}
    for name, scorer in {**paths, "unfused": unfused, "stepwise": stepwise}.items():
        got = scorer.score(prompt)
        row[name] = {
            "rel": float((got.values - expected).abs().max()) / peak,
            "same_tokens": list(got.info["look_ahead_token_ids"]) == continuation[: LOOK_AHEAD - 1],
        }
    for scorer in (graph, compiled, modules, unfused):
        scorer.release()
    half = graph.depth // 2
    early = DraftAttentionScorer(loaded, look_ahead=1, layers=half, target_tokenizer=tokenizer).score(prompt)
    early_expected, _ = reference_draft_attention_scores(loaded, ids, look_ahead=1, layers=half)
    row["early"] = {
        "layers": half,
        "rel": float((early.values - early_expected).abs().max()) / float(early_expected.abs().max()),
    }
    row["min_top2_margin"] = smallest_margin(loaded, ids, continuation)
    return row


def markdown(result: dict[str, Any]) -> str:
    lines = [
        *report_header("Scoring paths against the slow reference (look-ahead 8, random weights)", result, "one run"),
        "",
        "Each cell: largest score difference / largest reference score; `=` when the look-ahead tokens "
        "equal the reference's, `≠` when not.",
        "",
        "| draft | dtype | n | graph (shipped) | compiled | modules | eager | unfused norms | stepwise "
        "| first half of the layers, look-ahead 1 | smallest top-2 logit margin |",
        "|---|---|---:|---|---|---|---|---|---|---|---:|",
    ]
    for r in result["rows"]:
        paths = ("graph", "compiled", "modules", "eager", "unfused", "stepwise", "early")
        cells = " | ".join(
            f"{r[k]['rel']:.1e}" + ("" if "same_tokens" not in r[k] else " =" if r[k]["same_tokens"] else " ≠")
            for k in paths
        )
        lines.append(f"| {r['draft']} | {r['dtype']} | {r['n']} | {cells} | {r['min_top2_margin']:.2e} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--tiny", action="store_true", help="tiny configs on CPU (a check of the script)")
    add_output_args(parser, "exactness_gpu_h200", "/tmp/exactness_gpu")
    args = parser.parse_args()
    args.repeats = 1
    if args.tiny:
        args.n = min(args.n, 256)
    device, _, out, result = start_run("exactness_gpu", args, budget_s=1e9)
    result["rows"] = []
    for name in DRAFTS:
        config = tiny(CONFIGS[name]) if args.tiny else CONFIGS[name]
        tokenizer = synthetic_tokenizer(config["vocab_size"])
        loaded = build_model(name, config, device, tokenizer)
        for dtype in (torch.float32, torch.bfloat16):
            loaded.model.to(dtype)
            loaded.dtype = dtype
            row = {"draft": name, **compare(loaded, tokenizer, args.n)}
            result["rows"].append(row)
            sys.stdout.write(json.dumps(row) + "\n")
        del loaded
        if device.type == "cuda":
            torch.cuda.empty_cache()
    sys.stdout.write(write_results(out, args.name, result, markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
