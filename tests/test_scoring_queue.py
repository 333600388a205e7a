"""`ScoringQueue` and `QueuedScorer` over the real SmolLM2 draft scorer, with a fake clock.

Every batch the queue runs goes through `Recording`, a wrapper around the real scorer that logs the
prompts of each ``score_batch`` call (and can hold a call until a test lets it go), so the tests
assert how many calls there were and what each held. No test depends on timing: the fake clock
moves only when a test moves it, and every wait for another thread is a bounded poll.
"""

from __future__ import annotations

import contextvars
import inspect
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from specprefill_sdk._timing import REQUEST_TIMES, RequestTimes
from specprefill_sdk.errors import InvalidRequestError, RequestCancelledError
from specprefill_sdk.interfaces import IncrementalScorer, ModelScorer, Scorer
from specprefill_sdk.pipeline import compress_prompts
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.scoring import DraftAttentionScorer, QueuedScorer, ScoringQueue, UniformScorer
from specprefill_sdk.scoring.queue import REQUEST_CANCEL, ScoringQueueClosedError
from specprefill_sdk.selection import KeepRate
from specprefill_sdk.types import Prompt, TokenScores

TEXTS = {
    "a": "The keeper of the lighthouse wrote down the wind.",
    "b": "Every passing ship was noted in the book, with the tide.",
    "c": "In winter the lamp burned from four in the afternoon until eight in the morning, every day, and the "
    "keeper climbed the stairs each hour to trim the wick and wipe the salt from the glass.",
    "d": "Storms came from the west.",
}


class FakeClock:
    """Time that moves only on `advance`; a wait returns when notified (or after a bounded real pause)."""

    def __init__(self) -> None:
        self.t = 0.0
        self._conditions: set[threading.Condition] = set()

    def now(self) -> float:
        return self.t

    def wait(self, condition: threading.Condition, timeout: float | None) -> None:
        self._conditions.add(condition)
        condition.wait(0.5)  # the queue checks the fake time again; the bound keeps a defect from hanging

    def advance(self, seconds: float) -> None:
        self.t += seconds
        for condition in list(self._conditions):
            with condition:
                condition.notify_all()


class Recording:
    """The real scorer, with a log of each ``score_batch`` call's prompts (by label) and an optional hold."""

    def __init__(
        self,
        inner: Scorer,
        labels: dict[tuple[int, ...], str],
        log: list[tuple[str, list[str]]],
        *,
        tag: str = "",
        clock: FakeClock | None = None,
        fail: Exception | None = None,
    ) -> None:
        self.inner, self.labels, self.log, self.tag = inner, labels, log, tag
        self.clock, self.fail = clock, fail
        self.takes = 0.0
        self.hold: threading.Event | None = None  # while set, the next call waits until it is released
        self.held = threading.Event()

    @property
    def name(self) -> str:
        return self.inner.name

    def score(self, prompt: Prompt) -> TokenScores:
        return self.score_batch([prompt])[0]

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        self.log.append((self.tag, [self.labels[p.token_ids] for p in prompts]))
        if self.hold is not None:
            release, self.hold = self.hold, None
            self.held.set()
            assert release.wait(30), "the test never released the held call"
        if self.clock is not None and self.takes:
            self.clock.advance(self.takes)  # the call "takes" this long on the fake clock
        if self.fail is not None:
            raise self.fail
        return self.inner.score_batch(prompts)


class Caller(threading.Thread):
    """A thread that runs one call and keeps its result or its exception."""

    def __init__(self, fn: Callable[[], Any], context: contextvars.Context | None = None) -> None:
        super().__init__(daemon=True)
        self.fn, self.context = fn, context
        self.result: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.context.run(self.fn) if self.context is not None else self.fn()
        except BaseException as exc:
            self.error = exc

    def outcome(self) -> Any:
        self.join(60)
        assert not self.is_alive(), "the call never returned"
        if self.error is not None:
            raise self.error
        return self.result


