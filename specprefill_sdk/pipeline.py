"""`Pipeline(scorer, selector, backend)`: chain the three stages; own nothing else.

`compress_prompts` is the compress step (score -> fallback -> select) that every driver calls
(conversations, text mode, the evaluation harness); spans and metrics are `specprefill_sdk.tracing`'s.

Example::

    from specprefill_sdk import Pipeline
    pipe = Pipeline.from_policy("paper", model="smollm2-135m")
    answer = pipe.generate([{"role": "user", "content": long_text + "\\nWho wrote it?"}], max_tokens=32)
    print(answer.text, answer.usage.kept_tokens, "/", answer.usage.prompt_tokens)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context

from ._aio import chunks_in_threads
from ._timing import elapsed_ms
from .cost import (
    CostModel,
    OverheadReport,
    WarmUpReport,
    best_time_ms,
    is_cuda,
    overhead_length,
    warmup_token_ids,
)
from .errors import ContextTooLongError, InvalidRequestError, RequestCancelledError
from .interfaces import Backend, Calibrated, KeepEstimating, LocalBackend, Scorer, Selector
from .prompt import PromptInput, ToolsInput, build_prompt
from .tracing import Finish, StageTrace, Telemetry, draft_name
from .types import (
    Completion,
    CompletionChunk,
    CompressedPrompt,
    Compression,
    Prompt,
    SamplingParams,
    Selection,
    TokenScores,
)

if TYPE_CHECKING:
    from .conversation import Conversation

__all__ = ["Compression", "Pipeline", "PipelineWarmUp", "compress_prompts"]

logger = logging.getLogger(__name__)


def compress_prompts(
    prompts: Sequence[Prompt],
    scorer: Scorer,
    selector: Selector,
    *,
    trace: StageTrace | None = None,
    fallback_on_scorer_error: bool = True,
    batch: bool = False,
    score: Callable[[list[int]], Sequence[TokenScores]] | None = None,
    cost: CostModel | None = None,
) -> list[Compression]:
    """Score -> fallback -> select, for each prompt: the compress step of every driver.

    A selector that decides without scores skips the scorer; the others are scored in one call
    (``score_batch`` if ``batch``, else ``score`` each). A scorer error other than `InvalidRequestError`
    or `RequestCancelledError` makes them dense, the reason in `Compression.fallback`, unless
    ``fallback_on_scorer_error`` is False.
    ``score(indices)`` replaces the scorer's call for drivers that score another prompt than the one they
    select from (a conversation's draft session, a document read with its query); ``scorer`` names it.
    ``cost``: before scoring, a prompt whose scoring plus kept prefill the model estimates no faster
    than its dense prefill (`CostModel.decide`, with the selector's `KeepEstimating.expected_kept`) is
    prefilled densely, unscored, with the fallback ``slower_than_dense: ...``; None: no such check.
    """
    trace = trace or StageTrace.off()
    decided = [selector.decide_without_scores(p) for p in prompts]
    slower: dict[int, str] = {}
    if cost is not None and isinstance(selector, KeepEstimating):
        for i, p in enumerate(prompts):
            kept = selector.expected_kept(p) if decided[i] is None else None
            verdict = None if kept is None else cost.decide(p.n, kept)
            if verdict is not None and verdict.dense:
                slower[i] = verdict.reason
                decided[i] = Selection.keep_all(p.n, reason="slower than dense")
        if slower:
            logger.debug("dense prefill of %d prompt(s): %s", len(slower), next(iter(slower.values())))
            trace.dense_by_cost(len(slower))
    todo = [i for i, d in enumerate(decided) if d is None]
    scores: dict[int, TokenScores] = {}
    score_ms = 0.0
    fallback: str | None = None
    if todo:
        t0 = time.perf_counter()
        need = [prompts[i] for i in todo]
        with trace.score_span(scorer, need, batch=batch) as span:
            try:
                if score is not None:
                    values = list(score(todo))
                else:
                    values = scorer.score_batch(need) if batch else [scorer.score(p) for p in need]
                scores = dict(zip(todo, values, strict=True))
            except Exception as exc:
                # a cancelled request wants no answer, so no dense one either
                if not fallback_on_scorer_error or isinstance(exc, InvalidRequestError | RequestCancelledError):
                    raise
                fallback = f"scorer_error: {type(exc).__name__}: {exc}"
                logger.warning("scorer failed, falling back to dense prefill: %s", fallback)
                trace.scorer_failed(span, exc, fallback, len(todo))
        score_ms = elapsed_ms(t0)
        trace.scored(scorer, score_ms)
        score_ms /= len(todo)
    out = []
    for i, prompt in enumerate(prompts):
        t0 = time.perf_counter()
        with trace.select_span(selector) as span:
            selection = decided[i]
            if selection is None:
                s = scores.get(i)
                selection = Selection.keep_all(prompt.n, reason="fallback") if s is None else selector.select(prompt, s)
            trace.selected(span, selection)
        used = decided[i] is None
        compressed = CompressedPrompt.from_selection(prompt, selection)
        reason = fallback if used else slower.get(i)
        out.append(Compression(compressed, score_ms if used else 0.0, elapsed_ms(t0), reason))
    return out


@dataclass(frozen=True)
class PipelineWarmUp:
    """What `Pipeline.warmup` did: each stage's warm-up (None: the stage has none) and the seconds in all.

    ``overhead``: the measured overhead of a compressed request beyond its scoring and kept prefill
    (`OverheadReport`, counted by `Pipeline.cost_model`); None where it was not measured (no cost
    model, ``dense_when_slower`` off, a selector that does not say how much it keeps, or no warm-up
    length at which it compresses).
    """

    seconds: float
    backend: WarmUpReport | None
    scorer: WarmUpReport | None
    overhead: OverheadReport | None = None

    @property
    def compiled(self) -> bool:
        """Whether any stage's passes run compiled (so the warm-up compiled them)."""
        return any(r is not None and r.compiled for r in (self.backend, self.scorer))


class Pipeline:
    """Scores a prompt with ``scorer``, keeps tokens by ``selector``, generates with ``backend``.

    A selector that decides without scores (keep rate 1.0, a dense decision for short prompts)
    skips the scorer. A scorer that fails makes the pipeline fall back to dense prefill; the
    `Completion` says so in ``fallback``. The scorer serializes its own use of its draft model.

    ``dense_when_slower`` (on by default): once the backend's prefill and the scorer's pass have been
    measured (`warmup`; `load_pipeline` runs it at load when the passes compile, on CUDA by default),
    a prompt for which scoring plus the kept prefill would not beat a dense prefill is prefilled
    densely without scoring, ``fallback="slower_than_dense: ..."`` (`cost_model`,
    `specprefill_sdk.cost`). False: always compress as the selector says.
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
        dense_when_slower: bool = True,
    ) -> None:
        if not isinstance(dense_when_slower, bool):
            raise InvalidRequestError(
                f"dense_when_slower must be True or False, got {dense_when_slower!r}", param="dense_when_slower"
            )
        self.scorer = scorer
        self.selector = selector
        self.backend = backend
        self.fallback_on_scorer_error = fallback_on_scorer_error
        self.dense_when_slower = dense_when_slower
        self.telemetry = Telemetry(tracer_provider, meter_provider)
        #: what `warmup` did, or None: it has not run on this pipeline
        self.warmed_up: PipelineWarmUp | None = None

    @property
    def cost_model(self) -> CostModel | None:
        """The backend's and the scorer's measured costs (`warmup`), or None: one of them is not measured.

        Its ``overhead_ms`` is what `warmup` measured (`PipelineWarmUp.overhead`), 0 where it did not.
        """
        backend, scorer = self.backend, self.scorer
        if not (isinstance(backend, Calibrated) and isinstance(scorer, Calibrated)):
            return None
        if backend.cost is None or scorer.cost is None:
            return None
        overhead = None if self.warmed_up is None else self.warmed_up.overhead
        return CostModel(
            prefill=backend.cost, score=scorer.cost, overhead_ms=0.0 if overhead is None else overhead.overhead_ms
        )

    @property
    def compiled(self) -> bool:
        """Whether the backend's or the scorer's passes run compiled (`ExecutionSettings.compile`)."""
        return any(isinstance(part, Calibrated) and part.compiled for part in (self.backend, self.scorer))

    def warmup(self, lengths: Sequence[int] | None = None) -> PipelineWarmUp:
        """Warm up the backend and the scorer (`Calibrated.warmup`): compile their passes, measure their costs.

        Afterwards no request pays for compiling, and `cost_model` (the ``dense_when_slower`` check)
        is known. ``lengths``: the prompt lengths each stage runs (default: the device's, see
        `TransformersBackend.warmup`). Seconds and curves are logged and kept in `warmed_up`.
        A stage that is not `Calibrated` (an HTTP backend, a baseline scorer) is left as it is; one
        that has warmed up already (shared with another pipeline) is not run again unless ``lengths``
        are given.

        Where the check is in use, one compressed request (a warm-up prompt of the longest measured
        length not above `specprefill_sdk.cost.OVERHEAD_MAX_TOKENS` at which the selector scores,
        one generated token, the check bypassed) is then timed end to end like the stages' passes;
        what it costs beyond the curves' scoring and kept prefill is the cost model's overhead
        (`PipelineWarmUp.overhead`). It runs as any request does, recording no spans or metrics.
        """
        started = time.perf_counter()

        def warm(part: object) -> WarmUpReport | None:
            if not isinstance(part, Calibrated):
                return None
            if part.warmed_up is not None and lengths is None:
                return part.warmed_up
            return part.warmup(lengths)

        backend, scorer = warm(self.backend), warm(self.scorer)
        overhead = self._measure_overhead(backend, scorer)
        self.warmed_up = PipelineWarmUp(time.perf_counter() - started, backend, scorer, overhead)
        checked = "" if self.cost_model is None else "; dense prefill is chosen where scoring would not pay"
        if overhead is not None:
            checked += (
                f" (a compressed request of {overhead.n} tokens took {overhead.request_ms:.1f} ms, "
                f"overhead {overhead.overhead_ms:.1f} ms beyond scoring and the prefill of {overhead.kept} kept tokens)"
            )
        logger.info("warmed up the pipeline in %.1f s%s", self.warmed_up.seconds, checked)
        return self.warmed_up

    def _measure_overhead(self, backend: WarmUpReport | None, scorer: WarmUpReport | None) -> OverheadReport | None:
        """Time one compressed warm-up request end to end against the curves' estimate (see `warmup`)."""
        cost = self.cost_model
        selector = self.selector
        if cost is None or not self.dense_when_slower or not isinstance(selector, KeepEstimating):
            return None
        if backend is None or scorer is None or not backend.cost.points or not scorer.cost.points:
            return None
        # lengths both curves were measured up to, so that the estimate interpolates
        longest_scored = max(n for n, _ in scorer.cost.points)
        ids = warmup_token_ids(self.backend.tokenizer, max(n for n, _ in backend.cost.points))
        candidates = [
            n
            for n, _ in backend.cost.points
            if n <= longest_scored and selector.decide_without_scores(Prompt.from_token_ids(ids[:n])) is None
        ]
        n = overhead_length(candidates)
        if n is None:
            logger.debug("no warm-up length is compressed by %s: the per-request overhead is not measured", selector)
            return None
        prompt = Prompt.from_token_ids(ids[:n])
        kept: list[int] = []

        def run() -> None:
            kept.append(self._request_unchecked(prompt, SamplingParams(max_tokens=1)).usage.kept_tokens)

        # The target's device: the draft's scores reach the host before the selection, so the end
        # of the target's work is the end of the request.
        device = self.backend.device if isinstance(self.backend, LocalBackend) else None
        request_ms = best_time_ms(run, device, warm=is_cuda(device))
        verdict = cost.decide(n, kept[-1])
        return OverheadReport(n, verdict.kept, request_ms, verdict.score_ms + verdict.kept_ms)

    def _request_unchecked(self, prompt: Prompt, params: SamplingParams) -> Completion:
        """`generate` without the ``dense_when_slower`` check, a scorer error raised, and nothing traced."""
        t0 = time.perf_counter()
        trace = StageTrace.off()

        def compress() -> Compression:
            scorer, selector = self.scorer, self.selector
            return compress_prompts([prompt], scorer, selector, trace=trace, fallback_on_scorer_error=False)[0]

        return trace.generate(prompt, params, None, compress, self.backend.generate, functools.partial(self.finish, t0))

    @property
    def trace(self) -> StageTrace:
        """The spans and metrics of this pipeline's stages."""
        return StageTrace(self.telemetry, self.backend)

    @classmethod
    def from_policy(cls, policy: str = "auto", **kwargs: Any) -> Pipeline:
        """Build a pipeline from a named policy preset (see `specprefill_sdk.policies.load_pipeline`).

        The default, ``auto``, is `specprefill_sdk.policies.DEFAULT_POLICY`.
        """
        from .policies import load_pipeline

        return load_pipeline(policy, **kwargs)

    def conversation(self, strategy: str = "recompute", **kwargs: Any) -> Conversation:
        """A multi-turn `Conversation` over this pipeline (strategies: recompute, incremental, refresh)."""
        from .conversation import Conversation

        return Conversation(self, strategy=strategy, **kwargs)

    @property
    def draft_name(self) -> str | None:
        """The scorer's draft model, when it runs one."""
        return draft_name(self.scorer)

    # ----------------------------------------------------------------- stages
    def prompt(
        self,
        prompt: PromptInput | Prompt,
        *,
        protected_spans: Sequence[tuple[int, int]] = (),
        tools: ToolsInput | None = None,
    ) -> Prompt:
        """Tokenize text or messages with the target's tokenizer (a `Prompt` passes through).

        ``tools``: tool definitions for the chat template (see `build_prompt`).
        """
        if isinstance(prompt, Prompt):
            if not prompt.n:
                raise InvalidRequestError("the prompt is empty", param="prompt")
            if tools is not None:
                raise InvalidRequestError("tools are rendered when a prompt is built, not into a Prompt", param="tools")
            return prompt
        return build_prompt(self.backend.tokenizer, prompt, protected_spans=protected_spans, tools=tools)

    def _check_length(self, prompt: Prompt, params: SamplingParams | None) -> None:
        """Raise `ContextTooLongError` when ``prompt`` plus ``max_tokens`` exceeds the target's context."""
        limit = self.backend.max_context
        need = prompt.n + (params.max_tokens if params else 0)
        if prompt.n >= limit or need > limit:
            more = f" and asks for {params.max_tokens} more" if params else ""
            message = f"the prompt has {prompt.n} tokens{more}: that exceeds the model's context of {limit} tokens"
            raise ContextTooLongError(message, param="messages")

    def compress_step(
        self,
        prompts: Sequence[Prompt],
        *,
        selector: Selector | None = None,
        batch: bool = False,
        score: Callable[[list[int]], Sequence[TokenScores]] | None = None,
    ) -> list[Compression]:
        """`compress_prompts` with this pipeline's scorer, selector (or ``selector``), fallback, costs, traces."""
        select = self.selector if selector is None else selector
        fallback = self.fallback_on_scorer_error
        # The measured scoring cost is the scorer's own call: a driver's ``score`` (a draft session
        # that reuses its cache) costs something else.
        cost = self.cost_model if self.dense_when_slower and score is None else None
        return compress_prompts(
            prompts,
            self.scorer,
            select,
            trace=self.trace,
            fallback_on_scorer_error=fallback,
            batch=batch,
            score=score,
            cost=cost,
        )

    def compress(self, prompt: PromptInput | Prompt) -> CompressedPrompt:
        """Score and select without generating: the kept ids and their original positions."""
        p = self.prompt(prompt)
        self._check_length(p, None)
        with self.telemetry.span("specprefill.pipeline", {"specprefill.operation": "compress"}):
            return self.compress_step([p])[0].compressed

    def finish(self, t0: float, result: Completion, comp: Compression, backend_start: float) -> Completion:
        """The backend's `Completion` with the whole call's timings, draft, fallback and selection."""
        ttft = (backend_start - t0) * 1000.0 + result.timings.ttft
        timings = replace(result.timings, score=comp.score_ms, select=comp.select_ms, ttft=ttft, total=elapsed_ms(t0))
        draft = self.draft_name if comp.score_ms > 0 or comp.fallback else result.draft
        fallback = comp.fallback or result.fallback
        return replace(result, timings=timings, draft=draft, fallback=fallback, selection=comp.compressed.selection)

    # ----------------------------------------------------------------- generation
    def _start(
        self, prompt: PromptInput | Prompt, params: SamplingParams | None, sampling: dict[str, Any]
    ) -> tuple[SamplingParams, Prompt, Callable[[], Compression], Finish]:
        """A call's parameters and prompt, checked, with its compress step and how to finish its result."""
        t0 = time.perf_counter()
        sp = SamplingParams.from_call(params, sampling)
        p = self.prompt(prompt)
        self._check_length(p, sp)
        return sp, p, lambda: self.compress_step([p])[0], functools.partial(self.finish, t0)

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
        sp, p, compress, finish = self._start(prompt, params, sampling)
        return self.trace.generate(p, sp, conversation_id, compress, self.backend.generate, finish)

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
        sp, p, compress, finish = self._start(prompt, params, sampling)
        # The spans' parent is the caller's context now, not whatever is current at the first next().
        parent = otel_context.get_current()
        return self.trace.stream(p, sp, conversation_id, compress, self.backend.stream, finish, parent=parent)

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
        sp = SamplingParams.from_call(params, sampling)
        built = [self.prompt(p) for p in prompts]
        for p in built:
            self._check_length(p, sp)
        compress = functools.partial(self.compress_step, built, batch=True)
        finish = functools.partial(self.finish, t0)
        return self.trace.generate_batch(built, sp, compress, self.backend.generate_batch, finish)
