"""Each host step of a ``/v1/completions`` text request on the server's path to its first token (CPU).

`benchmarks/vllm_serve_gpu.py` measured, at 32,768 tokens on one H200, a median TTFT of 624 ms for
``specprefill serve --engine vllm`` against 305 ms of draft scoring and 86 ms of kept prefill. This
script times, in this process and without vLLM or a draft model, every step the server runs around
those two model steps for one such request, the way the server runs it, with the real tokenizers:

- ``parse``: the JSON body (``json.loads``) validated into the server's `CompletionRequest`;
- ``tokenize``: `build_prompt` of the text (the one tokenization of the request: the draft reads the
  prompt's ids when it shares the target's vocabulary) and the vocabulary check of the ids, the
  text encoded in parallel pieces as the SDK does on this host, and once more in one ``encode``
  call (``TOKENIZERS_PARALLELISM=false``, where the SDK does not cut);
- ``queue``: a prompt through an idle `ScoringQueue` (one request running) to a scorer that answers
  at once, as the server's queue is set up, and through the same queue without its count of running
  requests (a shorter prompt would then wait the queue's window for a second one; one above the
  batch budget, as 32K is above the default 16,384, closes its batch at once);
- ``select``: the ``paper`` policy's selector on the draft's scores of every token, as the server runs
  it and with torch set to one thread (the selection's arithmetic is numpy's, so torch's intra-op
  pool, whose wake-ups cost more than the ops on a busy machine, should make no difference), and
  the default ``auto`` policy's selector;
- ``offsets``: a new prompt's first read of its token offsets, which `build_prompt` leaves to be
  computed then (`DeferredOffsets`): ``auto``'s text chunks read them, ``paper``'s path does not;
- ``compress``: the kept ids and positions (`CompressedPrompt.from_selection`);
- ``compress_prompts``: the whole compress step around the scorer (scores given), as the pipeline
  calls it with its telemetry off;
- ``layout``: the vLLM request's prompt (kept ids, layout, its cache salt; `encode_prompt`);
- ``first_chunk``: the first SSE event's JSON and the usage object.

Each is the median wall time of ``--repeats`` calls. Tokenizers: the bundled SmolLM2 and, when its
GGUF packages are installed (``make bench-models``), Qwen2.5-Coder's. ``--busy N`` runs N CPU-bound
processes beside the measurement, a loaded host made on purpose; ``--tree PATH`` imports another
checkout (e.g. the main branch) to measure "before".

Usage::

    python benchmarks/server_path_cpu.py                          # results/server_path_cpu.{json,md}
    python benchmarks/server_path_cpu.py --tokens 8192 --repeats 5
    python benchmarks/server_path_cpu.py --busy 2 --tree ../main --name server_path_cpu_before
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import ROOT, add_output_args, command_line, median_ms, use_tree, write_results

TOKENIZERS = ("smollm2-135m", "qwen2.5-coder-0.5b")
POLICY = "paper"
DEFAULT_POLICY = "auto"


def text_of(tokenizer: Any, tokens: int) -> str:
    """Essay text that the tokenizer reads as exactly ``tokens`` tokens (with its special tokens)."""
    from specprefill_sdk.eval.corpora import haystack

    text = haystack(tokens * 6)
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    special = len(tokenizer("x", add_special_tokens=True)["input_ids"]) - len(
        tokenizer("x", add_special_tokens=False)["input_ids"]
    )
    return text[: enc["offset_mapping"][tokens - 1 - special][1]]


@contextmanager
def parallelism(setting: str) -> Iterator[None]:
    """``TOKENIZERS_PARALLELISM`` set to ``setting`` for the duration."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = setting
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def pieces(tokenizer: Any, text: str) -> int:
    """How many pieces `build_prompt` encodes ``text`` in (1 on a tree from before the pieces)."""
    try:
        from specprefill_sdk._parallel_encode import piece_starts
    except ImportError:
        return 1
    return len(piece_starts(tokenizer.backend_tokenizer, text))


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy(processes: int) -> Iterator[None]:
    """``processes`` CPU-bound processes for the duration: a loaded host, where an op that wakes a
    thread of torch's intra-op pool waits for that thread to get a core."""
    spinners = [multiprocessing.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(processes)]
    for p in spinners:
        p.start()
    try:
        yield
    finally:
        for p in spinners:
            p.terminate()
            p.join()