def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` (bounded: about 30 s) until it holds."""
    for _ in range(3000):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture(scope="module")
def draft(smollm_fp32: Any) -> DraftAttentionScorer:
    return DraftAttentionScorer(smollm_fp32, look_ahead=4, pool_kernel=5)


@pytest.fixture(scope="module")
def prompts(smollm_fp32: Any) -> dict[str, Prompt]:
    return {k: build_prompt(smollm_fp32.tokenizer, t) for k, t in TEXTS.items()}


@pytest.fixture
def log() -> list[tuple[str, list[str]]]:
    return []


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def labels(prompts: dict[str, Prompt]) -> dict[tuple[int, ...], str]:
    return {p.token_ids: k for k, p in prompts.items()}


@pytest.fixture
def recording(draft: DraftAttentionScorer, labels: Any, log: Any, clock: FakeClock) -> Recording:
    return Recording(draft, labels, log, clock=clock)


@pytest.fixture
def queue(clock: FakeClock) -> Any:
    q = ScoringQueue(max_batch_tokens=10_000, max_wait_ms=50.0, clock=clock)
    yield q
    q.close(timeout=30)


def batches(log: list[tuple[str, list[str]]]) -> list[list[str]]:
    return [labels for _, labels in log]


def same_scores(got: TokenScores, alone: TokenScores) -> None:
    assert got.scorer == alone.scorer and got.info == alone.info
    torch.testing.assert_close(got.values, alone.values, atol=1e-5, rtol=1e-4)


def queue_in_order(queue: ScoringQueue, calls: list[Callable[[], Any]]) -> list[Caller]:
    """Start one caller per call, each after the one before is waiting in the queue: a known arrival order."""
    callers = []
    for call in calls:
        depth = queue.depth
        callers.append(Caller(call))
        until(lambda d=depth: queue.depth == d + 1, "the caller's prompt waits in the queue")  # type: ignore[misc]
    return callers


def hold_the_gatherer(
    queue: ScoringQueue, clock: FakeClock, recording: Recording, prompt: Prompt
) -> tuple[Caller, threading.Event]:
    """Keep the gatherer busy scoring ``prompt`` until the returned event is set."""
    release = recording.hold = threading.Event()
    caller = Caller(lambda: queue.submit(recording, prompt))
    until(lambda: queue.depth == 1, "the held prompt is queued")
    clock.advance(1.0)  # its batch waited long enough
    until(recording.held.is_set, "the gatherer is inside the held call")
    return caller, release


# ----------------------------------------------------------------------------- batching
def test_prompts_from_many_threads_are_scored_in_one_call_equal_to_scoring_alone(
    queue: ScoringQueue, clock: FakeClock, recording: Recording, draft: DraftAttentionScorer, prompts: Any, log: Any
) -> None:
    recording.takes = 0.25
    queued = QueuedScorer(recording, queue)
    callers = {k: Caller(lambda p=p: queued.score(p)) for k, p in prompts.items()}
    until(lambda: queue.depth == 4, "all four prompts wait")
    assert log == []  # the batch waits for more until its time is up
    clock.advance(0.05)
    results = {k: c.outcome() for k, c in callers.items()}
    assert len(log) == 1 and sorted(log[0][1]) == ["a", "b", "c", "d"]
    for k, p in prompts.items():
        same_scores(results[k], draft.score(p))
    stats = queue.stats()
    assert (stats.batches, stats.prompts, stats.largest_batch, stats.depth) == (1, 4, 4, 0)
    assert stats.mean_batch_size == 4.0 and stats.scoring_ms == pytest.approx(250.0)


def test_score_batch_of_the_queued_scorer_keeps_its_prompts_in_order(
    queue: ScoringQueue, clock: FakeClock, recording: Recording, draft: DraftAttentionScorer, prompts: Any, log: Any
) -> None:
    queued = QueuedScorer(recording, queue)
    caller = Caller(lambda: queued.score_batch([prompts["c"], prompts["a"]]))
    until(lambda: queue.depth == 2, "both prompts wait")
    clock.advance(0.05)
    got = caller.outcome()
    assert batches(log) == [["c", "a"]]
    same_scores(got[0], draft.score(prompts["c"]))
    same_scores(got[1], draft.score(prompts["a"]))
    assert queued.score_batch([]) == []


def test_a_lone_caller_is_scored_at_once_when_nobody_else_is_active(
    clock: FakeClock, recording: Recording, prompts: Any, log: Any
) -> None:
    active = [1]
    with ScoringQueue(max_wait_ms=60_000.0, active=lambda: active[0], clock=clock) as queue:
        # one active caller, and it is waiting: the batch closes without the clock moving
        assert Caller(lambda: queue.submit(recording, prompts["a"])).outcome().scorer == "draft-attention"
        active[0] = 2  # another request runs elsewhere: wait for it ...
        caller = Caller(lambda: queue.submit(recording, prompts["b"]))
        until(lambda: queue.depth == 1, "the prompt waits")
        assert len(log) == 1
        active[0] = 1  # ... until it is done, which the server reports with wake()
        queue.wake()
        caller.outcome()
        assert batches(log) == [["a"], ["b"]] and clock.t == 0.0  # the clock never moved


def test_the_token_budget_closes_a_batch_and_the_prompt_that_does_not_fit_heads_the_next(
    clock: FakeClock, recording: Recording, prompts: Any, log: Any
) -> None:
    a, b, c = prompts["a"], prompts["b"], prompts["c"]
    assert c.n > 1
    with ScoringQueue(max_batch_tokens=a.n + b.n + 1, max_wait_ms=50.0, clock=clock) as queue:
        callers = queue_in_order(queue, [lambda p=p: queue.submit(recording, p) for p in (a, b)])
        assert log == []  # a and b fit, more may come
        callers.append(Caller(lambda: queue.submit(recording, c)))
        until(lambda: len(log) == 1, "c, which does not fit, closes the batch at once")
        assert batches(log) == [["a", "b"]]
        clock.advance(1.0)
        for caller in callers:
            caller.outcome()
        assert batches(log) == [["a", "b"], ["c"]]


def test_first_come_first_served_a_long_prompt_is_scored_alone_and_neither_overtakes(
    clock: FakeClock, recording: Recording, prompts: Any, log: Any
) -> None:
    a, b, c, d = (prompts[k] for k in "abcd")
    budget = b.n + d.n + 1
    assert c.n > budget  # c alone is longer than a batch may be
    with ScoringQueue(max_batch_tokens=budget, max_wait_ms=50.0, clock=clock) as queue:
        held, release = hold_the_gatherer(queue, clock, recording, a)
        # queued behind the held call, in this order: short, long, short, short
        callers = queue_in_order(queue, [lambda p=p: queue.submit(recording, p) for p in (b, c, d, b)])
        release.set()
        held.outcome()
        until(lambda: len(log) == 3, "b, then c alone, are scored at once: each batch was closed by the next")
        assert queue.depth == 2  # d and b fit together and wait for more
        clock.advance(1.0)
        for caller in callers:
            caller.outcome()
    assert batches(log) == [["a"], ["b"], ["c"], ["d", "b"]]


def test_only_prompts_of_the_same_scorer_object_share_a_batch(
    queue: ScoringQueue, clock: FakeClock, draft: DraftAttentionScorer, prompts: Any, labels: Any, log: Any
) -> None:
    variant = draft.with_options(look_ahead=1)  # the same weights, other settings
    first = Recording(draft, labels, log, tag="draft", clock=clock)
    other = Recording(variant, labels, log, tag="variant", clock=clock)
    held, release = hold_the_gatherer(queue, clock, first, prompts["d"])
    plan = [(first, "a"), (first, "b"), (other, "c"), (other, "a"), (first, "c")]
    callers = queue_in_order(queue, [lambda s=s, k=k: queue.submit(s, prompts[k]) for s, k in plan])
    release.set()
    held.outcome()
    clock.advance(1.0)
    results = [c.outcome() for c in callers]
    assert log == [("draft", ["d"]), ("draft", ["a", "b"]), ("variant", ["c", "a"]), ("draft", ["c"])]
    same_scores(results[2], variant.score(prompts["c"]))
    same_scores(results[4], draft.score(prompts["c"]))
    assert results[2].info["look_ahead_requested"] == 1


# ----------------------------------------------------------------------------- cancellation
def test_a_cancelled_prompt_leaves_the_queue_and_the_batch(
    queue: ScoringQueue, clock: FakeClock, recording: Recording, prompts: Any, log: Any
) -> None:
    held, release = hold_the_gatherer(queue, clock, recording, prompts["d"])
    gone = threading.Event()
    callers = queue_in_order(
        queue,
        [
            lambda: queue.submit(recording, prompts["a"]),
            lambda: queue.submit(recording, prompts["b"], cancel=gone),
            lambda: queue.submit(recording, prompts["c"]),
        ],
    )
    assert queue.cancel(gone) == 1
    with pytest.raises(RequestCancelledError) as info:
        callers[1].outcome()  # at once, while the gatherer is still busy
    assert info.value.status_code == 499 and info.value.code == "request_cancelled"
    assert queue.depth == 2 and queue.stats().cancelled == 1
    release.set()
    held.outcome()
    clock.advance(1.0)
    callers[0].outcome()
    callers[2].outcome()
    assert batches(log) == [["d"], ["a", "c"]]
    assert queue.cancel(gone) == 0  # nothing of it waits any more
    with pytest.raises(RequestCancelledError):
        queue.submit(recording, prompts["a"], cancel=gone)  # already cancelled: refused at once


def test_the_request_context_cancels_a_queued_scorer_and_the_compress_step_does_not_fall_back(
    queue: ScoringQueue, clock: FakeClock, recording: Recording, prompts: Any, log: Any
) -> None:
    held, release = hold_the_gatherer(queue, clock, recording, prompts["d"])
    queued = QueuedScorer(recording, queue)
    event = threading.Event()
    context = contextvars.copy_context()
    context.run(REQUEST_CANCEL.set, event)  # what the server's RequestContext does for each request
    caller = Caller(lambda: compress_prompts([prompts["a"]], queued, KeepRate(0.5)), context)
    until(lambda: queue.depth == 1, "the request's prompt waits")
    event.set()  # set without cancel(): dropped when the next batch forms
    release.set()
    held.outcome()
    with pytest.raises(RequestCancelledError):
        caller.outcome()
    assert batches(log) == [["d"]] and queue.stats().cancelled == 1


# ----------------------------------------------------------------------------- errors
def test_a_scorer_error_reaches_every_caller_of_the_batch_as_the_same_exception(
    queue: ScoringQueue, clock: FakeClock, draft: DraftAttentionScorer, prompts: Any, labels: Any, log: Any
) -> None:
    broken = Recording(draft, labels, log, clock=clock, fail=RuntimeError("the draft ran out of memory"))
    callers = queue_in_order(queue, [lambda k=k: queue.submit(broken, prompts[k]) for k in "abc"])
    clock.advance(1.0)
    errors = []
    for caller in callers:
        with pytest.raises(RuntimeError, match="out of memory") as info:
            caller.outcome()
        errors.append(info.value)
    assert errors[0] is errors[1] is errors[2] and batches(log) == [["a", "b", "c"]]
    # through the compress step, each request falls back to dense on its own
    queued = QueuedScorer(broken, queue)
    steps = [Caller(lambda k=k: compress_prompts([prompts[k]], queued, KeepRate(0.5))) for k in "ab"]
    until(lambda: queue.depth == 2, "both prompts wait")
    clock.advance(1.0)
    for k, step in zip("ab", steps, strict=True):
        (only,) = step.outcome()
        assert only.fallback == "scorer_error: RuntimeError: the draft ran out of memory"
        selection = only.compressed.selection
        assert selection is not None and selection.reason == "fallback" and selection.kept == prompts[k].n


def test_an_invalid_prompt_fails_alone_and_the_others_of_its_batch_are_scored(
    queue: ScoringQueue, clock: FakeClock, recording: Recording, draft: DraftAttentionScorer, prompts: Any, labels: Any
) -> None:
    bad = Prompt.from_token_ids([1, 2, 10**7])
    labels[bad.token_ids] = "bad"
    log = recording.log
    callers = queue_in_order(queue, [lambda p=p: queue.submit(recording, p) for p in (prompts["a"], bad, prompts["b"])])
    clock.advance(1.0)
    same_scores(callers[0].outcome(), draft.score(prompts["a"]))
    with pytest.raises(InvalidRequestError, match="outside the draft's vocabulary"):
        callers[1].outcome()
    same_scores(callers[2].outcome(), draft.score(prompts["b"]))
    assert batches(log) == [["a", "bad", "b"], ["a"], ["bad"], ["b"]]


# ----------------------------------------------------------------------------- closing, settings, protocol
def test_close_fails_the_waiting_callers_finishes_the_running_batch_and_stops_the_thread(
    clock: FakeClock, recording: Recording, prompts: Any, log: Any
) -> None:
    queue = ScoringQueue(max_wait_ms=50.0, clock=clock)
    held, release = hold_the_gatherer(queue, clock, recording, prompts["d"])
    waiting = Caller(lambda: queue.submit(recording, prompts["a"]))
    until(lambda: queue.depth == 1, "a waits")
    queue.close(timeout=0)  # the gatherer is busy: do not wait for it here
    with pytest.raises(ScoringQueueClosedError) as info:
        waiting.outcome()
    assert info.value.status_code == 503 and info.value.code == "scoring_queue_closed"
    release.set()
    assert held.outcome().scorer == "draft-attention"  # the batch being scored finished
    queue.close()  # waits for the thread this time; a second close is fine
    assert queue.closed and not any(t.name == "specprefill-scoring" and t.is_alive() for t in [queue._thread])
    with pytest.raises(ScoringQueueClosedError):
        queue.submit(recording, prompts["a"])
    assert batches(log) == [["d"]] and queue.stats().depth == 0


def test_what_is_not_a_prompt_is_refused_in_the_callers_thread(queue: ScoringQueue, recording: Recording) -> None:
    with pytest.raises(InvalidRequestError, match="Prompt objects, got str"):
        queue.submit(recording, "not a prompt")  # type: ignore[arg-type]
    assert queue.depth == 0 and not queue.closed


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"max_batch_tokens": 0}, "max_batch_tokens must be an integer >= 1"),
        ({"max_batch_tokens": 2.5}, "max_batch_tokens must be an integer"),
        ({"max_wait_ms": -1.0}, "max_wait_ms must be a finite number >= 0"),
        ({"max_wait_ms": float("nan")}, "max_wait_ms must be a finite number"),
        ({"max_wait_ms": True}, "max_wait_ms must be a finite number"),
    ],
)
def test_bad_settings_are_refused_with_a_typed_error(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        ScoringQueue(**settings)


def test_the_queued_scorer_is_the_inner_scorer_to_traces_and_drivers(
    queue: ScoringQueue, draft: DraftAttentionScorer
) -> None:
    queued = QueuedScorer(draft, queue)
    assert isinstance(queued, Scorer) and isinstance(queued, ModelScorer) and isinstance(queued, IncrementalScorer)
    assert (queued.name, queued.model_name, queued.look_ahead) == (draft.name, draft.model_name, draft.look_ahead)
    assert queued.loaded is draft.loaded
    for name in ("model_name", "look_ahead", "loaded", "new_session", "execution"):
        # found without __getattr__, as runtime protocol checks look from Python 3.12 on
        inspect.getattr_static(queued, name)
    assert queued.new_session().scorer is draft  # a conversation's draft session runs on the inner scorer
    plain = QueuedScorer(UniformScorer(), queue)
    assert isinstance(plain, Scorer) and not isinstance(plain, ModelScorer)
    with pytest.raises(AttributeError):
        _ = plain.model_name
    with pytest.raises(AttributeError):
        inspect.getattr_static(plain, "new_session")


def test_a_caller_records_its_wait_in_the_queue_in_its_request_times(
    queue: ScoringQueue, clock: FakeClock, recording: Recording, prompts: Any
) -> None:
    queued = QueuedScorer(recording, queue)
    times = RequestTimes()
    context = contextvars.copy_context()
    context.run(REQUEST_TIMES.set, times)
    caller = Caller(lambda: queued.score(prompts["a"]), context)
    bystander = Caller(lambda: queued.score(prompts["b"]))  # no request times: nothing recorded, no error
    until(lambda: queue.depth == 2, "both prompts wait")
    clock.advance(0.05)  # the batch's wait is over: scoring begins 50 ms after the prompts arrived
    caller.outcome()
    bystander.outcome()
    assert times.get("queue") == pytest.approx(50.0)
    assert times.get("submit") is None
