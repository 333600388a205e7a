"""What a prompt length never seen before costs the draft's attention: each SDPA kernel, and the scorer.

Served prompts seldom share a length. PyTorch's cuDNN attention builds an execution plan for each
shape it meets and keeps it in a per-thread cache; the flash and memory-efficient kernels build
nothing. `DraftAttentionScorer` puts cuDNN first on CUDA (``ExecutionSettings.attention_backends``),
chosen on prompts of repeated lengths. This script measures, in one process:

- ``kernels``: ``scaled_dot_product_attention`` alone (causal, the draft's query heads and head size,
  bf16 on CUDA) for each kernel the device offers: the first call at each of ``--repeats`` new
  lengths just above every ``--lengths`` value, and the call right after it at the same length;
- ``scorer``: the ``paper`` policy's `DraftAttentionScorer` on a random-weight draft (speed does not
  depend on the weights), with the default kernel order (cuDNN first) unpadded, with flash first, and
  cuDNN first with the prompt padded to buckets (``--buckets``, default `BUCKET`, the default
  ``ExecutionSettings.attention_bucket``): the median
  ``score`` time over prompts that all have one length, and over prompts each of a new length (all
  within one look-ahead buffer size, so no graph is captured again).

``new_extra_ms`` is what a new length adds. On CPU (``--tiny``) the script only checks itself: there
is no cuDNN there.

Usage (device machine)::

    python benchmarks/attention_lengths_gpu.py --draft qwen2.5-0.5b --lengths 8192 16384 32768 --out $OUT
    python benchmarks/attention_lengths_gpu.py --tiny --lengths 256 --repeats 2 --out /tmp/check
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from _common import add_output_args, write_results
from ttft_gpu import CONFIGS, build_model, random_prompt, start_run, synthetic_tokenizer, timed, tiny

from specprefill_sdk.policies import load_policy
from specprefill_sdk.runtime.attention import DEFAULT_ATTENTION_BACKENDS, SDPA_KERNELS
from specprefill_sdk.runtime.settings import ExecutionSettings

NAME = "attention_lengths_gpu"
#: The default bucket (`ExecutionSettings.attention_bucket`).
BUCKET = ExecutionSettings().attention_bucket


def scorer_settings(buckets: list[int]) -> dict[str, tuple[tuple[str, ...], int]]:
    """The scorer's settings compared: label -> (kernel order, bucket).

    The default kernel order (cuDNN first) unpadded, flash first (no plan to build per shape), and cuDNN
    first with the prompt padded to each of ``buckets`` (one plan per bucket).
    """
    settings = {
        "cudnn first, unpadded": (tuple(DEFAULT_ATTENTION_BACKENDS), 1),
        "flash first": (("flash", "efficient", "math"), 1),
    }
    settings.update({f"cudnn first, buckets of {b}": (tuple(DEFAULT_ATTENTION_BACKENDS), b) for b in buckets})
    return settings


#: New lengths step by this many tokens above each base length: distinct, and within one look-ahead buffer.
STEP = 7


def _pair(device: torch.device, repeats: int, base: int, call: Callable[[int], Any]) -> dict[str, float | list[float]]:
    """``call(n)`` at ``repeats`` new lengths above ``base``, each followed by a second call at the same length."""
    new, again = [], []
    for k in range(repeats):
        n = base + 1 + STEP * k
        new.append(timed(device, partial(call, n))[0])
        again.append(timed(device, partial(call, n))[0])
    return _summary(new, again)


def _summary(new: list[float], again: list[float]) -> dict[str, float | list[float]]:
    a, b = statistics.median(new), statistics.median(again)
    return {"new_ms": a, "repeat_ms": b, "new_extra_ms": a - b, "new_runs_ms": new, "repeat_runs_ms": again}


def bench_kernels(
    device: torch.device, config: dict[str, Any], lengths: list[int], repeats: int
) -> list[dict[str, Any]]:
    """Each SDPA kernel alone: a new length's first call against the next call at that length."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads = int(config["num_attention_heads"])
    dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for kernel, member in SDPA_KERNELS.items():
        backend = getattr(SDPBackend, member)

        def attend(n: int, backend: Any = backend) -> None:
            q = torch.randn(1, heads, n, dim, device=device, dtype=dtype)
            with sdpa_kernel([backend]):
                torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

        for base in lengths:
            try:
                attend(base)  # the kernel's own first use (library load), not a length's
                rows.append({"kernel": kernel, "n": base, **_pair(device, repeats, base, attend)})
            except RuntimeError as exc:  # the device offers no such kernel for these shapes
                rows.append({"kernel": kernel, "n": base, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
    return rows


def bench_scorer(
    device: torch.device, loaded: Any, lengths: list[int], repeats: int, buckets: list[int]
) -> list[dict[str, Any]]:
    """The paper policy's scorer in each of `scorer_settings`: one repeated length, then new lengths (one bucket's)."""
    gen = torch.Generator().manual_seed(0)
    vocab = int(loaded.model.config.vocab_size)
    policy = load_policy("paper")
    rows = []
    for label, (order, bucket) in scorer_settings(buckets).items():
        execution = ExecutionSettings(attention_backends=order, attention_bucket=bucket)
        scorer = policy.build_scorer(loaded, execution=execution)
        for base in lengths:
            scorer.warmup([base])  # compile and capture for this buffer size, as a server does at start
            same = [random_prompt(base, vocab, gen) for _ in range(repeats)]
            new = [random_prompt(base + 1 + STEP * k, vocab, gen) for k in range(repeats)]
            times = {
                key: [timed(device, partial(scorer.score, p))[0] for p in group]
                for key, group in (("same", same), ("new", new))
            }
            summary = _summary(times["new"], times["same"])
            rows.append({"order": label, "kernels": list(order), "bucket": bucket, "n": base, **summary})
        scorer.release()
    return rows


def _f(value: Any) -> str:
    return "-" if value is None else f"{value:,.1f}"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# A new prompt length: what it costs the draft's attention",
        "",
        f"Command: `{result['command']}`; draft {result['draft']} (random weights); device "
        f"{result['environment'].get('device', '?')}; medians of {result['repeats']} calls; new lengths step by "
        f"{STEP} tokens above each length.",
        "",
        "## Each SDPA kernel alone (ms)",
        "",
        "| kernel | length | new length | same length again | a new length adds |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in result["kernels"]:
        if "error" in r:
            lines.append(f"| {r['kernel']} | {r['n']:,} | not offered: {r['error'][:60]} | | |")
        else:
            lines.append(
                f"| {r['kernel']} | {r['n']:,} | {_f(r['new_ms'])} | {_f(r['repeat_ms'])} | {_f(r['new_extra_ms'])} |"
            )
    lines += [
        "",
        "## The scorer (`paper`: look-ahead 8, every layer), one prompt per call (ms)",
        "",
        "| kernel order | length | new lengths | the first of them | one length | a new length adds |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result.get("scorer", []):
        lines.append(
            f"| {r['order']} ({', '.join(r['kernels'])}) | {r['n']:,} | {_f(r['new_ms'])} | {_f(r['new_runs_ms'][0])} "
            f"| {_f(r['repeat_ms'])} | {_f(r['new_extra_ms'])} |"
        )
    lines += [
        "",
        "The new lengths of a length all fall in one bucket of each size: with buckets, the first of them "
        "pays for the bucket's plan and the others find it built.",
    ]
    return "\n".join([*lines, ""])


def plot(result: dict[str, Any], path: Path) -> None:
    """The scorer's time per prompt, one panel per length: each setting at one length and at new lengths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.get("scorer", [])
    lengths = sorted({r["n"] for r in rows})
    labels = list(dict.fromkeys(r["order"] for r in rows))
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 3.6), squeeze=False)
    for ax, n in zip(axes[0], lengths, strict=True):
        cells = {r["order"]: r for r in rows if r["n"] == n}
        x = range(len(labels))
        ax.bar([i - 0.2 for i in x], [cells[k]["repeat_ms"] for k in labels], 0.4, label="one length")
        ax.bar([i + 0.2 for i in x], [cells[k]["new_ms"] for k in labels], 0.4, label="new lengths")
        ax.set_xticks(list(x), [k.replace(", ", ",\n") for k in labels], fontsize=7)
        ax.set_title(f"{n:,} tokens")
        ax.set_ylabel("scoring ms (median)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Draft scoring ({result.get('draft')}): a new prompt length per kernel setting", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--draft", default="qwen2.5-0.5b", choices=[k for k in CONFIGS if k.endswith(("1b", "0.5b"))])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--repeats", type=int, default=5, help="new lengths (and repeats) per length")
    parser.add_argument("--buckets", type=int, nargs="+", default=[BUCKET], help="bucket sizes of the scorer runs")
    parser.add_argument("--tiny", action="store_true", help="a scaled-down draft on the CPU: checks the script")
    parser.add_argument("--render", type=Path, default=None, help="rewrite the markdown and plot from this JSON")
    add_output_args(parser, NAME)
    args = parser.parse_args()
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        write_results(args.render.parent, args.render.stem, saved, markdown, plot)
        return 0
    device, _bench, out, result = start_run(NAME, args, budget_s=float("inf"))
    config = tiny(CONFIGS[args.draft]) if args.tiny else dict(CONFIGS[args.draft])
    result.update(draft=args.draft + (" (tiny)" if args.tiny else ""), repeats=args.repeats, lengths=args.lengths)
    result["kernels"] = bench_kernels(device, config, args.lengths, args.repeats)
    write_results(out, args.name, result, markdown)
    loaded = build_model(args.draft, config, device, synthetic_tokenizer(int(config["vocab_size"])))
    result["scorer"] = bench_scorer(device, loaded, args.lengths, args.repeats, args.buckets)
    print(write_results(out, args.name, result, markdown, plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
