"""GPU time-to-first-token of SpecPrefill against full prefill, its ceiling, scoring cost and memory.

Runs on one GPU (written for an H200) with the Hugging Face backend, bf16, batch 1. The models have
real architectures built from hand-written configs (Llama-3.1-8B target / Llama-3.2-1B draft,
Qwen2.5-32B target / Qwen2.5-0.5B draft) and random weights: speed does not depend on weight values,
and nothing is downloaded. Prompts are random token ids.

``--mode`` picks how the passes run: ``default`` builds everything as a user who sets nothing
(`load_pipeline` over the loaded models, no `ExecutionSettings`, ``SPECPREFILL_COMPILE`` unset:
compiled and warmed up at load on CUDA, plain on a CPU, the dense-when-slower check on);
``compile`` passes ``ExecutionSettings(compile=True)``; ``eager`` ``compile=False`` (the default
without ``--mode``; ``--compile`` is ``--mode compile``). Each scorer is built and warmed up as
`load_pipeline` does for a policy asking for it; the seconds each build took are in ``warmup``.
``--pairs real --real-target PATH --real-draft PATH`` adds a real pair (GGUF files or model
folders, bf16); its prompts are random ids of the target's vocabulary.

For every pair, prompt length n and scorer (each ``--look-aheads`` value at full depth, then the
draft's first N layers with look-ahead 1 for each ``--draft-layers`` N) and keep rate, measured in
one process (median of ``--repeats`` runs after a warm-up run):

- ``dense_ms``: the ``dense`` policy's pipeline through the same backend (same mode), max_tokens=1;
- ``spec_ms``: ``load_pipeline("paper", keep_rate=r, look_ahead=..., layers=...)`` over the same
  backend and scorer, ``generate(max_tokens=1)``; ``fallback``: the reason the pipeline prefilled
  densely (e.g. ``slower_than_dense: ...``), None when it compressed; ``speedup = dense_ms / spec_ms``;
- ``full``/``draft``/``kept``: plain HF forwards of the prompt on the target and the draft, and of
  the kept tokens at their original positions on the target; ``ceiling = full / (draft + kept)``;
- ``score``: `DraftAttentionScorer.score` and its peak memory against the plain draft prefill's;
- with ``--direct``: score + select + a plain forward of the kept tokens (no explicit mask); with
  ``--no-graph``: look-ahead scoring without the CUDA graph.

One progress line is printed per cell and the JSON is rewritten after each; ``--budget-s`` skips
what is left (marked ``skipped``) and still writes the reports. ``benchmarks/ttft_modes.py``
compares the three modes' results.

Usage (device machine)::

    python benchmarks/ttft_gpu.py --mode default --name ttft_gpu_h200_default --out $OUT
    python benchmarks/ttft_gpu.py --mode compile --name ttft_gpu_h200_compile --out $OUT
    python benchmarks/ttft_gpu.py --pairs real --real-target T.gguf --real-draft D.gguf --mode default \
        --keep-rates 0.1 0.3 --draft-layers 4 --name ttft_gpu_h200_real_default --out $OUT
    python benchmarks/ttft_gpu.py --tiny --out /tmp/gpu-check     # CPU check with tiny configs
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from _common import add_output_args, command_line, save_figure, setup_logging, write_json, write_results

from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.models import LoadedModel, cache_argument
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.policies import load_pipeline, load_policy
from specprefill_sdk.runtime import ExecutionSettings
from specprefill_sdk.runtime.attention import DEFAULT_ATTENTION_BACKENDS, sdpa_context
from specprefill_sdk.runtime.settings import COMPILE_ENV
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.selection import Chunked, KeepRate, Protect
from specprefill_sdk.types import CompressedPrompt, Prompt, SamplingParams

logger = logging.getLogger("ttft_gpu")


# --------------------------------------------------------------------------- configurations


def _llama3_rope(factor: float) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 500000.0,
    }


#: Hand-written configs of the real architectures (from their published config.json files).
#: max_position_embeddings is 131072 for all, so 32K prompts fit every model (speed does not depend on it).
CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_llama3_rope(8.0),
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        hidden_act="silu",
        bos_token_id=128000,
        eos_token_id=128001,
    ),
    "llama-3.2-1b": dict(
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_llama3_rope(32.0),
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        hidden_act="silu",
        bos_token_id=128000,
        eos_token_id=128001,
    ),
    "qwen2.5-32b": dict(
        model_type="qwen2",
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        vocab_size=152064,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        hidden_act="silu",
        use_sliding_window=False,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        hidden_act="silu",
        use_sliding_window=False,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
}

PAIRS: dict[str, tuple[str, str]] = {
    "llama": ("llama-3.1-8b", "llama-3.2-1b"),
    "qwen": ("qwen2.5-32b", "qwen2.5-0.5b"),
}


def tiny(config: dict[str, Any]) -> dict[str, Any]:
    """A scaled-down copy of a config (same family, GQA kept) for CPU checks of the script."""
    small = dict(config)
    small.update(
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        num_hidden_layers=2,
        vocab_size=4096,
        bos_token_id=1,
        eos_token_id=2,
    )
    return small


# --------------------------------------------------------------------------- models


def synthetic_tokenizer(vocab_size: int) -> Any:
    """A word-level fast tokenizer over ``t0 .. t{V-1}`` (decoding output ids needs one; no files)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t2")


