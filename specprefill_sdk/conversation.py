"""`Conversation`: multi-turn chat over a `Pipeline`, with a strategy for the tokens earlier turns dropped.

SpecPrefill keeps only some prompt tokens. In a conversation, a later question may need a token an
earlier turn dropped. A strategy decides what each new turn does:

- ``recompute``: re-score the whole history plus the new message and prefill the selection from
  scratch. Always right, most costly; works with every backend.
- ``incremental``: keep the target's compact KV cache from earlier turns; the draft keeps the whole
  history's cache, so only the new turn's tokens are read, scored and selected. Tokens dropped earlier
  stay dropped. Cheapest.
- ``refresh``: keep the caches, but let the draft re-score the whole history against the new turn;
  old tokens that are now selected are prefilled into the target's cache at their original positions
  (each attends to the cached tokens of smaller position) and tokens no longer selected are evicted.
  Cost grows with what changed, not with the history.

Example::

    conv = pipe.conversation(strategy="refresh", system="You are terse.")
    conv.send(long_document + "\\n\\nSummarize this.", max_tokens=64).text
    conv.send("Which year was mentioned?", max_tokens=16).text
    conv.turns[-1].prefilled_tokens      # target tokens prefilled by the second turn
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
import uuid
from collections.abc import AsyncIterator, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from ._aio import chunks_in_threads
from ._timing import elapsed_ms
from .errors import ContextTooLongError, InvalidRequestError
from .interfaces import DraftModelScorer, IncrementalScorer, SessionBackend, SessionState
from .types import (
    Completion,
    CompletionChunk,
    CompressedPrompt,
    Compression,
    Message,
    Prompt,
    SamplingParams,
    Selection,
    Timings,
    TokenScores,
)

if TYPE_CHECKING:
    from .interfaces import ScoringSession
    from .pipeline import Pipeline

__all__ = ["STRATEGIES", "Conversation", "Strategy", "TurnStats"]

Strategy = Literal["recompute", "incremental", "refresh"]
STRATEGIES: tuple[str, ...] = ("recompute", "incremental", "refresh")
Overflow = Literal["error", "drop_oldest"]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    size = min(len(a), len(b))
    for i in range(size):
        if a[i] != b[i]:
            return i
    return size


@dataclass(frozen=True)
class TurnStats:
    """What one turn cost and kept.

    ``kept_tokens`` is the number of prompt tokens in the target's cache for this turn (``kept``
    positions are in ``Completion.selection``); ``prefilled_tokens`` of them went through the target
    in this turn, the rest were reused from earlier turns. ``draft_tokens`` is what the draft read
    (0 when no scores were needed).
    """

    turn: int
    strategy: str
    prompt_tokens: int
    kept_tokens: int
    prefilled_tokens: int
    reused_tokens: int
    evicted_tokens: int
    draft_tokens: int
    dropped_messages: int
    timings: Timings

    def as_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "timings"}
        out["timings"] = self.timings.as_dict()
        return out


@dataclass
class _Plan:
    """What a turn that reuses caches prefills: the compression, the draft tokens read, the evicted tokens."""

    compression: Compression
    draft_tokens: int
    evicted: int

    @property
    def compressed(self) -> CompressedPrompt:
        return self.compression.compressed


class Conversation:
    """A multi-turn chat: holds the messages and, for ``incremental``/``refresh``, both models' caches.

    Args:
        pipeline: the `Pipeline` whose scorer, selector and backend the turns use.
        strategy: ``recompute``, ``incremental`` or ``refresh`` (see the module docs).
        system: an optional system message that starts the history.
        history: earlier messages to start from (after ``system``).
        conversation_id: a key for this conversation (a random one by default); reported in traces.
        on_overflow: when the history plus ``max_tokens`` no longer fits the context: ``"error"``
            raises `ContextTooLongError`; ``"drop_oldest"`` drops the oldest messages (never the
            system message or the new one) until it fits.
        max_context: a smaller bound than the models' contexts, in tokens (bounds both caches).
        evict_unselected: ``refresh`` only: evict cached tokens that the new selection no longer keeps.
        recompute_stale: ``refresh`` only: also prefill again the cached tokens after the earliest
            change (a newly inserted or an evicted token), which were computed without it; the cache
            then equals a from-scratch prefill of the selection. ``False`` keeps them as they are:
            cheaper, approximate.

    Raises:
        InvalidRequestError: an unknown strategy, or ``incremental``/``refresh`` with a backend that
            keeps no KV state between calls.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        strategy: Strategy | str = "recompute",
        *,
        system: str | None = None,
        history: Sequence[Message | Mapping[str, Any]] = (),
        conversation_id: str | None = None,
        on_overflow: Overflow | str = "error",
        max_context: int | None = None,
        evict_unselected: bool = True,
        recompute_stale: bool = True,
    ) -> None:
        if strategy not in STRATEGIES:
            raise InvalidRequestError(
                f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}", param="strategy"
            )
        if on_overflow not in ("error", "drop_oldest"):
            raise InvalidRequestError(
                f"on_overflow must be 'error' or 'drop_oldest', got {on_overflow!r}", param="on_overflow"
            )
        backend = pipeline.backend
        # The cheap check first: asking a remote backend for its capabilities may query the server.
        if strategy != "recompute" and not (
            isinstance(backend, SessionBackend) and backend.capabilities.supports_sessions
        ):
            raise InvalidRequestError(
                f"strategy {strategy!r} keeps KV state between turns, which {type(backend).__name__} cannot; "
                "use strategy='recompute'",
                param="strategy",
            )
        if max_context is not None and max_context < 2:
            raise InvalidRequestError("max_context must be at least 2 tokens", param="max_context")
        self.pipeline = pipeline
        self.strategy: str = strategy
        self.id = conversation_id or uuid.uuid4().hex
        self.on_overflow = on_overflow
        self.evict_unselected = evict_unselected
        self.recompute_stale = recompute_stale
        self._initial = tuple(
            ([Message("system", system)] if system is not None else []) + [Message.coerce(m) for m in history]
        )
        self._messages: list[Message] = list(self._initial)
        self._max_context = max_context
        self._limit_cache: int | None = None
        self.turns: list[TurnStats] = []
        self._lock = threading.Lock()
        self._draft: ScoringSession | None = None
        if strategy != "recompute":
            self._draft = self._draft_session()
        self.state: SessionState | None = None
        self._state_ids: list[int] = []  # the token at each position the target state has seen

    # ----------------------------------------------------------------- public API
    @property
    def history(self) -> tuple[Message, ...]:
        """All messages so far, the system message first."""
        return tuple(self._messages)

    @property
    def max_context(self) -> int:
        """The largest prompt + answer this conversation allows (both models' contexts, or less)."""
        if self._limit_cache is None:
            self._limit_cache = self._context_limit(self._max_context)
        return self._limit_cache

    def reset(self) -> None:
        """Back to the initial messages; both caches are dropped."""
        with self._lock:
            self._messages = list(self._initial)
            self.turns.clear()
            self._drop_caches()

    def send(
        self, message: str | Message | Mapping[str, Any], params: SamplingParams | None = None, **sampling: Any
    ) -> Completion:
        """Add a user message (or any `Message`), answer it, add the answer to the history.

        Raises:
            InvalidRequestError: an empty message or bad sampling parameters.
            ContextTooLongError: the history no longer fits and ``on_overflow="error"``.
        """
        final: Completion | None = None
        for chunk in self.stream(message, params, **sampling):
            if chunk.completion is not None:
                final = chunk.completion
        assert final is not None
        return final

    def stream(
        self, message: str | Message | Mapping[str, Any], params: SamplingParams | None = None, **sampling: Any
    ) -> Generator[CompletionChunk, None, None]:
        """Like `send`, yielding text deltas; the last chunk carries the `Completion`.

        Closing the iterator early keeps the partial answer in the history. Errors in the request
        (an empty message, a history that does not fit) are raised here, before the first chunk. A
        conversation answers one message at a time: the next one waits until this stream ends or is closed.
        """
        msg = self._message(message)
        sp = SamplingParams.from_call(params, sampling)
        self._build([*self._messages, msg], sp)  # raise context errors now rather than at the first chunk
        return self._turn(msg, sp)

    async def asend(
        self, message: str | Message | Mapping[str, Any], params: SamplingParams | None = None, **sampling: Any
    ) -> Completion:
        """Async `send`: the model work runs in a worker thread."""
        return await asyncio.to_thread(self.send, message, params, **sampling)

    async def astream(
        self, message: str | Message | Mapping[str, Any], params: SamplingParams | None = None, **sampling: Any
    ) -> AsyncIterator[CompletionChunk]:
        """Async `stream`: each step runs in a worker thread."""
        async with contextlib.aclosing(chunks_in_threads(self.stream(message, params, **sampling))) as chunks:
            async for chunk in chunks:
                yield chunk

    def __repr__(self) -> str:
        return f"Conversation(id={self.id!r}, strategy={self.strategy!r}, messages={len(self._messages)})"

    # ----------------------------------------------------------------- set-up helpers
    @staticmethod
    def _message(message: str | Message | Mapping[str, Any]) -> Message:
        msg = Message("user", message) if isinstance(message, str) else Message.coerce(message)
        if not msg.content.strip():
            raise InvalidRequestError("the message is empty", param="message")
        return msg

    def _context_limit(self, max_context: int | None) -> int:
        limits = [int(self.pipeline.backend.max_context)]
        scorer = self.pipeline.scorer
        if isinstance(scorer, DraftModelScorer) and self.strategy != "recompute":
            limits.append(int(scorer.loaded.max_context))
        if max_context is not None:
            limits.append(max_context)
        return min(limits)

    def _draft_session(self) -> ScoringSession | None:
        scorer = self.pipeline.scorer
        return scorer.new_session() if isinstance(scorer, IncrementalScorer) else None

    def _drop_caches(self) -> None:
        self.state = None
        self._state_ids = []
        if self._draft is not None:
            self._draft.reset()

    # ----------------------------------------------------------------- one turn
    def _build(self, messages: list[Message], params: SamplingParams) -> tuple[Prompt, list[Message], int]:
        """The prompt for ``messages``, dropping the oldest ones on overflow if allowed."""
        dropped = 0
        while True:
            prompt = self.pipeline.prompt(messages)
            if prompt.n + params.max_tokens <= self.max_context and prompt.n < self.max_context:
                return prompt, messages, dropped
            droppable = [i for i, m in enumerate(messages[:-1]) if m.role != "system"]
            if self.on_overflow == "error" or not droppable:
                raise ContextTooLongError(
                    f"the conversation has {prompt.n} tokens and asks for {params.max_tokens} more: that exceeds "
                    f"its context of {self.max_context} tokens"
                    + (
                        "; start a new conversation or use on_overflow='drop_oldest'"
                        if self.on_overflow == "error"
                        else "; the new message alone does not fit"
                    ),
                    param="messages",
                )
            first = droppable[0]
            # Drop a whole exchange (a message and the answer to it) when possible.
            count = 2 if first + 1 < len(messages) - 1 and messages[first + 1].role == "assistant" else 1
            messages = messages[:first] + messages[first + count :]
            dropped += count

    def _turn(self, msg: Message, params: SamplingParams) -> Generator[CompletionChunk, None, None]:
        with self._lock:
            t0 = time.perf_counter()
            prompt, messages, dropped = self._build([*self._messages, msg], params)
            text: list[str] = []
            committed = False
            plans: list[_Plan] = []  # the plan of a turn that reuses caches, made by its compress step
            chunks: Iterator[CompletionChunk]
            if self.strategy == "recompute":
                chunks = self.pipeline.stream(prompt, params, conversation_id=self.id)
            else:
                chunks = self._reuse(prompt, params, t0, plans)
            try:
                for chunk in chunks:
                    text.append(chunk.text)
                    if chunk.completion is not None:
                        # Commit before handing out the last chunk: a caller may stop reading right there.
                        plan = plans[0] if plans else None
                        self.turns.append(self._turn_stats(prompt, plan, chunk.completion, dropped))
                        self._messages = [*messages, Message("assistant", chunk.completion.text)]
                        committed = True
                    yield chunk
            except GeneratorExit:
                if not committed:  # the caller stopped reading: the answer so far joins the history
                    self._messages = [*messages, Message("assistant", "".join(text))]
                raise
            except Exception:
                # A failure inside a forward pass can leave the caches half-written: start them afresh.
                # The failed turn does not join the history.
                self._drop_caches()
                raise
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()  # settles the cache bookkeeping of an unfinished generation now

    def _reuse(
        self, prompt: Prompt, params: SamplingParams, t0: float, plans: list[_Plan]
    ) -> Iterator[CompletionChunk]:
        """A turn that reuses the caches, traced as the pipeline traces a request (the recompute strategy is one)."""

        def compress() -> Compression:
            plans.append(self._plan(prompt))
            return plans[0].compression

        return self.pipeline.trace.stream(
            prompt,
            params,
            self.id,
            compress,
            self._stream_from,
            functools.partial(self.pipeline.finish, t0),
            root_extra={"specprefill.conversation.strategy": self.strategy},
        )

    def _turn_stats(self, prompt: Prompt, plan: _Plan | None, completion: Completion, dropped: int) -> TurnStats:
        if plan is None:  # recompute: one pipeline call
            scored = completion.timings.score > 0 or completion.fallback is not None
            kept = completion.usage.kept_tokens
            return self._stats(prompt, kept, kept, 0, prompt.n if scored else 0, dropped, completion.timings)
        assert self.state is not None
        return self._stats(
            prompt,
            plan.compressed.kept,
            self.state.last_prefilled,
            plan.evicted,
            plan.draft_tokens,
            dropped,
            completion.timings,
        )

    def _stats(
        self, prompt: Prompt, kept: int, prefilled: int, evicted: int, draft_tokens: int, dropped: int, timings: Timings
    ) -> TurnStats:
        return TurnStats(
            turn=len(self.turns) + 1,
            strategy=self.strategy,
            prompt_tokens=prompt.n,
            kept_tokens=kept,
            prefilled_tokens=prefilled,
            reused_tokens=max(kept - prefilled, 0),
            evicted_tokens=evicted,
            draft_tokens=draft_tokens,
            dropped_messages=dropped,
            timings=timings,
        )

    @property
    def _backend(self) -> SessionBackend:
        return cast(SessionBackend, self.pipeline.backend)  # checked at construction

    def _stream_from(self, compressed: CompressedPrompt, params: SamplingParams) -> Iterator[CompletionChunk]:
        assert self.state is not None and compressed.prompt is not None
        fed: list[int] = []
        self._state_ids = list(compressed.prompt.token_ids)
        try:
            for chunk in self._backend.stream_from(self.state, compressed, params):
                fed.extend(chunk.token_ids)
                yield chunk
        finally:
            # Every generated token but the last went into the cache, at positions n, n + 1, ...
            self._state_ids.extend(fed[:-1])

    def _plan(self, prompt: Prompt) -> _Plan:
        """Reconcile the caches with ``prompt``, score and select what the target must hold."""
        backend = self._backend
        if self.state is None:
            self.state = backend.new_state()
        state = self.state
        # Cached tokens from the first position where the prompt differs on are outdated.
        # (The last prompt token is always run again: its logits start the answer.)
        common = min(_common_prefix(self._state_ids, prompt.token_ids), prompt.n - 1)
        evicted = backend.evict_positions(state, [p for p in state.cached_positions() if p >= common])
        cached = set(state.cached_positions())
        n = prompt.n
        # ``incremental`` selects among the new tokens only; ``refresh`` among all of them again.
        offset = 0 if self.strategy == "refresh" else common
        draft_tokens = 0

        def score(_: list[int]) -> list[TokenScores]:
            nonlocal draft_tokens
            try:
                scores, draft_tokens = self._score(prompt)
            except Exception:
                self._draft_failed()
                raise
            return [scores if offset == 0 else TokenScores(scores.values[offset:], scores.scorer, scores.info)]

        (comp,) = self.pipeline.compress_step([prompt.take(range(offset, n)) if offset else prompt], score=score)
        t1 = time.perf_counter()
        chosen = comp.selection
        selected = {offset + i for i in chosen.indices}
        protected = {offset + i for i, p in zip(chosen.indices, chosen.protected, strict=True) if p}
        if self.strategy == "refresh":
            gone: list[int] = []
            if self.evict_unselected:
                gone = [p for p in cached if p not in selected]
                evicted += backend.evict_positions(state, gone)
                cached -= set(gone)
            inserted = [p for p in selected if p not in cached and p < common]
            if self.recompute_stale and (inserted or gone):
                # Cached tokens after the first change were computed without it: prefill them again.
                first = min(inserted + gone)
                stale = [p for p in cached if p > first]
                evicted += backend.evict_positions(state, stale)
                selected |= set(stale)
                cached -= set(stale)
        kept = sorted(selected | cached)
        selection = Selection(
            indices=tuple(kept),
            n=n,
            protected=tuple(p in protected for p in kept),
            dense=len(kept) == n,
            requested_rate=chosen.requested_rate,
            chunk_size=chosen.chunk_size,
            reason=f"{self.strategy}: {chosen.reason}" if chosen.reason else self.strategy,
        )
        compressed = CompressedPrompt.from_selection(prompt, selection)
        select_ms = comp.select_ms + elapsed_ms(t1)
        return _Plan(Compression(compressed, comp.score_ms, select_ms, comp.fallback), draft_tokens, evicted)

    def _score(self, prompt: Prompt) -> tuple[TokenScores, int]:
        if self._draft is not None:
            scores = self._draft.score(prompt)
            return scores, int(self._draft.last_prefilled)
        return self.pipeline.scorer.score(prompt), prompt.n

    def _draft_failed(self) -> None:
        if self._draft is not None:
            self._draft.reset()
