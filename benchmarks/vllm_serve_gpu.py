"""`specprefill serve --engine vllm` against vanilla `vllm serve` on one GPU, measured by `vllm bench serve`.

Stages (each writes ``<out>/vllm_serve_gpu.json`` as soon as it ends; ``--render`` rewrites the
markdown and the plot from that JSON):

correctness  a small random-weight Llama served twice, by ``specprefill serve --engine vllm`` and by
             vanilla ``vllm serve`` (CUDA graphs and torch.compile in both): greedy tokens through the
             served engine against `TransformersBackend` for the same prompt and selection (the
             server's own selection, and a pre-compressed prompt), streamed and not, again while 16
             other streams run; and ``specprefill.enabled: false`` against vanilla ``vllm serve``.
sweep        one pair (``--pair llama``: Llama-3.1-8B architecture target, Llama-3.2-1B architecture
             draft; ``--pair qwen``: Qwen2.5-32B / Qwen2.5-0.5B), random weights (``--load-format
             dummy`` for the target, a saved random draft), the same engine options for both servers.
             For each prompt length: vanilla's unloaded TTFT (one request at a time) sets the service
             level (p90 TTFT at most twice it); then ``vllm bench serve`` (random token prompts, 128
             output tokens, ``--ignore-eos``, Poisson arrivals) runs a rising request-rate sweep
             against each server until p90 TTFT passes the service level; a probe of our server
             gives draft scoring and kept-prefill times, hence the TTFT ceiling of the same run, and
             a second probe (streamed random-id text, as the load generator sends) the medians of
             every ``usage.specprefill`` stage field: where the unloaded TTFT goes. Each server's
             ``/metrics``, read before and after each unloaded run, gives its own mean TTFT over it;
             ``--probe-policies`` runs our server unloaded under other presets, asked for per request.

Run on the GPU machine with vLLM importable (see docs/vllm.md)::

    python benchmarks/vllm_serve_gpu.py --out results/ --tokenizer path/to/tokenizer --stages correctness,sweep
    python benchmarks/vllm_serve_gpu.py --render results/vllm_serve_gpu.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# not from _common: importing it turns compiling off for this process and the servers it starts
from _stream import stream_completion

logger = logging.getLogger("vllm_serve_gpu")
START = time.monotonic()
RESULTS: dict[str, Any] = {"stages": {}}
NAME = "vllm_serve_gpu"
MODELS = Path("/tmp/models")
#: Engine options both servers get (a fair comparison: same memory, same scheduler limits).
ENGINE = ["--gpu-memory-utilization", "0.80", "--seed", "0"]
#: Our server's policy (`--policy`): the issue's targets are the paper's keep 0.1, not the server's default.
POLICY = "paper"
#: More options of our server's command line (``--ours-arg``), e.g. ``--engine-core=subprocess``.
OURS_ARGS: list[str] = []
#: A sweep's first rate, as a share of the server's unloaded capacity (one over its unloaded TTFT):
#: vanilla's level is already lost near half its capacity; ours starts higher, as its level is vanilla's.
START_SHARE = {"vanilla": 0.3, "ours": 0.5}
#: Prompts per swept rate: about TARGET_S seconds of arrivals, at least MIN_PROMPTS.
MIN_PROMPTS, TARGET_S = 10, 24.0
#: Prompts of the one-at-a-time run that sets each server's unloaded TTFT.
UNLOADED_PROMPTS = 5


def elapsed() -> float:
    return time.monotonic() - START


def save(out: Path) -> None:
    (out / f"{NAME}.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    try:
        (out / f"{NAME}.md").write_text(render(RESULTS))
        plot(RESULTS, out / f"{NAME}.png")
    except Exception:  # the JSON is what matters; the rest can be rendered again
        logger.exception("cannot render")


# ----------------------------------------------------------------------------------------- servers
def http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 120.0) -> tuple[int, Any]:
    import httpx

    try:
        response = httpx.request(method, url, json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        return 0, str(exc)
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


class Server:
    """A server process on 127.0.0.1, its log in ``<out>/<name>_log.txt``."""

    def __init__(self, name: str, cmd: list[str], port: int, out: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.cmd, self.port = name, cmd, port
        self.base = f"http://127.0.0.1:{port}"
        self.log_path = out / f"{NAME}_{name}_log.txt"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (open for the process's life)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )
        self.startup_s: float | None = None

    def wait(self, timeout: float = 420.0) -> float:
        while time.monotonic() - self.started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail(1500)}")
            if http("GET", self.base + "/health", timeout=5)[0] == 200:
                self.startup_s = round(time.monotonic() - self.started, 1)
                logger.info("%s healthy after %.1f s", self.name, self.startup_s)
                return self.startup_s
            time.sleep(2)
        raise RuntimeError(f"{self.name} not healthy after {timeout:.0f} s: {self.tail(1500)}")

    def tail(self, chars: int = 3000) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def vanilla_cmd(model: Path, served: str, port: int, max_len: int, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--host", "127.0.0.1",
        "--port", str(port), "--served-model-name", served, "--max-model-len", str(max_len), *ENGINE, *extra,
    ]  # fmt: skip


def ours_cmd(model: Path, draft: Path, served: str, port: int, max_len: int, extra: list[str]) -> list[str]:
    """Our server's command line; the policy is always given (`POLICY`): the server's own default may differ."""
    return [
        sys.executable, "-m", "specprefill_sdk", "serve", "--engine", "vllm", "--model", str(model),
        "--draft", str(draft), "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", served, "--max-model-len", str(max_len), "--max-queue", "4096",
        "--policy", POLICY, "--log-level", "warning", "--metrics", *ENGINE, *extra, *OURS_ARGS,
    ]  # fmt: skip


def free_gpu(share: float, timeout_s: float = 60.0) -> None:
    """Wait until ``share`` of the GPU's memory is free (a stopped engine's processes exit late)."""
    import torch

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        free, total = torch.cuda.mem_get_info(0)
        if free / total >= share:
            return
        time.sleep(1)
    logger.warning("only %.0f%% of the GPU is free", 100 * free / total)


# ----------------------------------------------------------------------------------------- models
def llama_dir(kind: str, tokenizer: Path, weights: bool) -> Path:
    """A Llama-3.x-architecture folder (config + tokenizer), with saved random weights if ``weights``."""
    import vllm_gpu as base

    path = MODELS / f"llama-{kind}"
    # the tokenizer's vocabulary, so that every generated id decodes to text, as with real weights
    config = {**base.llama_config(kind), "vocab_size": 49152}
    return _model_dir(path, config, tokenizer, weights)


def qwen_dir(kind: str, tokenizer: Path, weights: bool) -> Path:
    """A Qwen2.5-architecture folder (32B target or 0.5B draft)."""
    common = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        # room for a 32K prompt and its answer (vLLM refuses a context beyond this)
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "use_sliding_window": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "dtype": "bfloat16",
        "vocab_size": 49152,  # the tokenizer's, so that every generated id decodes to text
    }
    if kind == "32b":
        common.update(
            hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
            num_key_value_heads=8, tie_word_embeddings=False,
        )  # fmt: skip
    else:
        common.update(
            hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2, tie_word_embeddings=True,
        )  # fmt: skip
    return _model_dir(MODELS / f"qwen-{kind}", common, tokenizer, weights)


def _model_dir(path: Path, config: dict[str, Any], tokenizer: Path, weights: bool) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    for f in tokenizer.iterdir():
        shutil.copy(f, path / f.name)
    if weights:
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(path)), dtype=torch.bfloat16)
        model.save_pretrained(str(path))
        del model
        torch.cuda.empty_cache()
    return path


def random_ids(n: int, seed: int, high: int = 49152) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(3, high, size=n).tolist()


# ----------------------------------------------------------------------------------------- correctness
def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(case: str, got: list[int], want: list[int], **extra: Any) -> dict[str, Any]:
    row = {"case": case, "equal": got == want, "first_divergence": _first_divergence(got, want), **extra}
    logger.info("%s: %s", case, "equal" if row["equal"] else f"differs at {row['first_divergence']}")
    return row


def _complete(base: str, body: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    status, payload = http("POST", base + "/v1/completions", body)
    if status != 200:
        raise RuntimeError(f"{base}: status {status}: {str(payload)[:500]}")
    choice = payload["choices"][0]
    return [int(t) for t in choice.get("token_ids") or []], payload.get("usage") or {}


def _stream(base: str, body: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """``body`` streamed: the generated ids and the usage chunk's usage."""
    import httpx

    ids: list[int] = []
    usage: dict[str, Any] = {}
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=300) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{base}: stream status {response.status_code}: {response.read()[:500]!r}")
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(f"stream error: {event}")
                for choice in event.get("choices") or []:
                    ids.extend(int(t) for t in choice.get("token_ids") or [])
                usage = event.get("usage") or usage
    return ids, usage