def build_model(name: str, config: dict[str, Any], device: torch.device, tokenizer: Any) -> LoadedModel:
    """Instantiate ``config`` with random bf16 weights directly on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    model_type = cfg.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    logger.info(
        "built %s (%.2fB parameters) in %.1f s",
        name,
        sum(p.numel() for p in model.parameters()) / 1e9,
        time.perf_counter() - t0,
    )
    return LoadedModel(
        name=name, model=model, tokenizer=tokenizer, device=device, dtype=torch.bfloat16, source=f"random-init:{name}"
    )


# --------------------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return (time.perf_counter() - t0) * 1000.0, out


def peak_extra(device: torch.device, fn: Callable[[], Any]) -> float:
    """Peak memory (MiB) allocated by ``fn`` above what was allocated before it."""
    if device.type != "cuda":
        return float("nan")
    sync(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def sdpa_order() -> list[str]:
    """The SDPA kernels torch would try now, in order (empty where this torch cannot say)."""
    from torch.nn.attention import SDPBackend

    read = getattr(torch._C, "_get_sdp_priority_order", None)
    if read is None:
        return []
    members = [getattr(SDPBackend, n) for n in ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")]
    names = {int(b): b.name for b in members}
    return [names.get(int(i), str(i)) for i in read()]


def best_kernels(device: torch.device) -> Any:
    """SDPA in the scorer's default order (cuDNN, flash, efficient, math) for the plain baselines, on CUDA.

    A plain forward should not run a slower kernel than the scorer's prefill does (which asks for this
    order itself); the scorer's own context also settles torch's order before it saves it.
    """
    return sdpa_context(DEFAULT_ATTENTION_BACKENDS, device)


@torch.inference_mode()
def plain_forward(
    loaded: LoadedModel, ids: torch.Tensor, positions: torch.Tensor | None = None, *, ordered: bool = True
) -> int:
    """A plain prefill: HF forward (SDPA causal, KV cache written, last logits only) and the greedy token.

    With a cache given and no mask, transformers builds a slot-causal mask; for the sorted positions
    of kept tokens that is exactly their position-causal mask, so this is also the direct kept prefill.
    SDPA runs in `best_kernels` order (``ordered=False``: in whatever the caller set).
    """
    from transformers import DynamicCache

    model = loaded.model
    kwargs: dict[str, Any] = {"input_ids": ids[None], "use_cache": True, "logits_to_keep": 1}
    if positions is not None:
        kwargs["position_ids"] = positions[None]
    kwargs[cache_argument(model)] = DynamicCache(config=model.config)
    with best_kernels(loaded.device) if ordered else contextlib.nullcontext():
        out = model(**kwargs)
    return int(out.logits[0, -1].argmax())


def selector(rate: float) -> Protect:
    return Protect(Chunked(KeepRate(rate), 32), sink=1, tail=True)


@dataclass
class Bench:
    device: torch.device
    repeats: int
    deadline: float

    def median(self, fn: Callable[[], Any], warmup: int = 1) -> tuple[float, list[float]]:
        ms, runs, _ = self.median_out(fn, warmup)
        return ms, runs

    def median_out(self, fn: Callable[[], Any], warmup: int = 1) -> tuple[float, list[float], list[Any]]:
        """The median, the runs and what each timed call returned."""
        for _ in range(warmup):
            timed(self.device, fn)
        runs, outs = [], []
        for _ in range(self.repeats):
            ms, out = timed(self.device, fn)
            runs.append(ms)
            outs.append(out)
        return statistics.median(runs), runs, outs

    def out_of_time(self) -> bool:
        return time.perf_counter() > self.deadline


# --------------------------------------------------------------------------- modes and stages

#: ``--mode``: what `ExecutionSettings` the backend and the scorers get. ``default`` passes none, as
#: a user who sets nothing (compile auto: on for CUDA; the warm-up at load where the passes compile).
MODES: dict[str, ExecutionSettings | None] = {
    "default": None,
    "compile": ExecutionSettings(compile=True),
    "eager": ExecutionSettings(compile=False),
}


@dataclass(frozen=True)
class ScorerConfig:
    """One scorer of the grid: a look-ahead, and the draft's first ``layers`` layers (None: all)."""

    look_ahead: int
    layers: int | None = None
    aggregation: str = "max"

    @property
    def label(self) -> str:
        return f"la{self.look_ahead}" + ("" if self.layers is None else f"-L{self.layers}-{self.aggregation}")

    def overrides(self) -> dict[str, Any]:
        out: dict[str, Any] = {"look_ahead": self.look_ahead}
        if self.layers is not None:
            out.update(layers=self.layers, aggregation=self.aggregation)
        return out


def scorer_configs(args: argparse.Namespace) -> list[ScorerConfig]:
    """The full-depth look-aheads, then the draft's first N layers (look-ahead 1) for each ``--draft-layers``."""
    configs = [ScorerConfig(la) for la in args.look_aheads]
    configs += [ScorerConfig(1, n, args.aggregation) for n in args.draft_layers]
    return configs


def _overhead_cell(ms: float | None) -> str:
    """The report's overhead column: the measured milliseconds, or a dash where none was measured."""
    return "-" if ms is None else f"{ms:.1f}"


def warm_summary(pipe: Pipeline, seconds: float) -> dict[str, Any]:
    """What building a pipeline cost (``seconds``: construction and warm-up) and what its warm-up did."""
    done = pipe.warmed_up
    out: dict[str, Any] = {"seconds": seconds, "compiled": pipe.compiled, "warmed_up": done is not None}
    if done is not None:
        out["warmup_s"] = done.seconds
        for part, report in (("backend", done.backend), ("scorer", done.scorer)):
            if report is not None:
                cost = report.cost
                out[part] = {
                    "seconds": report.seconds,
                    "compiled": report.compiled,
                    "cost_abc": [cost.a, cost.b, cost.c],
                }
    out["cost_model"] = pipe.cost_model is not None
    # the per-request overhead the warm-up measured (None: not measured)
    overhead = None if done is None else done.overhead
    out["overhead_ms"] = None if overhead is None else overhead.overhead_ms
    return out


