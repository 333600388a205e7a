"""How ``specprefill serve`` runs the app on uvicorn: bounded connections and a draining shutdown.

uvicorn bounds neither how long a client may take to send a request's head nor how many
connections it holds open, so connections that never finish their headers (slowloris) would pile
up until the process runs out of file descriptors. `LimitedH11Protocol`, uvicorn's h11 protocol
with two additions, bounds both:

- **header timeout**: a connection must send a whole request head (request line and headers)
  within ``header_timeout`` seconds of opening, and of each answer on it; else it is closed, with
  an answer ``408`` when part of a head came (a connection that sent nothing is closed silently, as
  uvicorn closes idle kept-alive connections);
- **connection cap**: beyond ``max_connections`` open connections, a new connection is answered
  ``503`` (OpenAI-style body, ``code: too_many_connections``, ``Retry-After``) as soon as its
  request head arrives, and closed. uvicorn's own ``limit_concurrency`` counts open connections and
  running tasks too, but answers a plain-text 503 and only when a head arrives; here the refused
  connections themselves are bounded as well: beyond as many again, a connection is closed at once.

`serve` runs the app with that protocol and a `uvicorn.Server` whose shutdown first calls
`ServingEngine.begin_shutdown`: queued and new requests get 503 at once, running ones get
``shutdown_grace`` seconds, and uvicorn waits that long plus `SHUTDOWN_MARGIN` before it cancels
what is left.

Example::

    from specprefill_sdk.server import ServerConfig, create_app
    from specprefill_sdk.server.listener import serve

    config = ServerConfig(header_timeout=10, max_connections=256, shutdown_grace=30)
    serve(create_app(config), config)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.h11_impl import H11Protocol

from .config import DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, ServerConfig
from .errors import error_body

__all__ = [
    "SHUTDOWN_MARGIN",
    "ConnectionLimits",
    "LimitedH11Protocol",
    "limited_protocol",
    "serve",
]

logger = logging.getLogger(__name__)

#: Seconds uvicorn waits beyond the grace period before it cancels what still runs: time for the
#: requests ended at the grace to send their last answer and free their model worker.
SHUTDOWN_MARGIN = 5.0
#: ``Retry-After`` of a connection refused by the cap: connections come and go within seconds.
CONNECTIONS_RETRY_AFTER = 1
#: The most of a refused request's body read before it is answered: a body still arriving when the
#: connection closes would reset it, and the client would see a reset instead of the answer.
_REFUSED_BODY_BYTES = 1 << 20


@dataclass
class ConnectionLimits:
    """The settings of `LimitedH11Protocol` and the connections that one server holds under them."""

    header_timeout: float
    max_connections: int
    served: set[asyncio.Protocol] = field(default_factory=set)
    refused: set[asyncio.Protocol] = field(default_factory=set)


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head timeout and a connection cap (`ConnectionLimits`).

    Build a class for one server with `limited_protocol`: the limits and the connections counted
    under them are the class's.
    """

    limits: ClassVar[ConnectionLimits] = ConnectionLimits(DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_cycle: object = None  # the request cycle current when the wait for a head began
        self._head_bytes = False  # whether part of a head came since then

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        if len(limits.served) < limits.max_connections:
            limits.served.add(self)
        elif len(limits.refused) < limits.max_connections:
            limits.refused.add(self)
            self.app = _too_many_connections(limits.max_connections, limits.header_timeout)
            logger.warning(
                "refusing a connection: %d connections are open, the most this server serves (--max-connections)",
                len(limits.served),
            )
        else:  # a flood: refused connections waiting for their heads are as many as those served
            transport.close()
            return
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        self.limits.served.discard(self)
        self.limits.refused.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        waiting = self._head_timer is not None
        super().data_received(data)
        if waiting:
            if self.cycle is not self._head_cycle or self.transport.is_closing():
                self._stop_head_timer()  # the head came (or the connection ends)
            else:
                self._head_bytes = True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A pipelined request already parsed has its cycle; otherwise the next head is awaited.
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._await_head()

    def send_400_response(self, msg: str) -> None:
        """A request uvicorn cannot parse (bad framing): this server's JSON error body, not plain text."""
        self._stop_head_timer()
        body = error_body(f"malformed HTTP request: {msg}", "invalid_request_error", code="malformed_request")
        self.transport.write(_raw_response(400, "Bad Request", body))
        self.transport.close()

    def _await_head(self) -> None:
        self._stop_head_timer()
        self._head_cycle = self.cycle
        self._head_bytes = bool(self.conn.trailing_data[0])
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes and self.conn.our_state is h11.IDLE:
            timeout = self.limits.header_timeout
            self.transport.write(
                _raw_response(
                    408,
                    "Request Timeout",
                    error_body(
                        f"the request's head (request line and headers) did not arrive within {timeout:g} s",
                        "invalid_request_error",
                        code="request_timeout",
                    ),
                )
            )
        logger.info("closed a connection whose request head did not arrive in time (--header-timeout)")
        self.transport.close()


def limited_protocol(header_timeout: float, max_connections: int) -> type[LimitedH11Protocol]:
    """A `LimitedH11Protocol` class of its own for one server, to give uvicorn as ``http``."""

    class Protocol(LimitedH11Protocol):
        limits = ConnectionLimits(header_timeout, max_connections)

    return Protocol


def _raw_response(status: int, reason: str, body: dict[str, Any], headers: tuple[str, ...] = ()) -> bytes:
    payload = json.dumps(body).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(payload)}"]
    head += [*headers, "connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload


def _too_many_connections(limit: int, wait_s: float) -> Any:
    """The ASGI app that answers a connection beyond the cap: 503 with an OpenAI-style body."""
    payload = json.dumps(
        error_body(
            f"the server has {limit} connections open, the most it serves; retry later",
            "service_unavailable_error",
            code="too_many_connections",
        )
    ).encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_read_body(receive), timeout=wait_s)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"retry-after", str(CONNECTIONS_RETRY_AFTER).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": payload, "more_body": False})

    return app


async def _read_body(receive: Any) -> None:
    seen = 0
    while seen <= _REFUSED_BODY_BYTES:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        seen += len(message.get("body", b""))


class _DrainingServer(uvicorn.Server):
    """A uvicorn server that starts the engine's shutdown before its own: refusals and the grace period."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Any) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_shutdown()
        await super().shutdown(sockets)


def serve(app: Any, config: ServerConfig, *, log_config: dict[str, Any] | None = None) -> None:
    """Serve ``app`` (from `create_app`) on ``config.host``/``config.port`` until SIGINT or SIGTERM.

    The connections are bounded by ``config.header_timeout`` and ``config.max_connections``; at
    shutdown the app's engine refuses queued and new requests, and gives running ones
    ``config.shutdown_grace`` seconds.
    """
    engine = app.state.engine
    uvicorn_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        log_config=log_config,
        http=limited_protocol(config.header_timeout, config.max_connections),
        timeout_graceful_shutdown=math.ceil(config.shutdown_grace + SHUTDOWN_MARGIN),
    )
    server = _DrainingServer(uvicorn_config, engine.begin_shutdown)
    # As uvicorn.run: uvicorn raises the signal again after its shutdown; Ctrl+C ends quietly.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:  # the port could not be bound (uvicorn logged why)
        sys.exit(STARTUP_FAILURE)
