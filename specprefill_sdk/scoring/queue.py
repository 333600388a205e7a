"""`ScoringQueue`: prompts submitted from many threads, scored together, one ``score_batch`` per batch.

A draft scorer runs one call at a time behind its model lock, so requests served at once would have
their prompts scored one after the other. The queue gathers them instead: callers block in
`ScoringQueue.submit` while one gatherer thread forms batches and scores each with one
``score_batch`` call of its scorer. `QueuedScorer` is a `Scorer` that submits to a queue, so a
`Pipeline` uses the queue unchanged.

How a batch forms (strictly first come, first served; no prompt is ever scored before one that
arrived earlier):

- it starts with the oldest waiting prompt and takes the following ones in arrival order while they
  are for the *same scorer object* and the sum of their lengths (``Prompt.n``) stays within
  ``max_batch_tokens``; the first prompt that is for another scorer, or does not fit, closes the
  batch and heads the next one. A prompt longer than the budget is scored alone.
- after the batch's first prompt arrived, the gatherer waits at most ``max_wait_ms`` for more; it
  closes the batch at once when the run already ended (a waiting prompt closed it), when the budget
  is full, or when ``active`` (a count of callers that may still submit, e.g. the requests a server
  runs) says that every such caller is already waiting: a lone caller is never delayed.
- a prompt whose cancel event is set (`cancel`) leaves the queue and its caller gets
  `RequestCancelledError`; a prompt already being scored is finished.

A caller's wait from its submission until its batch began scoring is recorded as the ``queue`` stage
of the request's times (`specprefill_sdk._timing.record`), where the server reports it.

Errors: an exception of a batch's ``score_batch`` reaches every caller of that batch as the same
exception object, except a `SpecPrefillError` (an invalid prompt, a prompt beyond the draft's context),
which is about one input: the batch is then scored again one prompt at a time, so that each caller
gets its own outcome and the others their scores.

Example::

    queue = ScoringQueue(max_batch_tokens=8192, max_wait_ms=5.0)
    pipeline = Pipeline(QueuedScorer(DraftAttentionScorer("smollm2-135m"), queue), KeepRate(0.1), backend)
    ...                              # pipeline.generate from many threads: their prompts are batched
    queue.close()
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._cancel import REQUEST_CANCEL  # `QueuedScorer` submits with the request's cancel event
from .._timing import record
from ..errors import InvalidRequestError, RequestCancelledError, SpecPrefillError
from ..interfaces import Scorer
from ..types import Prompt, TokenScores
from ..validation import check_float, check_int

__all__ = [
    "DEFAULT_MAX_BATCH_TOKENS",
    "DEFAULT_MAX_WAIT_MS",
    "REQUEST_CANCEL",
    "Clock",
    "QueuedScorer",
    "ScoringQueue",
    "ScoringQueueClosedError",
    "ScoringQueueStats",
    "SystemClock",
]

logger = logging.getLogger(__name__)

#: The token budget of a batch when none is given (the draft scorer's own default batch size).
DEFAULT_MAX_BATCH_TOKENS = 16384
#: How long a batch waits for more prompts after its first one arrived, when nothing else closes it.
DEFAULT_MAX_WAIT_MS = 5.0


class ScoringQueueClosedError(SpecPrefillError):
    """The scoring queue was closed before the prompt was scored (the server is shutting down)."""

    status_code = 503
    error_type = "backend_unavailable"
    code = "scoring_queue_closed"


class Clock(Protocol):
    """The time the queue measures waits and scoring with, and how it waits; tests give a fake one."""

    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...

    def wait(self, condition: threading.Condition, timeout: float | None) -> None:
        """Wait on ``condition`` (held by the caller) until notified or ``timeout`` seconds pass (None: no limit).

        Returning early is allowed: the queue checks again what it waits for.
        """
        ...


class SystemClock:
    """The real clock: `time.monotonic` and `threading.Condition.wait`."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, condition: threading.Condition, timeout: float | None) -> None:
        condition.wait(timeout)


