"""The serving engine: one target backend and one draft scorer per process, model work off the loop.

`ServingEngine` turns validated requests into pipeline calls. Every piece of model work (prompt
building, scoring, prefill, decoding) runs on a small thread pool of ``max_concurrency`` workers,
behind the bounded `Admission` queue. A request's ``specprefill`` options pick a policy preset and
override its fields; the pipelines built from them are cached and share the loaded models.
Conversations kept on the server (``specprefill.conversation_id``) live in its `ConversationStore`;
their turns run on the same workers, behind the same queue. With ``scoring_queue`` on, the draft
scorer of every pipeline scores through one `ScoringQueue`, so that concurrent requests' prompts
are scored together in batches.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace

from .._cancel import REQUEST_CANCEL, check_cancelled
from .._timing import REQUEST_TIMES, RequestTimes, elapsed_ms, record
from ..conversation import STRATEGIES, Conversation
from ..errors import (
    ContextTooLongError,
    InvalidRequestError,
    ModelLoadError,
    NotFoundError,
    PolicyError,
    SpecPrefillError,
)
from ..interfaces import Backend, ModelScorer, Scorer
from ..pipeline import Pipeline
from ..policies import DEPRECATED_PRESETS, Policy, build_pipeline, list_policies, load_policy, preset_name
from ..prompt import PromptInput, ToolsInput
from ..scoring.queue import QueuedScorer, ScoringQueue
from ..selection import DenseBelow
from ..types import (
    Completion,
    CompletionChunk,
    CompressedPrompt,
    Message,
    Prompt,
    SamplingParams,
)
from ..validation import check_int
from .config import ServerConfig
from .errors import RequestTooLargeError, ShuttingDownError
from .limits import Admission, Drain, Ticket
from .schemas import ConversationUsage, SpecPrefillOptions
from .sessions import ConversationStore, StoredConversation

if TYPE_CHECKING:
    from .metrics import ServerMetrics

__all__ = [
    "RequestContext",
    "ServingEngine",
    "StreamHandle",
    "Turn",
    "WarmUp",
    "check_chat_template",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_PIPELINE_CACHE = 64
#: Temperatures and top_p values below this decode greedily.
SAMPLING_EPS = 1e-5
#: The warm-up prompt: this sentence, repeated until the prompt has the asked number of tokens.
_WARMUP_SENTENCE = "The keeper of the lighthouse wrote down the wind, the tide and every passing ship. "


@dataclass(frozen=True)
class WarmUp:
    """What `ServingEngine.warm_up` ran: the prompt's and the kept tokens, and the seconds it took."""

    prompt_tokens: int
    kept_tokens: int
    seconds: float


