"""GPU time-to-first-token of SpecPrefill against full prefill, its ceiling, scoring cost and memory.

Runs on one GPU (written for an H200) with the Hugging Face backend, bf16, batch 1. The models have
real architectures built from hand-written configs (Llama-3.1-8B target / Llama-3.2-1B draft,
Qwen2.5-32B target / Qwen2.5-0.5B draft) and random weights: speed does not depend on weight values,
and nothing is downloaded. Prompts are random token ids.

For every pair, prompt length n, keep rate and look-ahead, measured in one process (median of
``--repeats`` runs after a warm-up):

- ``full``: a plain HF forward of the whole prompt (SDPA causal, KV cache written, last logits only)
  plus the greedy first token; the backend's dense path is timed too;
- ``draft``: the same plain forward on the draft (what scoring is compared with);
- ``score``: `DraftAttentionScorer.score` (draft prefill + look-ahead + attention reduction), and its
  peak memory over the weights against the plain draft prefill's;
- ``kept``: a plain forward of the kept tokens at their original positions;
- ``e2e``: `Pipeline(scorer, Protect(Chunked(KeepRate(r), 32)), TransformersBackend).generate(max_tokens=1)`;
- ``e2e_direct``: score + select + the kept tokens' plain forward (no explicit mask), i.e. what the
  backend reaches when a fresh single-row prefill skips the 4-D position mask;
- ``ceiling = full / (draft + kept)`` and ``ratio = (full / e2e) / ceiling``.

Usage (device machine)::

    python benchmarks/ttft_gpu.py --out $OUT
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
from specprefill_sdk.runtime import ExecutionSettings
from specprefill_sdk.runtime.attention import DEFAULT_ATTENTION_BACKENDS, sdpa_context
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
        for _ in range(warmup):
            timed(self.device, fn)
        runs = [timed(self.device, fn)[0] for _ in range(self.repeats)]
        return statistics.median(runs), runs

    def out_of_time(self) -> bool:
        return time.perf_counter() > self.deadline


# --------------------------------------------------------------------------- the benchmark


def bench_pair(
    pair: str,
    target: LoadedModel,
    draft: LoadedModel,
    args: argparse.Namespace,
    bench: Bench,
    sink: Callable[[dict[str, Any]], None],
) -> None:
    """Every length of one target/draft pair; each finished length goes to ``sink``."""
    execution = ExecutionSettings(compile=args.compile)
    backend = TransformersBackend(target, execution=execution)
    scorers = {
        la: DraftAttentionScorer(
            draft, look_ahead=la, pool_kernel=13, target_tokenizer=target.tokenizer, execution=execution
        )
        for la in args.look_aheads
    }
    check_n = min(args.lengths)
    sink({"pair": pair, "exactness": exactness(pair, target, draft, backend, check_n, max(args.look_aheads))})
    vocab = min(target.model.config.vocab_size, draft.model.config.vocab_size)
    gen = torch.Generator().manual_seed(1234)
    for n in args.lengths:
        if bench.out_of_time():
            logger.warning("out of time: skipping %s n=%d", pair, n)
            sink({"pair": pair, "n": n, "skipped": "out of time"})
            continue
        prompt = Prompt.from_token_ids(torch.randint(1000, vocab - 1000, (n,), generator=gen).tolist())
        sink(bench_length(pair, prompt, target, draft, backend, scorers, args, bench))


def direct_path(scorer: DraftAttentionScorer, rate: float, target: LoadedModel, prompt: Prompt) -> int:
    """Score, select, then a plain forward of the kept tokens at their positions (no explicit mask)."""
    scores = scorer.score(prompt)
    kept = CompressedPrompt.from_selection(prompt, selector(rate).select(prompt, scores))
    dev = target.device
    return plain_forward(target, torch.tensor(kept.token_ids, device=dev), torch.tensor(kept.position_ids, device=dev))


def bench_length(
    pair: str,
    prompt: Prompt,
    target: LoadedModel,
    draft: LoadedModel,
    backend: TransformersBackend,
    scorers: dict[int, DraftAttentionScorer],
    args: argparse.Namespace,
    bench: Bench,
) -> dict[str, Any]:
    """All measurements for one prompt."""
    dev = bench.device
    first = SamplingParams(max_tokens=1)
    n = prompt.n
    ids = torch.tensor(prompt.token_ids, device=dev)
    row: dict[str, Any] = {"pair": pair, "target": target.name, "draft": draft.name, "n": n}
    row["sdpa_order"] = sdpa_order()  # what unordered code (the backend's kept prefill) gets
    full, runs = bench.median(partial(plain_forward, target, ids))
    row["full_plain_ms"], row["full_plain_runs"] = full, runs
    if args.backend_full and n <= args.backend_full_max:
        ms, runs = bench.median(partial(backend.generate, CompressedPrompt.dense(prompt), first))
        row["full_backend_ms"], row["full_backend_runs"] = ms, runs
    draft_ms, runs = bench.median(partial(plain_forward, draft, ids))
    row["draft_prefill_ms"], row["draft_prefill_runs"] = draft_ms, runs
    draft_peak = peak_extra(dev, partial(plain_forward, draft, ids))
    row["draft_prefill_peak_mib"] = draft_peak
    row["score"] = {}
    for la, scorer in scorers.items():
        score_ms, runs = bench.median(partial(scorer.score, prompt))
        # Cold: buffers and graph kept between calls are freed first, so their allocation counts.
        peak = peak_extra(dev, partial(cold_score, scorer, prompt))
        held = held_after(dev, scorer, prompt)
        row["score"][la] = {
            "ms": score_ms,
            "runs": runs,
            "ratio_to_draft_prefill": score_ms / draft_ms,
            "peak_mib": peak,
            "peak_ratio": peak / draft_peak if draft_peak else float("nan"),
            "held_between_calls_mib": held,
        }
        if la > 1:
            eager = scorer.with_options(execution=dataclasses.replace(scorer.execution, cuda_graph=False))
            eager_ms, eager_runs = bench.median(partial(eager.score, prompt))
            row["score"][la]["no_graph_ms"], row["score"][la]["no_graph_runs"] = eager_ms, eager_runs
    row["cells"] = []
    for rate in args.keep_rates:
        scores = scorers[args.look_aheads[0]].score(prompt)
        sel = selector(rate).select(prompt, scores)
        kept = CompressedPrompt.from_selection(prompt, sel)
        kids = torch.tensor(kept.token_ids, device=dev)
        kpos = torch.tensor(kept.position_ids, device=dev)
        kept_ms, kept_runs = bench.median(partial(plain_forward, target, kids, kpos))
        select_ms, _ = bench.median(partial(selector(rate).select, prompt, scores), 0)
        for la in args.look_aheads:
            pipe = Pipeline(scorers[la], selector(rate), backend)
            e2e_ms, e2e_runs = bench.median(partial(pipe.generate, prompt, first))
            direct_ms, direct_runs = bench.median(partial(direct_path, scorers[la], rate, target, prompt))
            denominator = draft_ms + kept_ms
            ceiling = full / denominator
            row["cells"].append(
                {
                    "keep_rate": rate,
                    "look_ahead": la,
                    "kept": kept.kept,
                    "keep_ratio": kept.keep_ratio,
                    "full_ms": full,
                    "e2e_ms": e2e_ms,
                    "e2e_runs": e2e_runs,
                    "speedup": full / e2e_ms,
                    "e2e_direct_ms": direct_ms,
                    "e2e_direct_runs": direct_runs,
                    "speedup_direct": full / direct_ms,
                    "kept_prefill_ms": kept_ms,
                    "kept_prefill_runs": kept_runs,
                    "select_ms": select_ms,
                    "score_ms": row["score"][la]["ms"],
                    "ceiling": ceiling,
                    "ratio_to_ceiling": denominator / e2e_ms,
                    "ratio_to_ceiling_direct": denominator / direct_ms,
                }
            )
            logger.info(
                "%s n=%d keep %.1f la %d: full %.1f ms, e2e %.1f ms (%.2fx), direct %.1f ms (%.2fx), ceiling %.2fx",
                pair,
                n,
                rate,
                la,
                full,
                e2e_ms,
                full / e2e_ms,
                direct_ms,
                full / direct_ms,
                ceiling,
            )
    return row


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
    graph = DraftAttentionScorer(draft, look_ahead=look_ahead, target_tokenizer=target.tokenizer)
    eager = graph.with_options(execution=ExecutionSettings(cuda_graph=False))
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


def markdown(result: dict[str, Any]) -> str:
    lines = [
        *report_header(
            "GPU TTFT: SpecPrefill vs full prefill (HF backend, bf16, batch 1, random weights)",
            result,
            f"median of {result['repeats']} runs after a warm-up",
        ),
        "- full = plain HF forward of the prompt + first token; e2e = Pipeline(DraftAttentionScorer, "
        "Protect(Chunked(KeepRate(r), 32)), TransformersBackend).generate(max_tokens=1); direct = score + select + "
        "plain forward of the kept tokens at their positions; ceiling = full / (plain draft prefill + kept prefill)",
        "- scorer and backend: lean passes for Llama-style models (the default), "
        f"compile={result.get('compile', False)}",
    ]
    if any(row.get("cells") for row in result["rows"]):
        lines += [
            "",
            "## TTFT",
            "",
            "| pair | n | keep | look-ahead | full ms | SpecPrefill ms | speedup | ceiling | ratio to ceiling "
            "| direct ms | direct ratio to ceiling |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for row in result["rows"]:
        for c in row.get("cells", []):
            lines.append(
                f"| {row['pair']} | {row['n']} | {c['keep_rate']:g} | {c['look_ahead']} | {c['full_ms']:.1f} | "
                f"{c['e2e_ms']:.1f} | {c['speedup']:.2f}x | {c['ceiling']:.2f}x | {100 * c['ratio_to_ceiling']:.1f}% | "
                f"{c['e2e_direct_ms']:.1f} | {100 * c['ratio_to_ceiling_direct']:.0f}% |"
            )
    if any(row.get("score") for row in result["rows"]):
        lines += [
            "",
            "## Scoring against a plain draft prefill",
            "",
            "| pair | n | draft prefill ms | look-ahead | scoring ms | time ratio | without CUDA graph ms "
            "| draft peak MiB | scoring peak MiB | memory ratio | held between calls MiB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for row in result["rows"]:
        for la, s in row.get("score", {}).items():
            no_graph = f"{s['no_graph_ms']:.1f}" if "no_graph_ms" in s else "-"
            held = s.get("held_between_calls_mib", float("nan"))
            lines.append(
                f"| {row['pair']} | {row['n']} | {row['draft_prefill_ms']:.1f} | {la} | {s['ms']:.1f} | "
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
            "| pair | n | plain ms | backend ms |",
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
        lines += ["", "Not run (time limit): " + ", ".join(f"{r['pair']} n={r['n']}" for r in skipped)]
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
        combos = list(dict.fromkeys((c["keep_rate"], c["look_ahead"]) for r in rows for c in r["cells"]))
        for i, (rate, la) in enumerate(combos):
            ns = [r["n"] for r in rows]
            cells = [next(c for c in r["cells"] if c["keep_rate"] == rate and c["look_ahead"] == la) for r in rows]
            color = plt.get_cmap("tab10")(i)
            ax.plot(ns, [c["speedup"] for c in cells], "-o", color=color, label=f"keep {rate:g}, look-ahead {la}")
            ax.plot(ns, [c["ceiling"] for c in cells], ":", color=color)
        ax.set_xscale("log", base=2)
        ax.set_xticks([r["n"] for r in rows])
        ax.set_xticklabels([f"{r['n'] // 1024}K" for r in rows])
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("TTFT speedup over full prefill (dotted: ceiling)")
        ax.set_title(f"{rows[0]['target']} / {rows[0]['draft']}", fontsize=10)
        ax.grid(True, alpha=0.3)
    # One legend for every panel, below them: inside a panel it covered lines.
    handles, labels = axes[0][-1].get_legend_handles_labels()
    handles.append(Line2D([], [], linestyle=":", color="black"))
    labels.append("ceiling (dotted, same colour)")
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=9, frameon=False)
    fig.suptitle(
        f"{result['environment'].get('gpu', result['environment']['device'])}, HF backend, bf16, batch 1", fontsize=10
    )
    save_figure(fig, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=["llama", "qwen"], choices=sorted(PAIRS))
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 8192, 16384, 32768])
    parser.add_argument("--keep-rates", nargs="+", type=float, default=[0.1, 0.3])
    parser.add_argument("--look-aheads", nargs="+", type=int, default=[8, 1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--no-backend-full", dest="backend_full", action="store_false", help="skip timing the backend's dense path"
    )
    parser.add_argument(
        "--backend-full-max",
        type=int,
        default=1 << 30,
        help="time the backend's dense path only up to this many tokens",
    )
    parser.add_argument("--budget-s", type=float, default=480.0, help="skip remaining lengths after this long")
    parser.add_argument(
        "--profile-lookahead",
        action="store_true",
        help="only profile look-ahead scoring on the drafts (plain decode steps vs scored ones)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="scorer and backend with compile=True (element-wise work fused by torch.compile; CUDA only)",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny configs on CPU (a check of the script)")
    add_output_args(parser, "ttft_gpu_h200")
    args = parser.parse_args()
    if args.tiny:
        args.lengths = [n for n in args.lengths if n <= 1024] or [256, 512]
    device, bench, out, result = start_run("ttft_gpu", args, args.budget_s)
    result.update(repeats=args.repeats, tiny=args.tiny, compile=args.compile, configs={}, rows=[])

    def sink(row: dict[str, Any]) -> None:
        result["rows"].append(row)
        write_json(out, args.name, result)  # partial results survive

    for pair in args.pairs:
        if bench.out_of_time():
            break
        target_name, draft_name = PAIRS[pair]
        tcfg, dcfg = CONFIGS[target_name], CONFIGS[draft_name]
        if args.tiny:
            tcfg, dcfg = tiny(tcfg), tiny(dcfg)
        result["configs"][target_name], result["configs"][draft_name] = tcfg, dcfg
        tokenizer = synthetic_tokenizer(max(tcfg["vocab_size"], dcfg["vocab_size"]))
        if args.profile_lookahead:
            draft_only = build_model(draft_name, dcfg, device, tokenizer)
            result.setdefault("profile", []).extend(profile_lookahead(pair, draft_only, tokenizer, args, bench))
            write_json(out, args.name, result)
            del draft_only
            continue
        target = build_model(target_name, tcfg, device, tokenizer)
        draft = build_model(draft_name, dcfg, device, tokenizer)
        try:
            bench_pair(pair, target, draft, args, bench, sink)
        finally:
            del target, draft
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    sys.stdout.write(write_results(out, args.name, result, markdown, plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
