"""Where SpecPrefill's GPU time goes: scoring phases, SDPA kernels, and the pipeline's steps.

A companion of ``ttft_gpu.py`` (same random-weight models, same prompts) that breaks the measured
totals down instead of reporting them:

- ``drafts``: for each draft and length, a plain prefill (with and without a KV cache), the scorer at
  look-ahead 1 and 8, and the fixed-buffer path's three phases (the recording prefill, the decode
  steps, the reduction of every layer's queries at once);
- ``sdpa``: the plain prefill under each SDPA kernel that the device offers (flash, cuDNN,
  memory-efficient), for drafts and targets;
- ``pipeline``: the Llama pair at one length, the pipeline's steps timed one by one (score, select,
  the backend's kept prefill) against the plain forwards that define the ceiling;
- ``kernels``: torch.profiler's top CUDA kernels for one look-ahead-8 scoring call.

Usage (device machine)::

    python benchmarks/profile_gpu.py --out $OUT
    python benchmarks/profile_gpu.py --tiny --out /tmp/profile-check     # CPU check with tiny configs
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
from _common import add_output_args, write_json, write_results
from ttft_gpu import (
    CONFIGS,
    PAIRS,
    Bench,
    build_model,
    plain_forward,
    report_header,
    selector,
    start_run,
    synthetic_tokenizer,
    tiny,
)

from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.runtime import ExecutionSettings
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.types import CompressedPrompt, Prompt, SamplingParams

logger = logging.getLogger("profile_gpu")


@torch.inference_mode()
def plain_nocache(loaded: Any, ids: torch.Tensor) -> int:
    out = loaded.model(input_ids=ids[None], use_cache=False, logits_to_keep=1)
    return int(out.logits[0, -1].argmax())


def fixed_buffer_phases(scorer: DraftAttentionScorer, prompt: Prompt, bench: Bench) -> dict[str, float]:
    """The fixed-buffer path's phases, timed apart (the scorer's own code path, step by step)."""
    steps = scorer.look_ahead - 1
    input_ids, lengths, pad, mask, positions = scorer._padded([tuple(prompt.token_ids)])
    size, width = input_ids.shape
    runner = scorer._runner_for(size, width, steps)
    state: dict[str, Any] = {}

    def prefill() -> None:
        state["first"] = runner.prefill(input_ids, mask, positions)

    def run_steps() -> None:
        runner.run(state["first"], lengths, pad, width)

    def reduce() -> None:
        collector = scorer._collector(pad, width, 1 + steps)
        with torch.inference_mode():
            collector.observe_stacked(runner.query_stack, runner.key_stack, runner.scalings())

    out = {}
    for name, fn in (("prefill_ms", prefill), ("steps_ms", run_steps), ("reduce_ms", reduce)):
        out[name] = bench.median(fn)[0]
    out["step_ms"] = out["steps_ms"] / max(steps, 1)
    return out


def compare_scores(a: Any, b: Any) -> dict[str, Any]:
    """How far two scorings of one prompt are apart: look-ahead tokens, largest difference, top-10% overlap."""
    k = max(1, len(a.values) // 10)
    top_a, top_b = set(a.values.topk(k).indices.tolist()), set(b.values.topk(k).indices.tolist())
    return {
        "same_look_ahead": a.info["look_ahead_token_ids"] == b.info["look_ahead_token_ids"],
        "max_abs_diff": float((a.values - b.values).abs().max()),
        "max_score": float(b.values.max()),
        "top10_overlap": len(top_a & top_b) / k,
    }


def sdpa_kernels(loaded: Any, ids: torch.Tensor, bench: Bench) -> dict[str, float]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out: dict[str, float] = {"default": bench.median(partial(plain_forward, loaded, ids, ordered=False))[0]}
    for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):
        try:
            with sdpa_kernel([backend]):
                out[name] = bench.median(partial(plain_forward, loaded, ids, ordered=False))[0]
        except Exception as exc:  # a kernel the device lacks is reported, not fatal
            out[name] = float("nan")
            logger.warning("sdpa %s: %s", name, str(exc).splitlines()[0][:200])
    return out


def kernel_table(fn: Any, device: torch.device, rows: int = 25) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    fn()
    with profile(activities=activities) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    table: str = prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=70)
    return table


def host_syncs(fn: Any, device: torch.device) -> list[str]:
    """Where ``fn`` makes the host wait for the GPU (torch's sync debug mode), as ``file:line op`` lines."""
    import warnings

    if device.type != "cuda":
        return []
    fn()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{Path(w.filename).name}:{w.lineno} {str(w.message).splitlines()[0][:80]}" for w in caught]


def python_profile(fn: Any, calls: int = 10, rows: int = 30) -> str:
    """cProfile of ``calls`` calls, by own time (in the launch-bound regime the host's time is the wall time)."""
    import cProfile
    import io
    import pstats

    fn()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(rows)
    return text.getvalue()


def draft_rows(name: str, draft: Any, tokenizer: Any, lengths: list[int], bench: Bench) -> list[dict[str, Any]]:
    rows = []
    scorers = {
        la: DraftAttentionScorer(draft, look_ahead=la, pool_kernel=13, target_tokenizer=tokenizer) for la in (1, 8)
    }
    # transformers' own RMSNorm (eight kernels) in the scoring passes, for comparison
    unfused = DraftAttentionScorer(
        draft, look_ahead=8, pool_kernel=13, target_tokenizer=tokenizer, execution=ExecutionSettings(fused_norms=False)
    )
    gen = torch.Generator().manual_seed(99)
    for n in lengths:
        ids_cpu = torch.randint(1000, draft.model.config.vocab_size - 1000, (n,), generator=gen)
        prompt = Prompt.from_token_ids(ids_cpu.tolist())
        ids = ids_cpu.to(bench.device)
        row: dict[str, Any] = {"draft": name, "n": n}
        row["plain_prefill_ms"] = bench.median(partial(plain_forward, draft, ids))[0]
        row["plain_prefill_nocache_ms"] = bench.median(partial(plain_nocache, draft, ids))[0]
        for la, scorer in scorers.items():
            row[f"score_la{la}_ms"] = bench.median(partial(scorer.score, prompt))[0]
        row["score_la8_unfused_ms"] = bench.median(partial(unfused.score, prompt))[0]
        row["fused_vs_unfused"] = compare_scores(scorers[8].score(prompt), unfused.score(prompt))
        if scorers[8]._fixed_buffers:
            row["la8_phases"] = fixed_buffer_phases(scorers[8], prompt, bench)
            row["la8_unfused_phases"] = fixed_buffer_phases(unfused, prompt, bench)
        row["sdpa"] = sdpa_kernels(draft, ids, bench)
        logger.info("draft %s", row)
        rows.append(row)
    return rows


def pipeline_row(target: Any, draft: Any, tokenizer: Any, n: int, bench: Bench) -> dict[str, Any]:
    dev = bench.device
    backend = TransformersBackend(target)
    scorer = DraftAttentionScorer(draft, look_ahead=1, pool_kernel=13, target_tokenizer=tokenizer)
    gen = torch.Generator().manual_seed(1234)
    vocab = min(target.model.config.vocab_size, draft.model.config.vocab_size)
    prompt = Prompt.from_token_ids(torch.randint(1000, vocab - 1000, (n,), generator=gen).tolist())
    ids = torch.tensor(prompt.token_ids, device=dev)
    first = SamplingParams(max_tokens=1)
    row: dict[str, Any] = {"n": n, "keep_rate": 0.1}
    row["full_plain_ms"] = bench.median(partial(plain_forward, target, ids))[0]
    row["draft_plain_ms"] = bench.median(partial(plain_forward, draft, ids))[0]
    row["score_ms"] = bench.median(partial(scorer.score, prompt))[0]
    scores = scorer.score(prompt)
    sel = selector(0.1)
    row["select_ms"] = bench.median(partial(sel.select, prompt, scores))[0]
    selection = sel.select(prompt, scores)
    row["compress_ms"] = bench.median(partial(CompressedPrompt.from_selection, prompt, selection))[0]
    kept = CompressedPrompt.from_selection(prompt, selection)
    kids = torch.tensor(kept.token_ids, device=dev)
    kpos = torch.tensor(kept.position_ids, device=dev)
    row["kept_plain_ms"] = bench.median(partial(plain_forward, target, kids, kpos))[0]
    row["kept_backend_ms"] = bench.median(partial(backend.generate, kept, first))[0]
    pipe = Pipeline(scorer, sel, backend)
    row["e2e_ms"] = bench.median(partial(pipe.generate, prompt, first))[0]
    row["e2e_kernels"] = kernel_table(partial(pipe.generate, prompt, first), dev, rows=30)
    row["syncs"] = {
        "kept_plain": host_syncs(partial(plain_forward, target, kids, kpos), dev),
        "kept_backend": host_syncs(partial(backend.generate, kept, first), dev),
        "e2e": host_syncs(partial(pipe.generate, prompt, first), dev),
    }
    row["python_profile"] = {
        "kept_plain": python_profile(partial(plain_forward, target, kids, kpos)),
        "kept_backend": python_profile(partial(backend.generate, kept, first)),
    }
    row["kept_backend_kernels"] = kernel_table(partial(backend.generate, kept, first), dev, rows=30)
    logger.info("pipeline %s", {k: v for k, v in row.items() if not k.endswith("kernels")})
    return row


def markdown(result: dict[str, Any]) -> str:
    """The JSON's tables (kernel tables and Python profiles stay in the JSON)."""
    lines = [
        *report_header(
            "Where the GPU time goes (HF backend, bf16, batch 1, random weights)", result, "medians after a warm-up"
        ),
        "",
        "## Scoring phases (drafts alone)",
        "",
        "LA8 phases with RMSNorm fused in the scoring passes (the default) and, after the slash, with "
        "transformers' own RMSNorm (`ExecutionSettings(fused_norms=False)`).",
        "",
        "| draft | n | plain prefill ms | no-cache prefill ms | score LA1 ms | score LA8 ms "
        "| LA8 prefill ms | LA8 steps ms (per step) | LA8 reduction ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    nan = float("nan")
    for d in result.get("drafts", []):
        ph, un = d.get("la8_phases", {}), d.get("la8_unfused_phases", {})
        lines.append(
            f"| {d['draft']} | {d['n']} | {d['plain_prefill_ms']:.1f} | {d['plain_prefill_nocache_ms']:.1f} "
            f"| {d['score_la1_ms']:.1f} | {d['score_la8_ms']:.1f} / {d.get('score_la8_unfused_ms', nan):.1f} "
            f"| {ph.get('prefill_ms', nan):.1f} / {un.get('prefill_ms', nan):.1f} "
            f"| {ph.get('steps_ms', nan):.1f} ({ph.get('step_ms', nan):.2f}) / {un.get('steps_ms', nan):.1f} "
            f"({un.get('step_ms', nan):.2f}) | {ph.get('reduce_ms', nan):.1f} |"
        )
    lines += ["", "Fused against transformers' RMSNorm, the same prompt scored (look-ahead 8):", ""]
    for d in result.get("drafts", []):
        c = d.get("fused_vs_unfused")
        if c:
            lines.append(
                f"- {d['draft']}, n = {d['n']}: same look-ahead tokens {c['same_look_ahead']}, largest score "
                f"difference {c['max_abs_diff']:.2e} (largest score {c['max_score']:.2e}), top-10% overlap "
                f"{c['top10_overlap']:.1%}"
            )
    lines += [
        "",
        "## Plain prefill by SDPA kernel (ms)",
        "",
        "| model | n | default | cuDNN | flash |",
        "|---|---:|---:|---:|---:|",
    ]
    for d in result.get("drafts", []):
        k = d["sdpa"]
        lines.append(f"| {d['draft']} | {d['n']} | {k['default']:.1f} | {k['cudnn']:.1f} | {k['flash']:.1f} |")
    if "target_sdpa" in result:
        k = result["target_sdpa"]
        lines.append(f"| llama-3.1-8b | {k['n']} | {k['default']:.1f} | {k['cudnn']:.1f} | {k['flash']:.1f} |")
    pipe = result.get("pipeline")
    if pipe:
        lines += [
            "",
            f"## Pipeline steps, Llama pair, n = {pipe['n']}, keep {pipe['keep_rate']}, look-ahead 1 (ms)",
            "",
            "| full (plain) | draft (plain) | score | select | compress | kept (plain) | kept (backend) | e2e |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {pipe['full_plain_ms']:.1f} | {pipe['draft_plain_ms']:.1f} | {pipe['score_ms']:.1f} "
            f"| {pipe['select_ms']:.2f} | {pipe['compress_ms']:.2f} | {pipe['kept_plain_ms']:.1f} "
            f"| {pipe['kept_backend_ms']:.1f} | {pipe['e2e_ms']:.1f} |",
            "",
            "Host time against GPU time under torch.profiler (one call):",
            "",
        ]
        for key in ("e2e_kernels", "kept_backend_kernels"):
            tail = [ln for ln in pipe[key].strip().splitlines() if ln.startswith("Self")]
            lines.append(f"- {key.replace('_kernels', '')}: " + "; ".join(tail))
        lines += ["", "Host waits for the GPU (torch sync debug mode), one call each:", ""]
        for key, rows in pipe.get("syncs", {}).items():
            where = [r.split(" ")[0] for r in rows if "synchronizing" in r]
            lines.append(f"- {key}: {', '.join(where) or 'none'}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 32768])
    parser.add_argument("--pipeline-n", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true")
    add_output_args(parser, "profile_gpu_h200", "/tmp/profile_gpu")
    parser.add_argument("--render", type=Path, help="only write the markdown of an earlier run's JSON")
    args = parser.parse_args()
    if args.render:
        args.render.with_suffix(".md").write_text(markdown(json.loads(args.render.read_text())))
        return 0
    if args.tiny:
        args.lengths, args.pipeline_n = [256, 512], 512
    device, bench, out, result = start_run("profile_gpu", args, budget_s=1e9)

    def save() -> None:
        write_json(out, args.name, result)

    for pair in ("llama", "qwen"):
        target_name, draft_name = PAIRS[pair]
        dcfg = tiny(CONFIGS[draft_name]) if args.tiny else CONFIGS[draft_name]
        tcfg = tiny(CONFIGS[target_name]) if args.tiny else CONFIGS[target_name]
        tokenizer = synthetic_tokenizer(max(tcfg["vocab_size"], dcfg["vocab_size"]))
        draft = build_model(draft_name, dcfg, device, tokenizer)
        result.setdefault("drafts", []).extend(draft_rows(draft_name, draft, tokenizer, args.lengths, bench))
        save()
        if pair == "qwen":
            scorer = DraftAttentionScorer(draft, look_ahead=8, pool_kernel=13, target_tokenizer=tokenizer)
            ids = torch.randint(1000, 100000 if not args.tiny else 3000, (max(args.lengths),)).tolist()
            prompt = Prompt.from_token_ids(ids)
            result["kernels_qwen_la8"] = kernel_table(partial(scorer.score, prompt), device)
            scorer1 = DraftAttentionScorer(draft, look_ahead=1, pool_kernel=13, target_tokenizer=tokenizer)
            short = Prompt.from_token_ids(ids[: min(args.lengths)])
            result["kernels_qwen_la1_short"] = kernel_table(partial(scorer1.score, short), device)
            save()
            continue
        target = build_model(target_name, tcfg, device, tokenizer)
        result["pipeline"] = pipeline_row(target, draft, tokenizer, args.pipeline_n, bench)
        tids = torch.randint(1000, 100000 if not args.tiny else 3000, (max(args.lengths),), device=device)
        result["target_sdpa"] = {"n": max(args.lengths), **sdpa_kernels(target, tids, bench)}
        save()
        del target, draft
        torch.cuda.empty_cache() if device.type == "cuda" else None
    write_results(out, args.name, result, markdown)
    for key in ("kernels_qwen_la8", "kernels_qwen_la1_short"):
        sys.stdout.write(f"== {key}\n{result[key]}\n")
    sys.stdout.write(json.dumps({k: v for k, v in result.items() if "kernels" not in k}, indent=1)[:6000] + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
