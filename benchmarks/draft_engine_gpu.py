"""Where the draft should run beside a vLLM target: the transformers scorer, or a second vLLM engine.

A second vLLM engine for the draft would have to prefill the whole prompt and, in an attention-capture
hook, recompute the attention of the scoring queries over every layer's keys (vLLM's attention
kernels return no probabilities). Its prefill alone is therefore a lower bound on what it would cost
to score. This script measures, in one process on one GPU, for the same draft architecture (random
weights; speed does not depend on their values) and the same random prompts:

- ``vllm_prefill_ms``: the draft in vanilla vLLM (``vllm.LLM``), one request, ``max_tokens=1``, the
  whole prompt in one scheduler step (``max_num_batched_tokens`` set to the longest prompt, prefix
  caching off, a new prompt every call), engine defaults otherwise (torch.compile, CUDA graphs);
- ``hf_prefill_ms``: a plain transformers forward of the draft (SDPA, KV cache written, last
  logits only);
- ``score_ms`` per policy (``paper``: look-ahead 8, every layer, as the default ``auto`` scores;
  ``paper-la1``: look-ahead 1; ``auto-shallow``: the draft's first two thirds, the deepest voting):
  the scorer exactly as `load_pipeline` builds it for a user (default mode: compiled and warmed up at
  load on CUDA), ``scorer.score(prompt)``.

``score_ms / vllm_prefill_ms`` below 1 means the transformers scorer already costs less than the
second engine's prefill would, before that engine had captured anything. Medians of ``--repeats``
runs after a warm-up run; the vLLM engine is built first and kept, the transformers draft beside it
(``--gpu-memory-utilization`` is the engine's share of the GPU).

Usage (device machine, vLLM importable)::

    python benchmarks/draft_engine_gpu.py --draft llama-3.2-1b --lengths 8192 16384 32768 --out $OUT
    python benchmarks/draft_engine_gpu.py --tiny --no-vllm --out /tmp/check   # CPU check of the rest
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The scorers as users get them (auto: compiled on CUDA), which `_common` would otherwise turn off here.
os.environ.setdefault("SPECPREFILL_COMPILE", "")

import torch
from _common import add_output_args, command_line, save_figure, setup_logging, write_json, write_results
from ttft_gpu import CONFIGS, Bench, build_model, plain_forward, synthetic_tokenizer, tiny
from ttft_gpu import environment as device_environment

from specprefill_sdk.models import LoadedModel
from specprefill_sdk.policies import load_pipeline, load_policy
from specprefill_sdk.types import Prompt

logger = logging.getLogger("draft_engine_gpu")

#: The scorers compared: (label, policy, overrides). ``auto`` scores as ``paper`` does.
POLICIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("paper", "paper", {}),
    ("paper-la1", "paper", {"look_ahead": 1}),
    ("auto-shallow", "auto-shallow", {}),
)
#: What vLLM needs in a config.json that the hand-written configs leave out.
_VLLM_NAMES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def vllm_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as a model folder's config.json for vLLM (its architecture named, bf16)."""
    out = dict(config)
    out["architectures"] = [_VLLM_NAMES[config["model_type"]]]
    out["dtype"] = "bfloat16"
    return out


def start_engine(config: dict[str, Any], max_len: int, memory: float) -> tuple[Any, float]:
    """The draft in vanilla vLLM (``vllm.LLM``, random weights: ``load_format="dummy"``), and its start-up s."""
    import vllm

    folder = Path(tempfile.mkdtemp(prefix="draft-engine-"))
    write_json(folder, "config", vllm_config(config))
    t0 = time.perf_counter()
    llm = vllm.LLM(
        model=str(folder),
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=max_len,
        max_num_batched_tokens=max_len,
        gpu_memory_utilization=memory,
        enable_prefix_caching=False,
        seed=0,
    )
    return llm, time.perf_counter() - t0


