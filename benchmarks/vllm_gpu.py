"""vLLM backend on a GPU: equivalence checks and the TTFT / throughput benchmark, in one run.

Stages (each writes its results into ``<out>/vllm_gpu.json`` as soon as it ends):

kernel   the position kernel (Triton) against the torch reference on random mixed batches.
llama    a small random-weight Llama: VLLMBackend at keep 1.0 against vanilla vLLM (plugin off),
         at keep < 1 against TransformersBackend with the same selection and positions; a mixed
         batch, streaming, chunked prefill (256-token steps), CUDA graphs, and prefix caching with
         and without the layout salt.
qwen2    a small random-weight Qwen2 under a KV cache small enough to force preemptions: every
         compressed request against TransformersBackend.
serve    `vllm serve` with the plugin (entry point) in its own processes, driven over HTTP by
         OpenAIBackend(wire="vllm"): kept ids + positions against TransformersBackend, streaming,
         a control without layout and a malformed layout.
speed    Llama-3.1-8B architecture (random weights) in vLLM, a Llama-3.2-1B-architecture draft
         (random weights, transformers) on the same GPU; prompts of 8K/16K/32K tokens, keep 0.1:
         TTFT vanilla vs SpecPrefill with the ceiling of the same run, and requests/s within a TTFT
         deadline for a burst of 32K prompts.

Random weights keep the run self-contained; timing does not depend on them. Run on the GPU machine
with vLLM importable (see docs/vllm.md)::

    python benchmarks/vllm_gpu.py --out results/ --tokenizer path/to/tokenizer --stages kernel,llama,qwen2,speed
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger("vllm_gpu")
START = time.monotonic()
RESULTS: dict[str, Any] = {"stages": {}}


def elapsed() -> float:
    return time.monotonic() - START


def save(out: Path) -> None:
    (out / "vllm_gpu.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def install_entry_point() -> None:
    """Make vLLM load the plugin through its entry point in every process, as an installed wheel would."""
    root = Path("/tmp/specprefill-ep")
    info = root / "specprefill_sdk-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specprefill-sdk\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nspecprefill = specprefill_sdk.backends.vllm.plugin:register\n"
    )
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = f"{root}:{os.environ.get('PYTHONPATH', '')}"


# ------------------------------------------------------------------------------------------ helpers


def compressed(prompt: Any, keep: list[int]) -> Any:
    from specprefill_sdk.types import CompressedPrompt, Selection

    sel = Selection(indices=tuple(keep), n=prompt.n, protected=(False,) * len(keep))
    return CompressedPrompt.from_selection(prompt, sel)


def chunk_keep(n: int, rate: float, rng: np.random.Generator, chunk: int = 32) -> list[int]:
    """First 4 and last 8 tokens, plus random 32-token chunks up to ``rate``."""
    chunks = list(range(0, n, chunk))
    picked = sorted(rng.choice(len(chunks), size=max(1, int(len(chunks) * rate)), replace=False).tolist())
    keep = set(range(4)) | set(range(n - 8, n))
    for c in picked:
        keep.update(range(chunks[c], min(n, chunks[c] + chunk)))
    return sorted(keep)


def first_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def hf_margin(loaded: Any, cp: Any, generated: tuple[int, ...], index: int, other: int) -> dict[str, float]:
    """HF logits at the first divergence: chosen-token minus the other engine's token (a near tie is small)."""
    model = loaded.model
    ids = list(cp.token_ids) + list(generated[:index])
    pos = list(cp.position_ids) + list(range(cp.n, cp.n + index))
    dev = loaded.device
    length = len(ids)
    mask = torch.tril(torch.ones(length, length, dtype=torch.bool, device=dev))[None, None]
    with torch.no_grad():
        logits = (
            model(
                input_ids=torch.tensor([ids], device=dev),
                position_ids=torch.tensor([pos], device=dev),
                attention_mask=mask,
            )
            .logits[0, -1]
            .float()
        )
    chosen = generated[index]
    top2 = torch.topk(logits, 2).values
    return {
        "hf_logit_chosen": float(logits[chosen]),
        "hf_logit_other": float(logits[other]),
        "margin": float(logits[chosen] - logits[other]),
        "top1_top2_gap": float(top2[0] - top2[1]),
    }


def hf_first_logprobs(
    loaded: Any,
    token_ids: tuple[int, ...],
    positions: tuple[int, ...],
    k: int = 5,
) -> dict[int, float]:
    """Top-``k`` log-probabilities of the first generated token under transformers (fp32 softmax)."""
    dev = loaded.device
    length = len(token_ids)
    mask = torch.tril(torch.ones(length, length, dtype=torch.bool, device=dev))[None, None]
    with torch.no_grad():
        logits = (
            loaded.model(
                input_ids=torch.tensor([list(token_ids)], device=dev),
                position_ids=torch.tensor([list(positions)], device=dev),
                attention_mask=mask,
            )
            .logits[0, -1]
            .float()
        )
    values, ids = torch.topk(torch.log_softmax(logits, -1), k)
    return {int(i): float(v) for i, v in zip(ids, values, strict=True)}


