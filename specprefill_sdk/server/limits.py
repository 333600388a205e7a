"""Admission control and request guards: a bounded queue in front of the model, body size, API key.

`Admission` lets ``max_concurrency`` requests do model work at once and ``max_queue`` more wait;
anything beyond is refused at once with `OverloadedError` (HTTP 429 with ``Retry-After``), so an
overload costs a small JSON answer instead of memory. At shutdown `Admission.close` refuses the
waiting and later requests (503), and `Drain` tells the running ones when their grace period is over.

`GuardMiddleware` runs before routing: it refuses bodies larger than ``max_body_bytes`` (413),
with API keys configured any ``/v1``, ``/metrics`` or vLLM's ``/tokenize`` and ``/detokenize``
request without ``Authorization: Bearer <key>`` for one of them (401), and without keys any request
whose ``Host`` is not a loopback name (403, `HostCheck`).
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import ipaddress
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import AuthenticationError, OverloadedError, RequestTooLargeError, ShuttingDownError, error_body

__all__ = [
    "AUTHENTICATED_KEY",
    "Admission",
    "AdmissionStats",
    "Drain",
    "GuardMiddleware",
    "HostCheck",
    "Ticket",
]

#: Where `GuardMiddleware` leaves the API key that authenticated a request (``request.state``).
AUTHENTICATED_KEY = "specprefill_api_key"


@dataclass(frozen=True)
class AdmissionStats:
    """A snapshot of the queue: requests doing model work, requests waiting, and the limits."""

    running: int
    waiting: int
    max_concurrency: int
    max_queue: int

    @property
    def in_flight(self) -> int:
        """Admitted requests not yet finished (running plus waiting)."""
        return self.running + self.waiting


@dataclass
class Ticket:
    """A granted slot; hand it back with `Admission.release` exactly once.

    ``started`` is when it was granted (the admission's clock, ``time.perf_counter``), ``waited``
    the seconds spent queued for it.
    """

    started: float
    released: bool = False
    waited: float = 0.0


class Admission:
    """A bounded queue: ``max_concurrency`` running, ``max_queue`` waiting, the rest refused.

    Slots go to waiting requests in their order of arrival. `close` (at shutdown) refuses the
    waiting requests and every later one with `ShuttingDownError`.

    Example::

        admission = Admission(max_concurrency=1, max_queue=8)
        ticket = await admission.acquire()      # raises OverloadedError when full
        try:
            ...
        finally:
            admission.release(ticket)
    """

    def __init__(
        self, max_concurrency: int = 1, max_queue: int = 16, *, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self._running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed: ShuttingDownError | None = None
        #: Requests refused because the queue was full (429), since the start.
        self.rejected = 0
        self._clock = clock
        # Smoothed service time of one request (a first guess until requests are seen), for Retry-After.
        self._service_s = 1.0

    @property
    def _waiting(self) -> int:
        return len(self._waiters)

    def stats(self) -> AdmissionStats:
        return AdmissionStats(self._running, self._waiting, self.max_concurrency, self.max_queue)

    def retry_after(self) -> int:
        """Seconds until one slot is expected to free: the smoothed time of a request over the workers.

        A refused client that comes back then finds the queue one shorter, room for it, rather than
        waiting for the whole backlog to drain; the answer is an integer from 1 to 60.
        """
        return max(1, min(60, math.ceil(self._service_s / self.max_concurrency)))

    async def acquire(self) -> Ticket:
        """Wait for a slot, or raise `OverloadedError` at once when the queue is full.

        Raises:
            OverloadedError: the queue is full (429).
            ShuttingDownError: the admission is closed, or closed while the request waited (503).
        """
        if self._closed is not None:
            raise ShuttingDownError(self._closed.message)
        if self._running + self._waiting >= self.max_concurrency + self.max_queue:
            self.rejected += 1
            raise OverloadedError(
                f"the server is busy ({self._running} running, {self._waiting} queued); retry later",
                retry_after=self.retry_after(),
            )
        queued = self._clock()
        if self._running < self.max_concurrency and not self._waiters:
            self._running += 1
        else:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._give_back()  # granted, then cancelled before it resumed: the slot goes on
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                raise
        started = self._clock()
        return Ticket(started=started, waited=started - queued)

    def release(self, ticket: Ticket) -> None:
        """Give a slot back (a second call with the same ticket does nothing)."""
        if ticket.released:
            return
        ticket.released = True
        elapsed = self._clock() - ticket.started
        self._service_s = 0.8 * self._service_s + 0.2 * elapsed
        self._give_back()

    def close(self, message: str) -> None:
        """Refuse the waiting requests and every later one with `ShuttingDownError` (``message``).

        Running requests keep their slots until they release them.
        """
        self._closed = ShuttingDownError(message)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ShuttingDownError(message))

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed is not None

    def _give_back(self) -> None:
        # The slot passes straight to the first waiter: none that arrives meanwhile can take it.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._running -= 1


class Drain:
    """The server's shutdown as requests see it: `begin` starts it, `over` ends when its grace period has passed.

    Example::

        drain = Drain(grace_s=20.0)
        drain.begin()             # at SIGTERM, on the event loop
        await drain.over()        # 20 s later
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._over = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def started(self) -> bool:
        """Whether the shutdown began."""
        return self._timer is not None or self._over.is_set()

    def begin(self) -> None:
        """Start the grace period (on the event loop; a second call does nothing)."""
        if self.started:
            return
        self._timer = asyncio.get_running_loop().call_later(self.grace_s, self._over.set)

    async def over(self) -> None:
        """Return once the grace period has passed (never, while no shutdown began)."""
        await self._over.wait()


@dataclass(frozen=True)
class HostCheck:
    """Which ``Host`` values a server without API keys answers (against DNS rebinding).

    A web page can make a browser send requests to a name its author controls that resolves to
    127.0.0.1; the browser then sends that name as ``Host``. Loopback names and addresses are never
    such a name; nor is any IP literal, which a server bound beyond loopback (``ip_literals``) must
    accept for clients that reach it by address.
    """

    ip_literals: bool = False

    def allows(self, header: bytes) -> bool:
        name = _host_name(header)
        if name is None:
            return False
        if name == "localhost":
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False
        return address.is_loopback or self.ip_literals

    def refusal(self, header: bytes) -> dict[str, Any]:
        shown = header.decode("latin-1")[:200]
        return error_body(
            f"Host {shown!r} is not served: without an API key this server answers only loopback names "
            "(localhost, 127.0.0.1, [::1]); configure --api-key to serve other names",
            "invalid_request_error",
            code="host_not_allowed",
        )


def _host_name(header: bytes) -> str | None:
    """The name of a ``Host`` value without its port (``[::1]:8000`` -> ``::1``), or None if malformed."""
    try:
        text = header.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return None
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return text[1:end]
    name, sep, port = text.partition(":")
    if sep and not port.isdigit():
        return None
    return name


class GuardMiddleware:
    """Pure ASGI middleware: body size limit for every route, bearer API key for ``/v1``, ``/metrics`` and
    vLLM's root token routes."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        api_key: str | Sequence[str] | None = None,
        host_check: HostCheck | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.host_check = host_check
        keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
        self._keys = [k.encode() for k in keys if k]
        self._key_names = {k.encode(): k for k in keys if k}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_headers = scope.get("headers", [])
        headers = {k.lower(): v for k, v in raw_headers}
        path: str = scope.get("path", "")
        host = headers.get(b"host")
        if self.host_check is not None and host is not None and not self.host_check.allows(host):
            await _send_json(send, 403, self.host_check.refusal(host))
            return
        if self._keys and _needs_key(path):
            # One header only: with two, the key check and the route (conversation ownership) could
            # each read a different one.
            given = [v for k, v in raw_headers if k.lower() == b"authorization"]
            if len(given) > 1:
                problem: str | None = f"send one Authorization header, not {len(given)}"
            else:
                problem = self._auth_problem(given[0] if given else None)
            if problem is not None:
                await _send_error(send, AuthenticationError(problem), {"WWW-Authenticate": "Bearer"})
                return
            # The routes take the caller's identity from here, the key that was checked.
            token = given[0].partition(b" ")[2].strip()
            scope.setdefault("state", {})[AUTHENTICATED_KEY] = self._key_names[token]
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared < 0:
                await _send_json(
                    send,
                    400,
                    error_body("Content-Length is not a valid number", "invalid_request_error", code="invalid_request"),
                )
                return
            if declared > self.max_body_bytes:
                await _send_error(send, self._too_large(declared))
                return
        await self.app(scope, self._limited(receive), send)

    def _auth_problem(self, header: bytes | None) -> str | None:
        if not header:
            return "this server needs an API key: send 'Authorization: Bearer <key>'"
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return "the Authorization header must be 'Bearer <key>'"
        # Compare with every key (no early exit): the time taken does not tell which one came close.
        matches = [hmac.compare_digest(token.strip(), key) for key in self._keys]
        if not any(matches):
            return "the API key is not valid"
        return None

    def _too_large(self, size: int | None) -> RequestTooLargeError:
        got = f" ({size} bytes)" if size is not None else ""
        return RequestTooLargeError(f"the request body{got} is larger than the limit of {self.max_body_bytes} bytes")

    def _limited(self, receive: Receive) -> Receive:
        seen = 0

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    # FastAPI re-raises HTTPException from body reading; the handler renders it.
                    raise HTTPException(413, detail=str(self._too_large(None)))
            return message

        return wrapped


#: Routes outside ``/v1`` that need the API key too: vLLM's tokenize paths (they use the model workers).
_KEYED_ROOT_ROUTES = ("/tokenize", "/detokenize")


def _needs_key(path: str) -> bool:
    """Whether a path is served only with a key: the API (with vLLM's root token routes), and the
    metrics (which tell the load and the traffic); ``/health`` stays open for load balancers."""
    return path in ("/v1", "/metrics", *_KEYED_ROOT_ROUTES) or path.startswith(("/v1/", "/metrics/"))


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _send_error(
    send: Send, exc: AuthenticationError | RequestTooLargeError, headers: dict[str, str] | None = None
) -> None:
    await _send_json(send, exc.status_code, exc.to_openai(), headers)