@dataclass(frozen=True)
class ScoringQueueStats:
    """A snapshot of a `ScoringQueue` (``/health`` reports it).

    Attributes:
        depth: prompts waiting to be scored (not counting a batch being scored).
        batches: batches scored (each one ``score_batch`` call, unless it was scored again prompt by prompt).
        prompts: prompts taken into those batches.
        largest_batch: the most prompts one batch held.
        scoring_ms: time spent in the scorers' calls.
        cancelled: prompts dropped from the queue because their request was cancelled.
        max_batch_tokens, max_wait_ms: the queue's settings.
    """

    depth: int
    batches: int
    prompts: int
    largest_batch: int
    scoring_ms: float
    cancelled: int
    max_batch_tokens: int
    max_wait_ms: float

    @property
    def mean_batch_size(self) -> float:
        """Prompts per batch (0.0 before the first batch)."""
        return self.prompts / self.batches if self.batches else 0.0


@dataclass(eq=False)
class _Item:
    scorer: Scorer
    prompt: Prompt
    cancel: threading.Event | None
    arrived: float
    #: When its batch began scoring (the queue's clock); None until then.
    started: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: TokenScores | None = None
    error: BaseException | None = None

    def finish(self, result: TokenScores | None = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class ScoringQueue:
    """Gathers prompts that callers submit from many threads and scores them in batches on one thread.

    Args:
        max_batch_tokens: the most prompt tokens (the sum of ``Prompt.n``) one batch holds; a longer
            prompt is scored alone.
        max_wait_ms: how long a batch waits for more prompts after its first one arrived (0: never).
        active: how many callers may submit now (e.g. the requests a server runs); the batch stops
            waiting once no more callers than the prompts already waiting are active. None: every
            batch waits up to ``max_wait_ms`` unless the budget closes it first.
        clock: the time source and the way to wait (`SystemClock` by default; tests give a fake one).

    Raises:
        InvalidRequestError: ``max_batch_tokens`` below 1 or a negative or non-finite ``max_wait_ms``.
    """

    def __init__(
        self,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
        *,
        active: Callable[[], int] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.max_batch_tokens = check_int(
            max_batch_tokens, "the scoring queue's max_batch_tokens", param="scoring_batch_tokens", minimum=1
        )
        self.max_wait_ms = check_float(max_wait_ms, "the scoring queue's max_wait_ms", param="scoring_wait_ms")
        self._active = active
        self._clock: Clock = clock or SystemClock()
        self._cond = threading.Condition()
        self._pending: deque[_Item] = deque()
        self._closed = False
        self._batches = 0
        self._prompts = 0
        self._largest = 0
        self._scoring_s = 0.0
        self._cancelled = 0
        self._thread = threading.Thread(target=self._gather, name="specprefill-scoring", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"ScoringQueue(max_batch_tokens={self.max_batch_tokens}, max_wait_ms={self.max_wait_ms:g})"

    def __enter__(self) -> ScoringQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ callers
    def submit(self, scorer: Scorer, prompt: Prompt, *, cancel: threading.Event | None = None) -> TokenScores:
        """Score ``prompt`` with ``scorer`` in the next batch that takes it; blocks until it is scored.

        Raises:
            RequestCancelledError: ``cancel`` was set before the prompt was scored.
            ScoringQueueClosedError: the queue was closed before the prompt was scored.
            Exception: what the scorer raised for the batch (or, for a `SpecPrefillError`, for this prompt).
        """
        return self.submit_many(scorer, [prompt], cancel=cancel)[0]

    def submit_many(
        self, scorer: Scorer, prompts: Sequence[Prompt], *, cancel: threading.Event | None = None
    ) -> list[TokenScores]:
        """Submit several prompts at once (they queue one after the other) and wait for all of them.

        Raises:
            InvalidRequestError: something that is not a `Prompt` (the queue measures prompts by ``n``).
            The first error among the prompts' outcomes (see `submit`).
        """
        if not prompts:
            return []
        for p in prompts:
            if not isinstance(p, Prompt):
                raise InvalidRequestError(f"a scorer scores Prompt objects, got {type(p).__name__}", param="prompt")
        if threading.current_thread() is self._thread:
            # A scorer that itself scores through this queue would wait on its own thread forever.
            return scorer.score_batch(prompts)
        with self._cond:
            if self._closed:
                raise ScoringQueueClosedError("the scoring queue is closed")
            if cancel is not None and cancel.is_set():
                raise _cancelled()
            now = self._clock.now()
            items = [_Item(scorer, p, cancel, now) for p in prompts]
            self._pending.extend(items)
            self._cond.notify_all()
        for item in items:
            item.done.wait()
        # The wait until scoring began, for the request's stage times (``queue``); the last
        # prompt's, as the caller waits for all of them.
        started = [item.started for item in items if item.started is not None]
        if started:
            record("queue", (max(started) - now) * 1000.0)
        for item in items:
            if item.error is not None:
                raise item.error
        return [item.result for item in items if item.result is not None]

    def cancel(self, event: threading.Event) -> int:
        """Set ``event`` and drop the waiting prompts submitted with it; their callers raise at once.

        Returns how many prompts were dropped (a prompt already being scored is finished, not dropped).
        """
        event.set()
        with self._cond:
            dropped = [item for item in self._pending if item.cancel is event]
            if dropped:
                self._pending = deque(item for item in self._pending if item.cancel is not event)
                self._drop(dropped)
                self._cond.notify_all()
        return len(dropped)

    def wake(self) -> None:
        """Check again whether the forming batch should wait: call it when what ``active`` counts drops."""
        with self._cond:
            self._cond.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Stop the gatherer: waiting prompts get `ScoringQueueClosedError`, a batch being scored finishes.

        Waits up to ``timeout`` seconds (None: no limit) for the gatherer thread to end. Safe to call twice.
        """
        with self._cond:
            self._closed = True
            waiting, self._pending = list(self._pending), deque()
            self._cond.notify_all()
        for item in waiting:
            item.finish(error=ScoringQueueClosedError("the scoring queue was closed before this prompt was scored"))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def depth(self) -> int:
        """Prompts waiting to be scored."""
        with self._cond:
            return len(self._pending)

    def stats(self) -> ScoringQueueStats:
        """What the queue has done so far, and what waits now."""
        with self._cond:
            return ScoringQueueStats(
                depth=len(self._pending),
                batches=self._batches,
                prompts=self._prompts,
                largest_batch=self._largest,
                scoring_ms=self._scoring_s * 1000.0,
                cancelled=self._cancelled,
                max_batch_tokens=self.max_batch_tokens,
                max_wait_ms=self.max_wait_ms,
            )

    # ------------------------------------------------------------------ the gatherer
    def _drop(self, items: list[_Item]) -> None:
        """Fail cancelled items (the lock is held)."""
        self._cancelled += len(items)
        for item in items:
            item.finish(error=_cancelled())

    def _run(self) -> tuple[list[_Item], bool]:
        """The batch the oldest waiting prompt heads, and whether a waiting prompt already closed it."""
        head = self._pending[0]
        batch, tokens = [head], head.prompt.n
        for item in list(self._pending)[1:]:
            if item.scorer is not head.scorer or tokens + item.prompt.n > self.max_batch_tokens:
                return batch, True
            batch.append(item)
            tokens += item.prompt.n
        return batch, tokens >= self.max_batch_tokens

    def _next_batch(self) -> list[_Item] | None:
        """Wait for a batch to close and take it off the queue (None: the queue was closed)."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                cancelled = [i for i in self._pending if i.cancel is not None and i.cancel.is_set()]
                if cancelled:
                    self._pending = deque(i for i in self._pending if i not in cancelled)
                    self._drop(cancelled)
                if not self._pending:
                    self._clock.wait(self._cond, None)
                    continue
                batch, ended = self._run()
                remaining = batch[0].arrived + self.max_wait_ms / 1000.0 - self._clock.now()
                alone = self._active is not None and self._active() <= len(self._pending)
                if ended or alone or remaining <= 0:
                    for _ in batch:
                        self._pending.popleft()
                    return batch
                self._clock.wait(self._cond, remaining)

    def _gather(self) -> None:
        while True:
            try:
                batch = self._next_batch()
            except BaseException as exc:  # a defect here: fail and refuse everything rather than hang callers
                logger.exception("the scoring queue failed; it is closed")
                with self._cond:
                    self._closed = True
                    waiting, self._pending = list(self._pending), deque()
                for item in waiting:
                    item.finish(error=exc)
                return
            if batch is None:
                return
            try:
                self._score(batch)
            except BaseException as exc:  # never leave a caller waiting on an item nobody finishes
                logger.exception("the scoring queue failed")
                for item in batch:
                    if not item.done.is_set():
                        item.finish(error=exc)

    def _score(self, batch: list[_Item]) -> None:
        scorer = batch[0].scorer
        started = self._clock.now()
        for item in batch:
            item.started = started
        try:
            try:
                results = scorer.score_batch([item.prompt for item in batch])
            except SpecPrefillError as exc:
                if len(batch) == 1:
                    raise
                # About one prompt, most likely: score each alone so that the others still get scores.
                logger.info("a batch of %d prompts failed (%s); scoring them one by one", len(batch), exc)
                for item in batch:
                    try:
                        item.finish(result=scorer.score_batch([item.prompt])[0])
                    except Exception as one:
                        item.finish(error=one)
                return
            if len(results) != len(batch):
                raise SpecPrefillError(
                    f"{scorer.name} returned {len(results)} scores for {len(batch)} prompts", code="scorer_error"
                )
            for item, result in zip(batch, results, strict=True):
                item.finish(result=result)
        except Exception as exc:
            for item in batch:
                item.finish(error=exc)
        finally:
            with self._cond:
                self._batches += 1
                self._prompts += len(batch)
                self._largest = max(self._largest, len(batch))
                self._scoring_s += self._clock.now() - started


def _cancelled() -> RequestCancelledError:
    return RequestCancelledError("the request was cancelled while its prompt waited to be scored")


#: The side-interface members (`interfaces`: `ModelScorer`, `LookAheadScorer`, `DraftModelScorer`,
#: `IncrementalScorer`, `Executed`) a `QueuedScorer` takes over from its inner scorer when it has them.
_MIRRORED = (
    "model_name",
    "look_ahead",
    "loaded",
    "new_session",
    "pool_kernel",
    "layers",
    "target_tokenizer",
    "execution",
)


class QueuedScorer:
    """A `Scorer` that scores through a `ScoringQueue`: the inner scorer's calls are batched with others'.

    Everything but ``score`` and ``score_batch`` is the inner scorer's (``name``, ``model_name``,
    ``look_ahead``, ``loaded``, ``new_session``, ...), so traces, usage and the protocols a driver
    checks (`ModelScorer`, `IncrementalScorer`, ...) see the inner scorer; a conversation's draft
    session (``new_session``) scores on the inner scorer directly. A call submits with the cancel
    event of the current context (`REQUEST_CANCEL`). Only scorers that are the same object are
    batched together: several wrappers around one scorer share its batches.

    Example::

        queued = QueuedScorer(scorer, queue)
        queued.score(prompt)              # equal to scorer.score(prompt), scored in a batch
    """

    def __init__(self, inner: Scorer, queue: ScoringQueue) -> None:
        self.inner = inner
        self.queue = queue
        # Instance attributes, not __getattr__ alone: runtime protocol checks look attributes up
        # statically (Python 3.12 on), so a protocol the inner scorer fits must see them here.
        for name in _MIRRORED:
            if hasattr(inner, name):
                setattr(self, name, getattr(inner, name))

    @property
    def name(self) -> str:
        return self.inner.name

    def score(self, prompt: Prompt) -> TokenScores:
        """The inner scorer's scores of ``prompt``, scored in the queue's next batch for it."""
        return self.queue.submit(self.inner, prompt, cancel=REQUEST_CANCEL.get())

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        """Equal to ``[score(p) for p in prompts]``; the prompts queue one after the other."""
        return self.queue.submit_many(self.inner, list(prompts), cancel=REQUEST_CANCEL.get())

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "queue"):  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"QueuedScorer({self.inner!r})"
