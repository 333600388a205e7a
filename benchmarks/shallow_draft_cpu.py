"""Evidence recall of a shallow draft (its first N layers) per aggregation rule, on CPU with real weights.

For each RULER-style sample the draft reads the prompt once (look-ahead 1, every layer) and keeps every
layer's post-RoPE query of the last prompt token and its keys of the prompt. A draft cut after N
layers computes exactly the first N of them, so each depth is scored from that one pass: the
library's own reduction (`ScoreCollector.observe_stacked`, the one `DraftAttentionScorer` runs) over
layers ``:N``, with each `Aggregation`. The selection is the evaluation's ``draft-chunked`` one
(chunks of 32 at keep rate 0.1, the sink and the question protected); the metric is the share of
evidence tokens kept (`specprefill_sdk.eval`'s evidence recall: the target never runs).

The rules were compared on the ``--tune-seed`` samples while choosing ``content-mean``'s form; the
``--report-seed`` samples were not looked at until then and are the ones to quote.

Usage::

    python benchmarks/shallow_draft_cpu.py --threads 2 --length 2048 --samples 2 --cache /tmp/shallow
"""

from __future__ import annotations

import argparse
import logging
import platform
import time
from pathlib import Path
from typing import Any

from _common import add_output_args, command_line, save_figure, setup_logging, write_results

logger = logging.getLogger("benchmarks.shallow_draft")

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "qa_squad", "qa_hotpot")
DEPTHS = (24, 18, 16, 12, 8)


def capture(loaded: Any, scorer: Any, sample: Any, cache: Path | None, seed: int) -> dict[str, Any]:
    """Every layer's last-token query and prompt keys for one sample (read from ``cache`` when there)."""
    import torch

    from specprefill_sdk.eval.harness import _build_case
    from specprefill_sdk.scoring.draft_attention.lookahead import FixedBufferLookAhead
    from specprefill_sdk.types import int64_tensor

    path = None if cache is None else cache / f"s{seed}_{sample.sample_id.replace('/', '_')}.pt"
    if path is not None and path.exists():
        return dict(torch.load(path, weights_only=False))
    case = _build_case(loaded.tokenizer, sample)
    ids = case.prompt.token_ids
    runner = FixedBufferLookAhead(
        loaded.model, 1, len(ids), 0, cuda_graph=False, fused_norms=scorer.execution.fused_norms, lean=scorer._lean
    )
    runner.prefill(int64_tensor(ids)[None], None, None)
    data = {
        "id": sample.sample_id,
        "task": sample.task,
        "q": runner.query_stack.clone(),
        "k": runner.key_stack.clone(),
        "scal": runner.scalings(),
        "evidence": list(case.evidence),
        "prompt": case.prompt,
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, path)
    return data