def logprob_check(name: str, backend: Any, loaded: Any, cp: Any) -> dict[str, Any]:
    """vLLM's first-token top-5 logprobs against transformers at original and at compact positions."""
    import vllm

    from specprefill_sdk.types import SamplingParams

    vp, base = backend.request(cp, SamplingParams(max_tokens=1))
    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, logprobs=5, extra_args=base.extra_args)
    out = backend.llm.generate([vp], [params], use_tqdm=False)[0]
    got = {int(t): float(lp.logprob) for t, lp in out.outputs[0].logprobs[0].items()}
    original = hf_first_logprobs(loaded, cp.token_ids, cp.position_ids)
    compact = hf_first_logprobs(loaded, cp.token_ids, tuple(range(cp.kept)))

    def gap(reference: dict[int, float]) -> float | None:
        common = [t for t in reference if t in got]
        return max(abs(got[t] - reference[t]) for t in common) if common else None

    row = {
        "case": name,
        "vllm_top5": got,
        "max_abs_diff_vs_original_positions": gap(original),
        "top1_matches_original": max(got, key=got.get) == max(original, key=original.get),
        "max_abs_diff_vs_compact_positions": gap(compact),
        "shared_top5_with_compact": len(set(got) & set(compact)),
    }
    logger.info(
        "%-40s logprob diff original=%s compact=%s",
        name,
        row["max_abs_diff_vs_original_positions"],
        row["max_abs_diff_vs_compact_positions"],
    )
    return row


def compare(
    name: str,
    got: tuple[int, ...],
    want: tuple[int, ...],
    loaded: Any = None,
    cp: Any = None,
) -> dict[str, Any]:
    d = first_divergence(got, want)
    row: dict[str, Any] = {"case": name, "equal": d is None, "tokens": len(want)}
    if d is not None:
        row["first_divergence"] = d
        row["got"] = list(got[: d + 3])
        row["want"] = list(want[: d + 3])
        if loaded is not None and cp is not None and d < len(want) and d < len(got):
            row["near_tie"] = hf_margin(loaded, cp, want, d, got[d])
    logger.info("%-40s %s", name, "equal" if d is None else f"DIFFER at {d}: {row.get('near_tie')}")
    return row


def make_model(kind: str, path: Path, tokenizer_dir: Path, seed: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=49152,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        initializer_range=0.05,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(head_dim=64, **common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=False, **common))
    model = model.to(torch.bfloat16)
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(str(path))
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, path / f.name)
    return path


def random_prompt(n: int, rng: np.random.Generator, high: int = 49152) -> Any:
    from specprefill_sdk.types import Prompt

    return Prompt.from_token_ids(rng.integers(3, high, size=n).tolist())


# ------------------------------------------------------------------------------------------ stages


def stage_kernel(out: Path) -> dict[str, Any]:
    from specprefill_sdk.backends.vllm.layout import PositionLayout
    from specprefill_sdk.backends.vllm.positions import PositionTable, reference_rope_positions
    from specprefill_sdk.backends.vllm.state import _rope_positions_kernel

    rng = np.random.default_rng(0)
    dev = torch.device("cuda")
    checked = 0
    for trial in range(20):
        slots = 64
        table = PositionTable(slots, capacity=256)  # small: exercises growth and compaction
        lengths = {}
        for s in range(slots):
            if rng.random() < 0.3:
                table.set_dense(s)
                lengths[s] = (0, 5000)
            else:
                n = int(rng.integers(50, 5000))
                keep = np.sort(rng.choice(n, size=int(rng.integers(1, n)), replace=False))
                layout = PositionLayout.from_positions(keep, n)
                extra = int(rng.integers(0, 4))
                table.set(s, layout.prefill_positions(layout.kept + extra), layout.delta)
                lengths[s] = (layout.kept + extra, n)
        writes = table.take_writes()
        buf = torch.zeros(writes.capacity, dtype=torch.int32, device=dev)
        buf[torch.from_numpy(writes.indices).to(dev)] = torch.from_numpy(writes.values).to(dev)
        offset = torch.from_numpy(table.offset).to(dev)
        length = torch.from_numpy(table.length).to(dev)
        delta = torch.from_numpy(table.delta).to(dev)
        batch = rng.permutation(slots)[: int(rng.integers(1, slots))]
        computed = torch.zeros(slots, dtype=torch.int32)
        counts = []
        for s in batch:
            prefill_len, _ = lengths[int(s)]
            start = int(rng.integers(0, max(prefill_len, 1) + 3))
            computed[int(s)] = start
            counts.append(int(rng.integers(1, 3000)) if start < prefill_len else 1)
        qsl = torch.tensor([0, *np.cumsum(counts).tolist()], dtype=torch.int32, device=dev)
        idx = torch.from_numpy(batch.astype(np.int64)).to(dev)
        ncomp = computed.to(dev)
        total = int(sum(counts))
        ref = reference_rope_positions(buf, offset, length, delta, idx, qsl, ncomp, total, 9999)
        positions = torch.full((total + 1,), -7, dtype=torch.int64, device=dev)
        _rope_positions_kernel[(len(batch),)](
            positions, buf, offset, length, delta, idx, qsl, ncomp, 9999, BLOCK_SIZE=1024
        )
        assert torch.equal(positions[:total], ref), f"trial {trial}: kernel differs from the reference"
        checked += total
    return {"trials": 20, "tokens_checked": checked, "equal": True}