@dataclass
class Stages:
    """One pair's stages in one mode, built the way `load_pipeline` builds them for a user."""

    backend: TransformersBackend
    scorers: dict[ScorerConfig, DraftAttentionScorer]
    dense: Pipeline
    warmup: dict[str, Any]

    @classmethod
    def build(
        cls, target: LoadedModel, draft: LoadedModel, configs: list[ScorerConfig], args: argparse.Namespace
    ) -> Stages:
        """The backend with the first scorer, then each other scorer (each warmed up as `load_pipeline` does)."""
        execution = MODES[args.mode]
        warm = None if args.warmup == "auto" else True
        backend: TransformersBackend | None = None
        scorers: dict[ScorerConfig, DraftAttentionScorer] = {}
        warmup: dict[str, Any] = {}
        for config in configs:
            policy = load_policy("paper").with_overrides(keep_rate=args.keep_rates[0], **config.overrides())
            t0 = time.perf_counter()
            if backend is None:
                pipe = load_pipeline(policy, model=target, draft=draft, execution=execution, warmup=warm)
                assert isinstance(pipe.backend, TransformersBackend)
                backend = pipe.backend
            else:
                pipe = load_pipeline(policy, backend=backend, draft=draft, execution=execution, warmup=warm)
            seconds = time.perf_counter() - t0
            assert isinstance(pipe.scorer, DraftAttentionScorer)
            scorers[config] = pipe.scorer
            warmup[config.label] = warm_summary(pipe, seconds)
            logger.info("built %s (%s): %s", config.label, args.mode, warmup[config.label])
        assert backend is not None
        dense = load_pipeline("dense", backend=backend, scorer=next(iter(scorers.values())), warmup=warm)
        warmup["total_s"] = sum(w["seconds"] for w in warmup.values())
        return cls(backend, scorers, dense, warmup)

    def pipeline(self, config: ScorerConfig, rate: float, args: argparse.Namespace) -> Pipeline:
        """The user's pipeline for one cell: the paper's policy at ``rate`` over the built stages."""
        policy = load_policy("paper").with_overrides(keep_rate=rate, **config.overrides())
        warm = None if args.warmup == "auto" else True
        return load_pipeline(policy, backend=self.backend, scorer=self.scorers[config], warmup=warm)


# --------------------------------------------------------------------------- the benchmark


def random_prompt(n: int, vocab: int, gen: torch.Generator) -> Prompt:
    return Prompt.from_token_ids(torch.randint(1000, vocab - 1000, (n,), generator=gen).tolist())


def prompt_vocab(target: LoadedModel, draft: LoadedModel) -> int:
    """The ids prompts draw from: both models' and the target tokenizer's (a real vocabulary's last ids are special)."""
    sizes = [target.model.config.vocab_size, draft.model.config.vocab_size]
    if target.tokenizer is not None:
        sizes.append(len(target.tokenizer))
    return min(sizes)


def bench_pair(
    pair: str,
    target: LoadedModel,
    draft: LoadedModel,
    args: argparse.Namespace,
    bench: Bench,
    sink: Callable[[dict[str, Any]], None],
    flush: Callable[[], None],
) -> dict[str, Any]:
    """Every length of one target/draft pair; each length's row goes to ``sink``, ``flush`` after each cell.

    Returns what building (and warming up) the stages cost.
    """
    configs = scorer_configs(args)
    stages = Stages.build(target, draft, configs, args)
    if args.exactness:
        check_n = min(args.lengths)
        sink(
            {"pair": pair, "exactness": exactness(pair, target, draft, stages.backend, check_n, max(args.look_aheads))}
        )
    vocab = prompt_vocab(target, draft)
    # A prompt must leave room for the first token (the pipeline refuses one that does not) and for the
    # look-ahead in the draft: a real model's 32K context takes a few tokens less than 32768.
    limit = min(target.max_context, draft.max_context) - max(c.look_ahead for c in configs) - 1
    gen = torch.Generator().manual_seed(1234)
    for requested in args.lengths:
        n = min(requested, limit)
        if n != requested:
            logger.warning("%s: n=%d does not fit the context; measuring n=%d", pair, requested, n)
        if bench.out_of_time():
            logger.warning("out of time: skipping %s n=%d", pair, n)
            sink({"pair": pair, "n": n, "skipped": "out of time"})
            continue
        prompt = random_prompt(n, vocab, gen)
        bench_length(pair, prompt, target, draft, stages, configs, args, bench, sink, flush)
    return stages.warmup


def direct_path(scorer: DraftAttentionScorer, rate: float, target: LoadedModel, prompt: Prompt) -> int:
    """Score, select, then a plain forward of the kept tokens at their positions (no explicit mask)."""
    scores = scorer.score(prompt)
    kept = CompressedPrompt.from_selection(prompt, selector(rate).select(prompt, scores))
    dev = target.device
    return plain_forward(target, torch.tensor(kept.token_ids, device=dev), torch.tensor(kept.position_ids, device=dev))


