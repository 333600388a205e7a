"""`VLLMBackend`: the target model in an in-process ``vllm.LLM``, prefilled at original positions.

Example::

    from specprefill_sdk import Chunked, DraftAttentionScorer, KeepRate, Pipeline, Protect
    from specprefill_sdk.backends.vllm import VLLMBackend

    backend = VLLMBackend("/models/Llama-3.1-8B-Instruct", max_model_len=32768)
    scorer = DraftAttentionScorer("/models/Llama-3.2-1B-Instruct", device=backend.draft_device)
    pipe = Pipeline(scorer, Protect(Chunked(KeepRate(0.1), 32)), backend)
    print(pipe.generate(long_messages, max_tokens=64).text)
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..._cancel import check_cancelled
from ..._timing import elapsed_ms as _ms
from ..._timing import record
from ...errors import (
    BackendUnavailableError,
    ContextTooLongError,
    InvalidRequestError,
    ModelLoadError,
    SpecPrefillError,
)
from ...interfaces import BackendCapabilities
from ...models import DEFAULT_MODEL, resolve_model_path
from ...types import (
    Completion,
    CompletionChunk,
    CompressedPrompt,
    FinishReason,
    SamplingParams,
    Timings,
    TokenLogprob,
    Usage,
)
from ..base import BackendBase
from .layout import encode_prompt
from .parallel import DevicePlan, engine_in_process, plan_devices
from .plugin import (
    EXPLICIT_ARCHITECTURES,
    SUPPORTED_ARCHITECTURES,
    check_vllm,
    enable_stock_classes,
    register,
    supported_architecture,
)

__all__ = ["VLLMBackend"]

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "specprefill_sdk.backends.vllm.worker.SpecPrefillWorkerExtension"
_V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"


def _architectures(source: Path | str, overrides: Mapping[str, Any] | None) -> list[str]:
    if overrides and "architectures" in overrides:
        return list(overrides["architectures"])
    config = Path(source) / "config.json"
    if not config.is_file():
        return []  # a hub id: vLLM reads the config; the status probe still checks the model
    try:
        archs = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {config}: {exc}") from exc
    return [str(a) for a in archs]


class _EngineFailed:
    """Put in every waiting request's queue when the driver's stepping thread saw ``step`` fail."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _EngineDriver:
    """Serialises access to a vLLM ``LLMEngine`` across threads and routes outputs to per-request queues.

    Two ways to step, one per place of vLLM's engine core:

    - engine core in its own process (``own_thread=False``): whichever caller holds the lock steps
      the engine for everyone, so concurrent `generate` calls (threads, `agenerate`) share engine
      steps and batches;
    - engine core in this process (``own_thread=True``): one thread of the driver's adds and aborts
      requests between steps and steps while any request is unfinished, and sleeps otherwise. vLLM
      gives each thread that runs the model a CUDA stream of its own and, with asynchronous
      scheduling, launches a step before the previous one finished, so every step must come from
      the same thread. Callers hand their requests over and wait for the thread's answer.
    """

    def __init__(self, engine: Any, *, own_thread: bool = False) -> None:
        self.engine = engine
        self.lock = threading.Lock()
        self.queues: dict[str, queue.SimpleQueue[Any]] = {}
        self._ops: list[tuple[str, Any]] = []  # ("add", (rid, prompt, params, future)) or ("abort", rid)
        self._wake = threading.Condition(self.lock)  # the stepping thread's signal; holds no lock over a step
        self._failure: BaseException | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        if own_thread:
            self._thread = threading.Thread(target=self._run, name="specprefill-vllm-engine", daemon=True)
            self._thread.start()

    def submit(self, prompt: Mapping[str, Any], params: Any) -> str:
        rid = uuid.uuid4().hex
        if self._thread is None:
            with self.lock:
                self.queues[rid] = queue.SimpleQueue()
                self._add(rid, prompt, params)
            return rid
        added: Future[None] = Future()
        with self._wake:
            if self._failure is not None or self._closed:
                raise BackendUnavailableError(f"the vLLM engine is not running: {self._failure or 'closed'}")
            self.queues[rid] = queue.SimpleQueue()
            self._ops.append(("add", (rid, prompt, params, added)))
            self._wake.notify()
        added.result()
        return rid

    def _add(self, rid: str, prompt: Mapping[str, Any], params: Any) -> None:
        try:
            self.engine.add_request(rid, dict(prompt), params)
        except Exception as exc:
            self.queues.pop(rid, None)
            message = str(exc)
            if "too long" in message or "max_model_len" in message or "maximum context" in message:
                raise ContextTooLongError(message) from exc
            raise InvalidRequestError(f"vLLM refused the request: {message}") from exc

    def next(self, rid: str) -> Any:
        """The next output of request ``rid`` (blocks, stepping the engine as needed)."""
        own = self.queues[rid]
        if self._thread is not None:
            item = own.get()
            if isinstance(item, _EngineFailed):
                raise BackendUnavailableError(f"the vLLM engine failed: {item.exc}") from item.exc
            return item
        while True:
            try:
                return own.get_nowait()
            except queue.Empty:
                pass
            with self.lock:
                if not own.empty():
                    continue
                try:
                    outputs = self.engine.step()
                except Exception as exc:
                    raise BackendUnavailableError(f"the vLLM engine failed: {exc}") from exc
                self._route(outputs)

    def _route(self, outputs: Sequence[Any]) -> None:
        for out in outputs:
            target = self.queues.get(out.request_id)
            if target is not None:
                target.put(out)

    def _run(self) -> None:
        busy = False
        while True:
            with self._wake:
                while not self._closed and not self._ops and not busy:
                    self._wake.wait()
                if self._closed:
                    return
                ops, self._ops = self._ops, []
            try:
                for kind, op in ops:
                    if kind == "abort":
                        self.engine.abort_request([op])
                        continue
                    rid, prompt, params, added = op
                    try:
                        self._add(rid, prompt, params)
                    except SpecPrefillError as exc:  # this request's refusal, typed by `_add`
                        added.set_exception(exc)
                    else:
                        added.set_result(None)
                busy = self.engine.has_unfinished_requests()
                if busy:
                    self._route(self.engine.step())
            except Exception as exc:
                logger.exception("the vLLM engine failed")
                with self._wake:
                    self._failure = exc
                    self._release(ops + self._ops, _EngineFailed(exc))
                return

    def _release(self, ops: list[tuple[str, Any]], failed: _EngineFailed) -> None:
        """Every waiting caller gets ``failed``: those waiting for outputs and those whose add is pending."""
        for waiting in self.queues.values():
            waiting.put(failed)
        error = BackendUnavailableError(f"the vLLM engine is not running: {failed.exc}")
        for kind, op in ops:
            if kind == "add" and not op[3].done():
                op[3].set_exception(error)
        self._ops = []

    def done(self, rid: str) -> None:
        with self.lock:
            self.queues.pop(rid, None)

    def abort(self, rid: str) -> None:
        if self._thread is None:
            with self.lock:
                if self.queues.pop(rid, None) is not None:
                    self.engine.abort_request([rid])
            return
        with self._wake:
            if self.queues.pop(rid, None) is not None and self._failure is None:
                self._ops.append(("abort", rid))
                self._wake.notify()

    def close(self) -> None:
        """Stop the stepping thread (if any) after its current step; requests still waiting get an error."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is None or self._thread is threading.current_thread():
            return
        self._thread.join()
        with self._wake:
            self._release(self._ops, _EngineFailed(BackendUnavailableError("the vLLM engine was closed")))


@contextmanager
def _engine_core_placement(in_process: bool) -> Iterator[None]:
    """vLLM's engine core in this process or its own while an engine starts (vLLM reads an environment variable)."""
    key = "VLLM_ENABLE_V1_MULTIPROCESSING"
    before = os.environ.get(key)
    os.environ[key] = "0" if in_process else "1"
    try:
        from vllm import envs

        reset = getattr(envs, "disable_envs_cache", None)  # an earlier engine core froze the variables
        if callable(reset):
            reset()
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