def stage_llama(out: Path, tokenizer_dir: Path) -> dict[str, Any]:
    import vllm
    from vllm.inputs import TokensPrompt

    from specprefill_sdk.backends.transformers import TransformersBackend
    from specprefill_sdk.backends.vllm import VLLMBackend
    from specprefill_sdk.backends.vllm.layout import PositionLayout
    from specprefill_sdk.models import load_model
    from specprefill_sdk.types import CompressedPrompt, SamplingParams

    path = make_model("llama", Path("/tmp/models/tiny-llama"), tokenizer_dir, seed=1)
    rng = np.random.default_rng(1)
    prompts = [random_prompt(n, rng) for n in (1500, 1100, 1800)]
    cps = [
        compressed(prompts[0], chunk_keep(1500, 0.25, rng)),
        compressed(prompts[1], sorted(set(rng.choice(1100, size=300, replace=False).tolist()) | {0})),
        compressed(prompts[2], chunk_keep(1800, 0.1, rng)),
    ]
    params = SamplingParams(max_tokens=16)
    result: dict[str, Any] = {
        "model": "random Llama, 4 layers, hidden 512, GQA 8/2, bf16",
        "kept": [cp.kept for cp in cps],
        "n": [cp.n for cp in cps],
        "checks": [],
    }
    checks = result["checks"]

    hf_loaded = load_model(str(path), device="cuda", dtype="bfloat16", progress=False)
    hf = TransformersBackend(hf_loaded)
    hf_dense = [hf.generate(CompressedPrompt.dense(p), params).token_ids for p in prompts]
    hf_comp = [hf.generate(cp, params).token_ids for cp in cps]
    hf_compact = [
        hf.generate(
            CompressedPrompt(token_ids=cp.token_ids, position_ids=tuple(range(cp.kept)), n=cp.kept), params
        ).token_ids
        for cp in cps
    ]

    engine_args = dict(
        max_model_len=4096,
        gpu_memory_utilization=0.25,
        max_num_batched_tokens=256,
        enable_prefix_caching=True,
        seed=0,
        compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16]},
    )
    # Vanilla vLLM: the plugin is off in every process of this engine.
    os.environ["SPECPREFILL_VLLM_PLUGIN"] = "0"
    try:
        llm = vllm.LLM(model=str(path), **engine_args)
        sp = vllm.SamplingParams(max_tokens=16, temperature=0.0)
        vanilla = [
            tuple(o.outputs[0].token_ids)
            for o in llm.generate(
                [TokensPrompt(prompt_token_ids=list(p.token_ids)) for p in prompts], sp, use_tqdm=False
            )
        ]
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    finally:
        del os.environ["SPECPREFILL_VLLM_PLUGIN"]

    backend = VLLMBackend(str(path), **engine_args)
    result["worker_status"] = backend.status
    for i, p in enumerate(prompts):
        got = backend.generate(CompressedPrompt.dense(p), params).token_ids
        checks.append(compare(f"keep 1.0 vs vanilla vLLM #{i}", got, vanilla[i]))
        checks.append(compare(f"keep 1.0 vs transformers #{i}", got, hf_dense[i], hf_loaded, CompressedPrompt.dense(p)))
    for i, cp in enumerate(cps):
        c = backend.generate(cp, params)
        checks.append(compare(f"keep {cp.keep_ratio:.2f} vs transformers #{i}", c.token_ids, hf_comp[i], hf_loaded, cp))
        row = compare(f"control: compact positions #{i}", hf_compact[i], hf_comp[i])
        row["control"] = "transformers at positions 0..K-1 must differ from original positions"
        checks.append(row)
    batch = backend.generate_batch([cps[0], CompressedPrompt.dense(prompts[1]), cps[2], cps[1]], params)
    for name, c, want in zip(
        ("batch compressed #0", "batch dense #1", "batch compressed #2", "batch compressed #1"),
        batch,
        (hf_comp[0], vanilla[1], hf_comp[2], hf_comp[1]),
        strict=True,
    ):
        checks.append(compare(name, c.token_ids, want))
    chunks = list(backend.stream(cps[1], params))
    streamed = tuple(t for ch in chunks for t in ch.token_ids)
    checks.append(compare("stream compressed #1", streamed, hf_comp[1]))
    last = chunks[-1].completion
    result["stream"] = {
        "chunks": len(chunks),
        "finish_reason": last.finish_reason if last else None,
        "usage": vars(last.usage) if last else None,
        "timings": last.timings.as_dict() if last else None,
    }

    # Prefix caching: a dense request with the kept ids caches them at compact positions; the
    # compressed request must not reuse those blocks (salt), and must reuse its own on a repeat.
    cp = compressed(prompts[0], chunk_keep(1500, 0.25, np.random.default_rng(11)))  # a layout not sent before
    want_cache = hf.generate(cp, params).token_ids
    llm = backend.llm
    dense_kept = TokensPrompt(prompt_token_ids=list(cp.token_ids))
    llm.generate([dense_kept], vllm.SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    vp, vparams = backend.request(cp, params)
    first = llm.generate([vp], [vparams], use_tqdm=False)[0]
    again = llm.generate([vp], [vparams], use_tqdm=False)[0]
    unsalted = {k: v for k, v in vp.items() if k != "cache_salt"}
    wrong = llm.generate([unsalted], [vparams], use_tqdm=False)[0]
    result["prefix_cache"] = {
        "salt": PositionLayout.from_compressed(cp).cache_salt(),
        "salted_first_cached_tokens": first.num_cached_tokens,
        "salted_repeat_cached_tokens": again.num_cached_tokens,
        "unsalted_cached_tokens": wrong.num_cached_tokens,
    }
    checks.append(compare("salted compressed (cold)", tuple(first.outputs[0].token_ids), want_cache))
    checks.append(compare("salted compressed (cache hit)", tuple(again.outputs[0].token_ids), want_cache))
    row = compare("control: unsalted reuses compact KV", tuple(wrong.outputs[0].token_ids), want_cache)
    row["control"] = "without the salt the dense request's compact-position KV is reused"
    checks.append(row)
    result["logprobs"] = [
        logprob_check(f"llama first-token logprobs #{i}", backend, hf_loaded, cp) for i, cp in enumerate(cps)
    ]
    backend.close()
    del hf, hf_loaded
    gc.collect()
    torch.cuda.empty_cache()
    return result


def _http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read().decode()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        raw = err.read().decode()
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, raw
    except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
        return 0, str(err)


def stage_serve(out: Path, tokenizer_dir: Path, validate: bool = False) -> dict[str, Any]:
    """`vllm serve` (its own processes, plugin loaded through the entry point) driven over HTTP.

    `OpenAIBackend(wire="vllm")` sends kept ids + positions as ``vllm_xargs`` with the layout's
    ``cache_salt``; its greedy tokens are compared with TransformersBackend's at the same positions.
    Controls: the same ids without a layout (compact positions) and a malformed layout. With
    ``validate`` the server also loads `LayoutValidator` (``--logits-processors``), which answers the
    malformed layout with HTTP 400 instead of running it at compact positions.
    """
    import subprocess

    from specprefill_sdk.backends.openai import OpenAIBackend
    from specprefill_sdk.backends.transformers import TransformersBackend
    from specprefill_sdk.backends.vllm.layout import vllm_completion_body
    from specprefill_sdk.models import load_model
    from specprefill_sdk.types import CompressedPrompt, SamplingParams

    path = make_model("llama", Path("/tmp/models/tiny-llama"), tokenizer_dir, seed=1)
    rng = np.random.default_rng(5)
    prompts = [random_prompt(n, rng) for n in (1400, 1900)]
    cps = [compressed(prompts[0], chunk_keep(1400, 0.2, rng)), compressed(prompts[1], chunk_keep(1900, 0.1, rng))]
    params = SamplingParams(max_tokens=16)
    hf_loaded = load_model(str(path), device="cuda", dtype="bfloat16", progress=False)
    hf = TransformersBackend(hf_loaded)
    want = [hf.generate(cp, params).token_ids for cp in cps]
    compact = [
        hf.generate(CompressedPrompt(token_ids=cp.token_ids, position_ids=tuple(range(cp.kept)), n=cp.kept), params)
        for cp in cps
    ]
    del hf, hf_loaded
    gc.collect()
    torch.cuda.empty_cache()

    port = 8011
    base = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(path),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny-llama",
        "--max-model-len", "4096", "--gpu-memory-utilization", "0.25", "--enable-prefix-caching", "--seed", "0",
    ]  # fmt: skip
    if validate:
        cmd += ["--logits-processors", "specprefill_sdk.backends.vllm.validation:LayoutValidator"]
    log_path = out / ("vllm_serve_validated_log.txt" if validate else "vllm_serve_log.txt")
    result: dict[str, Any] = {"command": " ".join(cmd[1:]), "checks": []}
    checks = result["checks"]
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        # The served model keeps its stock architecture name, so the plugin must be opted in to replace it.
        env = {**os.environ, "SPECPREFILL_VLLM_PLUGIN": "1"}
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            while time.monotonic() - t0 < 300:
                if proc.poll() is not None:
                    raise RuntimeError(f"vllm serve exited with {proc.returncode} (see {log_path.name})")
                if _http("GET", base + "/health", timeout=5)[0] == 200:
                    break
                time.sleep(2)
            else:
                raise RuntimeError("vllm serve did not become healthy in 300 s")
            result["startup_s"] = round(time.monotonic() - t0, 1)
            backend = OpenAIBackend(
                base + "/v1", model="tiny-llama", tokenizer=str(path), mode="positions", wire="vllm", max_context=4096
            )
            for i, cp in enumerate(cps):
                got = backend.generate(cp, params)
                checks.append(compare(f"HTTP keep {cp.keep_ratio:.2f} vs transformers #{i}", got.token_ids, want[i]))
                result.setdefault("usage", []).append(vars(got.usage))
                streamed = tuple(t for ch in backend.stream(cp, params) for t in ch.token_ids)
                checks.append(compare(f"HTTP stream #{i} vs transformers", streamed, want[i]))
            body = vllm_completion_body(cps[0], params, "tiny-llama", stream=False)
            result["wire_example_keys"] = sorted(body)
            result["wire_example_vllm_xargs_keys"] = sorted(body.get("vllm_xargs", {}))
            plain = {k: v for k, v in body.items() if k not in ("vllm_xargs", "cache_salt")}
            status, payload = _http("POST", base + "/v1/completions", plain)
            ids = tuple(payload["choices"][0].get("token_ids") or ()) if status == 200 else ()
            row = compare("control: same ids without layout vs transformers at compact positions", ids,
                          compact[0].token_ids)  # fmt: skip
            row["control"] = "without vllm_xargs the server runs the ids at 0..K-1"
            checks.append(row)
            bad = json.loads(json.dumps(body))
            xargs = bad["vllm_xargs"]
            key = next(k for k, v in xargs.items() if isinstance(v, list))
            xargs[key] = [*xargs[key][:-1], -5]
            status, payload = _http("POST", base + "/v1/completions", bad)
            result["malformed_layout"] = {"status": status, "body": payload}
            if validate:
                row = {"case": "malformed layout refused with 400 (LayoutValidator)", "equal": status == 400}
                row["status"] = status
                checks.append(row)
            result["healthy_after_malformed"] = _http("GET", base + "/health", timeout=10)[0] == 200
            if result["healthy_after_malformed"]:
                again = backend.generate(cps[1], params)
                checks.append(compare("HTTP after the malformed request #1", again.token_ids, want[1]))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    result["log_tail"] = log_path.read_text()[-3000:]
    return result


