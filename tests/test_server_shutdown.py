"""SIGTERM to a real `specprefill serve` process (the real SmolLM2) while a long stream runs and a request
waits in the queue: the queued request gets 503 with an OpenAI-style body and ``Retry-After``; the
stream, still running when the grace period is over, ends with an SSE error event and ``[DONE]``.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_utils import start_server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
#: Far more tokens than SmolLM2 generates on a CPU within the grace period below.
LONG = {
    "model": MODEL,
    "max_tokens": 4000,
    "ignore_eos": True,
    "stream": True,
    "messages": [{"role": "user", "content": "Tell me a very long story about a lighthouse."}],
}
SHORT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Say hi."}]}


def _events(lines: list[str]) -> list[Any]:
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


def test_sigterm_refuses_the_queued_request_and_ends_the_long_stream_with_an_error_event(tmp_path: Path) -> None:
    args = ["--model", MODEL, "--device", "cpu", "--max-concurrency", "1", "--shutdown-grace", "2"]
    server = start_server(args, tmp_path / "server.log")
    try:
        queued: dict[str, httpx.Response] = {}

        def send_queued() -> None:
            queued["response"] = httpx.post(f"{server.api}/chat/completions", json=SHORT, timeout=120)

        url = f"{server.api}/chat/completions"
        with httpx.Client(timeout=120) as client, client.stream("POST", url, json=LONG) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            seen: list[str] = []
            while not any('"content":"' in line and '"content":""' not in line for line in seen):
                seen.append(next(lines))  # until the first generated text: the stream runs
            waiter = threading.Thread(target=send_queued)
            waiter.start()
            deadline = time.monotonic() + 60
            while httpx.get(f"{server.base}/health", timeout=10).json()["queue_depth"] < 1:
                assert time.monotonic() < deadline, "the second request never queued"
                time.sleep(0.05)
            server.proc.send_signal(signal.SIGTERM)
            seen.extend(lines)  # to the end of the stream
        waiter.join(timeout=120)

        refused = queued["response"]
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "5"
        error = refused.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("service_unavailable_error", "server_shutting_down")

        events = _events(seen)
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert set(last) == {"error"}, last
        assert set(last["error"]) == {"message", "type", "param", "code"}
        assert last["error"]["code"] == "server_shutting_down"
        chunks = [json.loads(e) for e in events[:-2]]
        assert chunks and all(c["choices"][0]["finish_reason"] is None for c in chunks)  # cut, not finished

        server.proc.wait(timeout=60)
        assert "Traceback" not in server.log()
    finally:
        server.stop()


def test_a_json_request_still_running_after_the_grace_period_gets_503(tmp_path: Path) -> None:
    server = start_server(["--model", MODEL, "--device", "cpu", "--shutdown-grace", "1"], tmp_path / "server.log")
    try:
        answer: dict[str, httpx.Response] = {}

        def send() -> None:
            body = {**LONG, "stream": False}
            answer["response"] = httpx.post(f"{server.api}/chat/completions", json=body, timeout=120)

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 60
        while httpx.get(f"{server.base}/health", timeout=10).json()["running"] < 1:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        sender.join(timeout=120)
        response = answer["response"]
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "5"
        assert response.json()["error"]["code"] == "server_shutting_down"
        server.proc.wait(timeout=60)
    finally:
        server.stop()


def test_a_closed_admission_refuses_the_waiting_and_new_requests_and_keeps_the_running_ones() -> None:
    import asyncio

    from specprefill_sdk.server.errors import ShuttingDownError
    from specprefill_sdk.server.limits import Admission

    async def scenario() -> None:
        admission = Admission(max_concurrency=1, max_queue=4)
        running = await admission.acquire()
        waiting = [asyncio.ensure_future(admission.acquire()) for _ in range(2)]
        await asyncio.sleep(0)
        assert admission.stats().waiting == 2
        admission.close("shutting down")
        for task in waiting:
            with pytest.raises(ShuttingDownError, match="shutting down"):
                await task
        with pytest.raises(ShuttingDownError):
            await admission.acquire()
        assert admission.stats().running == 1 and admission.stats().waiting == 0
        admission.release(running)
        assert admission.stats().running == 0

    asyncio.run(scenario())


def test_admission_hands_slots_on_in_order_and_a_cancelled_waiter_keeps_none() -> None:
    import asyncio

    from specprefill_sdk.server.limits import Admission

    async def scenario() -> None:
        admission = Admission(max_concurrency=1, max_queue=4)
        first = await admission.acquire()
        gone, second = asyncio.ensure_future(admission.acquire()), asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        gone.cancel()  # its client went away while it waited
        await asyncio.sleep(0)
        admission.release(first)
        ticket = await second
        assert admission.stats().running == 1 and admission.stats().waiting == 0
        # granted and cancelled before it resumed: the slot passes on instead of leaking
        third = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        admission.release(ticket)
        third.cancel()
        with pytest.raises(asyncio.CancelledError):
            await third
        assert admission.stats().running == 0
        assert (await admission.acquire()).released is False

    asyncio.run(scenario())