def with_selection(row: dict[str, Any], usage: dict[str, Any], compressed: Any) -> dict[str, Any]:
    """``row`` with ``same_selection``: the server kept the reference's positions (``usage.specprefill.
    kept_positions``). Another selection is another prompt, so the row is not equal without it."""
    positions = (usage.get("specprefill") or {}).get("kept_positions")
    row["same_selection"] = positions == list(compressed.position_ids)
    row["equal"] = bool(row["equal"] and row["same_selection"])
    return row


def stage_correctness(out: Path, tokenizer: Path) -> dict[str, Any]:
    import vllm_gpu as base

    from specprefill_sdk.backends.transformers import TransformersBackend
    from specprefill_sdk.policies import load_pipeline
    from specprefill_sdk.types import CompressedPrompt, Prompt, SamplingParams

    path = base.make_model("llama", MODELS / "tiny-llama", tokenizer, seed=1)
    max_len, tokens = 4096, 16
    small = ["--gpu-memory-utilization", "0.12", "--seed", "0"]
    result: dict[str, Any] = {"model": "random-weight Llama (4 layers, 512 wide), bf16", "checks": []}
    checks = result["checks"]
    # The reference first, then one server at a time: vLLM profiles the GPU's free memory at start,
    # and another process allocating meanwhile would upset that.
    target = TransformersBackend(str(path), device="cuda", dtype="bfloat16")
    # dense_when_slower=False: this tiny model is its own draft, so its scoring never pays and the cost model's
    # check would prefill every prompt whole; the server's scoring queue does not apply that check, and the
    # comparison needs the same selection on both sides.
    pipe = load_pipeline(POLICY, model=str(path), draft=str(path), backend=target, device="cuda", dtype="bfloat16",
                         dense_when_slower=False)  # fmt: skip
    net = target.loaded.model
    params = SamplingParams(max_tokens=tokens)
    prompts = [random_ids(n, seed=n) for n in (1500, 2200, 3000)]
    reference = []
    for ids in prompts:
        compressed = pipe.compress(Prompt.from_token_ids(ids))
        reference.append((compressed, list(target.generate(compressed, params).token_ids)))
    ours = Server(
        "correctness_ours", [*ours_cmd(path, path, "tiny", 8401, max_len, [])[: -len(ENGINE)], *small], 8401, out
    )
    vanilla: Server | None = None
    try:
        startup = {"ours": ours.wait()}
        vanilla = Server(
            "correctness_vanilla",
            [*vanilla_cmd(path, "tiny", 8402, max_len, [])[: -len(ENGINE)], *small],
            8402,
            out,
            env={"SPECPREFILL_VLLM_PLUGIN": "0"},
        )
        startup["vanilla"] = vanilla.wait()
        result["startup_s"] = startup
        common = {"model": "tiny", "max_tokens": tokens, "temperature": 0}

        def check(case: str, compressed: Any, got: list[int], want: list[int], **extra: Any) -> dict[str, Any]:
            row = with_margin(compare(case, got, want, **extra), net, compressed, want, got)
            checks.append(row)
            return row

        def check_all(label: str) -> None:
            for i, (ids, (compressed, want)) in enumerate(zip(prompts, reference, strict=True)):
                asked = {"return_token_ids": True, "return_kept_positions": True}
                body = {**common, "prompt": ids, "specprefill": asked}
                got, usage = _complete(ours.base, body)
                kept = (usage.get("specprefill") or {}).get("kept_tokens")
                row = check(f"{label}: server's selection #{i} vs transformers", compressed, got, want, kept=kept,
                            reference_kept=compressed.kept)  # fmt: skip
                with_selection(row, usage, compressed)
                got, usage = _stream(ours.base, body)
                with_selection(check(f"{label}: server's selection #{i}, streamed", compressed, got, want), usage,
                               compressed)  # fmt: skip
                pre = {
                    **common,
                    "specprefill": {
                        "prompt_token_ids": list(compressed.token_ids),
                        "position_ids": list(compressed.position_ids),
                        "prompt_length": compressed.n,
                        "return_token_ids": True,
                    },
                }
                check(f"{label}: pre-compressed #{i} vs transformers", compressed, _complete(ours.base, pre)[0], want)
                check(f"{label}: pre-compressed #{i}, streamed", compressed, _stream(ours.base, pre)[0], want)

        check_all("alone")
        stop = threading.Event()
        background_errors: list[str] = []

        def background(k: int) -> None:
            body = {**common, "prompt": random_ids(2000, seed=100 + k), "max_tokens": 400, "ignore_eos": True}
            while not stop.is_set():
                try:
                    _stream(ours.base, body)
                except Exception as exc:  # recorded, and the check fails below
                    background_errors.append(repr(exc))
                    return

        threads = [threading.Thread(target=background, args=(k,), daemon=True) for k in range(16)]
        for t in threads:
            t.start()
        time.sleep(3)
        _status, health = http("GET", ours.base + "/health")
        result["health_under_load"] = health
        check_all("beside 16 running streams")
        stop.set()
        for t in threads:
            t.join(timeout=120)
        checks.append({"case": "the 16 background streams ended without error", "equal": not background_errors,
                       "errors": background_errors[:3]})  # fmt: skip
        for i, ids in enumerate(prompts):
            ours_ids = _complete(
                ours.base, {**common, "prompt": ids, "specprefill": {"enabled": False, "return_token_ids": True}}
            )[0]
            vanilla_ids = _complete(vanilla.base, {**common, "prompt": ids, "return_token_ids": True})[0]
            # with transformers' lead of vanilla's token over ours: how close the two were in the model itself
            check(f"keep 1.0 (enabled: false) #{i} vs vanilla vllm serve",
                  CompressedPrompt.dense(Prompt.from_token_ids(ids)), ours_ids, vanilla_ids)  # fmt: skip
        result["all_equal"] = all(c["equal"] for c in checks)
    finally:
        ours.stop()
        if vanilla is not None:
            vanilla.stop()
        result["log_tail_ours"] = ours.tail(2000)
        del target, pipe
        import torch

        torch.cuda.empty_cache()
    return result


# ----------------------------------------------------------------------------------------- real weights
REAL_TARGET, REAL_DRAFT = Path("/tmp/qwen15.gguf"), Path("/tmp/qwen05.gguf")
REAL_TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "qa_squad", "qa_hotpot")
#: positions left for the answer when a sample is sized to the context (as the eval harness does)
ANSWER_ROOM = 96
#: where the reference pipeline runs
DEVICE = "cuda"


def _chat(base: str, body: dict[str, Any]) -> tuple[str, list[int], dict[str, Any]]:
    status, payload = http("POST", base + "/v1/chat/completions", body, timeout=300)
    if status != 200:
        raise RuntimeError(f"{base}: status {status}: {str(payload)[:500]}")
    choice = payload["choices"][0]
    return choice["message"]["content"] or "", [int(t) for t in choice.get("token_ids") or []], payload["usage"]


def _margin(net: Any, compressed: Any, generated: list[int], step: int, ours: int) -> float:
    """The reference's logit lead of its own token over the served one at the first differing step."""
    import torch

    ids = [*compressed.token_ids, *generated[:step]]
    positions = [*compressed.position_ids, *range(compressed.n, compressed.n + step)]
    with torch.inference_mode():
        logits = (
            net(input_ids=torch.tensor([ids], device=DEVICE), position_ids=torch.tensor([positions], device=DEVICE))
            .logits[0, -1]
            .float()
        )
    return float(logits[generated[step]] - logits[ours])


def with_margin(row: dict[str, Any], net: Any, compressed: Any, want: list[int], got: list[int]) -> dict[str, Any]:
    """``row`` with ``reference_margin`` (`_margin`) where ``got`` and ``want`` differ at a step both reached."""
    step = _first_divergence(got, want)
    if step is not None and step < min(len(got), len(want)):
        try:
            row["reference_margin"] = round(_margin(net, compressed, want, step, got[step]), 4)
        except Exception as exc:  # the row stands without it
            row["margin_error"] = repr(exc)
    return row


