"""The guards in front of the model, at their edges: API keys that almost match are refused, and the
admission queue refuses exactly the first request beyond ``max_concurrency + max_queue``.

The key checks run through real uvicorn on 127.0.0.1 around a one-route app (no model needed).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_utils import serve_in_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from specprefill_sdk.server.errors import OverloadedError
from specprefill_sdk.server.limits import AUTHENTICATED_KEY, Admission, GuardMiddleware, HostCheck

KEYS = ("sk-alpha-1234", "sk-beta-5678")


# ----------------------------------------------------------------------------- admission bound
@pytest.mark.parametrize(("concurrency", "queue"), [(1, 0), (1, 3), (2, 2)])
def test_admission_refuses_exactly_the_first_request_beyond_the_bound(concurrency: int, queue: int) -> None:
    async def scenario() -> None:
        admission = Admission(max_concurrency=concurrency, max_queue=queue)
        running = [await admission.acquire() for _ in range(concurrency)]
        # The waiting ones park on the semaphore; each call is admitted until the bound is reached.
        waiters = [asyncio.create_task(admission.acquire()) for _ in range(queue)]
        await asyncio.sleep(0)  # let each waiter register itself as waiting
        for _ in range(50):
            if admission.stats().waiting == queue:
                break
            await asyncio.sleep(0)
        stats = admission.stats()
        assert (stats.running, stats.waiting) == (concurrency, queue)
        with pytest.raises(OverloadedError) as refused:
            await admission.acquire()
        assert refused.value.retry_after >= 1
        # One slot handed back: a waiter runs, and exactly one more request fits in the queue again.
        admission.release(running.pop())
        first = await waiters.pop(0) if waiters else None
        extra = asyncio.create_task(admission.acquire())
        for _ in range(50):
            if admission.stats().in_flight == concurrency + queue:
                break
            await asyncio.sleep(0)
        assert admission.stats().in_flight == concurrency + queue
        with pytest.raises(OverloadedError):
            await admission.acquire()
        assert admission.rejected == 2  # each refusal counted once (the metrics report it)
        # Drain: everything handed back leaves the queue idle.
        for ticket in running + ([first] if first else []):
            admission.release(ticket)
        for task in [*waiters, extra]:
            admission.release(await task)
        assert admission.stats().in_flight == 0

    asyncio.run(scenario())


class _Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _refused_after(admission: Admission, clock: _Clock, seconds: float, served: int = 30) -> int:
    """Serve ``served`` requests of ``seconds`` each, fill the queue, and return the refusal's Retry-After."""
    for _ in range(served):
        ticket = await admission.acquire()
        clock.now += seconds
        admission.release(ticket)
    running = [await admission.acquire() for _ in range(admission.max_concurrency)]
    waiters = [asyncio.create_task(admission.acquire()) for _ in range(admission.max_queue)]
    for _ in range(50):
        if admission.stats().waiting == admission.max_queue:
            break
        await asyncio.sleep(0)
    with pytest.raises(OverloadedError) as refused:
        await admission.acquire()
    assert refused.value.retry_after == admission.retry_after()
    for ticket in running:
        admission.release(ticket)
    for task in waiters:
        admission.release(await task)
    return refused.value.retry_after


@pytest.mark.parametrize(
    ("concurrency", "queue", "seconds", "expected"),
    [(1, 8, 2.6, 3), (1, 0, 2.6, 3), (4, 16, 10.0, 3), (2, 2, 0.1, 1), (1, 80, 600.0, 60)],
    ids=["backlog-of-nine", "no-queue", "four-workers", "quick-requests", "capped"],
)
def test_retry_after_is_the_time_until_one_slot_frees(
    concurrency: int, queue: int, seconds: float, expected: int
) -> None:
    # One of `concurrency` workers frees about every seconds / concurrency: a refused client that
    # comes back then finds room; the whole backlog (queue + running) need not drain first.
    clock = _Clock()
    admission = Admission(max_concurrency=concurrency, max_queue=queue, clock=clock)
    assert asyncio.run(_refused_after(admission, clock, seconds)) == expected


def test_quick_requests_shorten_the_retry_after_estimate() -> None:
    # Each release folds the request's service time into the estimate: requests far quicker than a
    # slow start bring Retry-After down.
    clock = _Clock()
    admission = Admission(max_concurrency=1, max_queue=3, clock=clock)

    async def scenario() -> tuple[int, int]:
        return await _refused_after(admission, clock, 20.0), await _refused_after(admission, clock, 0.5)

    assert asyncio.run(scenario()) == (20, 1)


