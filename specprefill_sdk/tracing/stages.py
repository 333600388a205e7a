"""The spans and metrics of a pipeline's work, stage by stage, for every driver alike.

A single request, a batch, a compression without generation and a conversation turn that reuses
caches all record the same things: a ``specprefill.pipeline`` root, ``specprefill.score`` and
``specprefill.select`` spans from the compress step, one inference span named
``"{gen_ai.operation.name} {gen_ai.request.model}"`` and the metrics of `Telemetry`. `StageTrace`
holds that choreography; the drivers hand it their work as callables.
"""

from __future__ import annotations

import functools
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind

from ..cost import SLOWER_THAN_DENSE
from ..interfaces import Backend, LookAheadScorer, ModelScorer, ProviderBackend, RemoteBackend, Scorer, Selector
from ..types import Completion, CompletionChunk, CompressedPrompt, Compression, Prompt, SamplingParams, Selection
from .telemetry import Telemetry, error_type, mark_cancelled, record_error, set_attributes

__all__ = ["Inference", "StageTrace", "draft_name"]

# Metric attributes stay low-cardinality: the GenAI dimensions of the inference span only.
_METRIC_KEYS = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "server.address",
    "server.port",
)
_DONE = object()

#: Builds the final `Completion` from the backend's result, the compression and when the backend started.
Finish = Callable[[Completion, Compression, float], Completion]


def draft_name(scorer: Scorer) -> str | None:
    """The draft model's name of a scorer that runs one, else None."""
    return scorer.model_name if isinstance(scorer, ModelScorer) else None


def _look_ahead(scorer: Scorer) -> int | None:
    return scorer.look_ahead if isinstance(scorer, LookAheadScorer) else None


def operation(prompt: Prompt) -> str:
    """The GenAI operation name of a prompt: ``chat`` for messages, else ``text_completion``."""
    return "chat" if prompt.messages is not None else "text_completion"


@dataclass(frozen=True)
class Inference:
    """The inference span's name and attributes, and the metric attributes derived from them."""

    name: str
    attributes: dict[str, Any]
    metric_attributes: dict[str, Any]