def engine_prefill(llm: Any, ids: list[int]) -> None:
    """One request of ``ids`` to the engine, one greedy token back (its time is the engine's prefill)."""
    import vllm

    try:
        params = vllm.SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    except TypeError:  # a vLLM without the field: nothing to detokenize anyway without a tokenizer
        params = vllm.SamplingParams(max_tokens=1, temperature=0.0)
    outputs = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    if len(outputs[0].outputs[0].token_ids) != 1:
        raise RuntimeError(f"the engine returned {outputs[0].outputs[0].token_ids!r}, not one token")


def build_scorers(draft: LoadedModel) -> tuple[dict[str, Any], dict[str, float]]:
    """Each policy's scorer as `load_pipeline` builds it (the draft as its own target), and the build seconds."""
    scorers: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    backend = None
    for label, name, overrides in POLICIES:
        policy = load_policy(name).with_overrides(**overrides) if overrides else load_policy(name)
        t0 = time.perf_counter()
        if backend is None:
            pipe = load_pipeline(policy, model=draft, draft=draft)
            backend = pipe.backend
        else:
            pipe = load_pipeline(policy, backend=backend, draft=draft)
        seconds[label] = round(time.perf_counter() - t0, 2)
        scorers[label] = pipe.scorer
        logger.info("built %s: %r in %.1f s", label, pipe.scorer, seconds[label])
    return scorers, seconds


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every length: the engine's prefill, the plain prefill and each scorer, on the same prompt."""
    device = torch.device("cpu" if args.tiny else "cuda")
    config = tiny(CONFIGS[args.draft]) if args.tiny else dict(CONFIGS[args.draft])
    tokenizer = synthetic_tokenizer(int(config["vocab_size"]))
    max_len = max(args.lengths) + 16
    result: dict[str, Any] = {
        "command": command_line(),
        "draft": f"{args.draft} architecture, random weights, bf16" + (" (tiny)" if args.tiny else ""),
        "environment": environment(device),
        "engine": None,
        "rows": [],
    }
    engine = None
    if not args.no_vllm:
        engine, startup = start_engine(config, max_len, args.gpu_memory_utilization)
        result["engine"] = {
            "startup_s": round(startup, 1),
            "vllm": "vllm.LLM, engine defaults (torch.compile, CUDA graphs) but for these options",
            "options": {
                "load_format": "dummy",
                "max_model_len": max_len,
                "max_num_batched_tokens": max_len,
                "gpu_memory_utilization": args.gpu_memory_utilization,
                "enable_prefix_caching": False,
            },
        }
        logger.info("vLLM engine up in %.1f s", startup)
    draft = build_model(args.draft, config, device, tokenizer)
    scorers, built = build_scorers(draft)
    result["scorers"] = {label: {"repr": repr(s), "build_s": built[label]} for label, s in scorers.items()}
    bench = Bench(device, args.repeats, deadline=float("inf"))
    gen = torch.Generator().manual_seed(7)
    vocab = int(config["vocab_size"])
    for n in args.lengths:
        prompt = Prompt.from_token_ids(torch.randint(1000, vocab - 1000, (n,), generator=gen).tolist())
        ids = torch.tensor(prompt.token_ids, device=device)
        row: dict[str, Any] = {"n": n}
        if engine is not None:
            # a new prompt every call: nothing could come from a cache even if one were on
            def engine_call(engine: Any = engine, n: int = n) -> None:
                engine_prefill(engine, torch.randint(1000, vocab - 1000, (n,), generator=gen).tolist())

            row["vllm_prefill_ms"], row["vllm_prefill_runs"] = bench.median(engine_call)
        row["hf_prefill_ms"], row["hf_prefill_runs"] = bench.median(lambda ids=ids: plain_forward(draft, ids))
        row["score"] = {}
        for label, scorer in scorers.items():
            ms, runs = bench.median(lambda scorer=scorer, prompt=prompt: scorer.score(prompt))
            entry: dict[str, Any] = {"ms": ms, "runs": runs, "to_hf_prefill": ms / row["hf_prefill_ms"]}
            if "vllm_prefill_ms" in row:
                entry["to_vllm_prefill"] = ms / row["vllm_prefill_ms"]
            row["score"][label] = entry
        logger.info("n=%d %s", n, json.dumps({k: v for k, v in row.items() if not k.endswith("runs")}, default=str))
        result["rows"].append(row)
        write_results(args.out, args.name, result, markdown)
    return result