def recall_rows(data: dict[str, Any], depths: tuple[int, ...], rate: float) -> list[dict[str, Any]]:
    import torch

    from specprefill_sdk.eval.methods import CHUNK
    from specprefill_sdk.eval.metrics import evidence_recall
    from specprefill_sdk.scoring.draft_attention import AGGREGATIONS
    from specprefill_sdk.scoring.draft_attention.hook import ScoreCollector
    from specprefill_sdk.selection import Chunked, KeepRate, Protect
    from specprefill_sdk.types import TokenScores

    prompt = data["prompt"]
    selector = Protect(Chunked(KeepRate(rate), CHUNK), sink=1, tail=True)
    q, k, scal = data["q"], data["k"], data["scal"]
    rows = []
    for depth in depths:
        for rule in AGGREGATIONS:
            collector = ScoreCollector(
                pad=torch.zeros(1, dtype=torch.long),
                prompt_len=prompt.n,
                num_queries=1,
                pool_kernel=13,
                skip=frozenset(),
                device=torch.device("cpu"),
                aggregation=rule,
            )
            with torch.inference_mode():
                collector.observe_stacked(q[:depth], k[:depth], scal[:depth])
            scores = TokenScores(values=collector.reduced[0, 0].clone(), scorer="draft-attention", info={})
            selection = selector.select(prompt, scores)
            rows.append(
                {
                    "id": data["id"],
                    "task": data["task"],
                    "n": prompt.n,
                    "layers": depth,
                    "aggregation": rule,
                    "recall": round(evidence_recall(selection, data["evidence"]), 4),
                }
            )
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``{task or "all": {rule: {layers: {"recall": mean, "count": samples}}}}``."""
    out: dict[str, Any] = {}
    for task in ("all", *sorted({r["task"] for r in rows})):
        picked = [r for r in rows if task in ("all", r["task"])]
        out[task] = {}
        for rule in dict.fromkeys(r["aggregation"] for r in picked):
            out[task][rule] = {}
            for depth in sorted({r["layers"] for r in picked}, reverse=True):
                values = [r["recall"] for r in picked if r["aggregation"] == rule and r["layers"] == depth]
                out[task][rule][str(depth)] = {"recall": round(sum(values) / len(values), 4), "count": len(values)}
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Shallow draft: evidence recall against depth, per aggregation rule",
        "",
        f"`{result['command']}`",
        "",
        f"Draft {result['draft']} ({result['depth']} layers), look-ahead 1, pool 13, chunks of 32 at keep rate "
        f"{result['keep_rate']}, sink and question protected. Prompts of about {result['length']} tokens; "
        f"{result['samples']} samples per task and seed. Machine: {result['machine']}. Run time "
        f"{result['elapsed_s']:.0f} s.",
        "",
    ]
    for seed_key, title in (("report", "held-out"), ("tune", "tuning")):
        block = result["seeds"][seed_key]
        summary = block["summary"]
        depths = list(next(iter(summary["all"].values())))
        lines += [f"## Seed {block['seed']} ({title} samples)", ""]
        for task, rules in summary.items():
            count = next(iter(next(iter(rules.values())).values()))["count"]
            lines += [
                f"### {task} ({count} samples)",
                "",
                "| rule | " + " | ".join(f"{d} layers" for d in depths) + " |",
            ]
            lines.append("|---|" + "---:|" * len(depths))
            for rule, by_depth in rules.items():
                lines.append(f"| {rule} | " + " | ".join(f"{by_depth[d]['recall']:.3f}" for d in depths) + " |")
            lines.append("")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    block = result["seeds"]["report"]
    summary = block["summary"]
    tasks = list(summary)
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.0 * len(tasks), 3.2), sharey=True)
    for ax, task in zip(axes, tasks, strict=True):
        for rule, by_depth in summary[task].items():
            depths = sorted(by_depth, key=int)
            ax.plot([int(d) for d in depths], [by_depth[d]["recall"] for d in depths], marker="o", label=rule)
        count = next(iter(next(iter(summary[task].values())).values()))["count"]
        ax.set_title(f"{task} (n={count})", fontsize=9)
        ax.set_xlabel("draft layers")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("evidence recall at keep 0.1")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{result['draft']}, ~{result['length']} tokens, seed {block['seed']} (held out)", fontsize=10)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=2, help="samples per task and seed")
    parser.add_argument("--tune-seed", type=int, default=0)
    parser.add_argument("--report-seed", type=int, default=1)
    parser.add_argument("--keep-rate", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=None, help="keep each sample's queries and keys here")
    add_output_args(parser, "shallow_draft_cpu")
    args = parser.parse_args()
    setup_logging()
    import torch

    from specprefill_sdk.eval.harness import EvalConfig, _make_samples
    from specprefill_sdk.models import load_model
    from specprefill_sdk.scoring import DraftAttentionScorer

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    loaded = load_model(args.draft, device="cpu", dtype="auto", progress=False)
    scorer = DraftAttentionScorer(loaded, look_ahead=1)
    depths = tuple(d for d in DEPTHS if d <= scorer.depth)
    seeds: dict[str, Any] = {}
    for key, seed in (("tune", args.tune_seed), ("report", args.report_seed)):
        config = EvalConfig(model=args.draft, tasks=TASKS, lengths=(args.length,), samples=args.samples, seed=seed)
        rows: list[dict[str, Any]] = []
        for sample in _make_samples(config, loaded.tokenizer, loaded.max_context):
            rows += recall_rows(capture(loaded, scorer, sample, args.cache, seed), depths, args.keep_rate)
            logger.info("seed %d: %s done", seed, sample.sample_id)
        seeds[key] = {"seed": seed, "summary": summarise(rows), "rows": rows}
    result = {
        "command": command_line(),
        "draft": args.draft,
        "depth": scorer.depth,
        "dtype": str(loaded.model.dtype).removeprefix("torch."),
        "length": args.length,
        "samples": args.samples,
        "keep_rate": args.keep_rate,
        "tasks": list(TASKS),
        "machine": f"{platform.machine()} CPU, {args.threads} threads of {torch.get_num_threads()}, "
        f"torch {torch.__version__}",
        "elapsed_s": round(time.perf_counter() - started, 1),
        "seeds": seeds,
    }
    print(write_results(args.out, args.name, result, markdown, plot))


if __name__ == "__main__":
    main()
