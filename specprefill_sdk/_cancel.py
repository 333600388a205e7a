"""A request's cancel event, read by code that runs for it: the scoring queue and the backends.

A server sets `REQUEST_CANCEL` in each request's `contextvars.Context` and sets the event when the
request's client goes away: `QueuedScorer` then drops the request's prompt still waiting to be
scored, and a backend's non-streaming ``generate`` stops at its next token (`GenerationStopped`).
A stream needs neither: its consumer closes it.
"""

from __future__ import annotations

import contextvars
import threading

from .errors import RequestCancelledError

__all__ = ["REQUEST_CANCEL", "GenerationStopped", "check_cancelled"]

#: The cancel event of the request the current code runs for (None outside such a request).
REQUEST_CANCEL: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "specprefill_request_cancel", default=None
)


class GenerationStopped(RequestCancelledError):
    """A generation stopped midway because its request was cancelled; ``generated`` tokens were made."""

    def __init__(self, generated: int, max_tokens: int) -> None:
        super().__init__(
            f"the request was cancelled: the generation stopped after {generated} of at most {max_tokens} tokens"
        )
        self.generated = generated


def check_cancelled(generated: int, max_tokens: int) -> None:
    """Raise `GenerationStopped` if the current request's cancel event is set."""
    event = REQUEST_CANCEL.get()
    if event is not None and event.is_set():
        raise GenerationStopped(generated, max_tokens)