def stage_qwen2(out: Path, tokenizer_dir: Path) -> dict[str, Any]:
    import vllm  # noqa: F401  (the engine below needs it importable)

    from specprefill_sdk.backends.transformers import TransformersBackend
    from specprefill_sdk.backends.vllm import VLLMBackend
    from specprefill_sdk.models import load_model
    from specprefill_sdk.types import CompressedPrompt, SamplingParams

    path = make_model("qwen2", Path("/tmp/models/tiny-qwen2"), tokenizer_dir, seed=2)
    rng = np.random.default_rng(2)
    prompts = [random_prompt(int(n), rng) for n in rng.integers(900, 1300, size=6)]
    cps = [compressed(p, chunk_keep(p.n, 0.3, rng)) for p in prompts]
    # Four prompts of ~20 blocks are admitted into 100 blocks; 200 new tokens (13 blocks) each
    # outgrow the cache, so vLLM preempts and later re-prefills prompt + outputs.
    params = SamplingParams(max_tokens=200)
    hf_loaded = load_model(str(path), device="cuda", dtype="bfloat16", progress=False)
    hf = TransformersBackend(hf_loaded)
    want = [hf.generate(cp, params).token_ids for cp in cps]
    dense_prompt = random_prompt(300, rng)
    want_dense = hf.generate(CompressedPrompt.dense(dense_prompt), params).token_ids
    backend = VLLMBackend(
        str(path),
        max_model_len=1536,
        gpu_memory_utilization=0.25,
        num_gpu_blocks_override=100,
        max_num_seqs=8,
        disable_log_stats=False,
        max_num_batched_tokens=512,
        compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8]},
    )
    result: dict[str, Any] = {
        "model": "random Qwen2, 4 layers, hidden 512, GQA 8/2, bf16",
        "kv_blocks": 100,
        "kept": [cp.kept for cp in cps],
        "checks": [],
        "worker_status": backend.status,
    }
    requests = [backend.request(cp, params) for cp in cps]
    outputs = backend.llm.generate([r[0] for r in requests], [r[1] for r in requests], use_tqdm=False)
    preemptions = [getattr(o.metrics, "num_preemptions", None) for o in outputs]
    result["preemptions_per_request"] = preemptions
    for i, o in enumerate(outputs):
        result["checks"].append(
            compare(
                f"qwen2 compressed #{i} (preemptions={preemptions[i]})",
                tuple(o.outputs[0].token_ids),
                want[i],
                hf_loaded,
                cps[i],
            )
        )
    got = backend.generate(CompressedPrompt.dense(dense_prompt), params).token_ids
    result["checks"].append(
        compare("qwen2 keep 1.0 vs transformers", got, want_dense, hf_loaded, CompressedPrompt.dense(dense_prompt))
    )
    result["logprobs"] = [
        logprob_check(f"qwen2 first-token logprobs #{i}", backend, hf_loaded, cp) for i, cp in enumerate(cps[:3])
    ]
    backend.close()
    del hf, hf_loaded
    gc.collect()
    torch.cuda.empty_cache()
    return result