def environment(device: torch.device) -> dict[str, Any]:
    """`ttft_gpu.environment`, and the vLLM version (None without vLLM)."""
    env = device_environment(device)
    try:
        import vllm

        env["vllm"] = vllm.__version__
    except ImportError:
        env["vllm"] = None
    return env


def markdown(result: dict[str, Any]) -> str:
    """The table: per length, vLLM's and the plain prefill, each scorer and its ratio to both."""
    labels = list(result.get("scorers", {}))
    lines = [
        "# The draft beside a vLLM target: transformers scorer or a second vLLM engine",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Draft: {result['draft']}; {json.dumps(result['environment'])}.",
    ]
    if result.get("engine"):
        lines.append(f"vLLM engine: {json.dumps(result['engine'])}.")
    for label, info in result.get("scorers", {}).items():
        lines.append(f"- `{label}`: `{info['repr']}` (built in {info['build_s']} s)")
    lines += [
        "",
        "| n | vLLM prefill ms | transformers prefill ms | "
        + " | ".join(f"{x} ms | {x} / vLLM prefill" for x in labels)
        + " |",
        "|---:|---:|---:|" + "---:|---:|" * len(labels),
    ]
    for row in result["rows"]:
        vllm_ms = row.get("vllm_prefill_ms")
        cells = [str(row["n"]), "" if vllm_ms is None else f"{vllm_ms:.1f}", f"{row['hf_prefill_ms']:.1f}"]
        for label in labels:
            entry = row["score"][label]
            ratio = entry.get("to_vllm_prefill")
            cells += [f"{entry['ms']:.1f}", "" if ratio is None else f"{ratio:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "A second engine would pay at least its prefill to score; a ratio below 1 means the transformers",
        "scorer already costs less than that.",
    ]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """Milliseconds against prompt length: vLLM's prefill of the draft, the plain prefill, each scorer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    if not rows:
        return
    ns = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    if all("vllm_prefill_ms" in r for r in rows):
        ax.plot(ns, [r["vllm_prefill_ms"] for r in rows], "k-o", label="vLLM prefill of the draft")
    ax.plot(ns, [r["hf_prefill_ms"] for r in rows], "k--s", label="transformers prefill of the draft")
    for label in result.get("scorers", {}):
        ax.plot(ns, [r["score"][label]["ms"] for r in rows], "-^", label=f"scorer: {label}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("ms")
    ax.set_title(result["draft"], fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, path)


def add_engine_args(parser: argparse.ArgumentParser, lengths: list[int], memory: float, name: str) -> None:
    """The options this script shares with `scorer_served_gpu`: lengths, repeats, the engine's memory, checks."""
    parser.add_argument("--lengths", nargs="+", type=int, default=lengths)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gpu-memory-utilization", type=float, default=memory, help="the engine's share of the GPU")
    parser.add_argument("--no-vllm", action="store_true", help="leave the engine out (a check without vLLM)")
    parser.add_argument("--tiny", action="store_true", help="a tiny config on the CPU (a check of the script)")
    add_output_args(parser, name)


def parse_engine_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``argv`` parsed, logging set up, and the options `add_engine_args` added checked."""
    args = parser.parse_args(argv)
    setup_logging(sys.stdout)
    if not args.tiny and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --tiny for a CPU check)")
    if not 0 < args.gpu_memory_utilization < 1:
        parser.error("--gpu-memory-utilization must lie in (0, 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", choices=[k for k in CONFIGS if k in ("llama-3.2-1b", "qwen2.5-0.5b")],
                        default="llama-3.2-1b")  # fmt: skip
    add_engine_args(parser, [8192, 16384, 32768], 0.3, "draft_engine_gpu")
    args = parse_engine_args(parser, argv)
    result = measure(args)
    write_results(args.out, args.name, result, markdown, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
