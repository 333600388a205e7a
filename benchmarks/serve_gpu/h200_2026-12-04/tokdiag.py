"""Where a long text prompt's tokenizing goes on the device: the machine's cores, then the same random-id texts
as `vllm bench serve` sends (SmolLM2 tokenizer) encoded whole, in our parallel pieces, and through
`build_prompt`, in a worker thread and right after a CPU matrix product, and with other rayon pool sizes.
Every timing but the ``warm_`` ones starts from an empty BPE word cache, as a new random text finds it.

    python3 tokdiag.py TOKENIZER OUT.json   (writes OUT.json and OUT.md; --render OUT.json: the markdown again;
                                             the --child form is its own subprocess, one pool size)
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for the load generator's texts
from vllm_serve_gpu import _text_of, random_ids

LENGTHS = (8192, 16384, 32768)


def median_ms(fn: Any, reps: int = 7, clear: Any = None) -> float:
    """The median time of ``fn``; with ``clear``, called before each run outside the clock (a cold BPE cache)."""
    times = []
    for _ in range(reps):
        if clear is not None:
            clear()
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    return round(statistics.median(times), 2)


def texts(tokenizer: str, lengths: tuple[int, ...] = LENGTHS) -> tuple[Any, dict[int, str]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    return tok, {n: _text_of(tok, random_ids(n, seed=950 + 7 * n), n) for n in lengths}


def pieces(backend: Any, text: str, count: int) -> list[str]:
    from specprefill_sdk import _parallel_encode as pe

    spacing = len(text) / count
    starts = [0]
    for k in range(1, count):
        cut = pe._cut_near(text, int(k * spacing), int(k * spacing + spacing / 2))
        if cut is not None:
            starts.append(cut)
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]


def child(tokenizer: str) -> dict[str, Any]:
    from specprefill_sdk import _parallel_encode as pe
    from specprefill_sdk.prompt import _backend, build_prompt

    tok, by_length = texts(tokenizer, (32768,))
    backend = _backend(tok)
    text = by_length[32768]
    return {
        "workers": pe._workers(),
        "pieces": len(pe.piece_starts(backend, text)),
        "build_prompt_32k_ms": median_ms(
            lambda: build_prompt(tok, text), clear=getattr(backend.model, "_clear_cache", None)
        ),
    }


ROWS = (
    ("chars", "characters"),
    ("pieces", "pieces `piece_starts` cuts (two per core then)"),
    ("whole_ms", "`encode` whole"),
    ("warm_whole_ms", "`encode` whole, warm cache"),
    ("ours_ms", "`_parallel_encode.encode` (ids and offsets joined)"),
    ("build_prompt_ms", "`build_prompt`"),
    ("warm_build_prompt_ms", "`build_prompt`, warm cache"),
    ("build_prompt_in_thread_ms", "`build_prompt` in a worker thread"),
    ("build_prompt_after_matmul_ms", "a 1024-square CPU matmul, then `build_prompt`"),
    ("matmul_alone_ms", "the matmul alone"),
    *((f"batch_{k}_ms", f"`encode_batch` of {k} pieces (Rust only)") for k in (2, 4, 8, 16, 32)),
)


def render(result: dict[str, Any]) -> str:
    """The check as markdown: one column per prompt length, one row per timing (ms, medians of 7)."""
    lengths = result["lengths"]
    lines = [
        "# Tokenizing a long random-id text on the lent H200's host",
        "",
        f"`{result.get('command', 'python3 tokdiag.py TOKENIZER OUT.json')}`: {result['cpu']}, "
        f"{result['affinity']} cores in the process's affinity (cgroup limit: {result['cgroup_cpu_max'] or 'none'}), "
        f"tokenizers {result['versions']['tokenizers']}, transformers {result['versions']['transformers']}, the "
        "SmolLM2 tokenizer, texts as `vllm bench serve` sends them (random ids decoded). Medians of 7 runs in ms; "
        "every run but the warm ones starts from an empty BPE word cache, as a new random text finds it.",
        "",
        "| | " + " | ".join(f"{int(n):,} tokens" for n in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
    ]
    for key, label in ROWS:
        lines.append(f"| {label} | " + " | ".join(f"{row.get(key, '-'):,}" for row in lengths.values()) + " |")
    lines += [
        "",
        "`build_prompt` of the 32K text in a process whose rayon pool has N threads (`RAYON_NUM_THREADS`):",
        "",
    ]
    lines += ["| threads | pieces | ms |", "|---:|---:|---:|"]
    for threads, got in result.get("rayon", {}).items():
        if isinstance(got, dict):
            lines.append(f"| {threads} | {got['pieces']} | {got['build_prompt_32k_ms']} |")
    return "\n".join([*lines, ""])


def main() -> None:
    if sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
        return
    if sys.argv[1] == "--render":
        path = Path(sys.argv[2])
        path.with_suffix(".md").write_text(render(json.loads(path.read_text())))
        return
    tokenizer, out = sys.argv[1], Path(sys.argv[2])
    import tokenizers
    import torch
    import transformers

    from specprefill_sdk import _parallel_encode as pe
    from specprefill_sdk.prompt import _backend, build_prompt

    cpu_max = next((Path(p).read_text().strip() for p in ("/sys/fs/cgroup/cpu.max",
                    "/sys/fs/cgroup/cpu/cpu.cfs_quota_us") if Path(p).exists()), None)  # fmt: skip
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())  # fmt: skip
    result: dict[str, Any] = {
        "cpu": model,
        "os_cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "cgroup_cpu_max": cpu_max,
        "env": {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS", "OMP_NUM_THREADS")},
        "torch_threads": torch.get_num_threads(),
        "versions": {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__},
        "workers": pe._workers(),
        "lengths": {},
    }
    tok, by_length = texts(tokenizer)
    backend = _backend(tok)
    result["fast_path"] = backend is not None
    pool = ThreadPoolExecutor(1)
    a = torch.randn(1024, 1024)
    clear = getattr(backend.model, "_clear_cache", None)  # None: warm timings only (an older tokenizers)
    for n, text in by_length.items():
        row: dict[str, Any] = {"chars": len(text), "pieces": len(pe.piece_starts(backend, text))}
        row["whole_ms"] = median_ms(lambda t=text: backend.encode(t, add_special_tokens=False), clear=clear)
        row["warm_whole_ms"] = median_ms(lambda t=text: backend.encode(t, add_special_tokens=False))
        row["whole_with_lists_ms"] = median_ms(
            lambda t=text: (lambda e: (e.ids, e.offsets))(backend.encode(t)), clear=clear
        )
        row["ours_ms"] = median_ms(lambda t=text: pe.encode(backend, t, False), clear=clear)
        row["build_prompt_ms"] = median_ms(lambda t=text: build_prompt(tok, t), clear=clear)
        row["warm_build_prompt_ms"] = median_ms(lambda t=text: build_prompt(tok, t))
        row["build_prompt_in_thread_ms"] = median_ms(
            lambda t=text: pool.submit(build_prompt, tok, t).result(), clear=clear
        )
        row["build_prompt_after_matmul_ms"] = median_ms(lambda t=text: (a @ a, build_prompt(tok, t)), clear=clear)
        row["matmul_alone_ms"] = median_ms(lambda: a @ a)
        for count in (2, 4, 8, 16, 32):
            parts = pieces(backend, text, count)
            row[f"batch_{count}_ms"] = median_ms(
                lambda p=parts: backend.encode_batch(p, add_special_tokens=False), clear=clear
            )
        result["lengths"][n] = row
        print(n, row, flush=True)
    result["rayon"] = {}
    for threads in (4, 8, 16):
        env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
        done = subprocess.run([sys.executable, __file__, "--child", tokenizer], env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        result["rayon"][threads] = (
            json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else done.stderr[-500:]
        )
        print("rayon", threads, result["rayon"][threads], flush=True)
    out.write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(render(result))
    print(json.dumps({k: v for k, v in result.items() if k != "lengths"}))


if __name__ == "__main__":
    main()