def stage_real(out: Path, lengths: list[int], samples: int, seed: int) -> dict[str, Any]:
    """The real Qwen2.5-Coder pair: the served engine's answers against `TransformersBackend`'s, one policy."""
    from specprefill_sdk.backends.transformers import TransformersBackend
    from specprefill_sdk.eval.metrics import contains_match, exact_match
    from specprefill_sdk.eval.tasks import generate_samples
    from specprefill_sdk.policies import load_pipeline
    from specprefill_sdk.types import SamplingParams

    for gguf in (REAL_TARGET, REAL_DRAFT):
        for _ in range(600):  # the weights may still be arriving
            if (gguf.parent / f"{gguf.name}.ok").exists():
                break
            time.sleep(1)
    for _ in range(600):  # a conversion to bf16 folders started on arrival
        if not Path("/tmp/converting").exists():
            break
        time.sleep(1)
    served, policy = "qwen2.5-coder-1.5b", POLICY
    result: dict[str, Any] = {
        "target": "Qwen2.5-Coder-1.5B-Instruct (real weights, GGUF converted to bf16)",
        "draft": "Qwen2.5-Coder-0.5B-Instruct (real weights, GGUF converted to bf16)",
        "policy": f"{policy} (given to both)", "tasks": list(REAL_TASKS), "lengths": lengths,
        "samples_per_task": samples, "seed": seed, "rows": [],
    }  # fmt: skip
    RESULTS["stages"]["real"] = result
    t0 = time.monotonic()
    # The reference first and alone on the GPU: vLLM profiles the free memory when it starts.
    # dense_when_slower=False, as in the correctness stage: the server's scoring queue does not apply that check
    pipe = load_pipeline(policy, model=str(REAL_TARGET), draft=str(REAL_DRAFT), device=DEVICE, dtype="bfloat16",
                         dense_when_slower=False)  # fmt: skip
    backend = pipe.backend
    assert isinstance(backend, TransformersBackend)
    tokenizer, net = backend.tokenizer, backend.loaded.model
    result["load_s"] = round(time.monotonic() - t0, 1)
    cases = []
    for length in lengths:
        fit = min(length, pipe.backend.max_context - ANSWER_ROOM)
        for task in REAL_TASKS:
            cases += generate_samples(task, tokenizer, length=fit, count=samples, seed=seed)
    reference = []
    for sample in cases:
        messages = [{"role": "user", "content": sample.text}]
        prompt = pipe.prompt(messages)
        compressed = pipe.compress(prompt)
        done = pipe.backend.generate(compressed, SamplingParams(max_tokens=sample.max_new_tokens, temperature=0.0))
        reference.append((messages, prompt.n, compressed, list(done.token_ids), done.text))
    result["reference_s"] = round(time.monotonic() - t0, 1)
    save(out)
    ours = Server(f"real_{served}", [*ours_cmd(REAL_TARGET, REAL_DRAFT, served, 8601, 32768, [])[: -len(ENGINE)],
                  "--gpu-memory-utilization", "0.5", "--seed", "0"], 8601, out)  # fmt: skip
    try:
        result["startup_s"] = ours.wait()
        for sample, (messages, n, compressed, want, want_text) in zip(cases, reference, strict=True):
            body = {"model": served, "messages": messages, "max_tokens": sample.max_new_tokens, "temperature": 0,
                    "specprefill": {"return_token_ids": True}}  # fmt: skip
            text, got, usage = _chat(ours.base, body)
            step = _first_divergence(got, want)
            row = {
                "id": sample.sample_id, "task": sample.task, "prompt_tokens": n,
                "kept_reference": compressed.kept, "kept_served": (usage.get("specprefill") or {}).get("kept_tokens"),
                "equal_tokens": got == want, "first_divergence": step,
                "contains_reference": contains_match(want_text, sample.answers, sample.match),
                "contains_served": contains_match(text, sample.answers, sample.match),
                "exact_reference": exact_match(want_text, sample.answers, sample.match),
                "exact_served": exact_match(text, sample.answers, sample.match),
                "answer_reference": want_text[:200], "answer_served": text[:200],
            }  # fmt: skip
            result["rows"].append(with_margin(row, net, compressed, want, got))
        save(out)
    finally:
        ours.stop()
        result["log_tail"] = ours.tail(2000)
    return result


# ----------------------------------------------------------------------------------------- sweep
_SEEDS = iter(range(1, 1 << 30))


def _next_seed() -> int:
    """A new dataset seed for every run: repeated prompts would be served from vLLM's prefix cache."""
    return next(_SEEDS)