def llama_config(kind: str) -> dict[str, Any]:
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    base = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=128256,
        hidden_act="silu",
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        bos_token_id=128000,
        eos_token_id=128001,
        rope_theta=500000.0,
        rope_scaling=rope,
        attention_bias=False,
        mlp_bias=False,
        dtype="bfloat16",
        head_dim=64 if kind == "1b" else 128,
        tie_word_embeddings=kind == "1b",
    )
    if kind == "8b":
        base.update(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
        )
    else:
        base.update(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
        )
    return base


def stage_speed(
    out: Path,
    tokenizer_dir: Path,
    lengths: list[int],
    reps: int,
    deadline_s: float,
    burst: int,
    budget_s: float,
    look_aheads: tuple[int, ...] = (8,),
) -> dict[str, Any]:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from specprefill_sdk.backends.vllm import VLLMBackend
    from specprefill_sdk.models import LoadedModel
    from specprefill_sdk.scoring import DraftAttentionScorer
    from specprefill_sdk.selection import Chunked, KeepRate, Protect
    from specprefill_sdk.types import CompressedPrompt, SamplingParams

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    target_dir = Path("/tmp/models/llama-3.1-8b-arch")
    target_dir.mkdir(parents=True, exist_ok=True)
    (target_dir / "config.json").write_text(json.dumps(llama_config("8b")))
    max_len = max(lengths) + 64
    t0 = time.monotonic()
    backend = VLLMBackend(
        str(target_dir),
        tokenizer=tok,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=max_len,
        gpu_memory_utilization=0.80,
        max_num_batched_tokens=16384,
        enable_prefix_caching=True,
        disable_log_stats=False,
    )
    startup_s = time.monotonic() - t0
    torch.manual_seed(0)
    draft_config = LlamaConfig(
        **{k: v for k, v in llama_config("1b").items() if k not in ("architectures", "model_type", "dtype")}
    )
    with torch.device("cuda"):
        draft_model = LlamaForCausalLM._from_config(
            draft_config, attn_implementation="sdpa", dtype=torch.bfloat16
        ).eval()
    loaded = LoadedModel(
        name="llama-3.2-1b-arch (random)",
        model=draft_model,
        tokenizer=tok,
        device=torch.device("cuda"),
        dtype=torch.bfloat16,
        source="random",
    )
    scorers = {la: DraftAttentionScorer(loaded, look_ahead=la, target_tokenizer=tok) for la in look_aheads}
    scorer = scorers[look_aheads[0]]
    selector = Protect(Chunked(KeepRate(0.1), 32))
    one = SamplingParams(max_tokens=1)
    rng = np.random.default_rng(3)
    result: dict[str, Any] = {
        "target": "Llama-3.1-8B architecture, random weights (load_format=dummy), bf16, vLLM 0.33.0 V2 runner, "
        "CUDA graphs + torch.compile, max_num_batched_tokens=16384, gpu_memory_utilization=0.80",
        "draft": f"Llama-3.2-1B architecture, random weights, transformers SDPA bf16, same GPU, {scorer!r}"
        + (f"; also look-ahead {', '.join(map(str, look_aheads[1:]))}" if len(look_aheads) > 1 else ""),
        "selector": selector.name,
        "engine_startup_s": round(startup_s, 1),
        "vanilla_note": "vanilla = requests without layout on the same engine (stock positions path)",
        "ttft": [],
    }

    def vanilla_ms(n: int) -> float:
        return backend.generate(CompressedPrompt.dense(random_prompt(n, rng, 128000)), one).timings.ttft

    def specprefill_ms(n: int, scorer: Any = scorer) -> dict[str, float]:
        prompt = random_prompt(n, rng, 128000)
        t_start = time.perf_counter()
        scores = scorer.score(prompt)
        torch.cuda.synchronize()
        t_scored = time.perf_counter()
        selection = selector.select(prompt, scores)
        cp = CompressedPrompt.from_selection(prompt, selection)
        t_selected = time.perf_counter()
        completion = backend.generate(cp, one)
        t_end = time.perf_counter()
        return {
            "score": (t_scored - t_start) * 1e3,
            "select": (t_selected - t_scored) * 1e3,
            "prefill": completion.timings.ttft,
            "total": (t_end - t_start) * 1e3,
            "kept": cp.kept,
        }

    for index, n in enumerate(lengths):
        if index and elapsed() > budget_s - 40:
            result["ttft"].append({"n": n, "skipped": f"{elapsed():.0f} s elapsed of a {budget_s:.0f} s budget"})
            continue
        vanilla_ms(n)  # warm-up at this length
        for la_scorer in scorers.values():
            specprefill_ms(n, la_scorer)
        vanilla = [vanilla_ms(n) for _ in range(reps)]
        for la, la_scorer in scorers.items():
            sp = [specprefill_ms(n, la_scorer) for _ in range(reps)]
            row = {"look_ahead": la, **ttft_row(n, vanilla, sp)}
            logger.info("TTFT %s", row)
            result["ttft"].append(row)
        RESULTS["stages"]["speed"] = result
        save(out)
        if index == 0:  # the longest prompts first: the throughput burst uses that length
            result["throughput"] = throughput(backend, scorers, selector, n, deadline_s, burst, rng)
            save(out)
    backend.close()
    return result