class RequestContext:
    """One request's execution context: its trace parent and cancel event, carried into every worker-thread step.

    All steps of a request run inside one `contextvars.Context`, so spans opened in one step (a
    streaming generator's) are closed in the same context by a later step. ``arrived`` is when the
    request was received (``time.perf_counter``; ``arrived`` when given, else now), where its
    end-to-end latency starts; the request's prompt waiting in the scoring queue is the one
    `ServingEngine.cancel` drops. ``times`` collects the stage times its steps record (`REQUEST_TIMES`).
    """

    def __init__(self, headers: Mapping[str, str] | None = None, arrived: float | None = None) -> None:
        self.arrived = time.perf_counter() if arrived is None else arrived
        self.times = RequestTimes()
        self._ctx = contextvars.copy_context()
        self._ctx.run(REQUEST_TIMES.set, self.times)
        #: Set when the request is cancelled (its client went away): see `ServingEngine.cancel`.
        self.cancelled = threading.Event()
        self._ctx.run(REQUEST_CANCEL.set, self.cancelled)
        if headers and not trace.get_current_span().get_span_context().is_valid:
            # Continue the caller's W3C trace (traceparent/tracestate) unless a server span is active.
            carrier = {k.lower(): v for k, v in headers.items() if k.lower() in ("traceparent", "tracestate")}
            if carrier:
                self._ctx.run(otel_context.attach, propagate.extract(carrier))
        self._lock = threading.Lock()

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` inside this request's context (one step at a time)."""
        with self._lock:
            return self._ctx.run(fn, *args)


_DONE = object()


class StreamHandle:
    """A running stream: steps and closes a synchronous chunk iterator on the engine's workers.

    ``request`` is what the stream answers (a `Prepared` request or a `Turn`), for the metrics of its end.
    """

    def __init__(
        self,
        engine: ServingEngine,
        ctx: RequestContext,
        iterator: Iterator[CompletionChunk],
        ticket: Ticket,
        request: Prepared | Turn,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._engine = engine
        self._ctx = ctx
        #: The request's context (its arrival and stage times, for the usage).
        self.ctx = ctx
        self._iterator = iterator
        self._ticket = ticket
        self._request = request
        self._on_close = on_close
        self._closed = False
        self._finished = False

    async def next(self) -> CompletionChunk | None:
        """The next chunk, or None at the end."""
        chunk = await self._engine.call(self._ctx, next, self._iterator, _DONE)
        if chunk is _DONE:
            self._finished = True
            return None
        if chunk.finish_reason is not None:
            self._finished = True
            if chunk.completion is not None:
                self._engine.finished(self._ctx, self._ticket, self._request, chunk.completion)
        return chunk

    async def aclose(self) -> None:
        """Stop the generation and give the slot back (safe to call twice; never cancelled midway)."""
        if self._closed:
            return
        self._closed = True
        if not self._finished:
            self._engine.cancelled_streams += 1
            if self._engine.metrics is not None:
                self._engine.metrics.aborted()
            why = "the server is shutting down" if self._engine.drain.started else "the client went away"
            logger.info("a stream was stopped before its end (%s)", why)
            # a first step still waiting for its scores would hold the context's lock until scored
            self._engine.cancel(self._ctx)
        try:
            close = getattr(self._iterator, "close", None)
            if close is not None:
                # The lock in RequestContext waits for a step still running in a worker thread.
                await self._engine.call(self._ctx, close)
        except Exception:
            logger.exception("closing a stream failed")
        finally:
            self._engine.admission.release(self._ticket)
            if self._on_close is not None:
                self._on_close()


@dataclass(frozen=True)
class Prepared:
    """What a request resolves to before generation: a pipeline call or a pre-compressed prompt."""

    pipeline: Pipeline | None
    prompt: Prompt | None
    compressed: CompressedPrompt | None
    params: SamplingParams


@dataclass(frozen=True)
class Turn:
    """A conversation turn ready to run: the stored conversation, the new message, the sampling."""

    entry: StoredConversation
    conversation: Conversation
    message: Message
    params: SamplingParams


class _Primed:
    """A chunk iterator whose first chunk was already computed (so set-up errors surface before streaming)."""

    def __init__(self, first: CompletionChunk, rest: Generator[CompletionChunk, None, None]) -> None:
        self._first: CompletionChunk | None = first
        self._rest = rest

    def __iter__(self) -> _Primed:
        return self

    def __next__(self) -> CompletionChunk:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return next(self._rest)

    def close(self) -> None:
        self._rest.close()


class ServingEngine:
    """Holds the loaded backend and draft scorer, the admission queue and the worker threads.

    Args:
        backend: the target (one per process).
        scorer: the draft scorer for the default policy (one per process); per-request options derive
            variants from it that share its model.
        config: the server's settings (the default policy, limits, conversations).
        tracer_provider, meter_provider: OpenTelemetry providers for the pipelines.
    """

    def __init__(
        self,
        backend: Backend,
        scorer: Scorer | None,
        *,
        config: ServerConfig | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> None:
        config = config or ServerConfig()
        policy = config.policy
        max_concurrency = config.max_concurrency
        assert max_concurrency is not None  # ServerConfig resolves None to its engine's default
        self.backend = backend
        self.config = config
        self.default_policy = policy
        self.served_model = config.served_model_name or backend.model_name
        self.max_prompt_tokens = config.max_prompt_tokens
        self.max_output_tokens = config.max_output_tokens
        self.default_max_tokens = config.default_max_tokens
        self.admission = _Admission(max_concurrency, config.max_queue, on_release=self._released)
        #: The shutdown: `begin_shutdown` starts it, ``config.shutdown_grace`` seconds later it is over.
        self.drain = Drain(config.shutdown_grace)
        #: Streams stopped before their end because the client went away.
        self.cancelled_streams = 0
        #: Non-streaming requests stopped, queued or running, because the client went away (`left`).
        self.cancelled_requests = 0
        self._executor = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="specprefill-model")
        self._telemetry = {"tracer_provider": tracer_provider, "meter_provider": meter_provider}
        self._pipelines: OrderedDict[tuple[Any, ...], Pipeline] = OrderedDict()
        self._pipelines_lock = threading.Lock()
        self._base_scorer = scorer
        self._dense: Pipeline | None = None
        #: The queue every pipeline's draft scorer scores through (None: ``scoring_queue`` is off).
        self.scoring: ScoringQueue | None = None
        if config.scoring_queued and scorer is not None:
            # By default every prompt is a batch of its own: a prompt scored beside others can keep other
            # tokens (rounding, docs/server.md), and an answer should not depend on the load. A batch
            # waits for more prompts only while more requests run than prompts wait: a request alone is
            # scored at once.
            self.scoring = ScoringQueue(
                config.scoring_batch_tokens or 1, config.scoring_wait_ms, active=lambda: self.admission.stats().running
            )
        self._policy_names = sorted(list_policies())
        if policy in DEPRECATED_PRESETS:
            policy = self.default_policy = preset_name(policy)
        if self._policy_names and policy not in self._policy_names:
            raise PolicyError(f"unknown policy {policy!r}; choose one of {', '.join(self._policy_names)}")
        self.vocab_size = len(backend.tokenizer)
        #: The tokenizer's special tokens as text: a chat message holding one would forge template markup.
        self.special_tokens = _special_token_texts(backend.tokenizer)
        check_chat_template(backend)
        self.max_context = int(backend.max_context)
        #: Conversations kept on the server (``specprefill.conversation_id``).
        self.conversations = ConversationStore(
            config.session_ttl, config.max_sessions, max_per_owner=config.sessions_per_key or None
        )
        self.default_strategy = config.session_strategy
        #: The draft model's name (None without a draft scorer), as every pipeline here reports it.
        self.draft_name = self.pipeline_for_disabled().draft_name
        #: The warm-up this engine ran (`warm_up`), or None.
        self.warmed_up: WarmUp | None = None
        #: The Prometheus metrics (``config.metrics``), or None.
        self.metrics: ServerMetrics | None = self._metrics() if config.metrics else None

    # ------------------------------------------------------------------ facts
    @property
    def policies(self) -> list[str]:
        return list(self._policy_names)

    def check_model(self, model: str | None) -> None:
        """Raise `NotFoundError` (404) unless ``model`` is absent or the served model's id."""
        if model is not None and model != self.served_model:
            raise NotFoundError(
                f"model {model!r} is not served here; this server serves {self.served_model!r}",
                param="model",
                code="model_not_found",
            )

    def check_messages(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Refuse chat text holding one of the tokenizer's special tokens (400 naming the field).

        The chat template writes a message's text into the prompt and the tokenizer reads every
        special token in it as the control token itself: ``<|im_end|>`` then ``<|im_start|>system``
        in a user message would end the turn and open a system turn the client was not given.
        """
        if not self.special_tokens:
            return
        for i, message in enumerate(messages):
            content = message.get("content")
            parts = [(f"messages.{i}.content", content)] if isinstance(content, str) else []
            if isinstance(content, list):
                parts = [(f"messages.{i}.content.{j}.text", p.get("text")) for j, p in enumerate(content)]
            for param, text in parts:
                found = next((t for t in self.special_tokens if isinstance(text, str) and t in text), None)
                if found is not None:
                    raise InvalidRequestError(
                        f"{param} holds the special token {found!r}: the chat template would read it as "
                        "markup (a forged turn); remove it, or send the whole text to POST /v1/completions",
                        param=param,
                        code="special_token_in_text",
                    )

    def _metrics(self) -> ServerMetrics:
        try:
            from .metrics import ServerMetrics
        except ImportError as exc:
            raise SpecPrefillError(
                f"serving metrics needs prometheus-client (missing module {exc.name!r}); install it with: "
                "pip install 'specprefill-sdk[server]'",
                code="missing_dependency",
            ) from exc
        strategies = STRATEGIES if self.conversations.enabled else ()
        return ServerMetrics(
            self.served_model, self.admission, self.conversations, max_model_len=self.max_context, strategies=strategies
        )

    def finished(self, ctx: RequestContext, ticket: Ticket, request: Prepared | Turn, completion: Completion) -> None:
        """Record a request that ``completion`` answered in the metrics (nothing when they are off).

        Every completion route calls this once, when its request finished (streamed or not): what is
        recorded is decided here and in `ServerMetrics.finished`, never per route.
        """
        if self.metrics is None:
            return
        if isinstance(request, Turn):
            disabled = request.conversation.pipeline is self.pipeline_for_disabled()
            strategy: str | None = request.conversation.strategy
        else:
            disabled = request.pipeline is self.pipeline_for_disabled()
            strategy = None
        e2e_s = time.perf_counter() - ctx.arrived
        self.metrics.finished(completion, e2e_s=e2e_s, queued_s=ticket.waited, disabled=disabled, strategy=strategy)

    # ------------------------------------------------------------------ threads
    async def call(self, ctx: RequestContext, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on a model worker thread inside the request's context."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, ctx.run, fn, *args)

    def begin_shutdown(self) -> None:
        """Start shutting down (on the event loop): queued and new requests get 503 from now on.

        Running requests go on for ``config.shutdown_grace`` seconds (`drain`); what still runs then
        is ended by its route (`until_grace_over`, and the streams' error event).
        """
        if self.drain.started:
            return
        running = self.admission.stats()
        logger.info(
            "shutting down: %d running request(s) get %g s to finish, %d queued one(s) are refused",
            running.running,
            self.drain.grace_s,
            running.waiting,
        )
        self.admission.close("the server is shutting down; retry later (another instance, or this one restarted)")
        self.drain.begin()

    async def until_grace_over(self, ctx: RequestContext, work: Awaitable[T]) -> T:
        """``await work``, unless the shutdown's grace period ends first: then `ShuttingDownError` (503).

        The request is cancelled (`cancel`); a model step already running on a worker finishes there
        and its result is dropped.
        """
        task = asyncio.ensure_future(work)
        over = asyncio.ensure_future(self.drain.over())
        try:
            await asyncio.wait({task, over}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            over.cancel()
            if not task.done():
                task.cancel()
        if task.cancelled() or not task.done():
            self.cancel(ctx)
            raise ShuttingDownError(
                f"the server shut down before this request finished (it waits {self.drain.grace_s:g} s for running "
                "requests); retry later"
            )
        return task.result()

    def shutdown(self) -> None:
        if self.scoring is not None:
            self.scoring.close(timeout=0)  # prompts still waiting fail; a batch being scored ends on its own
        self._executor.shutdown(wait=False, cancel_futures=True)

    def cancel(self, ctx: RequestContext) -> None:
        """Cancel a request whose client went away: its prompt still waiting to be scored is dropped.

        The request's step that waited for it raises `RequestCancelledError` (no dense fallback); a
        non-streaming generation on the transformers backend, and a conversation turn, stop at their
        next token (`GenerationStopped`). A batch being scored and a prefill run to their end.
        """
        if self.scoring is not None:
            dropped = self.scoring.cancel(ctx.cancelled)
            if dropped:
                logger.info("dropped a prompt waiting to be scored: its client went away")
        else:
            ctx.cancelled.set()

    def left(self, generated: int = 0) -> None:
        """Record a non-streaming request stopped because its client went away, after ``generated`` tokens."""
        self.cancelled_requests += 1
        logger.info("a request was stopped after %d generated tokens: its client went away", generated)
        if self.metrics is not None:
            self.metrics.aborted(generated)

    def _released(self) -> None:
        if self.scoring is not None:
            self.scoring.wake()  # one running request fewer: a waiting batch may not need to wait

    def warm_up(self, tokens: int) -> WarmUp:
        """Serve one request of up to ``tokens`` prompt tokens, and prefill it whole, on a model worker.

        The result is kept as `warmed_up`.

        With ``compile=True`` the first long prompts compile the draft's and the target's passes (tens
        of seconds, once per process); a server that warms up before it accepts requests pays that at
        start instead of in its first requests. The prompt is a repeated sentence of text, cut to fit
        ``tokens``, the context and ``max_prompt_tokens``: it goes through the default policy's
        pipeline (scoring, selection, the kept prefill, one token), and the backend then prefills
        all of it, since a selection keeps too few tokens to reach the compiled prefill of a long
        kept prompt.

        Raises:
            InvalidRequestError: ``tokens`` is below 1.
            SpecPrefillError: the warm-up request failed (``code="warmup_failed"``).
        """
        check_int(tokens, "the warm-up's prompt tokens", param="warmup_tokens", minimum=1)
        self.warmed_up = self._executor.submit(self._warm_up, tokens).result()
        return self.warmed_up

    def _warm_up(self, tokens: int) -> WarmUp:
        started = time.perf_counter()
        limit = min(tokens, self.max_context - 2, self.max_prompt_tokens or tokens)
        try:
            served = self.pipeline_for(None)
            selector = served.selector
            if isinstance(selector, DenseBelow):  # a warm-up shorter than the threshold still runs the draft
                selector = selector.inner
            # the same scorer, selector and backend, without telemetry: the warm-up is no request
            pipeline = Pipeline(
                served.scorer,
                selector,
                self.backend,
                tracer_provider=trace.NoOpTracerProvider(),
                meter_provider=metrics.NoOpMeterProvider(),
                fallback_on_scorer_error=False,  # a failing draft fails the warm-up, not falls back
                dense_when_slower=False,  # the warm-up runs the draft whatever the costs say
            )
            per_sentence = max(1, pipeline.prompt(_WARMUP_SENTENCE * 8).n // 8)
            repeats = max(1, limit // per_sentence)
            prompt = pipeline.prompt(_WARMUP_SENTENCE * repeats)
            while prompt.n > limit and repeats > 1:  # the first and last tokens may tokenize apart
                repeats = max(1, min(repeats - 1, repeats * limit // prompt.n))
                prompt = pipeline.prompt(_WARMUP_SENTENCE * repeats)
            if prompt.n > limit:  # a limit shorter than one sentence
                prompt = Prompt.from_token_ids(prompt.token_ids[:limit])
            completion = pipeline.generate(prompt, SamplingParams(max_tokens=1))
            self.backend.generate(CompressedPrompt.dense(prompt), SamplingParams(max_tokens=2))
        except Exception as exc:  # any failure of the models: the server should not start half-working
            detail = str(exc) if isinstance(exc, SpecPrefillError) else f"{type(exc).__name__}: {exc}"
            raise SpecPrefillError(f"the warm-up request failed: {detail}", code="warmup_failed") from exc
        done = WarmUp(prompt.n, completion.usage.kept_tokens, time.perf_counter() - started)
        logger.info(
            "warmed up on a %d-token prompt (%d kept) in %.1f s", done.prompt_tokens, done.kept_tokens, done.seconds
        )
        return done

    # ------------------------------------------------------------------ pipelines
    def pipeline_for(self, options: SpecPrefillOptions | None) -> Pipeline:
        """The pipeline for a request's options, or a new conversation's (cached; all share the loaded models).

        The policy decides whether the process's draft scorer serves as it is or through a variant
        sharing its model (`specprefill_sdk.policies.build_pipeline`).

        Raises:
            PolicyError: unknown policy name or an invalid override.
        """
        if options is not None and not options.enabled:
            return self.pipeline_for_disabled()
        name = (options.policy if options is not None else None) or self.default_policy
        if name in DEPRECATED_PRESETS:
            name = preset_name(name)  # an earlier name shares the pipelines of the preset it now loads
        if name not in self._policy_names:
            raise PolicyError(
                f"unknown policy {name!r}; choose one of {', '.join(self._policy_names) or '(none installed)'}",
                param="specprefill.policy",
            )
        overrides = options.overrides() if options is not None else {}
        key = ("policy", name, tuple(sorted(overrides.items())))
        return self._cached(key, lambda: self._build(load_policy(name).with_overrides(**overrides)))

    def pipeline_for_disabled(self) -> Pipeline:
        """The pipeline of requests that turn compression off: every token kept, the draft never runs.

        Built once and kept outside the cache, so that a request's pipeline tells by identity whether
        its compression was off.
        """
        if self._dense is None:
            self._dense = self._build(None)
        return self._dense

    def _build(self, policy: Policy | None) -> Pipeline:
        pipeline = build_pipeline(policy, self._base_scorer, self.backend, **self._telemetry)
        scorer = pipeline.scorer
        # Only a scorer that runs a draft gains from batching; baselines score at once.
        if self.scoring is not None and isinstance(scorer, ModelScorer) and scorer.model_name is not None:
            pipeline.scorer = QueuedScorer(scorer, self.scoring)
        return pipeline

    def _cached(self, key: tuple[Any, ...], build: Callable[[], Pipeline]) -> Pipeline:
        with self._pipelines_lock:
            pipe = self._pipelines.get(key)
            if pipe is not None:
                self._pipelines.move_to_end(key)
                return pipe
        pipe = build()
        with self._pipelines_lock:
            self._pipelines[key] = pipe
            while len(self._pipelines) > _PIPELINE_CACHE:
                self._pipelines.popitem(last=False)
        return pipe

    # ------------------------------------------------------------------ preparing requests
    def prepare(
        self,
        prompt_input: PromptInput | Prompt | None,
        options: SpecPrefillOptions | None,
        sampling: dict[str, Any],
        tools: ToolsInput | None = None,
    ) -> Prepared:
        """Resolve a request (in a worker thread): tokenize (``tools`` through the chat template), check
        limits, pick the pipeline.

        Raises:
            InvalidRequestError, PolicyError, ContextTooLongError: 400.
            RequestTooLargeError: the prompt exceeds ``max_prompt_tokens`` (413).
        """
        if options is not None and options.conversational:
            raise InvalidRequestError(
                "conversations kept on the server are served on POST /v1/chat/completions only",
                param="specprefill.conversation_id",
            )
        if options is not None and options.precompressed:
            if prompt_input is not None:
                raise InvalidRequestError(
                    "give either the prompt (prompt/messages) or specprefill.prompt_token_ids, not both",
                    param="specprefill.prompt_token_ids",
                )
            compressed = self._precompressed(options)
            return Prepared(None, None, compressed, self._sampling(sampling, compressed.n))
        if prompt_input is None:
            raise InvalidRequestError("the request has no prompt", param="messages")
        pipeline = self.pipeline_for(options)
        started = time.perf_counter()
        prompt = pipeline.prompt(prompt_input, tools=tools)
        # min/max run in C: a generator over a long prompt's ids costs milliseconds.
        if prompt.n and (min(prompt.token_ids) < 0 or max(prompt.token_ids) >= self.vocab_size):
            raise InvalidRequestError(f"token ids must lie in [0, {self.vocab_size})", param="prompt")
        record("tokenize", elapsed_ms(started))
        self._check_prompt_length(prompt.n, "prompt" if isinstance(prompt_input, str | Prompt) else "messages")
        return Prepared(pipeline, prompt, None, self._sampling(sampling, prompt.n))

    def _check_prompt_length(self, n: int, param: str) -> None:
        if self.max_prompt_tokens is not None and n > self.max_prompt_tokens:
            raise RequestTooLargeError(
                f"the prompt has {n} tokens; this server accepts at most {self.max_prompt_tokens}",
                param=param,
                code="prompt_too_long",
            )
        if n >= self.max_context:
            raise ContextTooLongError(
                f"the prompt has {n} tokens; the model's context is {self.max_context}", param=param
            )

    def _sampling(self, sampling: dict[str, Any], n: int, context: int | None = None) -> SamplingParams:
        values = {k: v for k, v in sampling.items() if v is not None}
        # A vanishing temperature or top_p leaves only the most likely token: decode greedily, as
        # dividing logits by ~0 (or cutting the distribution to nothing) has no defined sample.
        if values.get("temperature", 1.0) < SAMPLING_EPS or values.get("top_p", 1.0) < SAMPLING_EPS:
            values["temperature"] = 0.0
            values.pop("top_p", None)
        limit = self.max_output_tokens
        context = self.max_context if context is None else context
        if "max_tokens" not in values:
            # A client that names no max_tokens wants the whole answer: what the context leaves (as
            # vLLM does), within the server's limits, rather than an answer cut at a fixed length.
            default = context - n
            for cap in (self.default_max_tokens, limit):
                if cap is not None:
                    default = min(default, cap)
            values["max_tokens"] = max(1, default)
        elif limit is not None and values["max_tokens"] > limit:
            raise InvalidRequestError(
                f"max_tokens is {values['max_tokens']}; this server generates at most {limit} tokens per request",
                param="max_tokens",
            )
        if n + values["max_tokens"] > context:
            raise ContextTooLongError(
                f"the prompt has {n} tokens and asks for {values['max_tokens']} more: that exceeds the "
                f"model's context of {context} tokens",
                param="max_tokens",
            )
        return SamplingParams(**values)

    def _precompressed(self, options: SpecPrefillOptions) -> CompressedPrompt:
        ids = options.prompt_token_ids or []
        positions = options.position_ids or []
        if len(ids) != len(positions):
            raise InvalidRequestError(
                f"prompt_token_ids has {len(ids)} entries but position_ids has {len(positions)}: "
                "they must have the same length",
                param="specprefill.position_ids",
            )
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token id {bad} is outside the vocabulary [0, {self.vocab_size})", param="specprefill.prompt_token_ids"
            )
        if positions[0] < 0 or any(b <= a for a, b in itertools.pairwise(positions)):
            raise InvalidRequestError(
                "position_ids must be non-negative and strictly increasing", param="specprefill.position_ids"
            )
        if positions[-1] >= self.max_context:
            raise ContextTooLongError(
                f"position {positions[-1]} is beyond the model's context of {self.max_context} tokens",
                param="specprefill.position_ids",
            )
        n = options.prompt_length if options.prompt_length is not None else positions[-1] + 1
        if n <= positions[-1]:
            raise InvalidRequestError(
                f"prompt_length {n} must exceed the last position {positions[-1]}", param="specprefill.prompt_length"
            )
        # n is what prompt_length says, or what the last position implies.
        self._check_prompt_length(
            n, "specprefill.prompt_length" if options.prompt_length is not None else "specprefill.position_ids"
        )
        return CompressedPrompt(token_ids=tuple(ids), position_ids=tuple(positions), n=n)

    # ------------------------------------------------------------------ running
    def run_generate(self, prepared: Prepared) -> Completion:
        """Generate (in a worker thread).

        Raises:
            GenerationStopped: the request was cancelled (`cancel`) while it generated: the
                transformers backend stops at its next token.
        """
        if prepared.compressed is not None:
            return self.backend.generate(prepared.compressed, prepared.params)
        assert prepared.pipeline is not None and prepared.prompt is not None
        return prepared.pipeline.generate(prepared.prompt, prepared.params)

    def open_stream(self, prepared: Prepared) -> Iterator[CompletionChunk]:
        """Start a stream (in a worker thread); closing the iterator stops the generation."""
        if prepared.compressed is not None:
            return self.backend.stream(prepared.compressed, prepared.params)
        assert prepared.pipeline is not None and prepared.prompt is not None
        return prepared.pipeline.stream(prepared.prompt, prepared.params)

    # ------------------------------------------------------------------ conversations
    def begin_turn(
        self,
        entry: StoredConversation,
        options: SpecPrefillOptions,
        messages: Sequence[Mapping[str, Any]] | None,
        sampling: dict[str, Any],
    ) -> Turn:
        """Check a conversation turn and resolve it (in a worker thread); starts the conversation if new.

        Raises:
            InvalidRequestError, PolicyError, ContextTooLongError: 400.
            RequestTooLargeError: the whole conversation exceeds ``max_prompt_tokens`` (413).
        """
        if options.precompressed:
            raise InvalidRequestError(
                "a conversation takes messages, not specprefill.prompt_token_ids", param="specprefill.prompt_token_ids"
            )
        if not messages:
            raise InvalidRequestError("the request has no messages", param="messages")
        given = [Message.coerce(m) for m in messages]
        conversation = entry.conversation
        if conversation is None:
            strategy = options.conversation_strategy or self.default_strategy
            conversation = Conversation(
                self.pipeline_for(options), strategy, history=given[:-1], conversation_id=entry.id
            )
            message = given[-1]
        else:
            self._check_continuation(conversation, options)
            message = _new_message(conversation.history, given)
        if message.role != "user":
            raise InvalidRequestError(
                f"the new message of a conversation must have role 'user', not {message.role!r}", param="messages"
            )
        if not message.content.strip():
            raise InvalidRequestError("the new message is empty", param="messages")
        prompt = conversation.pipeline.prompt([*conversation.history, message])
        if self.max_prompt_tokens is not None and prompt.n > self.max_prompt_tokens:
            raise RequestTooLargeError(
                f"the conversation has {prompt.n} tokens with the new message; this server accepts at most "
                f"{self.max_prompt_tokens}: start a new conversation with fewer messages",
                param="messages",
                code="prompt_too_long",
            )
        context = conversation.max_context
        if prompt.n >= context:
            raise ContextTooLongError(
                f"the conversation has {prompt.n} tokens with the new message; its context is {context}: start a "
                "new conversation with fewer messages",
                param="messages",
            )
        params = self._sampling(sampling, prompt.n, context)
        entry.conversation = conversation
        return Turn(entry, conversation, message, params)

    @staticmethod
    def _check_continuation(conversation: Conversation, options: SpecPrefillOptions) -> None:
        strategy = options.conversation_strategy
        if strategy is not None and strategy != conversation.strategy:
            raise InvalidRequestError(
                f"conversation {conversation.id!r} uses strategy {conversation.strategy!r}; a strategy is set "
                "when a conversation starts",
                param="specprefill.conversation_strategy",
            )
        fixed = sorted(options.model_fields_set - _PER_TURN_OPTIONS)
        if fixed:
            raise InvalidRequestError(
                f"specprefill.{fixed[0]} is set when a conversation starts; a later turn may only send "
                "conversation_id and return_token_ids",
                param=f"specprefill.{fixed[0]}",
            )

    def run_turn(self, turn: Turn) -> Completion:
        """Answer a conversation turn (in a worker thread).

        Raises:
            GenerationStopped: the request was cancelled (`cancel`): the turn stops at its next
                token and keeps its answer so far in the history, as a stream closed early does.
        """
        chunks = self._turn_chunks(turn)
        generated = 0
        try:
            for chunk in chunks:
                if chunk.completion is not None:
                    return chunk.completion
                generated += len(chunk.token_ids)
                check_cancelled(generated, turn.params.max_tokens)
        finally:
            chunks.close()
        raise SpecPrefillError("the turn ended without a completion", code="internal_error")

    def open_turn_stream(self, turn: Turn) -> Iterator[CompletionChunk]:
        """Start streaming a conversation turn (in a worker thread): the prefill runs before this returns."""
        chunks = self._turn_chunks(turn)
        first = next(chunks)
        return _Primed(first, chunks)

    @staticmethod
    def _turn_chunks(turn: Turn) -> Generator[CompletionChunk, None, None]:
        # Request errors are raised here, before the turn changes anything: the conversation stays.
        chunks = turn.conversation.stream(turn.message, turn.params)
        return ServingEngine._watched(turn, chunks)

    @staticmethod
    def _watched(turn: Turn, chunks: Generator[CompletionChunk, None, None]) -> Generator[CompletionChunk, None, None]:
        try:
            yield from chunks
        except GeneratorExit:
            raise
        except BaseException as exc:
            # The caches may be half-updated: the store drops the conversation when the request ends.
            turn.entry.failed = f"{type(exc).__name__}: {exc}"
            raise

    @staticmethod
    def turn_usage(turn: Turn) -> ConversationUsage:
        """``usage.specprefill.conversation`` for a finished turn."""
        conversation = turn.conversation
        stats = conversation.turns[-1]
        return ConversationUsage(
            id=conversation.id,
            strategy=conversation.strategy,
            turn=stats.turn,
            messages=len(conversation.history),
            prefilled_tokens=stats.prefilled_tokens,
            reused_tokens=stats.reused_tokens,
            evicted_tokens=stats.evicted_tokens,
            draft_tokens=stats.draft_tokens,
        )


class _Admission(Admission):
    """`Admission` that reports each released slot (the scoring queue's batches wait on running requests)."""

    def __init__(self, max_concurrency: int, max_queue: int, *, on_release: Callable[[], None]) -> None:
        super().__init__(max_concurrency, max_queue)
        self._on_release = on_release

    def release(self, ticket: Ticket) -> None:
        held = not ticket.released
        super().release(ticket)
        if held:
            self._on_release()


def check_chat_template(backend: Backend) -> None:
    """Render a one-message conversation with the target's chat template, as a server does at start.

    A template that cannot render one is the model folder's fault, not any client's: the server
    refuses to start rather than answer every chat request with an error. A tokenizer without a
    template passes (a base model: chat requests are told to send plain text instead).

    Raises:
        ModelLoadError: the chat template fails (``code="invalid_chat_template"``).
    """
    tokenizer = backend.tokenizer
    if getattr(tokenizer, "chat_template", None) is None:
        return
    from ..prompt import build_prompt

    try:
        build_prompt(tokenizer, [Message("user", "Hello.")])
    except Exception as exc:
        detail = exc.message if isinstance(exc, SpecPrefillError) else f"{type(exc).__name__}: {exc}"
        raise ModelLoadError(
            f"the chat template of model {backend.model_name!r} cannot render a one-message conversation "
            f"({detail}): fix chat_template in the model folder (tokenizer_config.json or chat_template.jinja), "
            "or remove it to serve text completions only",
            code="invalid_chat_template",
        ) from exc


def _special_token_texts(tokenizer: Any) -> tuple[str, ...]:
    """The text of every special token the tokenizer reads out of plain text (longest first)."""
    texts = set(getattr(tokenizer, "all_special_tokens", None) or [])
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts.update(str(t.content) for t in added.values() if getattr(t, "special", False))
    return tuple(sorted((t for t in texts if t), key=len, reverse=True))


#: The ``specprefill`` fields a conversation's later turns may send.
_PER_TURN_OPTIONS = frozenset({"conversation_id", "conversation_strategy", "conversation_start", "return_token_ids"})


def _new_message(history: tuple[Message, ...], given: list[Message]) -> Message:
    """The new turn of a continued conversation: ``given`` is it alone, or the whole history then it."""
    k = len(history)
    if len(given) == k + 1 and tuple(given[:k]) == history:
        return given[-1]
    if len(given) == 1:
        return given[0]
    raise InvalidRequestError(
        f"a request that continues a conversation sends only the new user message (the server holds the "
        f"{k} earlier ones), or the conversation's whole history followed by it; got {len(given)} messages "
        "that are neither",
        param="messages",
    )