def bench(
    server: Server,
    tokenizer_dir: Path,
    served: str,
    length: int,
    rate: float,
    prompts: int,
    out: Path,
    tag: str,
    slo_ms: float | None = None,
    concurrency: int | None = None,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One `vllm bench serve` run; its saved result with the command line.

    ``extra_body`` goes into every request's body (``--extra-body``), e.g. ``{"specprefill": {"policy": "auto"}}``.
    """
    name = f"bench_{tag}.json"
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
        "--base-url", server.base, "--endpoint", "/v1/completions", "--model", str(tokenizer_dir),
        "--served-model-name", served, "--tokenizer", str(tokenizer_dir), "--dataset-name", "random",
        "--random-input-len", str(length), "--random-output-len", "128", "--random-range-ratio", "0",
        "--num-prompts", str(prompts), "--request-rate", "inf" if math.isinf(rate) else f"{rate:g}",
        "--ignore-eos", "--seed", str(_next_seed()), "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99", "--save-result", "--result-dir", str(out / "bench"),
        "--result-filename", name, "--disable-tqdm",
    ]  # fmt: skip
    if slo_ms is not None:
        cmd += ["--goodput", f"ttft:{slo_ms:.0f}"]
    if concurrency is not None:
        cmd += ["--max-concurrency", str(concurrency)]
    if extra_body:
        cmd += ["--extra-body", json.dumps(extra_body)]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({done.returncode}): {done.stderr[-2000:]}{done.stdout[-1000:]}")
    data = json.loads((out / "bench" / name).read_text())
    keep = (
        "completed", "failed", "request_throughput", "output_throughput", "request_goodput", "duration",
        "mean_ttft_ms", "median_ttft_ms", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
        "p90_tpot_ms", "median_e2el_ms", "total_input_tokens",
    )  # fmt: skip
    row = {k: data.get(k) for k in keep if k in data}
    row.update(rate=rate, prompts=prompts, wall_s=round(time.monotonic() - t0, 1))
    logger.info("%s: rate %s p50 %.0f p90 %.0f ms, %s done, %s failed", tag, rate, row.get("median_ttft_ms") or -1,
                row.get("p90_ttft_ms") or -1, row.get("completed"), row.get("failed"))  # fmt: skip
    return row


#: The /metrics series whose change over a run gives the server's own account of it (sums over the labels).
SERVER_SERIES = (
    "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count", "vllm:prompt_tokens_total",
    "vllm:request_queue_time_seconds_sum", "specprefill:score_time_seconds_sum", "specprefill:score_time_seconds_count",
    "specprefill:kept_tokens_total",
)  # fmt: skip


def series_values(exposition: str) -> dict[str, float]:
    """The `SERVER_SERIES` samples of a Prometheus text exposition, each summed over its labels."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in SERVER_SERIES:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def metrics_snapshot(server: Server) -> dict[str, float]:
    """`series_values` of the server's ``GET /metrics`` now (empty when it serves none)."""
    import httpx

    try:
        response = httpx.get(server.base + "/metrics", timeout=30)
    except httpx.HTTPError:
        return {}
    return series_values(response.text) if response.status_code == 200 else {}


def server_side(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per-request means over a run from two snapshots: the server's TTFT, queue time, prompt tokens, scoring.

    The run's requests include `vllm bench serve`'s own ready check (one request of the same length).
    """

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    done = delta("vllm:time_to_first_token_seconds_count")
    if done <= 0:
        return {}
    result = {
        "requests": done,
        "ttft_ms": 1000 * delta("vllm:time_to_first_token_seconds_sum") / done,
        "queue_ms": 1000 * delta("vllm:request_queue_time_seconds_sum") / done,
        "prompt_tokens": delta("vllm:prompt_tokens_total") / done,
    }
    scored = delta("specprefill:score_time_seconds_count")
    if scored > 0:
        result["score_ms"] = 1000 * delta("specprefill:score_time_seconds_sum") / scored
        result["kept_tokens"] = delta("specprefill:kept_tokens_total") / done
    return result


def bench_unloaded(
    server: Server, tokenizer_dir: Path, served: str, length: int, out: Path, tag: str, **kwargs: Any
) -> dict[str, Any]:
    """`UNLOADED_PROMPTS` prompts one at a time, with the server's own per-request means (`server_side`)."""
    before = metrics_snapshot(server)
    row = bench(server, tokenizer_dir, served, length, math.inf, UNLOADED_PROMPTS, out, tag, concurrency=1, **kwargs)
    row["server_side"] = server_side(before, metrics_snapshot(server))
    return row


#: The ``usage.specprefill`` stage fields the probes collect (ms; absent fields are skipped).
STAGES = (
    "score_ms", "queue_ms", "select_ms", "prefill_ms", "submit_ms", "tokenize_ms", "admit_ms", "ttft_ms",
    "server_ms", "host_ms",
)  # fmt: skip


def _medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each field over ``rows`` (the first row, a warm-up, left out when there are more)."""
    rows = rows[1:] if len(rows) > 1 else rows
    keys = [k for k in rows[0] if all(isinstance(r.get(k), int | float) for r in rows)]
    return {k: statistics.median(float(r[k]) for r in rows) for k in keys}


def _stream_usage(base: str, body: dict[str, Any]) -> dict[str, Any]:
    """A streamed completion as ``vllm bench serve`` sends it: the client's TTFT and the usage stage fields."""
    import httpx

    with httpx.Client(timeout=300) as client:  # built before the clock: its TLS context takes tens of ms
        ttft, usage = stream_completion(client, base + "/v1/completions", body)
    fields = usage.get("specprefill") or {}
    row = {
        "client_ttft_ms": ttft,
        "prompt_tokens": usage.get("prompt_tokens"),
        "kept_tokens": fields.get("kept_tokens"),
    }
    row.update({k: fields[k] for k in STAGES if isinstance(fields.get(k), int | float)})
    return row


def _text_of(tok: Any, ids: list[int], length: int) -> str:
    """Text of random ids that the server reads back as ``length`` tokens, special tokens counted, where the
    re-encoding allows (at most ``length``), as ``vllm bench serve``'s random dataset sends.

    The length matters beyond the token count: the draft's prompt attention pads to a bucket
    (``attention_bucket``), and the ids probe's and the load generator's prompts fill theirs exactly.
    """
    specials = len(tok.encode("probe text")) - len(tok.encode("probe text", add_special_tokens=False))
    room = length - specials
    text = tok.decode(ids[:room])
    for _ in range(4):  # decoding and encoding again may merge or split tokens: cut until it fits
        again = tok.encode(text, add_special_tokens=False)
        if len(again) <= room:
            break
        text = tok.decode(again[:room])
    return text


def probe_components(
    server: Server,
    length: int,
    served: str,
    tokenizer: Path | None = None,
    reps: int = 4,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Draft scoring and kept-prefill times (the server's usage fields), one streamed request at a time.

    The ids probe sends token ids (no tokenizing): its ``score_ms`` and ``prefill_ms`` make the
    ceiling. With ``tokenizer``, a second probe sends prompts of the same length as text, as
    ``vllm bench serve`` does, and keeps the median of every stage field (``text``): where the
    unloaded TTFT goes beyond the two model steps. ``options`` is every request's ``specprefill`` field.
    """
    result: dict[str, Any] = _probe(server, length, served, reps, options=options)
    logger.info("ids probe at %d: %s", length, {k: round(v, 1) for k, v in result.items()})
    if tokenizer is not None:
        try:
            result["text"] = _probe(server, length, served, reps, tokenizer, options)
            logger.info("text probe at %d: %s", length, {k: round(v, 1) for k, v in result["text"].items()})
        except Exception as exc:  # the ceiling's probe above still counts
            logger.exception("the text probe failed")
            result["text_error"] = f"{type(exc).__name__}: {exc}"
    return result


def probe_vanilla(server: Server, length: int, served: str, tokenizer: Path, reps: int = 3) -> dict[str, Any]:
    """Vanilla's client TTFT for streamed prompts given as token ids and as text, one at a time.

    The difference is what vanilla's own server spends on tokenizing the text: the host time that
    both servers pay, which the ceiling (model steps only) leaves out.
    """
    return {
        "ids": _probe(server, length, served, reps),
        "text": _probe(server, length, served, reps, tokenizer),
    }


def _probe(
    server: Server,
    length: int,
    served: str,
    reps: int,
    tokenizer: Path | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, float]:
    """The medians of `_stream_usage` over the `_probe_bodies` of these arguments, sent one at a time."""
    return _medians(
        [_stream_usage(server.base, body) for body in _probe_bodies(length, served, reps, tokenizer, options)]
    )


def _probe_bodies(
    length: int, served: str, reps: int, tokenizer: Path | None = None, options: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """``reps`` streamed completion bodies of ``length``-token random prompts: ids, or text with ``tokenizer``."""
    base: dict[str, Any] = {"model": served, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    if options:
        base["specprefill"] = options
    # a seed per length: a shorter prompt of the same seed is a prefix of the longer one, which vLLM's
    # prefix cache would serve
    if tokenizer is None:
        return [{**base, "prompt": random_ids(length, seed=900 + r + 7 * length)} for r in range(reps)]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    return [
        {**base, "prompt": _text_of(tok, random_ids(length, seed=950 + r + 7 * length), length)} for r in range(reps)
    ]


#: A sweep ends once its highest rate within the service level and its lowest rate over it are this close (ratio).
BRACKET = 1.15
#: The most rates one sweep runs.
MAX_RATES = 9


def next_rate(rows: list[dict[str, Any]], slo_ms: float) -> float | None:
    """The sweep's next Poisson rate after ``rows`` (with ``rate``, ``p90_ttft_ms``, ``within_slo``), or None: done.

    Until a rate misses the service level, rates rise (x1.5 while the last p90 is under 0.6 of the level,
    else x1.25). After that the maximum lies between the highest rate met below the lowest rate missed
    and that rate: the next rate halves the bracket geometrically until its two ends are `BRACKET` apart.
    While no rate below the lowest one missed has met the level, the next is that rate / 1.5; a sweep
    whose first two rates missed, or whose first missed it three-fold, stops there (the server cannot
    sustain its starting rate; the capacity bounds it for the ratio).
    """
    missed = [float(r["rate"]) for r in rows if not r["within_slo"]]
    if not missed:
        last = rows[-1]
        return float(last["rate"]) * (1.5 if (last.get("p90_ttft_ms") or 0) < 0.6 * slo_ms else 1.25)
    low_miss = min(missed)
    met = [float(r["rate"]) for r in rows if r["within_slo"] and float(r["rate"]) < low_miss]
    if met:
        high_met = max(met)
        return math.sqrt(high_met * low_miss) if low_miss / high_met > BRACKET else None
    first = rows[0]
    if len(rows) >= 2 or (first.get("p90_ttft_ms") or 0) > 3 * slo_ms:
        return None
    return low_miss / 1.5


def sweep_rates(
    measure: Callable[[float], dict[str, Any]], start_rate: float, slo_ms: float, budget_s: float
) -> list[dict[str, Any]]:
    """``measure(rate)`` at the rates `next_rate` chooses, until it is done, `MAX_RATES` ran, or the budget ends
    (after the first); each row gets ``within_slo``."""
    rows: list[dict[str, Any]] = []
    rate: float | None = start_rate
    t_end = time.monotonic() + budget_s
    while rate is not None and (not rows or (time.monotonic() < t_end and len(rows) < MAX_RATES)):
        row = measure(rate)
        row["within_slo"] = bool(row.get("p90_ttft_ms") is not None and row["p90_ttft_ms"] <= slo_ms
                                 and not row.get("failed"))  # fmt: skip
        rows.append(row)
        rate = next_rate(rows, slo_ms)
    return rows


def sweep_server(
    server: Server,
    tokenizer: Path,
    served: str,
    length: int,
    out: Path,
    tag: str,
    slo_ms: float,
    start_rate: float,
    budget_s: float,
    target_s: float = TARGET_S,
) -> list[dict[str, Any]]:
    """`sweep_rates` with `vllm bench serve` against ``server``: about ``target_s`` of arrivals a rate."""

    def measure(rate: float) -> dict[str, Any]:
        prompts = int(min(160, max(MIN_PROMPTS, math.ceil(rate * target_s))))
        return with_draft_time(
            server,
            lambda: bench(server, tokenizer, served, length, rate, prompts, out, f"{tag}_{length}_{rate:g}", slo_ms),
        )

    return sweep_rates(measure, start_rate, slo_ms, budget_s)


def with_draft_time(server: Server, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s row, with our server's draft time per prompt scored meanwhile (``/health``'s counters)."""
    before = _scoring(server)
    row = run()
    after = _scoring(server)
    if before and after and after["prompts"] > before["prompts"]:  # vanilla has no scoring queue
        row["draft_ms_per_prompt"] = (after["scoring_ms"] - before["scoring_ms"]) / (
            after["prompts"] - before["prompts"]
        )
        row["draft_batches"] = after["batches"] - before["batches"]
    return row


def _scoring(server: Server) -> dict[str, Any] | None:
    """Our server's scoring-queue counters from ``/health`` (None: vanilla, or no answer)."""
    status, health = http("GET", server.base + "/health", timeout=5)
    return health.get("scoring") if status == 200 and isinstance(health, dict) else None


#: The longest `wait_for` waits for its file (seconds).
PAUSE_S = 240.0


def wait_for(path: Path, timeout_s: float) -> None:
    """Wait until ``path`` exists, at most ``timeout_s``: a tree may be changed between the two servers."""
    t0 = time.monotonic()
    logger.info("waiting for %s (at most %.0f s)", path, timeout_s)
    while not path.exists() and time.monotonic() - t0 < timeout_s:
        time.sleep(1)
    logger.info("%s after %.0f s", "going on" if path.exists() else "no file; going on", time.monotonic() - t0)


def probe_policy(
    server: Server, tokenizer: Path, served: str, length: int, out: Path, policy: str, vanilla_ms: float
) -> dict[str, Any]:
    """Our server under another policy preset, asked for per request: text probes and an unloaded run."""
    options = {"policy": policy}
    text = _probe(server, length, served, 4, tokenizer, options)
    logger.info("%s text probe at %d: %s", policy, length, {k: round(v, 1) for k, v in text.items()})
    unloaded = bench_unloaded(server, tokenizer, served, length, out, f"ours_{policy}_{length}_unloaded",
                              extra_body={"specprefill": options})  # fmt: skip
    return {"text": text, "unloaded": unloaded, "unloaded_speedup": vanilla_ms / float(unloaded["median_ttft_ms"])}


def _budget_share(left: float, lengths: list[int], length: int) -> float:
    """The part of ``left`` seconds for ``length``'s sweep: an equal share among the lengths still to sweep.

    A rate takes about the same wall time at every length (its arrivals last about `TARGET_S`, the load
    generator starts and drains around them), so a short length needs as much time for its rates as a
    long one; what a length leaves unused goes to the ones after it.
    """
    rest = lengths[lengths.index(length) :]
    return left / len(rest)


def max_rate_within(rows: list[dict[str, Any]]) -> float | None:
    """The highest swept rate whose p90 TTFT met the service level (every lower one met it too)."""
    best = None
    for row in sorted(rows, key=lambda r: r["rate"]):
        if not row["within_slo"]:
            break
        best = row["rate"]
    return best


def vanilla_ceiling(row: dict[str, Any]) -> float | None:
    """A rate vanilla cannot sustain within the service level: its lowest failed rate, or else its capacity.

    Its capacity (one over its unloaded TTFT) bounds it even when every swept rate passed: a long prefill
    is compute-bound, so vanilla cannot start prompts faster than it finishes them one at a time.
    """
    unloaded = (row.get("vanilla_unloaded") or {}).get("median_ttft_ms")
    failed = _first_failed(row.get("vanilla") or [])
    bounds = [b for b in (failed, 1000.0 / float(unloaded) if unloaded else None) if b is not None]
    return min(bounds) if bounds else None


def ratio_at_least(row: dict[str, Any]) -> float | None:
    """Our highest rate within the service level over `vanilla_ceiling`: the ratio whatever lies between the rates."""
    ours, ceiling = max_rate_within(row.get("ours") or []), vanilla_ceiling(row)
    return ours / ceiling if ours and ceiling else None


def _first_failed(rows: list[dict[str, Any]]) -> float | None:
    """The lowest swept rate that missed the service level (None: every one met it)."""
    failed = [float(r["rate"]) for r in rows if not r.get("within_slo")]
    return min(failed) if failed else None


def bracketed_ratio(row: dict[str, Any]) -> float | None:
    """Our highest rate met over vanilla's, only where each server also missed a rate (above it: both maxima found)."""
    vanilla, ours = (max_rate_within(row.get(k) or []) for k in ("vanilla", "ours"))
    missed = all(_first_failed(row.get(k) or []) is not None for k in ("vanilla", "ours"))
    return ours / vanilla if missed and vanilla and ours else None


def rate_summary(row: dict[str, Any]) -> dict[str, float | None]:
    """A length's rates as the results store and the report prints them: each server's highest met and first missed."""
    return {
        "max_rate_vanilla": max_rate_within(row.get("vanilla") or []),
        "vanilla_ceiling": vanilla_ceiling(row),
        "max_rate_ours": max_rate_within(row.get("ours") or []),
        "ours_failed_at": _first_failed(row.get("ours") or []),
        "rate_ratio": bracketed_ratio(row),
        "rate_ratio_at_least": ratio_at_least(row),
    }


def stage_sweep(
    out: Path,
    tokenizer: Path,
    pair: str,
    lengths: list[int],
    budget_s: float,
    vanilla_budget_s: float | None = None,
    vanilla_probe_reps: int = 3,
    sweep_lengths: list[int] | None = None,
    probe_policies: tuple[str, ...] = (),
    pause_file: Path | None = None,
) -> dict[str, Any]:
    """Both servers, one after the other: unloaded probes, then rising Poisson rates per length.

    ``budget_s`` is the sweeps' time for the pair, half for each server unless ``vanilla_budget_s``
    sets vanilla's part (ours gets the rest); a sweep always runs its first rate. Only the lengths in
    ``sweep_lengths`` (default: every one) are swept; the others get the unloaded runs and probes only.
    Each of ``probe_policies`` gets our server's unloaded run and text probes too, asked for per request
    (`probe_policy`). With ``pause_file``, our server starts only once that file exists (`wait_for`).
    """
    swept = list(lengths) if sweep_lengths is None else [n for n in lengths if n in sweep_lengths]
    if pair == "llama":
        target, draft = llama_dir("8b", tokenizer, weights=False), llama_dir("1b", tokenizer, weights=True)
        names = ("Llama-3.1-8B architecture", "Llama-3.2-1B architecture")
    else:
        target, draft = qwen_dir("32b", tokenizer, weights=False), qwen_dir("0.5b", tokenizer, weights=True)
        names = ("Qwen2.5-32B architecture", "Qwen2.5-0.5B architecture")
    served = target.name
    max_len = max(lengths) + 256
    extra = ["--load-format", "dummy"]
    result: dict[str, Any] = {
        "pair": pair,
        "target": f"{names[0]}, random weights (--load-format dummy), bf16",
        "draft": f"{names[1]}, random weights, transformers bf16, same GPU, in the server's process",
        "policy": _policy_label(),
        "server_policy": POLICY,
        "engine_options": [*ENGINE, "--max-model-len", str(max_len), *extra],
        "ours_options": list(OURS_ARGS),
        "load_generator": "vllm bench serve (vLLM 0.33.0): random dataset, output 128, --ignore-eos, "
        "--random-range-ratio 0, Poisson arrivals, a new dataset seed per run (no prompt is sent twice)",
        "sweep_rule": f"rates from {START_SHARE['vanilla']:g} (vanilla) and {START_SHARE['ours']:g} (ours) x the "
        "server's unloaded capacity, x1.5 while p90 TTFT < 0.6 x SLO, else x1.25, until a rate misses the SLO; then "
        "halving (geometrically) the bracket between the highest rate met and the lowest missed until its ends are "
        f"{BRACKET:g}x apart, or {MAX_RATES} rates ran, or the sweep's time ended; about {TARGET_S:g} s of arrivals "
        f"per rate, at least {MIN_PROMPTS} prompts; {UNLOADED_PROMPTS} prompts one at a time for the unloaded TTFT",
        "lengths": {},
        "swept_lengths": swept,
    }
    RESULTS["stages"][f"sweep_{pair}"] = result
    shares = {"vanilla": budget_s / 2 if vanilla_budget_s is None else vanilla_budget_s}
    shares["ours"] = budget_s - shares["vanilla"]
    result["budget_s"] = shares
    vanilla = Server(f"{pair}_vanilla", vanilla_cmd(target, served, 8501, max_len, extra), 8501, out,
                     env={"SPECPREFILL_VLLM_PLUGIN": "0"})  # fmt: skip
    try:
        result["startup_s_vanilla"] = vanilla.wait()
        # keep 1.0 on the big target too: vLLM's dummy weights come from a fixed seed, the same in both servers
        probe = {"model": served, "max_tokens": 16, "temperature": 0, "return_token_ids": True}
        vanilla_ids = [_complete(vanilla.base, {**probe, "prompt": random_ids(2048, seed=s)})[0] for s in (1, 2)]
        t_stage = time.monotonic()
        for length in lengths:
            row = result["lengths"].setdefault(str(length), {})
            unloaded = bench_unloaded(vanilla, tokenizer, served, length, out, f"vanilla_{length}_unloaded")
            row["vanilla_unloaded"] = unloaded
            slo = 2 * float(unloaded["median_ttft_ms"])
            row["slo_p90_ttft_ms"] = slo
            try:
                if vanilla_probe_reps:
                    row["vanilla_probe"] = probe_vanilla(vanilla, length, served, tokenizer, vanilla_probe_reps)
            except Exception as exc:  # a diagnostic: the sweep still runs
                logger.exception("the vanilla probe failed")
                row["vanilla_probe"] = {"error": f"{type(exc).__name__}: {exc}"}
            capacity = 1000.0 / float(unloaded["median_ttft_ms"])
            left = shares["vanilla"] - (time.monotonic() - t_stage)
            # a budget of 0 sweeps no rate (the unloaded TTFTs and the probes still run)
            row["vanilla"] = (
                sweep_server(vanilla, tokenizer, served, length, out, "vanilla", slo,
                             START_SHARE["vanilla"] * capacity, _budget_share(left, swept, length))
                if shares["vanilla"] > 0 and length in swept
                else []
            )  # fmt: skip
            save(out)
    finally:
        vanilla.stop()
    free_gpu(0.9)
    if pause_file is not None:
        wait_for(pause_file, PAUSE_S)
    ours = Server(f"{pair}_ours", ours_cmd(target, draft, served, 8502, max_len, extra), 8502, out)
    try:
        result["startup_s_ours"] = ours.wait()
        off = {**probe, "specprefill": {"enabled": False, "return_token_ids": True}}
        off.pop("return_token_ids")
        result["keep_all_vs_vanilla"] = [
            compare(
                f"{names[0]}: enabled false #{i} vs vanilla vllm serve",
                _complete(ours.base, {**off, "prompt": random_ids(2048, seed=s)})[0],
                want,
            )
            for i, (s, want) in enumerate(zip((1, 2), vanilla_ids, strict=True))
        ]
        t_stage = time.monotonic()
        for length in lengths:
            row = result["lengths"][str(length)]
            row["components"] = probe_components(ours, length, served, tokenizer)
            save(out)  # the probes alone already give the ceiling and where the unloaded TTFT goes
            unloaded = bench_unloaded(ours, tokenizer, served, length, out, f"ours_{length}_unloaded")
            row["ours_unloaded"] = unloaded
            comp = row["components"]
            vanilla_ms = float(row["vanilla_unloaded"]["median_ttft_ms"])
            row["ceiling"] = vanilla_ms / (comp["score_ms"] + comp["prefill_ms"])
            row["unloaded_speedup"] = vanilla_ms / float(unloaded["median_ttft_ms"])
            row["share_of_ceiling"] = row["unloaded_speedup"] / row["ceiling"]
            for name in probe_policies:
                got = probe_policy(ours, tokenizer, served, length, out, name, vanilla_ms)
                row.setdefault("policies", {})[name] = got
                save(out)
            capacity = 1000.0 / float(unloaded["median_ttft_ms"])
            left = shares["ours"] - (time.monotonic() - t_stage)
            row["ours"] = (
                sweep_server(ours, tokenizer, served, length, out, "ours", row["slo_p90_ttft_ms"],
                             START_SHARE["ours"] * capacity, _budget_share(left, swept, length))
                if shares["ours"] > 0 and length in swept
                else []
            )  # fmt: skip
            _status, health = http("GET", ours.base + "/health")
            row["ours_health_after"] = health
            row.update(rate_summary(row))
            save(out)
    finally:
        ours.stop()
    return result


# ----------------------------------------------------------------------------------------- report
def _policy_label() -> str:
    """The policy as the results name it: the preset and, for `paper`, its settings."""
    suffix = " (keep 0.1, chunks of 32, look-ahead 8)" if POLICY == "paper" else ""
    return f"{POLICY}{suffix}, given as --policy"


def _f(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else str(value)


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _summary_row(length: str, row: dict[str, Any]) -> str:
    comp = row.get("components") or {}
    share = row.get("share_of_ceiling")
    kept = comp["kept_tokens"] / comp["prompt_tokens"] if comp.get("prompt_tokens") and "kept_tokens" in comp else None
    rates = rate_summary(row)  # from the swept rows, so a results file from before these fields renders too
    cells = [
        f"{int(length):,}",
        f"{_f((row.get('vanilla_unloaded') or {}).get('median_ttft_ms'))} ms",
        f"{_f(row.get('slo_p90_ttft_ms'))} ms",
        f"{_f((row.get('ours_unloaded') or {}).get('median_ttft_ms'))} ms",
        "-" if kept is None else f"{100 * kept:.1f}%",
        f"{_f(comp.get('score_ms'))} + {_f(comp.get('prefill_ms'))} ms",
        f"{_f(row.get('ceiling'), 2)}x",
        f"{_f(row.get('unloaded_speedup'), 2)}x ({_f(100 * share if share else None, 1)}%)",
        f"{_f(rates['max_rate_vanilla'], 2)} / {_f(rates['vanilla_ceiling'], 2)}",
        f"{_f(rates['max_rate_ours'], 2)} / {_f(rates['ours_failed_at'], 2)}",
        _times(rates["rate_ratio"]),
        _times(rates["rate_ratio_at_least"]),
    ]
    return "| " + " | ".join(cells) + " |"


def _stage_table(lengths: dict[str, Any]) -> list[str]:
    """Where one streamed text request's TTFT goes (medians of the ``usage.specprefill`` stage fields)."""
    texts = {length: (row.get("components") or {}).get("text") for length, row in lengths.items()}
    texts = {length: t for length, t in texts.items() if t}
    if not texts:
        return []
    keys = [k for k in ("client_ttft_ms", "server_ms", *STAGES) if any(k in t for t in texts.values())]
    caption = (
        "Where the unloaded TTFT goes: one streamed text request at a time (random-id text, as `vllm bench serve` "
        "sends it), medians of the `usage.specprefill` fields in ms (`client_ttft_ms` is the probe's own):"
    )
    return _by_length(caption, "field", texts, list(dict.fromkeys(keys)))


def _by_length(caption: str, first: str, cells: dict[str, dict[str, Any]], keys: list[str] | None = None) -> list[str]:
    """A markdown table under ``caption``: a row per key (default: the first cell's), a column per prompt
    length (``cells[length][key]``); no lines without cells."""
    if not cells:
        return []
    keys = list(next(iter(cells.values()))) if keys is None else keys
    lines = [
        caption,
        "",
        f"| {first} | " + " | ".join(f"{int(length):,}" for length in cells) + " |",
        "|---|" + "---:|" * len(cells),
    ]
    for key in keys:
        lines.append(f"| {key} | " + " | ".join(_f(c.get(key), 1) for c in cells.values()) + " |")
    return [*lines, ""]


def _host_table(lengths: dict[str, Any]) -> list[str]:
    """Each server's client TTFT for a streamed prompt sent as token ids and as text (one request at a time)."""
    cells: dict[str, dict[str, Any]] = {}
    for length, row in lengths.items():
        vanilla, comp = row.get("vanilla_probe") or {}, row.get("components") or {}
        got = {
            "vllm serve, ids": (vanilla.get("ids") or {}).get("client_ttft_ms"),
            "vllm serve, text": (vanilla.get("text") or {}).get("client_ttft_ms"),
            "ours, ids": comp.get("client_ttft_ms"),
            "ours, text": (comp.get("text") or {}).get("client_ttft_ms"),
        }
        if any(v is not None for v in got.values()):
            cells[length] = got
    caption = (
        "Client TTFT of one streamed request at a time, the prompt sent as token ids or as text (ms; the "
        "difference is the server's tokenizing of the text, which both servers pay):"
    )
    return _by_length(caption, "request", cells)


def _server_side_table(lengths: dict[str, Any]) -> list[str]:
    """Each server's unloaded run as the load generator saw it and as the server's /metrics counted it."""
    cells: dict[str, dict[str, Any]] = {}
    for length, row in lengths.items():
        got: dict[str, Any] = {}
        for server in ("vanilla", "ours"):
            run = row.get(f"{server}_unloaded") or {}
            side = run.get("server_side") or {}
            got[f"{server}: load generator TTFT, median"] = run.get("median_ttft_ms")
            got[f"{server}: load generator TTFT, mean"] = run.get("mean_ttft_ms")
            got[f"{server}: server TTFT, mean"] = side.get("ttft_ms")
            got[f"{server}: prompt tokens, mean"] = side.get("prompt_tokens")
        got["ours: draft scoring, mean"] = ((row.get("ours_unloaded") or {}).get("server_side") or {}).get("score_ms")
        if any(isinstance(v, int | float) for k, v in got.items() if "server" in k):
            cells[length] = got
    caption = (
        "The unloaded runs (one request at a time) as `vllm bench serve` timed them and as each server's "
        "`/metrics` counted them (means over the run's requests, its ready check included; ms):"
    )
    return _by_length(caption, "field", cells)


def _policies_table(lengths: dict[str, Any]) -> list[str]:
    """Our server under other presets, asked for per request: unloaded TTFT, kept share, host steps."""
    rows = [(length, name, got) for length, row in lengths.items() for name, got in (row.get("policies") or {}).items()]
    if not rows:
        return []
    lines = [
        "Our server with other policies, asked for per request (`specprefill.policy`): an unloaded run of "
        "`vllm bench serve` (median TTFT) and the medians of text probes' `usage.specprefill` fields (ms):",
        "",
        "| input | policy | unloaded TTFT | speedup over vanilla | kept | scoring + kept prefill | tokenize | "
        "selection | server |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for length, name, got in rows:
        text = got.get("text") or {}
        n, k = text.get("prompt_tokens"), text.get("kept_tokens")
        kept = k / n if n and k is not None else None
        lines.append(
            f"| {int(length):,} | `{name}` | {_f((got.get('unloaded') or {}).get('median_ttft_ms'))} ms | "
            f"{_times(got.get('unloaded_speedup'))} | {'-' if kept is None else f'{100 * kept:.1f}%'} | "
            f"{_f(text.get('score_ms'))} + {_f(text.get('prefill_ms'))} ms | {_f(text.get('tokenize_ms'), 1)} | "
            f"{_f(text.get('select_ms'), 1)} | {_f(text.get('server_ms'), 1)} |"
        )
    return [*lines, ""]


def _rate_row(length: str, server: str, r: dict[str, Any]) -> str:
    cells = [
        f"{int(length):,}",
        server,
        f"{r['rate']:.3g}",
        str(r["prompts"]),
        _f(r.get("median_ttft_ms")),
        _f(r.get("p90_ttft_ms")),
        "yes" if r.get("within_slo") else "no",
        _f(r.get("request_goodput"), 2),
        _f(r.get("request_throughput"), 2),
        _f(r.get("failed")),
        _f(r.get("draft_ms_per_prompt")),
    ]
    return "| " + " | ".join(cells) + " |"


def _render_real(real: dict[str, Any] | None) -> list[str]:
    if not real:
        return []
    lines = ["## Real weights: the served engine against `TransformersBackend`", ""]
    if "error" in real:
        lines += [f"Failed: `{real['error'][:300]}`", ""]
    rows = real.get("rows") or []
    lines += [
        f"Target {real.get('target')}; draft {real.get('draft')}; policy {real.get('policy')}; greedy; "
        f"{real.get('samples_per_task')} samples per task and length, seed {real.get('seed')}, lengths "
        f"{', '.join(f'{n:,}' for n in real.get('lengths', []))} (sized to the context less {ANSWER_ROOM} tokens "
        "of answer room). The same chat messages go to `specprefill serve --engine vllm` and, in the benchmark's "
        "process, to the same policy's pipeline over `TransformersBackend`.",
        "",
        "| task | samples | contains: transformers | contains: served | exact: transformers | exact: served "
        "| same tokens | same kept count |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lengths = sorted({r["id"].split("/")[1] for r in rows}, key=int)
    groups = [(t, [r for r in rows if r["task"] == t]) for t in real.get("tasks", [])]
    groups += [(f"all at {int(n):,} tokens", [r for r in rows if r["id"].split("/")[1] == n]) for n in lengths]
    groups += [("all", rows)]
    for task, group in groups:
        if not group:
            continue

        def count(key: str, rows: list[dict[str, Any]] = group) -> str:
            return f"{sum(bool(r[key]) for r in rows)}/{len(rows)}"

        same_kept = sum(r["kept_served"] == r["kept_reference"] for r in group)
        lines.append(
            f"| {task} | {len(group)} | {count('contains_reference')} | {count('contains_served')} | "
            f"{count('exact_reference')} | {count('exact_served')} | {count('equal_tokens')} | "
            f"{same_kept}/{len(group)} |"
        )
    differ = [r for r in rows if not r["equal_tokens"]]
    if differ:
        lines += ["", "Where the greedy tokens differ (the reference's logit lead of its own token at that step):", ""]
        lines += ["| sample | prompt tokens | kept (ref / served) | first differing token | logit lead |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in differ:
            lines.append(
                f"| {r['id']} | {r['prompt_tokens']:,} | {r['kept_reference']} / {r['kept_served']} | "
                f"{_f(r.get('first_divergence'))} | {_f(r.get('reference_margin'), 3)} |"
            )
    lines.append("")
    return lines


def gpu_name() -> str:
    """The first GPU's name as nvidia-smi gives it ("unknown" without one)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.splitlines()[0].strip() if out.strip() else "unknown"


def render(results: dict[str, Any]) -> str:
    # the runs before the GPU was recorded all ran on an H200
    gpu = results.get("gpu", "NVIDIA H200")
    lines = [f"# `specprefill serve --engine vllm` against vanilla `vllm serve` (one {gpu})", ""]
    if results.get("command"):
        lines += [f"Command: `{results['command']}`", ""]
    for note in results.get("notes", []):
        lines += [f"> {note}", ""]
    corr = results["stages"].get("correctness")
    if corr:
        lines += ["## Correctness", ""]
        if "error" in corr:
            lines += [f"Failed: `{corr['error'][:300]}`", ""]
        lines += [f"Model: {corr.get('model')}; greedy, 16 tokens. Logit lead: the reference's (transformers')"
                  " logit of its own token over the served one at the first differing step.", ""]  # fmt: skip
        lines += ["| case | equal | first divergence | logit lead | kept (served / reference) | same selection |",
                  "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for c in corr.get("checks", []):
            kept = f"{c['kept']} / {c['reference_kept']}" if "reference_kept" in c else "-"
            same = "-" if "same_selection" not in c else "yes" if c["same_selection"] else "no"
            lines.append(f"| {c['case']} | {'yes' if c['equal'] else 'no'} | {_f(c.get('first_divergence'))} | "
                         f"{_f(c.get('reference_margin'), 3)} | {kept} | {same} |")  # fmt: skip
        lines.append("")
    lines += _render_real(results["stages"].get("real"))
    for key, sweep in results["stages"].items():
        if not key.startswith("sweep_"):
            continue
        policy = f", policy `{sweep['server_policy']}`" if sweep.get("server_policy") else ""
        lines += [f"## Throughput: {sweep.get('target')} with a {sweep.get('draft')}{policy}", ""]
        if "error" in sweep:
            lines += [f"Failed: `{sweep['error'][:300]}`", ""]
        lines += [
            f"Policy {sweep.get('policy')}; engine options for both servers: "
            f"`{' '.join(sweep.get('engine_options', []))}`"
            + (f"; ours also `{' '.join(sweep['ours_options'])}`" if sweep.get("ours_options") else "")
            + f"; load: {sweep.get('load_generator')}"
            + (f"; {sweep['sweep_rule']}" if sweep.get("sweep_rule") else "")
            + ". Start-up: vanilla "
            f"{_f(sweep.get('startup_s_vanilla'), 1)} s, ours {_f(sweep.get('startup_s_ours'), 1)} s.",
            "",
            "| input | vanilla unloaded TTFT | SLO (p90) | ours unloaded TTFT | kept | scoring + kept prefill | "
            "ceiling | unloaded speedup (share of ceiling) | vanilla: max met / fails at | ours: max met / failed at "
            "| ratio | ratio at least |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        detail = [
            "| input | server | rate (req/s) | prompts | TTFT p50 | TTFT p90 | within SLO | goodput (req/s) | "
            "throughput (req/s) | failed | draft ms per prompt |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for length, row in sweep.get("lengths", {}).items():
            lines.append(_summary_row(length, row))
            detail += [_rate_row(length, server, r) for server in ("vanilla", "ours") for r in row.get(server) or []]
        by_length = sweep.get("lengths", {})
        lines += ["", *_stage_table(by_length), *_host_table(by_length), *_server_side_table(by_length)]
        lines += _policies_table(by_length)
        lines += ["", "Every rate of the sweeps (TTFT in ms):", "", *detail, ""]
        for check in sweep.get("keep_all_vs_vanilla") or []:
            verdict = "equal" if check["equal"] else f"differ from token {check['first_divergence']}"
            lines.append(f"- {check['case']} (2,048-token prompt, 16 greedy tokens): {verdict}")
        lines.append("")
        lines += [
            "The service level is p90 TTFT at most twice vanilla's unloaded TTFT at that length; the maximum rate is "
            "the highest swept rate within it (with every lower rate within it too); goodput counts requests whose "
            "TTFT met it. The ceiling is vanilla's unloaded TTFT over our server's draft scoring plus kept prefill "
            "(medians of the `usage.specprefill` fields of single requests); kept is the share of the prompt they "
            "kept. Vanilla fails at its lowest rate that missed the level, or at its capacity (one over its "
            "unloaded TTFT) where none did: its maximum lies below that, so the ratio is at least ours over it. "
            "The ratio of the two maxima is given only where each server also missed a rate above its maximum.",
            "",
        ]
    return "\n".join(lines)


def _length_rows(results: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every (stage, length, row) of the sweep stages, in the results' order."""
    return [(key, length, row) for key, stage in results["stages"].items() if key.startswith("sweep_")
            for length, row in stage.get("lengths", {}).items()]  # fmt: skip


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    panels = [(k, length, row) for k, length, row in _length_rows(results) if row.get("vanilla")]
    if not panels:
        plot_unloaded(results, path)  # a run without sweeps: what one request at a time spends
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (key, length, row) in zip(axes[0], panels, strict=True):
        for server, color in (("vanilla", "tab:gray"), ("ours", "tab:blue")):
            rows = sorted(row.get(server) or [], key=lambda r: r["rate"])
            if not rows:
                continue
            rates = [r["rate"] for r in rows]
            label = "vllm serve" if server == "vanilla" else "specprefill serve --engine vllm"
            ax.plot(rates, [r.get("p50_ttft_ms") or r.get("median_ttft_ms") for r in rows], "o-", color=color,
                    label=f"{label} p50")  # fmt: skip
            ax.plot(rates, [r.get("p90_ttft_ms") for r in rows], "s--", color=color, label=f"{label} p90")
        if row.get("slo_p90_ttft_ms"):
            ax.axhline(row["slo_p90_ttft_ms"], color="tab:red", lw=1, ls=":", label="service level (p90)")
        # linear rates (the sweep spans a few-fold range); log TTFT with plain numbers on the ticks
        ax.set_xlim(left=0)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.set_ylabel("TTFT (ms)")
        sweep = results["stages"][key]
        pair = sweep.get("target", key.removeprefix("sweep_")).split(",")[0]
        policy = f", policy {sweep['server_policy']}" if sweep.get("server_policy") else ""
        ax.set_title(f"{pair}\n{int(length):,}-token prompts, 128 out{policy}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    # every panel's entries, once: a panel may lack a server (its sweep not run)
    entries = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    axes[0][-1].legend(list(entries.values()), list(entries), fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_unloaded(results: dict[str, Any], path: Path) -> None:
    """Each length's unloaded TTFT: vanilla's beside ours, ours cut into scoring, kept prefill and the rest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, length, row) for k, length, row in _length_rows(results)
              if row.get("vanilla_unloaded") and row.get("ours_unloaded") and row.get("components")]  # fmt: skip
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4.5), squeeze=False)
    for ax, (_, length, row) in zip(axes[0], panels, strict=True):
        vanilla, ours = row["vanilla_unloaded"]["median_ttft_ms"], row["ours_unloaded"]["median_ttft_ms"]
        score, prefill = row["components"]["score_ms"], row["components"]["prefill_ms"]
        ax.bar(0, vanilla, color="tab:gray", label="vllm serve")
        parts = (("draft scoring", score, "tab:blue"), ("kept prefill", prefill, "tab:cyan"),
                 ("the rest: host, HTTP", max(ours - score - prefill, 0.0), "tab:orange"))  # fmt: skip
        bottom = 0.0
        for label, ms, color in parts:
            ax.bar(1, ms, bottom=bottom, color=color, label=f"specprefill serve: {label}")
            bottom += ms
        ax.set_xticks([0, 1], ["vllm serve", "specprefill\nserve"])
        share = row.get("share_of_ceiling")
        note = f"{vanilla / ours:.2f}x" + (f", {share:.1%} of the {row['ceiling']:.2f}x ceiling" if share else "")
        ax.set_title(f"{int(length):,}-token prompts\n{note}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("median TTFT, one request at a time (ms)")
    sweep = results["stages"][panels[0][0]]
    fig.suptitle(f"{sweep.get('target', panels[0][0]).split(',')[0]}, unloaded", fontsize=10)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--tokenizer", type=Path, default=Path(".gpujob/tok"))
    parser.add_argument("--stages", default="correctness,sweep")
    parser.add_argument("--pair", choices=("llama", "qwen"), default="llama")
    parser.add_argument("--lengths", default="32768,8192")
    parser.add_argument(
        "--sweep-lengths",
        default=None,
        help="the lengths swept (default: every --lengths value); the others get unloaded runs only",
    )
    parser.add_argument("--budget", type=float, default=900.0,
                        help="seconds for the sweeps of one pair, counted once each server is up: its unloaded runs "
                             "and probes spend it too (a server runs one rate at least)")  # fmt: skip
    parser.add_argument("--budget-vanilla", type=float, default=None, help="vanilla's part of --budget (default: half)")
    parser.add_argument("--start-vanilla", type=float, default=START_SHARE["vanilla"],
                        help="vanilla's first rate, as a share of its unloaded capacity")  # fmt: skip
    parser.add_argument("--start-ours", type=float, default=START_SHARE["ours"],
                        help="our server's first rate, as a share of its unloaded capacity")  # fmt: skip
    parser.add_argument("--policy", default=POLICY, help="our server's policy preset or .toml file (default: paper)")
    parser.add_argument(
        "--probe-policies", default="", help="presets (comma-separated) our server also runs unloaded, per request"
    )
    parser.add_argument(
        "--pause-file", type=Path, help=f"start our server once this file exists (wait {PAUSE_S:.0f} s at most)"
    )
    parser.add_argument("--min-prompts", type=int, default=MIN_PROMPTS, help="prompts per swept rate, at least")
    parser.add_argument("--unloaded-prompts", type=int, default=UNLOADED_PROMPTS,
                        help="prompts of each server's one-at-a-time run")  # fmt: skip
    parser.add_argument("--vanilla-probe-reps", type=int, default=3,
                        help="vanilla's ids-and-text probe requests per kind and length (0: none)")  # fmt: skip
    parser.add_argument("--real-lengths", default="8192,32768", help="prompt lengths of the real-weight stage")
    parser.add_argument("--real-samples", type=int, default=4, help="samples per task and length (real stage)")
    parser.add_argument("--real-seed", type=int, default=7, help="seed of the real stage's samples")
    parser.add_argument("--name", default=NAME, help="file name stem of the results")
    parser.add_argument("--render", type=Path, default=None, help="rewrite the markdown and plot from this JSON")
    parser.add_argument("--ours-arg", action="append", default=[], help="one more option of our server (repeatable)")
    args = parser.parse_args()
    OURS_ARGS[:] = args.ours_arg
    globals()["NAME"] = args.name
    START_SHARE.update(vanilla=args.start_vanilla, ours=args.start_ours)
    globals().update(MIN_PROMPTS=args.min_prompts, UNLOADED_PROMPTS=args.unloaded_prompts, POLICY=args.policy)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    if args.render is not None:
        data = json.loads(args.render.read_text())
        args.render.with_suffix(".md").write_text(render(data))
        plot(data, args.render.with_suffix(".png"))
        return 0
    import vllm_gpu as base

    base.install_entry_point()
    args.out.mkdir(parents=True, exist_ok=True)
    RESULTS["command"] = " ".join(["python", *sys.argv])
    RESULTS["gpu"] = gpu_name()
    for stage in args.stages.split(","):
        t0 = elapsed()
        try:
            if stage == "correctness":
                RESULTS["stages"]["correctness"] = stage_correctness(args.out, args.tokenizer)
            elif stage == "real":
                lengths = [int(x) for x in args.real_lengths.split(",")]
                stage_real(args.out, lengths, args.real_samples, args.real_seed)
            elif stage == "sweep":
                lengths = [int(x) for x in args.lengths.split(",")]
                swept = None if args.sweep_lengths is None else [int(x) for x in args.sweep_lengths.split(",")]
                policies = tuple(p for p in args.probe_policies.split(",") if p)
                stage_sweep(args.out, args.tokenizer, args.pair, lengths, args.budget, args.budget_vanilla,
                            args.vanilla_probe_reps, swept, policies, args.pause_file)  # fmt: skip
            else:
                raise SystemExit(f"unknown stage {stage!r}")
        except Exception as exc:
            logger.exception("stage %s failed", stage)
            key = stage if stage != "sweep" else f"sweep_{args.pair}"
            RESULTS["stages"].setdefault(key, {})["error"] = f"{exc}\n{traceback.format_exc()[-3000:]}"
        RESULTS["stages"].setdefault(stage if stage != "sweep" else f"sweep_{args.pair}", {})["stage_s"] = round(
            elapsed() - t0, 1
        )
        save(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