# ----------------------------------------------------------------------------- API keys
async def _whoami(request: Request) -> JSONResponse:
    return JSONResponse({"key": request.scope["state"][AUTHENTICATED_KEY]})


async def _health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/v1/whoami", _whoami), Route("/health", _health)])
    guarded = GuardMiddleware(app, max_body_bytes=1024, api_key=list(KEYS))
    with serve_in_thread(guarded) as base:
        yield base


@pytest.mark.parametrize("key", KEYS)
def test_each_configured_key_is_accepted_and_named(keyed_url: str, key: str) -> None:
    response = httpx.get(f"{keyed_url}/v1/whoami", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200 and response.json() == {"key": key}


NEAR_MISSES = {
    "last char changed": "sk-alpha-1235",
    "first char changed": "tk-alpha-1234",
    "prefix": "sk-alpha-123",
    "one char longer": "sk-alpha-12345",
    "upper case": "SK-ALPHA-1234",
    "both keys joined": "sk-alpha-1234sk-beta-5678",
    "inner space": "sk-alpha -1234",
}


@pytest.mark.parametrize("token", list(NEAR_MISSES.values()), ids=list(NEAR_MISSES))
def test_a_near_miss_key_is_refused_with_an_openai_error(keyed_url: str, token: str) -> None:
    response = httpx.get(f"{keyed_url}/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    "header", ["sk-alpha-1234", "Basic sk-alpha-1234", "Bearersk-alpha-1234", "Token sk-alpha-1234", "Bearer"]
)
def test_a_right_key_in_the_wrong_scheme_is_refused(keyed_url: str, header: str) -> None:
    assert httpx.get(f"{keyed_url}/v1/whoami", headers={"Authorization": header}).status_code == 401


def test_the_scheme_is_case_insensitive_and_routes_outside_v1_need_no_key(keyed_url: str) -> None:
    response = httpx.get(f"{keyed_url}/v1/whoami", headers={"Authorization": f"bearer {KEYS[1]}"})
    assert response.status_code == 200 and response.json() == {"key": KEYS[1]}
    assert httpx.get(f"{keyed_url}/health").status_code == 200
    assert httpx.get(f"{keyed_url}/v1/whoami").status_code == 401


# ----------------------------------------------------------------------------- Host check
@pytest.fixture(scope="module")
def keyless_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/v1/whoami", _health), Route("/health", _health)])
    with serve_in_thread(GuardMiddleware(app, max_body_bytes=1024, host_check=HostCheck())) as base:
        yield base


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "127.0.0.1", "[::1]:80", "127.0.0.2"])
def test_a_keyless_guard_answers_loopback_hosts(keyless_url: str, host: str) -> None:
    assert httpx.get(f"{keyless_url}/v1/whoami", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "localhost.evil.example", "10.0.0.1", "localhost:http", "[::1"])
def test_a_keyless_guard_refuses_other_hosts_with_an_openai_error(keyless_url: str, host: str) -> None:
    response = httpx.get(f"{keyless_url}/v1/whoami", headers={"Host": host})
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "host_not_allowed"


# ----------------------------------------------------------------------------- Content-Length
def _call(guard: GuardMiddleware, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> tuple[int, dict[str, Any]]:
    """One POST through the middleware as an ASGI call (a server would refuse some of these headers itself)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/whoami", "headers": headers, "query_string": b""}
    asyncio.run(guard(scope, receive, send))  # type: ignore[arg-type]
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(payload)


async def _echo_length(request: Request) -> JSONResponse:
    return JSONResponse({"received": len(await request.body())})


GUARD = GuardMiddleware(Starlette(routes=[Route("/v1/whoami", _echo_length, methods=["POST"])]), max_body_bytes=8)


@pytest.mark.parametrize("declared", [b"abc", b"-5", b"", b"1e3"])
def test_a_content_length_that_is_not_a_number_is_refused(declared: bytes) -> None:
    status, payload = _call(GUARD, [(b"content-length", declared)])
    assert status == 400 and payload["error"]["code"] == "invalid_request", payload


@pytest.mark.parametrize(("declared", "body"), [(b"0", b""), (b"8", b"12345678")])
def test_a_content_length_up_to_the_limit_is_served(declared: bytes, body: bytes) -> None:
    assert _call(GUARD, [(b"content-length", declared)], body) == (200, {"received": len(body)})


def test_a_content_length_over_the_limit_is_refused_before_the_body() -> None:
    status, payload = _call(GUARD, [(b"content-length", b"9")], b"123456789")
    assert status == 413 and set(payload["error"]) == {"message", "type", "param", "code"}, payload