def progress(line: str) -> None:
    """One line per finished cell, flushed, so that a log's tail says where a run is."""
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def bench_length(
    pair: str,
    prompt: Prompt,
    target: LoadedModel,
    draft: LoadedModel,
    stages: Stages,
    configs: list[ScorerConfig],
    args: argparse.Namespace,
    bench: Bench,
    sink: Callable[[dict[str, Any]], None],
    flush: Callable[[], None],
) -> None:
    """All measurements for one prompt; the row goes to ``sink`` first and fills cell by cell."""
    dev = bench.device
    first = SamplingParams(max_tokens=1)
    n = prompt.n
    ids = torch.tensor(prompt.token_ids, device=dev)
    row: dict[str, Any] = {"pair": pair, "target": target.name, "draft": draft.name, "n": n, "mode": args.mode}
    sink(row)
    row["sdpa_order"] = sdpa_order()  # what unordered code (the backend's kept prefill) gets
    full, runs = bench.median(partial(plain_forward, target, ids))
    row["full_plain_ms"], row["full_plain_runs"] = full, runs
    dense_ms, runs = bench.median(partial(stages.dense.generate, prompt, first))
    row["dense_ms"], row["dense_runs"] = dense_ms, runs
    row["full_backend_ms"] = dense_ms  # the backend's dense path (the name earlier results used)
    draft_ms, runs = bench.median(partial(plain_forward, draft, ids))
    row["draft_prefill_ms"], row["draft_prefill_runs"] = draft_ms, runs
    draft_peak = peak_extra(dev, partial(plain_forward, draft, ids))
    row["draft_prefill_peak_mib"] = draft_peak
    row["score"] = {}
    for config in configs:
        scorer = stages.scorers[config]
        score_ms, runs = bench.median(partial(scorer.score, prompt))
        # Cold: buffers and graph kept between calls are freed first, so their allocation counts.
        peak = peak_extra(dev, partial(cold_score, scorer, prompt))
        held = held_after(dev, scorer, prompt)
        entry: dict[str, Any] = {
            "look_ahead": config.look_ahead,
            "layers": config.layers,
            "ms": score_ms,
            "runs": runs,
            "ratio_to_draft_prefill": score_ms / draft_ms,
            "peak_mib": peak,
            "peak_ratio": peak / draft_peak if draft_peak else float("nan"),
            "held_between_calls_mib": held,
        }
        if config.look_ahead > 1 and args.no_graph:
            eager = scorer.with_options(execution=dataclasses.replace(scorer.execution, cuda_graph=False))
            entry["no_graph_ms"], entry["no_graph_runs"] = bench.median(partial(eager.score, prompt))
        row["score"][config.label] = entry
    flush()
    row["cells"] = []
    for rate in args.keep_rates:
        scores = stages.scorers[configs[0]].score(prompt)
        kept = CompressedPrompt.from_selection(prompt, selector(rate).select(prompt, scores))
        kids = torch.tensor(kept.token_ids, device=dev)
        kpos = torch.tensor(kept.position_ids, device=dev)
        kept_ms, kept_runs = bench.median(partial(plain_forward, target, kids, kpos))
        select_ms, _ = bench.median(partial(selector(rate).select, prompt, scores), 0)
        for config in configs:
            where = f"{pair} {args.mode} n={n} keep={rate:g} la={config.look_ahead} layers={config.layers or 'all'}"
            if bench.out_of_time():
                row["cells"].append(
                    {
                        "keep_rate": rate,
                        "look_ahead": config.look_ahead,
                        "layers": config.layers,
                        "skipped": "out of time",
                    }
                )
                progress(f"{where}: skipped (out of time)")
                flush()
                continue
            pipe = stages.pipeline(config, rate, args)
            spec_ms, spec_runs, completions = bench.median_out(partial(pipe.generate, prompt, first))
            fallbacks = sorted({c.fallback for c in completions if c.fallback})
            denominator = draft_ms + kept_ms
            cell: dict[str, Any] = {
                "keep_rate": rate,
                "look_ahead": config.look_ahead,
                "layers": config.layers,
                "aggregation": config.aggregation if config.layers is not None else "max",
                "kept": kept.kept,
                "keep_ratio": kept.keep_ratio,
                "kept_by_pipeline": completions[-1].usage.kept_tokens if completions else None,
                "dense_ms": dense_ms,
                "spec_ms": spec_ms,
                "spec_runs": spec_runs,
                "speedup": dense_ms / spec_ms,
                "fallback": fallbacks[0] if fallbacks else None,
                "fallbacks": fallbacks,
                "full_ms": full,
                "e2e_ms": spec_ms,
                "speedup_vs_plain": full / spec_ms,
                "kept_prefill_ms": kept_ms,
                "kept_prefill_runs": kept_runs,
                "select_ms": select_ms,
                "score_ms": row["score"][config.label]["ms"],
                "ceiling": full / denominator,
                "ratio_to_ceiling": denominator / spec_ms,
            }
            if args.direct:
                direct_ms, direct_runs = bench.median(
                    partial(direct_path, stages.scorers[config], rate, target, prompt)
                )
                cell.update(
                    e2e_direct_ms=direct_ms,
                    e2e_direct_runs=direct_runs,
                    speedup_direct=full / direct_ms,
                    ratio_to_ceiling_direct=denominator / direct_ms,
                )
            row["cells"].append(cell)
            flush()
            progress(
                f"{where}: dense {dense_ms:.1f} ms, SpecPrefill {spec_ms:.1f} ms ({dense_ms / spec_ms:.2f}x), "
                f"ceiling {cell['ceiling']:.2f}x, fallback {cell['fallback']}"
            )


def cold_score(scorer: DraftAttentionScorer, prompt: Prompt) -> Any:
    scorer.release()
    return scorer.score(prompt)


def held_after(device: torch.device, scorer: DraftAttentionScorer, prompt: Prompt) -> float:
    """Memory (MiB) a scorer keeps allocated between calls (look-ahead buffers and CUDA graph)."""
    if device.type != "cuda":
        return float("nan")
    scorer.release()
    sync(device)
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    scorer.score(prompt)
    sync(device)
    gc.collect()
    return (torch.cuda.memory_allocated(device) - base) / 2**20


