"""The draft's scoring passes three ways: transformers' modules, `LeanModel` eagerly, `LeanModel` compiled.

For each draft of ``ttft_gpu.py`` (random weights, bf16) and each length: the scorer's time at
look-ahead 1 and 8, the fixed-buffer path's phases (prefill, decode steps, reduction), the time the
first compiled call took, and how far the scores are from those of transformers' modules.

Usage (device machine)::

    python benchmarks/lean_gpu.py --out $OUT
    python benchmarks/lean_gpu.py --tiny --out /tmp/lean-check     # CPU check with tiny configs
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from functools import partial
from typing import Any

import torch
from _common import add_output_args, write_results
from profile_gpu import compare_scores, fixed_buffer_phases
from ttft_gpu import CONFIGS, PAIRS, build_model, plain_forward, report_header, start_run, synthetic_tokenizer, tiny

from specprefill_sdk.runtime import ExecutionSettings
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.types import Prompt

logger = logging.getLogger("lean_gpu")

VARIANTS = {
    "modules": ExecutionSettings(lean=False),
    "lean": ExecutionSettings(lean=True),
    "compiled": ExecutionSettings(lean=True, compile=True),
}


def kept_rows(name: str, target: Any, n: int, rates: list[float], bench: Any) -> list[dict[str, Any]]:
    """A target's prefill of the tokens a keep rate leaves of ``n``, at their positions: plain, lean, compiled."""
    from transformers import DynamicCache

    from specprefill_sdk.runtime.lean import LeanModel

    rows = []
    gen = torch.Generator().manual_seed(7)
    model = target.model
    for rate in rates:
        k = int(n * rate)
        positions = torch.randperm(n, generator=gen)[:k].sort().values.to(bench.device)
        ids = torch.randint(1000, model.config.vocab_size - 1000, (k,), generator=gen).to(bench.device)
        row: dict[str, Any] = {"target": name, "n": n, "keep": rate, "k": k}
        row["plain_ms"] = bench.median(partial(plain_forward, target, ids, positions))[0]
        for variant, compiled in (("lean", False), ("compiled", True)):
            lean = LeanModel.build(model, fused=True, compiled=compiled)
            assert lean is not None

            @torch.inference_mode()
            def run(lean: Any = lean, ids: torch.Tensor = ids, positions: torch.Tensor = positions) -> int:
                cache = DynamicCache(config=model.config)

                def store(i: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
                    cache.update(key, value, i)
                    return False

                logits = lean.forward(ids[None], positions[None], store)
                return int(logits[0].argmax())

            started = time.perf_counter()
            token = run()
            row[f"{variant}_first_call_s"] = time.perf_counter() - started
            row[f"{variant}_same_token"] = token == plain_forward(target, ids, positions)
            row[f"{variant}_ms"] = bench.median(run)[0]
        logger.info("%s", row)
        rows.append(row)
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        *report_header(
            "The draft's scoring passes: transformers' modules, lean, lean compiled", result, "medians after a warm-up"
        ),
        "",
        "| draft | n | variant | LA1 ms | LA8 ms | LA8 prefill ms | LA8 steps ms (per step) | reduction ms "
        "| first call s | same tokens | max score diff (of max) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in result["rows"]:
        ph = r.get("phases", {})
        cmp = r.get("vs_modules") or {}
        diff = f"{cmp['max_abs_diff']:.2e} ({cmp['max_score']:.2e})" if cmp else "-"
        lines.append(
            f"| {r['draft']} | {r['n']} | {r['variant']} | {r['score_la1_ms']:.1f} | {r['score_la8_ms']:.1f} "
            f"| {ph.get('prefill_ms', float('nan')):.1f} | {ph.get('steps_ms', float('nan')):.1f} "
            f"({ph.get('step_ms', float('nan')):.2f}) | {ph.get('reduce_ms', float('nan')):.1f} "
            f"| {r['first_call_s']:.1f} | {cmp.get('same_look_ahead', '-')} | {diff} |"
        )
    if result.get("kept"):
        lines += [
            "",
            "## The targets' kept prefill (ms; first compiled call in s)",
            "",
            "| target | n | keep | tokens | plain | lean | compiled | first compiled call | same token |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in result["kept"]:
            lines.append(
                f"| {r['target']} | {r['n']} | {r['keep']} | {r['k']} | {r['plain_ms']:.1f} | {r['lean_ms']:.1f} "
                f"| {r['compiled_ms']:.1f} | {r['compiled_first_call_s']:.1f} "
                f"| {r['lean_same_token']} / {r['compiled_same_token']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 32768])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--targets", action="store_true", help="also time the targets' kept prefills")
    parser.add_argument("--no-drafts", action="store_true")
    add_output_args(parser, "lean_gpu_h200", "/tmp/lean_gpu")
    args = parser.parse_args()
    if args.tiny:
        args.lengths = [256, 512]
    device, bench, out, result = start_run("lean_gpu", args, budget_s=1e9)
    result["rows"] = []

    def save() -> None:
        write_results(out, args.name, result, markdown)

    for pair in ("llama", "qwen"):
        target_name, draft_name = PAIRS[pair]
        if args.targets:
            tcfg = tiny(CONFIGS[target_name]) if args.tiny else CONFIGS[target_name]
            target = build_model(target_name, tcfg, device, synthetic_tokenizer(tcfg["vocab_size"]))
            for n in args.lengths:
                result.setdefault("kept", []).extend(kept_rows(target_name, target, n, [0.1, 0.3], bench))
            save()
            del target
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if args.no_drafts:
            continue
        dcfg = tiny(CONFIGS[draft_name]) if args.tiny else CONFIGS[draft_name]
        tokenizer = synthetic_tokenizer(dcfg["vocab_size"])
        draft = build_model(draft_name, dcfg, device, tokenizer)
        gen = torch.Generator().manual_seed(99)
        for n in args.lengths:
            ids = torch.randint(1000, dcfg["vocab_size"] - 1000, (n,), generator=gen).tolist()
            prompt = Prompt.from_token_ids(ids)
            reference: Any = None
            for variant, execution in VARIANTS.items():
                scorers = {
                    la: DraftAttentionScorer(draft, look_ahead=la, target_tokenizer=tokenizer, execution=execution)
                    for la in (1, 8)
                }
                started = time.perf_counter()
                scores = scorers[8].score(prompt)
                row: dict[str, Any] = {"draft": draft_name, "n": n, "variant": variant}
                row["first_call_s"] = time.perf_counter() - started
                if reference is None:
                    reference = scores
                else:
                    row["vs_modules"] = compare_scores(scores, reference)
                for la, scorer in scorers.items():
                    row[f"score_la{la}_ms"] = bench.median(partial(scorer.score, prompt))[0]
                row["phases"] = fixed_buffer_phases(scorers[8], prompt, bench)
                logger.info("%s", row)
                result["rows"].append(row)
                save()
                for scorer in scorers.values():
                    scorer.release()
        del draft
        if device.type == "cuda":
            torch.cuda.empty_cache()
    save()
    sys.stdout.write(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