class VLLMBackend(BackendBase):
    """The target runs in vLLM (V2 model runner) with the SpecPrefill plugin's positions.

    Args:
        model: a bundled model name, a Hugging Face model folder, or a hub id in the local cache.
            Its architecture must be one the plugin covers (Llama, Mistral, Qwen2, Qwen3).
        tokenizer: a tokenizer object, a path, or None (the model's own).
        dtype: vLLM's dtype (``"auto"``, ``"bfloat16"``, ...).
        max_model_len: the context length (default: the model's).
        gpu_memory_utilization: vLLM's share of each GPU; None plans it with room for a draft of
            ``draft_memory_gib`` beside rank 0 (see `plan_devices`).
        tensor_parallel_size: vLLM's tensor parallelism.
        draft_device: where the draft should score (``auto``: a spare GPU, else rank 0's GPU);
            read back as `draft_device` to build the scorer.
        draft_memory_gib: GPU memory left free for the draft when it shares rank 0's GPU.
        engine_core: where vLLM's engine core runs: ``"auto"`` (this process when one rank shares
            its GPU with the draft, so that the draft's and the target's kernels can overlap;
            otherwise vLLM's own process), ``"in-process"`` or ``"subprocess"``; read back as
            `engine_in_process`. See `engine_in_process` in `specprefill_sdk.backends.vllm.parallel`.
        enable_prefix_caching: vLLM prefix caching; compressed requests are salted by layout.
        **engine_kwargs: passed to ``vllm.LLM`` (``enforce_eager``, ``max_num_batched_tokens``,
            ``load_format``, ...).

    Raises:
        ModelLoadError: unknown model or an architecture the plugin does not cover.
        BackendUnavailableError: vLLM missing or unsupported, or the engine does not run the
            plugin's model state (for example on the V1 model runner).
    """

    capabilities = BackendCapabilities(supports_position_ids=True, supports_sessions=False, supports_streaming=True)
    provider_name = "vllm"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        tokenizer: Any = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float | None = None,
        tensor_parallel_size: int = 1,
        draft_device: str = "auto",
        draft_memory_gib: float = 8.0,
        engine_core: str = "auto",
        enable_prefix_caching: bool = True,
        seed: int = 0,
        **engine_kwargs: Any,
    ) -> None:
        problem = check_vllm()
        if problem:
            raise BackendUnavailableError(f"VLLMBackend: {problem}")
        source = resolve_model_path(model)
        archs = _architectures(source, engine_kwargs.get("hf_overrides"))
        if archs and supported_architecture(archs) is None:
            raise ModelLoadError(
                f"{model!r} is a {', '.join(archs)}; SpecPrefill positions on vLLM cover "
                f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))} (or {', '.join(EXPLICIT_ARCHITECTURES)})"
            )
        # The plugin leaves vLLM's stock classes alone unless asked; this engine is asked for, so its
        # processes (children, which inherit the environment) opt in, unless the user chose otherwise.
        enable_stock_classes()
        register()  # this process resolves the architecture too
        import torch
        import vllm

        num_gpus = torch.cuda.device_count()
        total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if num_gpus else None
        self.plan: DevicePlan = plan_devices(
            tensor_parallel_size,
            num_gpus,
            draft_device=draft_device,
            gpu_memory_gib=total_gib,
            draft_memory_gib=draft_memory_gib,
            gpu_memory_utilization=gpu_memory_utilization,
        )
        #: Whether vLLM's engine core runs in this process (`engine_in_process`).
        self.engine_in_process: bool = engine_in_process(engine_core, self.plan)
        engine_kwargs.setdefault("worker_extension_cls", WORKER_EXTENSION)
        self._name = Path(model).name if Path(model).exists() else model
        t0 = time.perf_counter()
        try:
            with _engine_core_placement(self.engine_in_process):
                self.llm = vllm.LLM(
                    model=str(source),
                    tokenizer=str(tokenizer) if isinstance(tokenizer, str | Path) else None,
                    dtype=dtype,
                    max_model_len=max_model_len,
                    gpu_memory_utilization=self.plan.gpu_memory_utilization,
                    tensor_parallel_size=tensor_parallel_size,
                    enable_prefix_caching=enable_prefix_caching,
                    seed=seed,
                    **engine_kwargs,
                )
        except Exception as exc:
            raise BackendUnavailableError(f"vLLM could not start {model!r}: {exc}") from exc
        logger.info("vLLM engine for %s ready in %.1f s", self._name, time.perf_counter() - t0)
        self.status = self._check_workers()
        self.engine = self.llm.llm_engine
        self._driver = _EngineDriver(self.engine, own_thread=self.engine_in_process)
        self._tokenizer = self._load_tokenizer(tokenizer, source, engine_kwargs)
        # With skip_tokenizer_init vLLM returns ids only; text then comes from our tokenizer, if any.
        self._engine_detokenizes = not engine_kwargs.get("skip_tokenizer_init", False)
        self._max_context = int(self.engine.model_config.max_model_len)

    # ------------------------------------------------------------------ construction helpers
    def _check_workers(self) -> list[dict[str, Any]]:
        try:
            statuses = list(self.llm.collective_rpc("specprefill_status"))
        except Exception as exc:
            self.close()
            raise BackendUnavailableError(f"cannot query the vLLM workers: {exc}") from exc
        for status in statuses:
            runner = str(status.get("runner") or "")
            if not runner.startswith(_V2_RUNNER_MODULE):
                self.close()
                raise BackendUnavailableError(
                    f"vLLM runs the model on {runner or 'an unknown runner'}; SpecPrefill positions need the "
                    "V2 model runner (unset VLLM_USE_V2_MODEL_RUNNER=0 and avoid features that force V1)"
                )
            if status.get("state") != "SpecPrefillModelState":
                self.close()
                raise BackendUnavailableError(
                    f"vLLM built {status.get('model')} with {status.get('state')}, not the SpecPrefill state: "
                    "the architecture is not covered or the plugin is disabled or limited by SPECPREFILL_VLLM_PLUGIN"
                )
        return statuses

    @staticmethod
    def _load_tokenizer(tokenizer: Any, source: Path | str, engine_kwargs: Mapping[str, Any]) -> Any:
        if tokenizer is not None and not isinstance(tokenizer, str | Path):
            return tokenizer
        if engine_kwargs.get("skip_tokenizer_init"):
            return None
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(tokenizer or source), local_files_only=True)
        except Exception as exc:
            raise ModelLoadError(f"cannot load the tokenizer of {source}: {exc}") from exc

    def close(self) -> None:
        """Stop the engine's processes and free its GPU memory."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        driver = getattr(self, "_driver", None)
        if driver is not None:
            driver.close()
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # shutting down twice, or an engine that died already
            logger.debug("vLLM engine shutdown raised", exc_info=True)
        self.llm = None

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ Backend protocol
    @property
    def model_name(self) -> str:
        return self._name

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def draft_device(self) -> str:
        """The device planned for the draft scorer (``cuda:N`` or ``cpu``)."""
        return self.plan.draft_device

    def request(self, prompt: CompressedPrompt, params: SamplingParams) -> tuple[dict[str, Any], Any]:
        """The vLLM prompt dict and ``vllm.SamplingParams`` for a compressed prompt.

        A compressed prompt carries its layout in ``extra_args`` and a ``cache_salt`` of it; a
        dense one is a plain token prompt.
        """
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        if prompt.n + params.max_tokens > self._max_context:
            raise ContextTooLongError(
                f"the prompt has {prompt.n} tokens and asks for {params.max_tokens} more: that exceeds the "
                f"model's context of {self._max_context} tokens",
                param="max_tokens",
            )
        if params.stop and not self._engine_detokenizes:
            raise InvalidRequestError(
                "stop strings need vLLM's detokenizer (the engine skips its tokenizer)", param="stop"
            )
        vllm_prompt, extra = encode_prompt(prompt)
        vllm_params = VllmSamplingParams(
            n=1,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            stop=list(params.stop) or None,
            ignore_eos=params.ignore_eos,
            extra_args=extra,
            output_kind=RequestOutputKind.CUMULATIVE,
            detokenize=self._engine_detokenizes,
            logprobs=params.logprobs,
        )
        return vllm_prompt, vllm_params

    def _completion(
        self, prompt: CompressedPrompt, output: Any, t0: float, t_first: float | None, top: int | None = None
    ) -> Completion:
        out = output.outputs[0]
        reason = out.finish_reason
        finish: FinishReason = "length" if reason == "length" else "stop"
        if reason not in (None, "stop", "length"):
            logger.warning("vLLM finished a request with reason %r", reason)
        t_end = time.perf_counter()
        ttft = _ms(t0, t_first if t_first is not None else t_end)
        ids = tuple(int(t) for t in out.token_ids)
        text = out.text or ""
        if not self._engine_detokenizes and self._tokenizer is not None:
            text = self._tokenizer.decode(list(ids), skip_special_tokens=True)
        return Completion(
            text=text,
            token_ids=ids,
            finish_reason=finish,
            usage=Usage(prompt_tokens=prompt.n, kept_tokens=prompt.kept, completion_tokens=len(out.token_ids)),
            timings=Timings(prefill=ttft, ttft=ttft, total=_ms(t0, t_end)),
            model=self._name,
            logprobs=None if top is None else _logprobs(out, top),
        )

    def _events(self, prompt: CompressedPrompt, params: SamplingParams) -> Generator[tuple[Any, float], None, None]:
        """Yield ``(cumulative output, wall time)`` until the request finishes; abort if closed early."""
        if self.llm is None:
            raise BackendUnavailableError("the vLLM backend is closed")
        t0 = time.perf_counter()
        vllm_prompt, vllm_params = self.request(prompt, params)
        rid = self._driver.submit(vllm_prompt, vllm_params)
        # Building the request (its layout, the sampling) and handing it to the engine: host time
        # inside ``prefill``, reported apart (``submit_ms``).
        record("submit", _ms(t0))
        finished = False
        try:
            while True:
                output = self._driver.next(rid)
                now = time.perf_counter()
                finished = bool(output.finished)
                yield output, now
                if finished:
                    return
        finally:
            if finished:
                self._driver.done(rid)
            else:
                self._driver.abort(rid)

    def generate(self, prompt: CompressedPrompt, params: SamplingParams) -> Completion:
        """Prefill the kept tokens at their original positions, decode from position ``n``.

        Raises:
            GenerationStopped: the current request's cancel event (`REQUEST_CANCEL`) was set; vLLM's
                request is aborted at its next output, which frees its KV blocks.
        """
        t0 = time.perf_counter()
        t_first: float | None = None
        last = None
        events = self._events(prompt, params)
        try:
            for output, now in events:
                generated = len(output.outputs[0].token_ids) if output.outputs else 0
                if t_first is None and generated:
                    t_first = now
                last = output
                if not output.finished:
                    check_cancelled(generated, params.max_tokens)
        finally:
            events.close()  # an unfinished request is aborted there, not when the generator is collected
        assert last is not None
        return self._completion(prompt, last, t0, t_first, params.logprobs)

    def stream(self, prompt: CompressedPrompt, params: SamplingParams) -> Iterator[CompletionChunk]:
        """Yield text deltas as vLLM produces them; the last chunk carries the `Completion`."""
        t0 = time.perf_counter()
        t_first: float | None = None
        sent_text, sent_tokens = 0, 0
        for output, now in self._events(prompt, params):
            out = output.outputs[0]
            if t_first is None and out.token_ids:
                t_first = now
            text, ids = out.text or "", tuple(int(t) for t in out.token_ids)
            # Outputs are cumulative: a chunk's log-probabilities are those of its new tokens.
            logprobs = () if params.logprobs is None else _logprobs(out, params.logprobs)[sent_tokens:]
            if output.finished:
                completion = self._completion(prompt, output, t0, t_first, params.logprobs)
                yield CompletionChunk(
                    text=text[sent_text:],
                    token_ids=ids[sent_tokens:],
                    logprobs=logprobs,
                    finish_reason=completion.finish_reason,
                    completion=completion,
                )
                return
            if len(ids) > sent_tokens:
                yield CompletionChunk(text=text[sent_text:], token_ids=ids[sent_tokens:], logprobs=logprobs)
                sent_text, sent_tokens = len(text), len(ids)

    def generate_batch(self, prompts: Sequence[CompressedPrompt], params: SamplingParams) -> list[Completion]:
        """Submit every prompt at once so vLLM batches them; results in input order."""
        if self.llm is None:
            raise BackendUnavailableError("the vLLM backend is closed")
        t0 = time.perf_counter()
        requests = [self.request(p, params) for p in prompts]
        rids = [self._driver.submit(vp, sp) for vp, sp in requests]
        results: list[Completion | None] = [None] * len(prompts)
        try:
            for i, (rid, prompt) in enumerate(zip(rids, prompts, strict=True)):
                t_first: float | None = None
                while True:
                    output = self._driver.next(rid)
                    now = time.perf_counter()
                    if t_first is None and output.outputs and output.outputs[0].token_ids:
                        # Outputs wait in the queue while earlier requests are drained: use vLLM's
                        # own first-token time when it is recorded, else this (late) wall time.
                        t_first = self._first_token_time(output, t0) or now
                    if output.finished:
                        results[i] = self._completion(prompt, output, t0, t_first, params.logprobs)
                        self._driver.done(rid)
                        break
        finally:
            for rid, result in zip(rids, results, strict=True):
                if result is None:
                    self._driver.abort(rid)
        return [r for r in results if r is not None]

    @staticmethod
    def _first_token_time(output: Any, t0: float) -> float | None:
        metrics = getattr(output, "metrics", None)
        first = getattr(metrics, "first_token_ts", 0.0) if metrics is not None else 0.0
        if not first:
            return None
        # vLLM stamps with time.monotonic(); convert to the perf_counter clock used here.
        return time.perf_counter() - (time.monotonic() - float(first))


def _logprobs(out: Any, top: int) -> tuple[TokenLogprob, ...]:
    """A vLLM ``CompletionOutput``'s log-probabilities (``SamplingParams(logprobs=top)``) as `TokenLogprob` entries.

    Each step of ``out.logprobs`` maps token ids to ``Logprob(logprob, rank, ...)``: the ``top`` most
    likely tokens (ranks 1 to ``top``) and the sampled one, whatever its rank.
    """
    steps = out.logprobs or ()
    entries = []
    for token, step in zip(out.token_ids, steps, strict=False):
        ranked = sorted(
            ((int(t), lp) for t, lp in step.items() if lp.rank is not None and lp.rank <= top), key=lambda p: p[1].rank
        )
        chosen = step.get(int(token))
        logprob = float(chosen.logprob) if chosen is not None else float("-inf")
        entries.append(
            TokenLogprob(token_id=int(token), logprob=logprob, top=tuple((t, float(lp.logprob)) for t, lp in ranked))
        )
    return tuple(entries)