def exactness(
    pair: str, target: LoadedModel, draft: LoadedModel, backend: TransformersBackend, n: int, look_ahead: int
) -> dict[str, Any]:
    """On this device: graph vs eager vs step-by-step look-ahead scores; unmasked vs masked kept prefill."""
    vocab = min(target.model.config.vocab_size, draft.model.config.vocab_size)
    gen = torch.Generator().manual_seed(7)
    prompt = Prompt.from_token_ids(torch.randint(1000, vocab - 1000, (n,), generator=gen).tolist())
    # Not compiled in any mode (as before compiling was the default): it checks the graph and buffers only.
    graph = DraftAttentionScorer(
        draft, look_ahead=look_ahead, target_tokenizer=target.tokenizer, execution=ExecutionSettings(compile=False)
    )
    eager = graph.with_options(execution=ExecutionSettings(compile=False, cuda_graph=False))
    stepwise = graph.with_options()
    stepwise._fixed_buffers = False
    first, replayed = graph.score(prompt), graph.score(prompt)  # capture, then replay only
    plain, again, stepped = eager.score(prompt), eager.score(prompt), stepwise.score(prompt)
    graph.release()

    def rel(a: Any, b: Any) -> float:
        return float((a.values - b.values).abs().max() / b.values.abs().max())

    def same(a: Any, b: Any) -> bool:
        return bool(a.info["look_ahead_token_ids"] == b.info["look_ahead_token_ids"])

    kept = CompressedPrompt.from_selection(prompt, selector(0.1).select(prompt, plain))
    state = backend.prefill(kept)
    dev = target.device
    ids = torch.tensor([kept.token_ids], device=dev)
    pos = torch.tensor([kept.position_ids], device=dev)
    mask = (pos[:, None, :] <= pos[:, :, None])[:, None]
    from transformers import DynamicCache

    with torch.inference_mode():
        masked = (
            target.model(
                input_ids=ids,
                position_ids=pos,
                attention_mask=mask,
                use_cache=True,
                logits_to_keep=1,
                **{cache_argument(target.model): DynamicCache(config=target.model.config)},
            )
            .logits[0, -1]
            .float()
        )
    assert state.logits is not None  # a prefill returns the last position's logits
    fast = state.logits[0].float()
    result = {
        "pair": pair,
        "n": n,
        "look_ahead": look_ahead,
        "eager_run_to_run_rel": rel(again, plain),
        "eager_run_to_run_tokens_equal": same(again, plain),
        "graph_first_vs_eager_rel": rel(first, plain),
        "graph_replay_vs_eager_rel": rel(replayed, plain),
        "graph_tokens_equal_eager": same(first, plain) and same(replayed, plain),
        "fixed_buffers_vs_stepwise_rel": rel(plain, stepped),
        "fixed_buffers_tokens_equal_stepwise": same(plain, stepped),
        "kept": kept.kept,
        "unmasked_vs_masked_kept_logits_max_abs": float((fast - masked).abs().max()),
        "kept_logits_max_abs": float(masked.abs().max()),
        "unmasked_vs_masked_argmax_equal": bool(fast.argmax() == masked.argmax()),
    }
    logger.info("exactness %s", result)
    return result


@torch.inference_mode()
def plain_lookahead(loaded: LoadedModel, ids: torch.Tensor, steps: int) -> int:
    """A plain prefill then ``steps`` greedy decode steps (no scoring hook): the look-ahead's bare cost."""
    from transformers import DynamicCache

    model = loaded.model
    cache_kw = cache_argument(model)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids[None], use_cache=True, logits_to_keep=1, **{cache_kw: cache})
    token = out.logits[:, -1].argmax(-1)
    n = ids.shape[0]
    for step in range(1, steps + 1):
        bool(token.eq(-1).all())  # the scorer checks for EOS each step (one host sync), so does this
        out = model(
            input_ids=token[:, None],
            position_ids=torch.tensor([[n - 1 + step]], device=ids.device),
            use_cache=True,
            logits_to_keep=1,
            **{cache_kw: cache},
        )
        token = out.logits[:, -1].argmax(-1)
    return int(token[0])


def profile_lookahead(
    pair: str, draft: LoadedModel, tokenizer: Any, args: argparse.Namespace, bench: Bench
) -> list[dict[str, Any]]:
    """Where look-ahead scoring time goes: plain prefill, plain decode steps, and the scorer's extra."""
    rows = []
    scorers = {
        la: DraftAttentionScorer(draft, look_ahead=la, pool_kernel=13, target_tokenizer=tokenizer) for la in (1, 8)
    }
    gen = torch.Generator().manual_seed(99)
    for n in args.lengths:
        ids_cpu = torch.randint(1000, draft.model.config.vocab_size - 1000, (n,), generator=gen)
        prompt = Prompt.from_token_ids(ids_cpu.tolist())
        ids = ids_cpu.to(bench.device)
        prefill, _ = bench.median(partial(plain_forward, draft, ids))
        decode7, _ = bench.median(partial(plain_lookahead, draft, ids, 7))
        la1, _ = bench.median(partial(scorers[1].score, prompt))
        la8, _ = bench.median(partial(scorers[8].score, prompt))
        layers = draft.model.config.num_hidden_layers
        row = {
            "pair": pair,
            "draft": draft.name,
            "n": n,
            "layers": layers,
            "plain_prefill_ms": prefill,
            "plain_prefill_plus_7_decode_ms": decode7,
            "plain_decode_step_ms": (decode7 - prefill) / 7,
            "score_la1_ms": la1,
            "score_la8_ms": la8,
            "scored_step_ms": (la8 - la1) / 7,
            "hook_ms_per_layer_step": ((la8 - la1) - (decode7 - prefill)) / 7 / layers,
        }
        logger.info("profile %s", row)
        rows.append(row)
    return rows


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            sdpa_flash=torch.backends.cuda.flash_sdp_enabled(),
            cuda=torch.version.cuda,
        )
    return env


