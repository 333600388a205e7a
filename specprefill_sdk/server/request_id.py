"""Request ids: the client's ``X-Request-Id`` echoed (or a new one), on every response and in the logs.

`RequestIdMiddleware` runs outside every other middleware, so refusals before routing (401, 403,
413) carry the header too; the routes read the id with `request_id` and use it as the suffix of
completion ids (``chatcmpl-<id>``), as vLLM does. Being outermost, it also notes when each request
arrived (`request_arrived`), before its body is read: where a request's server time starts.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "MAX_REQUEST_ID_LENGTH",
    "REQUEST_ID_HEADER",
    "RequestIdMiddleware",
    "request_arrived",
    "request_id",
    "valid_request_id",
]

#: The header read and written (HTTP header names are case-insensitive).
REQUEST_ID_HEADER = "x-request-id"
#: A longer client id is replaced: it ends up in every log line and completion id of the request.
MAX_REQUEST_ID_LENGTH = 128
#: Where the middleware leaves the id (``scope["state"]``, that is ``request.state``).
_STATE_KEY = "request_id"
#: Where it leaves the arrival time (`time.perf_counter`).
_ARRIVED_KEY = "request_arrived"


def valid_request_id(value: bytes) -> bool:
    """Whether a client's id may be echoed: 1 to `MAX_REQUEST_ID_LENGTH` visible ASCII characters.

    No spaces or control characters: the id goes into response headers, log lines and JSON ids.
    """
    return 0 < len(value) <= MAX_REQUEST_ID_LENGTH and all(0x21 <= b <= 0x7E for b in value)


def request_id(scope_or_request: Any) -> str:
    """The id `RequestIdMiddleware` gave a request (a `Request` or its ASGI scope); ``""`` outside it."""
    scope = getattr(scope_or_request, "scope", scope_or_request)
    return str(scope.get("state", {}).get(_STATE_KEY, ""))


def request_arrived(scope_or_request: Any) -> float | None:
    """When `RequestIdMiddleware` saw the request (`time.perf_counter`), before its body was read; None outside it."""
    scope = getattr(scope_or_request, "scope", scope_or_request)
    arrived = scope.get("state", {}).get(_ARRIVED_KEY)
    return float(arrived) if arrived is not None else None


class RequestIdMiddleware:
    """Pure ASGI middleware: a valid ``X-Request-Id`` is kept, else a new one; every response carries it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrived = time.perf_counter()
        given = [v for k, v in scope.get("headers", []) if k.lower() == REQUEST_ID_HEADER.encode()]
        # One valid header is echoed; none, several or an invalid one get a fresh id rather than a refusal.
        rid = given[0].decode("ascii") if len(given) == 1 and valid_request_id(given[0]) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state[_STATE_KEY], state[_ARRIVED_KEY] = rid, arrived
        header = (REQUEST_ID_HEADER.encode(), rid.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != header[0]]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        await self.app(scope, receive, send_with_id)
