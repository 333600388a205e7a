"""`Pipeline(scorer, selector, backend)`: chain the three stages; own nothing else.

Example::

    from specprefill_sdk import Pipeline
    pipe = Pipeline.from_policy("paper", model="smollm2-135m")
    answer = pipe.generate([{"role": "user", "content": long_text + "\\nWho wrote it?"}], max_tokens=32)
    print(answer.text, answer.usage.kept_tokens, "/", answer.usage.prompt_tokens)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind

from ._aio import chunks_in_threads
from .errors import ContextTooLongError, InvalidRequestError
from .interfaces import Backend, Scorer, Selector
from .prompt import PromptInput, build_prompt
from .tracing import Telemetry, error_type, mark_cancelled, record_error, set_attributes
from .types import Completion, CompletionChunk, CompressedPrompt, Prompt, SamplingParams, Selection, Timings

if TYPE_CHECKING:
    from .conversation import Conversation

__all__ = ["Compression", "Pipeline"]

logger = logging.getLogger(__name__)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


def _metric_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    # Metric attributes stay low-cardinality: the GenAI dimensions of the inference span only.
    return {k: attributes[k] for k in _METRIC_KEYS if attributes.get(k) is not None}


_METRIC_KEYS = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "server.address",
    "server.port",
)
_DONE = object()


@dataclass(frozen=True)
class Compression:
    """A compressed prompt with how it was obtained: stage times and a fallback reason, if any."""

    compressed: CompressedPrompt
    score_ms: float
    select_ms: float
    fallback: str | None = None

    @property
    def selection(self) -> Selection:
        assert self.compressed.selection is not None
        return self.compressed.selection


class Pipeline:
    """Scores a prompt with ``scorer``, keeps tokens by ``selector``, generates with ``backend``.

    A selector that decides without scores (keep rate 1.0, a dense decision for short prompts)
    skips the scorer. A scorer that fails makes the pipeline fall back to dense prefill; the
    `Completion` says so in ``fallback``.
    """

    def __init__(
        self,
        scorer: Scorer,
        selector: Selector,
        backend: Backend,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        fallback_on_scorer_error: bool = True,
    ) -> None:
        self.scorer = scorer
        self.selector = selector
        self.backend = backend
        self.fallback_on_scorer_error = fallback_on_scorer_error
        self.telemetry = Telemetry(tracer_provider, meter_provider)
        # A scorer holds one draft model; serialize its use across threads (server, async callers).
        self._score_lock = threading.Lock()

    # ----------------------------------------------------------------- construction helpers
    @classmethod
    def from_policy(cls, policy: str = "paper", **kwargs: Any) -> Pipeline:
        """Build a pipeline from a named policy preset (see `specprefill_sdk.policies.load_pipeline`)."""
        from .policies import load_pipeline

        return load_pipeline(policy, **kwargs)

    def conversation(self, strategy: str = "recompute", **kwargs: Any) -> Conversation:
        """A multi-turn `Conversation` over this pipeline (strategies: recompute, incremental, refresh)."""
        from .conversation import Conversation

        return Conversation(self, strategy=strategy, **kwargs)

    @property
    def draft_name(self) -> str | None:
        return getattr(self.scorer, "model_name", None)

    # ----------------------------------------------------------------- stages
    def prompt(self, prompt: PromptInput | Prompt, *, protected_spans: Sequence[tuple[int, int]] = ()) -> Prompt:
        """Tokenize text or messages with the target's tokenizer (a `Prompt` passes through)."""
        if isinstance(prompt, Prompt):
            if not prompt.n:
                raise InvalidRequestError("the prompt is empty", param="prompt")
            return prompt
        return build_prompt(self.backend.tokenizer, prompt, protected_spans=protected_spans)

    def _check_length(self, prompt: Prompt, params: SamplingParams | None) -> None:
        limit = self.backend.max_context
        need = prompt.n + (params.max_tokens if params else 0)
        if prompt.n >= limit or need > limit:
            raise ContextTooLongError(
                f"the prompt has {prompt.n} tokens"
                + (f" and asks for {params.max_tokens} more" if params else "")
                + f": that exceeds the model's context of {limit} tokens",
                param="messages",
            )

    def _compress(self, prompt: Prompt) -> Compression:
        tel = self.telemetry
        t0 = time.perf_counter()
        decided = self.selector.decide_without_scores(prompt)
        if decided is not None:
            select_ms = _ms(t0)
            with tel.span("specprefill.select", {"specprefill.selector": self.selector.name}) as span:
                self._select_attributes(span, decided)
            return Compression(CompressedPrompt.from_selection(prompt, decided), 0.0, select_ms)
        fallback: str | None = None
        t0 = time.perf_counter()
        with tel.span(
            "specprefill.score",
            {
                "specprefill.scorer": self.scorer.name,
                "specprefill.draft.model": self.draft_name,
                "specprefill.prompt_tokens": prompt.n,
                "specprefill.look_ahead": getattr(self.scorer, "look_ahead", None),
            },
        ) as span:
            try:
                with self._score_lock:
                    scores = self.scorer.score(prompt)
            except Exception as exc:
                if not self.fallback_on_scorer_error or isinstance(exc, InvalidRequestError):
                    raise
                fallback = f"scorer_error: {type(exc).__name__}: {exc}"
                logger.warning("scorer failed, falling back to dense prefill: %s", fallback)
                span.add_event(
                    "specprefill.fallback", {"specprefill.fallback.reason": fallback, "error.type": error_type(exc)}
                )
                tel.fallbacks.add(1, self._fallback_metric_attributes("scorer_error"))
                scores = None
        score_ms = _ms(t0)
        tel.score_time.record(score_ms, self._score_metric_attributes())
        t0 = time.perf_counter()
        with tel.span("specprefill.select", {"specprefill.selector": self.selector.name}) as span:
            if scores is None:
                selection = Selection.keep_all(prompt.n, reason="fallback")
            else:
                selection = self.selector.select(prompt, scores)
            self._select_attributes(span, selection)
        return Compression(CompressedPrompt.from_selection(prompt, selection), score_ms, _ms(t0), fallback)

    def _score_metric_attributes(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in (("specprefill.scorer", self.scorer.name), ("specprefill.draft.model", self.draft_name))
            if v is not None
        }

    def _fallback_metric_attributes(self, reason: str) -> dict[str, Any]:
        return {"specprefill.fallback.reason": reason, "gen_ai.request.model": self.backend.model_name}

    @staticmethod
    def _select_attributes(span: Any, selection: Selection) -> None:
        set_attributes(
            span,
            {
                "specprefill.keep_rate.requested": selection.requested_rate,
                "specprefill.keep_rate.actual": selection.keep_ratio,
                "specprefill.kept_tokens": selection.kept,
                "specprefill.protected_tokens": selection.protected_count,
                "specprefill.prompt_tokens": selection.n,
                "specprefill.dense": selection.dense,
                "specprefill.reason": selection.reason or None,
            },
        )

    def compress(self, prompt: PromptInput | Prompt) -> CompressedPrompt:
        """Score and select without generating: the kept ids and their original positions."""
        p = self.prompt(prompt)
        self._check_length(p, None)
        with self.telemetry.span("specprefill.pipeline", {"specprefill.operation": "compress"}):
            return self._compress(p).compressed

    # ----------------------------------------------------------------- generation
    def _params(self, params: SamplingParams | None, kwargs: dict[str, Any]) -> SamplingParams:
        if params is not None and kwargs:
            raise InvalidRequestError("pass either a SamplingParams or keyword arguments, not both")
        if params is not None:
            return params
        try:
            return SamplingParams(**kwargs)
        except TypeError as exc:
            raise InvalidRequestError(str(exc)) from exc

    def _operation(self, prompt: Prompt) -> str:
        return "chat" if prompt.messages is not None else "text_completion"

    def _server_attributes(self) -> dict[str, Any]:
        base_url = getattr(self.backend, "base_url", None)
        if not base_url:
            return {}
        url = urllib.parse.urlsplit(str(base_url))
        try:
            port = url.port or {"http": 80, "https": 443}.get(url.scheme)
        except ValueError:
            port = None
        return {"server.address": url.hostname, "server.port": port}

    def _inference_attributes(
        self,
        operation: str,
        params: SamplingParams,
        input_tokens: int,
        *,
        stream: bool,
        conversation_id: str | None = None,
    ) -> dict[str, Any]:
        return {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": getattr(self.backend, "provider_name", "specprefill"),
            "gen_ai.request.model": self.backend.model_name,
            "gen_ai.conversation.id": conversation_id,
            "gen_ai.request.max_tokens": params.max_tokens,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.request.seed": params.seed,
            "gen_ai.request.stop_sequences": params.stop or None,
            "gen_ai.request.stream": stream,
            "gen_ai.usage.input_tokens": input_tokens,
            **self._server_attributes(),
        }

    def _finish(
        self, result: Completion, comp: Compression, t0: float, backend_start: float, metric_attributes: dict[str, Any]
    ) -> Completion:
        total = _ms(t0)
        ttft = (backend_start - t0) * 1000.0 + result.timings.ttft
        sel = comp.compressed.selection
        completion = replace(
            result,
            timings=Timings(
                score=comp.score_ms, select=comp.select_ms, prefill=result.timings.prefill, ttft=ttft, total=total
            ),
            draft=self.draft_name if comp.score_ms > 0 or comp.fallback else result.draft,
            fallback=comp.fallback or result.fallback,
            selection=sel,
        )
        tel = self.telemetry
        model = {"gen_ai.request.model": self.backend.model_name}
        tel.ttft.record(ttft, model)
        tel.keep_ratio.record(completion.usage.keep_ratio, model)
        tel.prompt_tokens.add(completion.usage.prompt_tokens, model)
        tel.kept_tokens.add(completion.usage.kept_tokens, model)
        if result.fallback and not comp.fallback:
            tel.fallbacks.add(1, self._fallback_metric_attributes("backend"))
        response = (
            {**metric_attributes, "gen_ai.response.model": completion.model} if completion.model else metric_attributes
        )
        usage = completion.usage
        tel.token_usage.record(usage.kept_tokens, {**response, "gen_ai.token.type": "input"})
        tel.token_usage.record(usage.completion_tokens, {**response, "gen_ai.token.type": "output"})
        return completion

    def _record_inference(self, span: Any, completion: Completion, first_chunk_s: float | None) -> None:
        set_attributes(
            span,
            {
                "gen_ai.response.model": completion.model or None,
                "gen_ai.usage.output_tokens": completion.usage.completion_tokens,
                "gen_ai.response.finish_reasons": (completion.finish_reason,),
                "gen_ai.response.time_to_first_chunk": first_chunk_s,
            },
        )
        if completion.fallback and span.is_recording():
            span.add_event("specprefill.fallback", {"specprefill.fallback.reason": completion.fallback})

    @staticmethod
    def _record_root(root: Any, completion: Completion) -> None:
        set_attributes(
            root,
            {
                "specprefill.kept_tokens": completion.usage.kept_tokens,
                "specprefill.keep_ratio": completion.usage.keep_ratio,
                "specprefill.ttft_ms": completion.timings.ttft,
            },
        )

    def _record_duration(
        self, start: float, metric_attributes: dict[str, Any], exc: BaseException | None = None
    ) -> None:
        attributes = metric_attributes if exc is None else {**metric_attributes, "error.type": error_type(exc)}
        self.telemetry.operation_duration.record(time.perf_counter() - start, attributes)

    def _root_attributes(self, prompt: Prompt, conversation_id: str | None) -> dict[str, Any]:
        return {
            "specprefill.prompt_tokens": prompt.n,
            "gen_ai.conversation.id": conversation_id,
            "gen_ai.request.model": self.backend.model_name,
        }

    def generate(
        self,
        prompt: PromptInput | Prompt,
        params: SamplingParams | None = None,
        *,
        conversation_id: str | None = None,
        **sampling: Any,
    ) -> Completion:
        """Compress ``prompt`` and generate; keyword arguments build `SamplingParams`.

        Raises:
            InvalidRequestError: bad prompt or sampling parameters.
            ContextTooLongError: the prompt plus ``max_tokens`` exceeds the target's context.
        """
        t0 = time.perf_counter()
        sp = self._params(params, sampling)
        p = self.prompt(prompt)
        self._check_length(p, sp)
        tel = self.telemetry
        with tel.span("specprefill.pipeline", self._root_attributes(p, conversation_id)) as root:
            comp = self._compress(p)
            if comp.fallback:
                root.add_event("specprefill.fallback", {"specprefill.fallback.reason": comp.fallback})
            op = self._operation(p)
            attrs = self._inference_attributes(
                op, sp, comp.compressed.kept, stream=False, conversation_id=conversation_id
            )
            mattrs = _metric_attributes(attrs)
            with tel.span(f"{op} {self.backend.model_name}", attrs, kind=SpanKind.CLIENT) as span:
                backend_start = time.perf_counter()
                try:
                    result = self.backend.generate(comp.compressed, sp)
                except BaseException as exc:
                    self._record_duration(backend_start, mattrs, exc)
                    raise
                self._record_duration(backend_start, mattrs)
                completion = self._finish(result, comp, t0, backend_start, mattrs)
                self._record_inference(span, completion, result.timings.ttft / 1000.0)
            self._record_root(root, completion)
            return completion

    def stream(
        self,
        prompt: PromptInput | Prompt,
        params: SamplingParams | None = None,
        *,
        conversation_id: str | None = None,
        **sampling: Any,
    ) -> Iterator[CompletionChunk]:
        """Like `generate`, yielding `CompletionChunk` text deltas; the last carries the `Completion`.

        Closing the iterator early stops the generation.
        """
        t0 = time.perf_counter()
        sp = self._params(params, sampling)
        p = self.prompt(prompt)
        self._check_length(p, sp)
        # The spans' parent is the caller's context now, not whatever is current at the first next().
        return self._stream(p, sp, t0, conversation_id, otel_context.get_current())

    def _stream(
        self, p: Prompt, sp: SamplingParams, t0: float, conversation_id: str | None, parent: otel_context.Context
    ) -> Iterator[CompletionChunk]:
        # The spans are attached to the context only around our own work, never across a yield:
        # a span left current while the consumer runs would parent the consumer's spans, and an
        # async consumer resumes this generator in other contexts, where the detach would fail.
        tel = self.telemetry
        root = tel.start_span("specprefill.pipeline", self._root_attributes(p, conversation_id), context=parent)
        span = None
        chunks: Iterator[CompletionChunk] | None = None
        failed: BaseException | None = None
        try:
            with tel.activate(root):
                comp = self._compress(p)
                if comp.fallback:
                    root.add_event("specprefill.fallback", {"specprefill.fallback.reason": comp.fallback})
                op = self._operation(p)
                attrs = self._inference_attributes(
                    op, sp, comp.compressed.kept, stream=True, conversation_id=conversation_id
                )
                mattrs = _metric_attributes(attrs)
                span = tel.start_span(f"{op} {self.backend.model_name}", attrs, kind=SpanKind.CLIENT)
            backend_start = time.perf_counter()
            first_chunk_s: float | None = None
            with tel.activate(span):
                chunks = iter(self.backend.stream(comp.compressed, sp))
            while True:
                with tel.activate(span):
                    chunk = next(chunks, _DONE)
                if chunk is _DONE:
                    break
                assert isinstance(chunk, CompletionChunk)
                if first_chunk_s is None and (chunk.text or chunk.token_ids):
                    first_chunk_s = time.perf_counter() - backend_start
                    span.add_event("gen_ai.first_chunk")
                    tel.time_to_first_chunk.record(first_chunk_s, mattrs)
                if chunk.completion is not None:
                    self._record_duration(backend_start, mattrs)
                    completion = self._finish(chunk.completion, comp, t0, backend_start, mattrs)
                    self._record_inference(span, completion, first_chunk_s)
                    self._record_root(root, completion)
                    chunk = replace(chunk, completion=completion)
                yield chunk
        except GeneratorExit:
            for s in (span, root):
                if s is not None:
                    mark_cancelled(s)
            raise
        except BaseException as exc:
            failed = exc
            if span is not None:
                self._record_duration(backend_start, mattrs, exc)
                record_error(span, exc)
            record_error(root, exc)
            raise
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                try:
                    with tel.activate(span or root):
                        close()
                except Exception:
                    if failed is None:
                        raise
            if span is not None:
                span.end()
            root.end()

    async def agenerate(
        self,
        prompt: PromptInput | Prompt,
        params: SamplingParams | None = None,
        *,
        conversation_id: str | None = None,
        **sampling: Any,
    ) -> Completion:
        """Async `generate`: model work runs in worker threads, never on the event loop."""
        return await asyncio.to_thread(self.generate, prompt, params, conversation_id=conversation_id, **sampling)

    async def astream(
        self,
        prompt: PromptInput | Prompt,
        params: SamplingParams | None = None,
        *,
        conversation_id: str | None = None,
        **sampling: Any,
    ) -> AsyncIterator[CompletionChunk]:
        """Async `stream`. Each step of the synchronous stream runs in a worker thread."""
        iterator = await asyncio.to_thread(self.stream, prompt, params, conversation_id=conversation_id, **sampling)
        async with contextlib.aclosing(chunks_in_threads(iterator)) as chunks:
            async for chunk in chunks:
                yield chunk

    def generate_batch(
        self,
        prompts: Sequence[PromptInput | Prompt],
        params: SamplingParams | None = None,
        **sampling: Any,
    ) -> list[Completion]:
        """Generate for several prompts: the draft scores them as one batch, the backend as one batch.

        Equal to ``[generate(p) for p in prompts]`` (greedy), only faster.
        """
        if isinstance(prompts, str):
            raise InvalidRequestError("generate_batch takes a list of prompts; use generate for one prompt")
        if not prompts:
            return []
        t0 = time.perf_counter()
        sp = self._params(params, sampling)
        built = [self.prompt(p) for p in prompts]
        for p in built:
            self._check_length(p, sp)
        tel = self.telemetry
        with tel.span(
            "specprefill.pipeline",
            {
                "specprefill.batch_size": len(built),
                "specprefill.prompt_tokens": sum(p.n for p in built),
                "gen_ai.request.model": self.backend.model_name,
            },
        ) as root:
            decided = [self.selector.decide_without_scores(p) for p in built]
            todo = [i for i, d in enumerate(decided) if d is None]
            comps: list[Compression | None] = [
                None if d is None else Compression(CompressedPrompt.from_selection(p, d), 0.0, 0.0)
                for p, d in zip(built, decided, strict=True)
            ]
            if todo:
                ts = time.perf_counter()
                fallback = None
                with tel.span(
                    "specprefill.score",
                    {
                        "specprefill.scorer": self.scorer.name,
                        "specprefill.draft.model": self.draft_name,
                        "specprefill.batch_size": len(todo),
                        "specprefill.prompt_tokens": sum(built[i].n for i in todo),
                        "specprefill.look_ahead": getattr(self.scorer, "look_ahead", None),
                    },
                ) as span:
                    try:
                        with self._score_lock:
                            all_scores: list[Any] = self.scorer.score_batch([built[i] for i in todo])
                    except Exception as exc:
                        if not self.fallback_on_scorer_error or isinstance(exc, InvalidRequestError):
                            raise
                        fallback = f"scorer_error: {type(exc).__name__}: {exc}"
                        logger.warning("scorer failed, falling back to dense prefill: %s", fallback)
                        span.add_event(
                            "specprefill.fallback",
                            {"specprefill.fallback.reason": fallback, "error.type": error_type(exc)},
                        )
                        root.add_event("specprefill.fallback", {"specprefill.fallback.reason": fallback})
                        tel.fallbacks.add(len(todo), self._fallback_metric_attributes("scorer_error"))
                        all_scores = [None] * len(todo)
                tel.score_time.record(_ms(ts), self._score_metric_attributes())
                score_ms = _ms(ts) / len(todo)
                for i, scores in zip(todo, all_scores, strict=True):
                    ts = time.perf_counter()
                    with tel.span("specprefill.select", {"specprefill.selector": self.selector.name}) as span:
                        sel = (
                            Selection.keep_all(built[i].n, reason="fallback")
                            if scores is None
                            else self.selector.select(built[i], scores)
                        )
                        self._select_attributes(span, sel)
                    comps[i] = Compression(CompressedPrompt.from_selection(built[i], sel), score_ms, _ms(ts), fallback)
            ready = [c for c in comps if c is not None]
            ops = {self._operation(p) for p in built}
            op = ops.pop() if len(ops) == 1 else "chat"
            attrs = self._inference_attributes(op, sp, sum(c.compressed.kept for c in ready), stream=False)
            mattrs = _metric_attributes(attrs)
            with tel.span(f"{op} {self.backend.model_name}", attrs, kind=SpanKind.CLIENT) as span:
                backend_start = time.perf_counter()
                try:
                    results = self.backend.generate_batch([c.compressed for c in ready], sp)
                except BaseException as exc:
                    self._record_duration(backend_start, mattrs, exc)
                    raise
                self._record_duration(backend_start, mattrs)
                completions = [
                    self._finish(r, c, t0, backend_start, mattrs) for r, c in zip(results, ready, strict=True)
                ]
                set_attributes(
                    span,
                    {
                        "gen_ai.response.model": completions[0].model or None,
                        "gen_ai.usage.output_tokens": sum(c.usage.completion_tokens for c in completions),
                        "gen_ai.response.finish_reasons": tuple(c.finish_reason for c in completions),
                    },
                )
            set_attributes(root, {"specprefill.kept_tokens": sum(c.usage.kept_tokens for c in completions)})
            return completions