def ttft_row(n: int, vanilla: list[float], sp: list[dict[str, float]]) -> dict[str, Any]:
    """One TTFT row: medians of the vanilla runs (ms) and of the SpecPrefill runs' parts, and the ceiling."""
    med = {k: statistics.median(s[k] for s in sp) for k in sp[0]}
    v = statistics.median(vanilla)
    ceiling = v / (med["score"] + med["prefill"])
    speedup = v / med["total"]
    return {
        "n": n,
        "kept": int(med["kept"]),
        "vanilla_ttft_ms": round(v, 1),
        "specprefill_ttft_ms": round(med["total"], 1),
        "draft_score_ms": round(med["score"], 1),
        "select_ms": round(med["select"], 2),
        "compressed_prefill_ms": round(med["prefill"], 1),
        "speedup": round(speedup, 2),
        "ceiling": round(ceiling, 2),
        "share_of_ceiling": round(speedup / ceiling, 3),
        "reps": len(vanilla),
        "vanilla_all_ms": [round(x, 1) for x in vanilla],
        "specprefill_all_ms": [round(s["total"], 1) for s in sp],
    }


def steady_rate(first_token_s: list[float]) -> float | None:
    """Requests per second between the first and the last first token of a burst (None below two).

    Unlike the count within a deadline, which moves by a whole request when one first token lands
    just before or after it, this rate does not depend on where the deadline falls.
    """
    times = sorted(first_token_s)
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def throughput(
    backend: Any,
    scorers: dict[int, Any],
    selector: Any,
    n: int,
    deadline_s: float,
    burst: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Requests whose first token comes within ``deadline_s`` of a burst of ``burst`` prompts, per second.

    One vanilla burst, then one SpecPrefill burst per scorer (look-ahead -> scorer): ``specprefill``,
    ``gain`` and ``steady_gain`` are the first scorer's; ``by_look_ahead`` holds every scorer's.
    """
    from specprefill_sdk.types import CompressedPrompt, SamplingParams

    one = SamplingParams(max_tokens=1)
    engine, driver = backend.engine, backend._driver

    def first_token_s(output: Any, t0_mono: float, now_mono: float) -> float:
        metrics = getattr(output, "metrics", None)
        stamp = getattr(metrics, "first_token_ts", 0.0) if metrics is not None else 0.0
        return (stamp or now_mono) - t0_mono

    def collect(rids: list[str], t0_mono: float, stop_at: float) -> dict[str, float]:
        firsts: dict[str, float] = {}
        while len(firsts) < len(rids) and time.monotonic() < stop_at:
            for rid in rids:
                if rid in firsts:
                    continue
                queue_ = driver.queues.get(rid)
                if queue_ is not None and not queue_.empty():
                    output = queue_.get()
                    if output.outputs and output.outputs[0].token_ids:
                        firsts[rid] = first_token_s(output, t0_mono, time.monotonic())
            if len(firsts) < len(rids):
                with driver.lock:
                    for output in engine.step():
                        target = driver.queues.get(output.request_id)
                        if target is not None:
                            target.put(output)
        for rid in rids:
            if rid not in firsts:
                driver.abort(rid)
            else:
                driver.done(rid)
        return firsts

    def drain() -> None:
        # Aborted requests may still hold the engine for a step; a tiny request after them
        # returns only once the engine core has moved past them.
        backend.generate(CompressedPrompt.dense(random_prompt(16, rng, 128000)), one)

    result: dict[str, Any] = {"n": n, "burst": burst, "deadline_s": deadline_s}
    # Vanilla: the whole burst is queued at t0.
    prompts = [random_prompt(n, rng, 128000) for _ in range(burst)]
    t0 = time.monotonic()
    rids = []
    for p in prompts:
        vp, params = backend.request(CompressedPrompt.dense(p), one)
        rids.append(driver.submit(vp, params))
    firsts = collect(rids, t0, t0 + deadline_s + 0.5)
    drain()
    ok = sorted(v for v in firsts.values() if v <= deadline_s)
    result["vanilla"] = {
        "within_deadline": len(ok),
        "requests_per_s": round(len(ok) / deadline_s, 3),
        "first_token_s": [round(v, 2) for v in sorted(firsts.values())],
    }
    logger.info("throughput vanilla %s", result["vanilla"])
    # SpecPrefill: the draft scores the queued prompts one after another and submits each at once;
    # vLLM (its own process) prefills while the draft scores the next.
    v = result["vanilla"]["requests_per_s"]
    rate = steady_rate(result["vanilla"]["first_token_s"])
    result["vanilla"]["steady_requests_per_s"] = None if rate is None else round(rate, 3)
    sv = result["vanilla"]["steady_requests_per_s"]
    result["by_look_ahead"] = {}
    for la, scorer in scorers.items():
        prompts = [random_prompt(n, rng, 128000) for _ in range(burst)]
        t0 = time.monotonic()
        rids = []
        for p in prompts:
            if time.monotonic() - t0 > deadline_s:
                break
            cp = CompressedPrompt.from_selection(p, selector.select(p, scorer.score(p)))
            vp, params = backend.request(cp, one)
            rids.append(driver.submit(vp, params))
        firsts = collect(rids, t0, t0 + deadline_s + 0.5)
        drain()
        ok = sorted(t for t in firsts.values() if t <= deadline_s)
        spec: dict[str, Any] = {
            "look_ahead": la,
            "within_deadline": len(ok),
            "requests_per_s": round(len(ok) / deadline_s, 3),
            "submitted": len(rids),
            "first_token_s": [round(t, 2) for t in sorted(firsts.values())],
        }
        rate = steady_rate(spec["first_token_s"])
        spec["steady_requests_per_s"] = None if rate is None else round(rate, 3)
        spec["gain"] = round(spec["requests_per_s"] / v, 2) if v else None
        ss = spec["steady_requests_per_s"]
        spec["steady_gain"] = round(ss / sv, 2) if sv and ss else None
        logger.info("throughput specprefill look-ahead %d %s", la, spec)
        result["by_look_ahead"][str(la)] = spec
    first = result["by_look_ahead"][str(next(iter(scorers)))]
    result["specprefill"] = first
    result["gain"], result["steady_gain"] = first["gain"], first["steady_gain"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    parser.add_argument("--tokenizer", type=Path, default=Path(".devrun/tokenizer"))
    parser.add_argument("--stages", default="kernel,llama,qwen2,speed")
    parser.add_argument("--lengths", default="32768,16384,8192", help="the first also sets the burst length")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=5.0)
    parser.add_argument("--burst", type=int, default=24)
    parser.add_argument("--budget", type=float, default=500.0, help="seconds this run may take")
    parser.add_argument(
        "--look-aheads", default="8", help="speed stage: the draft scorers' look-aheads, comma-separated (first: main)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stdout)
    args.out.mkdir(parents=True, exist_ok=True)
    install_entry_point()
    import vllm

    RESULTS["environment"] = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "python": sys.version.split()[0],
    }
    stages = args.stages.split(",")
    for stage in stages:
        t_stage = time.monotonic()
        try:
            if stage == "kernel":
                res = stage_kernel(args.out)
            elif stage == "llama":
                res = stage_llama(args.out, args.tokenizer)
            elif stage in ("serve", "serve-validated"):
                res = stage_serve(args.out, args.tokenizer, validate=stage == "serve-validated")
            elif stage == "qwen2":
                res = stage_qwen2(args.out, args.tokenizer)
            elif stage == "speed":
                lengths = [int(x) for x in args.lengths.split(",")]
                look_aheads = tuple(int(x) for x in args.look_aheads.split(","))
                res = stage_speed(
                    args.out, args.tokenizer, lengths, args.reps, args.deadline, args.burst, args.budget, look_aheads
                )
            else:
                raise SystemExit(f"unknown stage {stage}")
        except Exception:
            res = {"error": traceback.format_exc()}
            logger.error("stage %s failed:\n%s", stage, res["error"])
        res["seconds"] = round(time.monotonic() - t_stage, 1)
        RESULTS["stages"][stage] = res
        save(args.out)
        logger.info("stage %s done in %.0f s (total %.0f s)", stage, res["seconds"], elapsed())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