class StageTrace:
    """The span and metric choreography of one pipeline (its telemetry and its target backend).

    Example::

        trace = StageTrace(Telemetry(tracer_provider), backend)
        with trace.score_span(scorer, [prompt], batch=False) as span:
            ...
    """

    def __init__(self, telemetry: Telemetry, backend: Backend | None) -> None:
        self.telemetry = telemetry
        self.backend = backend

    @staticmethod
    def off() -> StageTrace:
        """A trace that records nothing, whatever the global providers (for drivers without telemetry)."""
        return _off()

    @property
    def _model(self) -> str | None:
        return self.backend.model_name if self.backend is not None else None

    # ----------------------------------------------------------------- the compress step
    def score_span(self, scorer: Scorer, prompts: Sequence[Prompt], *, batch: bool) -> AbstractContextManager[Span]:
        """The ``specprefill.score`` span of one scoring call over ``prompts``."""
        return self.telemetry.span(
            "specprefill.score",
            {
                "specprefill.scorer": scorer.name,
                "specprefill.draft.model": draft_name(scorer),
                "specprefill.batch_size": len(prompts) if batch else None,
                "specprefill.prompt_tokens": sum(p.n for p in prompts),
                "specprefill.look_ahead": _look_ahead(scorer),
            },
        )

    def scorer_failed(self, span: Span, exc: BaseException, reason: str, count: int) -> None:
        """A scorer error that the compress step answers with dense prefill of ``count`` prompts."""
        span.add_event("specprefill.fallback", {"specprefill.fallback.reason": reason, "error.type": error_type(exc)})
        self.telemetry.fallbacks.add(count, self._fallback_attributes("scorer_error"))

    def dense_by_cost(self, count: int) -> None:
        """``count`` prompts prefilled densely, unscored, because the cost model found scoring would not pay."""
        self.telemetry.fallbacks.add(count, self._fallback_attributes(SLOWER_THAN_DENSE))

    def scored(self, scorer: Scorer, ms: float) -> None:
        """Record the time of one scoring call."""
        attributes = {"specprefill.scorer": scorer.name, "specprefill.draft.model": draft_name(scorer)}
        self.telemetry.score_time.record(ms, {k: v for k, v in attributes.items() if v is not None})

    def select_span(self, selector: Selector) -> AbstractContextManager[Span]:
        """The ``specprefill.select`` span of one selection."""
        return self.telemetry.span("specprefill.select", {"specprefill.selector": selector.name})

    @staticmethod
    def selected(span: Span, selection: Selection) -> None:
        """What a selection kept, on its span."""
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

    def _fallback_attributes(self, reason: str) -> dict[str, Any]:
        return {"specprefill.fallback.reason": reason, "gen_ai.request.model": self._model}

    # ----------------------------------------------------------------- attributes
    def root_attributes(
        self, prompt: Prompt, conversation_id: str | None, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The attributes of a request's ``specprefill.pipeline`` span."""
        return {
            "specprefill.prompt_tokens": prompt.n,
            "gen_ai.conversation.id": conversation_id,
            "gen_ai.request.model": self._model,
            **(extra or {}),
        }

    def inference(
        self,
        op: str,
        params: SamplingParams,
        input_tokens: int,
        *,
        stream: bool,
        conversation_id: str | None = None,
    ) -> Inference:
        """The inference span of a call that prefills ``input_tokens`` (GenAI semantic conventions)."""
        model = self._model
        attributes = {
            "gen_ai.operation.name": op,
            "gen_ai.provider.name": (
                self.backend.provider_name if isinstance(self.backend, ProviderBackend) else "specprefill"
            ),
            "gen_ai.request.model": model,
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
        metric = {k: attributes[k] for k in _METRIC_KEYS if attributes.get(k) is not None}
        return Inference(f"{op} {model}", attributes, metric)

    def _server_attributes(self) -> dict[str, Any]:
        if not isinstance(self.backend, RemoteBackend) or not self.backend.base_url:
            return {}
        url = urllib.parse.urlsplit(str(self.backend.base_url))
        try:
            port = url.port or {"http": 80, "https": 443}.get(url.scheme)
        except ValueError:
            port = None
        return {"server.address": url.hostname, "server.port": port}

    # ----------------------------------------------------------------- results
    def completed(self, completion: Completion, comp: Compression, backend_fallback: bool, inf: Inference) -> None:
        """The metrics of one finished generation."""
        tel = self.telemetry
        model = {"gen_ai.request.model": self._model}
        usage = completion.usage
        tel.ttft.record(completion.timings.ttft, model)
        tel.keep_ratio.record(usage.keep_ratio, model)
        tel.prompt_tokens.add(usage.prompt_tokens, model)
        tel.kept_tokens.add(usage.kept_tokens, model)
        if backend_fallback and not comp.fallback:
            tel.fallbacks.add(1, self._fallback_attributes("backend"))
        response = inf.metric_attributes
        if completion.model:
            response = {**response, "gen_ai.response.model": completion.model}
        tel.token_usage.record(usage.kept_tokens, {**response, "gen_ai.token.type": "input"})
        tel.token_usage.record(usage.completion_tokens, {**response, "gen_ai.token.type": "output"})

    @staticmethod
    def record_inference(span: Span, completion: Completion, first_chunk_s: float | None) -> None:
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
    def record_root(root: Span, completion: Completion) -> None:
        set_attributes(
            root,
            {
                "specprefill.kept_tokens": completion.usage.kept_tokens,
                "specprefill.keep_ratio": completion.usage.keep_ratio,
                "specprefill.ttft_ms": completion.timings.ttft,
            },
        )

    @staticmethod
    def compressed(root: Span, comp: Compression) -> None:
        """A compression's fallback, on the request's root span."""
        if comp.fallback:
            root.add_event("specprefill.fallback", {"specprefill.fallback.reason": comp.fallback})

    def duration(self, start: float, inf: Inference, exc: BaseException | None = None) -> None:
        """``gen_ai.client.operation.duration`` of a backend call that started at ``start``."""
        attributes = inf.metric_attributes
        if exc is not None:
            attributes = {**attributes, "error.type": error_type(exc)}
        self.telemetry.operation_duration.record(time.perf_counter() - start, attributes)

    # ----------------------------------------------------------------- whole requests
    def generate(
        self,
        prompt: Prompt,
        params: SamplingParams,
        conversation_id: str | None,
        compress: Callable[[], Compression],
        run: Callable[[CompressedPrompt, SamplingParams], Completion],
        finish: Finish,
    ) -> Completion:
        """One traced request: ``compress()``, ``run(compressed, params)``, ``finish(result, compression, start)``."""
        tel = self.telemetry
        with tel.span("specprefill.pipeline", self.root_attributes(prompt, conversation_id)) as root:
            comp = compress()
            self.compressed(root, comp)
            inf = self.inference(
                operation(prompt), params, comp.compressed.kept, stream=False, conversation_id=conversation_id
            )
            with tel.span(inf.name, inf.attributes, kind=SpanKind.CLIENT) as span:
                backend_start = time.perf_counter()
                try:
                    result = run(comp.compressed, params)
                except BaseException as exc:
                    self.duration(backend_start, inf, exc)
                    raise
                self.duration(backend_start, inf)
                completion = finish(result, comp, backend_start)
                self.completed(completion, comp, bool(result.fallback), inf)
                self.record_inference(span, completion, result.timings.ttft / 1000.0)
            self.record_root(root, completion)
            return completion

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams,
        conversation_id: str | None,
        compress: Callable[[], Compression],
        open_stream: Callable[[CompressedPrompt, SamplingParams], Iterator[CompletionChunk]],
        finish: Finish,
        *,
        parent: otel_context.Context | None = None,
        root_extra: dict[str, Any] | None = None,
    ) -> Iterator[CompletionChunk]:
        """One traced streaming request: compress, stream the backend's chunks, finish the last one.

        The spans are attached to the context only around this generator's own work, never across a
        yield: a span left current while the consumer runs would parent the consumer's spans, and an
        async consumer resumes this generator in other contexts, where the detach would fail.
        """
        tel = self.telemetry
        attributes = self.root_attributes(prompt, conversation_id, root_extra)
        root = tel.start_span("specprefill.pipeline", attributes, context=parent)
        span: Span | None = None
        chunks: Iterator[CompletionChunk] | None = None
        failed: BaseException | None = None
        backend_start = 0.0
        try:
            with tel.activate(root):
                comp = compress()
                self.compressed(root, comp)
                inf = self.inference(
                    operation(prompt), params, comp.compressed.kept, stream=True, conversation_id=conversation_id
                )
                span = tel.start_span(inf.name, inf.attributes, kind=SpanKind.CLIENT)
            backend_start = time.perf_counter()
            first_chunk_s: float | None = None
            with tel.activate(span):
                chunks = iter(open_stream(comp.compressed, params))
            while True:
                with tel.activate(span):
                    chunk = next(chunks, _DONE)
                if chunk is _DONE:
                    break
                assert isinstance(chunk, CompletionChunk)
                if first_chunk_s is None and (chunk.text or chunk.token_ids):
                    first_chunk_s = time.perf_counter() - backend_start
                    span.add_event("gen_ai.first_chunk")
                    tel.time_to_first_chunk.record(first_chunk_s, inf.metric_attributes)
                if chunk.completion is not None:
                    self.duration(backend_start, inf)
                    completion = finish(chunk.completion, comp, backend_start)
                    self.completed(completion, comp, bool(chunk.completion.fallback), inf)
                    self.record_inference(span, completion, first_chunk_s)
                    self.record_root(root, completion)
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
                self.duration(backend_start, inf, exc)
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

    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams,
        compress: Callable[[], list[Compression]],
        run: Callable[[list[CompressedPrompt], SamplingParams], list[Completion]],
        finish: Finish,
    ) -> list[Completion]:
        """One traced batch: one root, the compress step's spans, one inference span for the whole batch."""
        tel = self.telemetry
        with tel.span(
            "specprefill.pipeline",
            {
                "specprefill.batch_size": len(prompts),
                "specprefill.prompt_tokens": sum(p.n for p in prompts),
                "gen_ai.request.model": self._model,
            },
        ) as root:
            comps = compress()
            # One scoring call for the batch: its fallback, if any, is the same for every prompt it scored.
            for comp in [c for c in comps if c.fallback][:1]:
                self.compressed(root, comp)
            ops = {operation(p) for p in prompts}
            op = ops.pop() if len(ops) == 1 else "chat"
            inf = self.inference(op, params, sum(c.compressed.kept for c in comps), stream=False)
            with tel.span(inf.name, inf.attributes, kind=SpanKind.CLIENT) as span:
                backend_start = time.perf_counter()
                try:
                    results = run([c.compressed for c in comps], params)
                except BaseException as exc:
                    self.duration(backend_start, inf, exc)
                    raise
                self.duration(backend_start, inf)
                completions = []
                for result, comp in zip(results, comps, strict=True):
                    completion = finish(result, comp, backend_start)
                    self.completed(completion, comp, bool(result.fallback), inf)
                    completions.append(completion)
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


@functools.cache
def _off() -> StageTrace:
    return StageTrace(Telemetry(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider()), None)
