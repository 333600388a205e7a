"""Wall-clock intervals in milliseconds, as every stage reports them, and a request's stage times.

A stage deep in a call (the scoring queue's wait, a backend's hand-off to its engine) cannot return
its time through the `Scorer` or `Backend` interfaces; it `record`\\ s it instead, into the
`RequestTimes` that the caller (the server, per request) set in `REQUEST_TIMES` of the running
context. Without one set, `record` does nothing.

Example::

    times = RequestTimes()
    token = REQUEST_TIMES.set(times)
    try:
        pipeline.generate(prompt)       # the queue records "queue", a vLLM backend "submit"
    finally:
        REQUEST_TIMES.reset(token)
    times.get("queue")
"""

from __future__ import annotations

import contextvars
import threading
import time

__all__ = ["REQUEST_TIMES", "RequestTimes", "elapsed_ms", "record"]


def elapsed_ms(start: float, end: float | None = None) -> float:
    """Milliseconds from ``start`` to ``end`` (default: now), both `time.perf_counter` readings."""
    return ((time.perf_counter() if end is None else end) - start) * 1000.0


class RequestTimes:
    """Milliseconds per stage name for one request, summed over the times a stage ran (thread-safe)."""

    def __init__(self) -> None:
        self._ms: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, stage: str, ms: float) -> None:
        """Add ``ms`` to ``stage``'s time."""
        with self._lock:
            self._ms[stage] = self._ms.get(stage, 0.0) + ms

    def get(self, stage: str) -> float | None:
        """``stage``'s time in milliseconds, or None when it never ran."""
        with self._lock:
            return self._ms.get(stage)


#: The stage times of the request the current code runs for (None: nobody collects them).
REQUEST_TIMES: contextvars.ContextVar[RequestTimes | None] = contextvars.ContextVar(
    "specprefill_request_times", default=None
)


def record(stage: str, ms: float) -> None:
    """Add ``ms`` to ``stage`` in the current request's `RequestTimes`, if one is set."""
    times = REQUEST_TIMES.get()
    if times is not None:
        times.add(stage, ms)