def start_run(name: str, args: argparse.Namespace, budget_s: float) -> tuple[torch.device, Bench, Path, dict[str, Any]]:
    """Logging, the device (CPU with ``--tiny`` or without CUDA), the timer, the output folder, the result's head."""
    setup_logging(sys.stdout)
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    bench = Bench(device=device, repeats=args.repeats, deadline=time.perf_counter() + budget_s)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "benchmark": name,
        "command": command_line(),
        "environment": environment(device),
    }
    return device, bench, out, result


def report_header(title: str, result: dict[str, Any], timing: str) -> list[str]:
    """The first lines of a markdown report: title, machine and software, command and how it timed."""
    env = result["environment"]
    return [
        f"# {title}",
        "",
        f"- machine: {env.get('gpu', env['device'])}, torch {env['torch']}, transformers {env['transformers']}",
        f"- command: `{result['command']}`; {timing}",
    ]


#: Requirement (2): the pipeline's TTFT at most this many times dense prefill's, in every cell.
DENSE_TOLERANCE = 1.05


def measured_cells(result: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every measured (row, cell) of a result (cells skipped for time left out)."""
    return [(r, c) for r in result["rows"] for c in r.get("cells", []) if "skipped" not in c]


def worst_by_pair(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per pair, its cell of the lowest speedup over dense and whether it is within `DENSE_TOLERANCE`."""
    out: dict[str, dict[str, Any]] = {}
    for row, c in measured_cells(result):
        best = out.get(row["pair"])
        if best is None or c["speedup"] < best["speedup"]:
            out[row["pair"]] = {
                "n": row["n"],
                "keep_rate": c["keep_rate"],
                "look_ahead": c["look_ahead"],
                "layers": c.get("layers"),
                "speedup": c["speedup"],
                "within_tolerance": c["speedup"] >= 1 / DENSE_TOLERANCE,
            }
    return out


def markdown(result: dict[str, Any]) -> str:
    mode = result.get("mode", "compile" if result.get("compile") else "eager")
    lines = [
        *report_header(
            f"GPU TTFT: SpecPrefill vs dense prefill (HF backend, bf16, batch 1), mode {mode}",
            result,
            f"median of {result['repeats']} runs after a warm-up",
        ),
        "- dense = the `dense` policy's pipeline through the same TransformersBackend (max_tokens=1); SpecPrefill "
        "= `load_pipeline('paper', keep_rate=r, look_ahead=..., layers=...)` over the same backend, "
        "generate(max_tokens=1), the dense-when-slower check included; speedup = dense / SpecPrefill; "
        "ceiling = plain forward of the prompt / (plain draft prefill + plain kept prefill)",
        f"- mode {mode}: " + MODE_TEXT.get(mode, ""),
    ]
    warm = result.get("warmup", {})
    if warm:
        lines += [
            "",
            "## Building the stages (what a user pays at load)",
            "",
            "| pair | scorer | seconds | compiled | warmed up | cost model | overhead ms |",
            "|---|---|---:|---|---|---|---:|",
        ]
        for pair, parts in warm.items():
            for label, w in parts.items():
                if isinstance(w, dict):
                    lines.append(
                        f"| {pair} | {label} | {w['seconds']:.1f} | {w['compiled']} | {w['warmed_up']} "
                        f"| {w['cost_model']} | {_overhead_cell(w.get('overhead_ms'))} |"
                    )
            lines.append(f"| {pair} | all | {parts.get('total_s', float('nan')):.1f} | | | | |")
    cells = measured_cells(result)
    if cells:
        direct = any("e2e_direct_ms" in c for _, c in cells)
        lines += [
            "",
            "## TTFT",
            "",
            "| pair | n | keep | look-ahead | layers | dense ms | SpecPrefill ms | speedup | ceiling | fallback "
            + ("| direct ms |" if direct else "|"),
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|" + ("---:|" if direct else ""),
        ]
        for row, c in cells:
            # The reason's kind only: the JSON has the whole string with its estimates.
            fallback = (c.get("fallback") or "-").split(":", 1)[0]
            line = (
                f"| {row['pair']} | {row['n']} | {c['keep_rate']:g} | {c['look_ahead']} | {c.get('layers') or 'all'} "
                f"| {c['dense_ms']:.1f} | {c['spec_ms']:.1f} | {c['speedup']:.2f}x | {c['ceiling']:.2f}x "
                f"| {fallback} |"
            )
            if direct:
                line += f" {c['e2e_direct_ms']:.1f} |" if "e2e_direct_ms" in c else " - |"
            lines.append(line)
        lines.append("")
        for pair, w in worst_by_pair(result).items():
            verdict = "within" if w["within_tolerance"] else "NOT within"
            lines.append(
                f"- {pair}: worst speedup {w['speedup']:.3f}x (n={w['n']}, keep {w['keep_rate']:g}, look-ahead "
                f"{w['look_ahead']}, layers {w['layers'] or 'all'}): {verdict} {DENSE_TOLERANCE}x of dense "
                f"(speedup >= {1 / DENSE_TOLERANCE:.3f})"
            )
    if any(row.get("score") for row in result["rows"]):
        lines += [
            "",
            "## Scoring against a plain draft prefill",
            "",
            "| pair | n | draft prefill ms | scorer | scoring ms | time ratio | without CUDA graph ms "
            "| draft peak MiB | scoring peak MiB | memory ratio | held between calls MiB |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for row in result["rows"]:
        for label, s in row.get("score", {}).items():
            no_graph = f"{s['no_graph_ms']:.1f}" if "no_graph_ms" in s else "-"
            held = s.get("held_between_calls_mib", float("nan"))
            lines.append(
                f"| {row['pair']} | {row['n']} | {row['draft_prefill_ms']:.1f} | {label} | {s['ms']:.1f} | "
                f"{s['ratio_to_draft_prefill']:.2f}x | {no_graph} | {row['draft_prefill_peak_mib']:.0f} | "
                f"{s['peak_mib']:.0f} | {s['peak_ratio']:.3f} | {held:.0f} |"
            )
    checks = [r["exactness"] for r in result["rows"] if "exactness" in r]
    if checks:
        lines += [
            "",
            "## Exactness on this device (bf16)",
            "",
            "| pair | n | look-ahead | eager vs eager, max rel | graph vs eager (first call / replay), max rel "
            "| same look-ahead tokens "
            "| fixed buffers vs step-by-step, max rel | same tokens | kept prefill: unmasked vs masked logits, "
            "max abs (of max) | same argmax |",
            "|---|---:|---:|---|---|---|---:|---|---|---|",
        ]
        for c in checks:
            lines.append(
                f"| {c['pair']} | {c['n']} | {c['look_ahead']} | {c['eager_run_to_run_rel']:.2e} | "
                f"{c['graph_first_vs_eager_rel']:.2e} / "
                f"{c['graph_replay_vs_eager_rel']:.2e} | {c['graph_tokens_equal_eager']} | "
                f"{c['fixed_buffers_vs_stepwise_rel']:.2e} | {c['fixed_buffers_tokens_equal_stepwise']} | "
                f"{c['unmasked_vs_masked_kept_logits_max_abs']:.3g} ({c['kept_logits_max_abs']:.3g}) | "
                f"{c['unmasked_vs_masked_argmax_equal']} |"
            )
    backend_rows = [r for r in result["rows"] if "full_backend_ms" in r]
    if backend_rows:
        lines += [
            "",
            "## Dense prompt: plain forward vs the backend's prefill",
            "",
            "| pair | n | plain ms | dense pipeline ms |",
            "|---|---:|---:|---:|",
        ]
        for r in backend_rows:
            lines.append(f"| {r['pair']} | {r['n']} | {r['full_plain_ms']:.1f} | {r['full_backend_ms']:.1f} |")
    if result.get("profile"):
        lines += [
            "",
            "## Look-ahead profile (draft only)",
            "",
            "| draft | n | layers | plain prefill ms | plain decode step ms | scored step ms "
            "| hook ms per layer and step |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for p in result["profile"]:
            lines.append(
                f"| {p['draft']} | {p['n']} | {p['layers']} | {p['plain_prefill_ms']:.1f} | "
                f"{p['plain_decode_step_ms']:.2f} | {p['scored_step_ms']:.2f} | "
                f"{p['hook_ms_per_layer_step']:.3f} |"
            )
    skipped = [r for r in result["rows"] if "skipped" in r]
    if skipped:
        lines += [
            "",
            "Not run (time limit): " + ", ".join(r["pair"] + (f" n={r['n']}" if "n" in r else "") for r in skipped),
        ]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """Speedup against n, one panel per pair: SpecPrefill (solid), its ceiling (dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    pairs = list(dict.fromkeys(r["pair"] for r in result["rows"] if r.get("cells")))
    if not pairs:
        return
    fig, axes = plt.subplots(1, len(pairs), figsize=(6.2 * len(pairs), 4.6), squeeze=False, layout="constrained")
    for ax, pair in zip(axes[0], pairs, strict=True):
        rows = [r for r in result["rows"] if r["pair"] == pair and r.get("cells")]

        def key(c: dict[str, Any]) -> tuple[float, int, int | None]:
            return c["keep_rate"], c["look_ahead"], c.get("layers")

        done = [(r, c) for r in rows for c in r["cells"] if "skipped" not in c]
        combos = list(dict.fromkeys(key(c) for _, c in done))
        for i, (rate, la, layers) in enumerate(combos):
            points = [(r["n"], c) for r, c in done if key(c) == (rate, la, layers)]
            color = plt.get_cmap("tab10")(i % 10)
            label = f"keep {rate:g}, look-ahead {la}" + ("" if layers is None else f", {layers} layers")
            ns = [n for n, _ in points]
            ax.plot(ns, [c["speedup"] for _, c in points], "-o", color=color, label=label)
            ax.plot(ns, [c["ceiling"] for _, c in points], ":", color=color)
        ax.set_xscale("log", base=2)
        ax.set_xticks([r["n"] for r in rows])
        ax.set_xticklabels([f"{round(r['n'] / 1024)}K" if r["n"] >= 1024 else str(r["n"]) for r in rows])
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("TTFT speedup over dense prefill (dotted: ceiling)")
        ax.set_title(f"{rows[0]['target']} / {rows[0]['draft']}", fontsize=10)
        ax.grid(True, alpha=0.3)
    # One legend for every panel, below them: inside a panel it covered lines.
    handles, labels = axes[0][-1].get_legend_handles_labels()
    handles.append(Line2D([], [], linestyle=":", color="black"))
    labels.append("ceiling (dotted, same colour)")
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4), fontsize=9, frameon=False)
    fig.suptitle(
        f"{result['environment'].get('gpu', result['environment']['device'])}, HF backend, bf16, batch 1"
        + (f", mode {result['mode']}" if "mode" in result else ""),
        fontsize=10,
    )
    save_figure(fig, path)


def real_name(spec: str) -> str:
    """A model's name in results: its file's or folder's stem (a registry name as it is)."""
    return Path(spec).stem if ("/" in spec or spec.endswith(".gguf")) else spec


def load_pair(
    pair: str, args: argparse.Namespace, device: torch.device, result: dict[str, Any]
) -> tuple[str, LoadedModel, LoadedModel]:
    """The pair's name and its target and draft: random weights from `CONFIGS`, or ``--real-*`` loaded in bf16."""
    if pair == "real":
        from specprefill_sdk.models import load_model

        if not (args.real_target and args.real_draft):
            raise SystemExit("--pairs real needs --real-target PATH and --real-draft PATH")
        target = load_model(args.real_target, device=device, dtype="bfloat16")
        draft = load_model(args.real_draft, device=device, dtype="bfloat16")
        name = f"{real_name(args.real_target)}/{real_name(args.real_draft)}"
        result["models"][name] = {"target": args.real_target, "draft": args.real_draft}
        return name, target, draft
    target_name, draft_name = PAIRS[pair]
    tcfg, dcfg = CONFIGS[target_name], CONFIGS[draft_name]
    if args.tiny:
        tcfg, dcfg = tiny(tcfg), tiny(dcfg)
    result["configs"][target_name], result["configs"][draft_name] = tcfg, dcfg
    tokenizer = synthetic_tokenizer(max(tcfg["vocab_size"], dcfg["vocab_size"]))
    return pair, build_model(target_name, tcfg, device, tokenizer), build_model(draft_name, dcfg, device, tokenizer)


#: How each ``--mode`` runs the passes, for the reports.
MODE_TEXT = {
    "default": "no ExecutionSettings (what a user gets without flags: compile auto, on for CUDA, with the "
    "warm-up at load where the passes compile; SPECPREFILL_COMPILE unset)",
    "compile": "ExecutionSettings(compile=True)",
    "eager": "ExecutionSettings(compile=False)",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=["llama", "qwen"], choices=[*sorted(PAIRS), "real"])
    parser.add_argument("--real-target", help="with --pairs real: the target (a GGUF file, a model folder or name)")
    parser.add_argument("--real-draft", help="with --pairs real: the draft (a GGUF file, a model folder or name)")
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 8192, 16384, 32768])
    parser.add_argument("--keep-rates", nargs="+", type=float, default=[0.1, 0.3])
    parser.add_argument("--look-aheads", nargs="+", type=int, default=[8, 1])
    parser.add_argument(
        "--draft-layers",
        nargs="+",
        type=int,
        default=[],
        metavar="N",
        help="extra cells scored by the draft's first N layers (look-ahead 1)",
    )
    parser.add_argument(
        "--aggregation", default="max", choices=["max", "mean", "content-mean"], help="of the --draft-layers cells"
    )
    parser.add_argument(
        "--mode",
        choices=sorted(MODES),
        default=None,
        help="default: no execution settings, as a user without flags (compile auto); compile: compile=True; "
        "eager: compile=False (default: eager, or compile with --compile)",
    )
    parser.add_argument("--compile", action="store_true", help="the same as --mode compile")
    parser.add_argument(
        "--warmup",
        choices=["auto", "always"],
        default="auto",
        help="auto: warm the stages up where load_pipeline does (when the passes compile); always: in every mode",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--direct", action="store_true", help="also time score + select + a plain kept forward")
    parser.add_argument("--no-graph", action="store_true", help="also time look-ahead scoring without a CUDA graph")
    parser.add_argument("--no-exactness", dest="exactness", action="store_false", help="skip the exactness check")
    parser.add_argument(
        "--budget-s", type=float, default=480.0, help="skip the remaining cells after this long (results are kept)"
    )
    parser.add_argument(
        "--profile-lookahead",
        action="store_true",
        help="only profile look-ahead scoring on the drafts (plain decode steps vs scored ones)",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny configs on CPU (a check of the script)")
    add_output_args(parser, "ttft_gpu_h200")
    args = parser.parse_args()
    if args.compile and args.mode not in (None, "compile"):
        parser.error(f"--compile contradicts --mode {args.mode}")
    args.mode = args.mode or ("compile" if args.compile else "eager")
    if any(n < 1 for n in args.draft_layers):
        parser.error(f"--draft-layers must be >= 1, got {args.draft_layers}")
    if "real" in args.pairs and not (args.real_target and args.real_draft):
        parser.error("--pairs real needs --real-target and --real-draft")
    if (args.real_target or args.real_draft) and "real" not in args.pairs:
        parser.error("--real-target and --real-draft are read only with --pairs real")
    if args.mode == "default":
        # _common turns auto compiling off for the scripts; a user who sets nothing has it unset.
        os.environ.pop(COMPILE_ENV, None)
    if args.tiny:
        args.lengths = [n for n in args.lengths if n <= 1024] or [256, 512]
    device, bench, out, result = start_run("ttft_gpu", args, args.budget_s)
    result.update(
        repeats=args.repeats,
        tiny=args.tiny,
        mode=args.mode,
        compile=args.mode == "compile",
        warmup_policy=args.warmup,
        configs={},
        models={},
        warmup={},
        rows=[],
    )

    def flush() -> None:
        write_json(out, args.name, result)  # partial results survive

    def sink(row: dict[str, Any]) -> None:
        result["rows"].append(row)
        flush()

    for pair in args.pairs:
        if bench.out_of_time():
            logger.warning("out of time: skipping %s", pair)
            sink({"pair": pair, "skipped": "out of time"})
            continue
        if args.profile_lookahead:
            if pair == "real":
                parser.error("--profile-lookahead runs the random-weight drafts only")
            draft_name = PAIRS[pair][1]
            dcfg = tiny(CONFIGS[draft_name]) if args.tiny else CONFIGS[draft_name]
            result["configs"][draft_name] = dcfg
            tokenizer = synthetic_tokenizer(dcfg["vocab_size"])
            draft_only = build_model(draft_name, dcfg, device, tokenizer)
            result.setdefault("profile", []).extend(profile_lookahead(pair, draft_only, tokenizer, args, bench))
            flush()
            del draft_only
            continue
        name, target, draft = load_pair(pair, args, device, result)
        try:
            result["warmup"][name] = bench_pair(name, target, draft, args, bench, sink, flush)
        finally:
            del target, draft
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    result["worst_by_pair"] = worst_by_pair(result)
    sys.stdout.write(write_results(out, args.name, result, markdown, plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