class _Instant:
    """A scorer that answers at once with given scores: the queue's own cost, not a model's."""

    name = "instant"

    def __init__(self, scores: Any) -> None:
        self.scores = scores

    def score(self, prompt: Any) -> Any:
        return self.scores

    def score_batch(self, prompts: Any) -> list[Any]:
        return [self.scores for _ in prompts]


def offsets_ms(tokenize: Any, repeats: int) -> float:
    """The median ms of a new prompt's first read of its offsets: what `auto`'s text chunks pay on top of
    ``select_default_ms`` (0 where the tree computes them while tokenizing, inside ``tokenize_ms``)."""
    runs = []
    for _ in range(repeats):
        prompt = tokenize()
        t0 = time.perf_counter()
        _ = prompt.offsets
        runs.append((time.perf_counter() - t0) * 1000)
    try:
        from specprefill_sdk.types import DeferredOffsets  # noqa: F401  (a tree that defers them)
    except ImportError:
        return 0.0
    return statistics.median(runs)


def steps(name: str, tokens: int, repeats: int) -> dict[str, Any]:
    """The median ms of each host step for a ``tokens``-token text request with ``name``'s tokenizer."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from specprefill_sdk.backends.vllm.layout import encode_prompt
    from specprefill_sdk.models import resolve_model_path
    from specprefill_sdk.pipeline import compress_prompts
    from specprefill_sdk.policies import load_policy
    from specprefill_sdk.prompt import build_prompt
    from specprefill_sdk.scoring.queue import DEFAULT_MAX_WAIT_MS, ScoringQueue
    from specprefill_sdk.server.schemas import CompletionRequest, SpecPrefillUsage, UsageInfo
    from specprefill_sdk.types import CompressedPrompt, TokenScores

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(name, progress=False)))
    text = text_of(tokenizer, tokens)
    body = json.dumps({"model": name, "prompt": text, "max_tokens": 128, "stream": True, "ignore_eos": True}).encode()
    vocab = len(tokenizer)

    def tokenize() -> Any:
        prompt = build_prompt(tokenizer, text)
        assert min(prompt.token_ids) >= 0 and max(prompt.token_ids) < vocab
        return prompt

    prompt = tokenize()
    scores = TokenScores(torch.from_numpy(np.random.default_rng(0).random(prompt.n, dtype=np.float32)))
    selector = load_policy(POLICY).build_selector()
    default = load_policy(DEFAULT_POLICY).build_selector()
    selection = selector.select(prompt, scores)
    compressed = CompressedPrompt.from_selection(prompt, selection)
    scorer = _Instant(scores)
    row: dict[str, Any] = {"tokenizer": name, "tokens": prompt.n, "chars": len(text), "kept": compressed.kept}
    row["parse_ms"] = median_ms(lambda: CompletionRequest.model_validate(json.loads(body)), repeats, 1)
    row["tokenize_ms"] = median_ms(tokenize, repeats, 1)
    with parallelism("false"):
        row["tokenize_whole_ms"] = median_ms(tokenize, repeats, 1)
    row["pieces"] = pieces(tokenizer, text)
    # The server's queue counts its running requests (here: this one alone).
    with ScoringQueue(active=lambda: 1) as idle:
        row["queue_idle_ms"] = median_ms(lambda: idle.submit(scorer, prompt), repeats, 1)
    with ScoringQueue() as windowed:
        row["queue_window_ms"] = median_ms(lambda: windowed.submit(scorer, prompt), repeats, 1)
    row["queue_window_setting_ms"] = DEFAULT_MAX_WAIT_MS
    row["select_ms"] = median_ms(lambda: selector.select(prompt, scores), repeats, 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same ops without torch's intra-op thread pool
    try:
        row["select_one_thread_ms"] = median_ms(lambda: selector.select(prompt, scores), repeats, 1)
    finally:
        torch.set_num_threads(threads)
    row["select_default_ms"] = median_ms(lambda: default.select(prompt, scores), repeats, 1)
    row["offsets_ms"] = offsets_ms(tokenize, repeats)
    row["compress_ms"] = median_ms(lambda: CompressedPrompt.from_selection(prompt, selection), repeats, 1)
    row["compress_prompts_ms"] = median_ms(lambda: compress_prompts([prompt], scorer, selector), repeats, 1)
    row["layout_ms"] = median_ms(lambda: encode_prompt(compressed), repeats, 1)

    def first_chunk() -> str:
        chunk = {"id": "cmpl-x", "object": "text_completion", "choices": [{"index": 0, "text": " a"}], "usage": None}
        usage = UsageInfo(
            prompt_tokens=prompt.n,
            completion_tokens=1,
            total_tokens=prompt.n + 1,
            specprefill=SpecPrefillUsage(
                kept_tokens=compressed.kept, keep_ratio=compressed.keep_ratio, score_ms=305.0, prefill_ms=86.0
            ),
        )
        return json.dumps(chunk, separators=(",", ":")) + json.dumps(usage.model_dump())

    row["first_chunk_ms"] = median_ms(first_chunk, repeats, 1)
    keys = ("parse_ms", "tokenize_ms", "queue_idle_ms", "select_ms", "compress_ms", "layout_ms", "first_chunk_ms")
    row["sum_ms"] = sum(row[k] for k in keys)
    return row


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = [
        "# Host steps of a text completion on the server's path to its first token (CPU)",
        "",
        f"- machine: {result['machine']}",
        f"- command: `{result['command']}`",
        f"- median wall time of {result['repeats']} calls per step; policy {result['policy']}",
        *([f"- {result['busy']} CPU-bound processes ran beside the measurement (`--busy`)"] if result["busy"] else []),
        "",
        "| step | " + " | ".join(f"{r['tokenizer']} ({r['tokens']:,} tokens) ms" for r in rows) + " |",
        "|---|" + "---:|" * len(rows),
    ]
    names = {
        "parse_ms": "parse the JSON body into CompletionRequest",
        "tokenize_ms": "tokenize (build_prompt + vocabulary check)",
        "tokenize_whole_ms": "tokenize, the text in one encode call (TOKENIZERS_PARALLELISM=false)",
        "queue_idle_ms": "scoring queue, idle (one request running)",
        "queue_window_ms": "scoring queue without the running count (a prompt above the batch budget goes at once)",
        "select_ms": f"select ({result['policy']} selector)",
        "select_one_thread_ms": "select, torch on one thread (no intra-op pool)",
        "select_default_ms": f"select ({result['default_policy']} selector, the default policy)",
        "offsets_ms": "a new prompt's first read of its offsets (auto's text chunks; in tokenize before)",
        "compress_ms": "kept ids and positions (from_selection)",
        "compress_prompts_ms": "compress_prompts around an instant scorer (select + compress + spans off)",
        "layout_ms": "vLLM prompt: kept ids, layout, cache salt (encode_prompt)",
        "first_chunk_ms": "first SSE chunk + usage JSON",
        "sum_ms": "sum of the steps on the path (without the windowed queue and compress_prompts)",
    }
    for key, label in names.items():
        if key not in rows[0]:  # a result from before the step was timed
            continue
        lines.append(f"| {label} | " + " | ".join(f"{r[key]:.2f}" for r in rows) + " |")
    lines += ["", "Kept tokens: " + ", ".join(f"{r['tokenizer']} {r['kept']:,}" for r in rows) + "."]
    pieces = ", ".join(f"{r['tokenizer']} {r.get('pieces', 1)}" for r in rows)
    lines += [f"Pieces the text is encoded in: {pieces}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tokenizers", nargs="+", default=list(TOKENIZERS))
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes to run beside the measurement")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to import")
    add_output_args(parser, "server_path_cpu")
    args = parser.parse_args()
    use_tree(args.tree)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from specprefill_sdk.errors import ModelLoadError

    rows = []
    with busy(args.busy):
        for name in args.tokenizers:
            try:
                rows.append(steps(name, args.tokens, args.repeats))
            except ModelLoadError as exc:  # its packages are not installed (make bench-models)
                print(f"{name}: skipped ({exc})")
                continue
            print({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()})
    result = {
        "benchmark": "server_path_cpu",
        "command": command_line(),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
        "busy": args.busy,
        "repeats": args.repeats,
        "policy": POLICY,
        "default_policy": DEFAULT_POLICY,
        "rows": rows,
    }
    print(write_results(args.out, args.name, result, markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
