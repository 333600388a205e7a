"""Load on a real `specprefill serve` process with a small queue: 32 clients at once against one
worker and 8 queue places. Every request is answered 200 or 429 (never a 5xx or a dropped
connection), the refusals say when to come back, and the server is idle again afterwards.

Bounded: 32 clients x 1 request of 4 tokens each; a burst that happens to fit the queue is sent again
at most twice (a 429 is required, and it only comes when the burst overlaps).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_utils import ServerProcess, start_server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
CLIENTS, REQUESTS, QUEUE = 32, 1, 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("load") / "server.log"
    proc = start_server(["--model", MODEL, "--device", "cpu", "--max-concurrency", "1", "--max-queue", str(QUEUE)], log)
    yield proc
    proc.stop()


def _burst(server: ServerProcess) -> tuple[Counter[int], list[httpx.Response]]:
    statuses: Counter[int] = Counter()
    refused: list[httpx.Response] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(CLIENTS, timeout=60)
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": "The three primary colours are red, yellow and",
        "max_tokens": 4,
        "temperature": 0,
    }

    def client(i: int) -> None:
        try:
            with httpx.Client(base_url=server.base, timeout=300) as http:
                start.wait()
                for j in range(REQUESTS):
                    # Every other client compresses (the draft runs), the rest are dense.
                    sent = body if (i + j) % 2 else {**body, "specprefill": {"enabled": False}}
                    response = http.post("/v1/completions", json=sent)
                    with lock:
                        statuses[response.status_code] += 1
                        if response.status_code == 429:
                            refused.append(response)
        except BaseException as exc:  # a dropped connection fails the test, with its cause
            with lock:
                failures.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a client did not finish"
    assert not failures, failures
    return statuses, refused


def test_a_burst_of_clients_gets_answers_or_429_and_the_server_is_idle_after(server: ServerProcess) -> None:
    total: Counter[int] = Counter()
    refused: list[httpx.Response] = []
    for _ in range(3):
        statuses, rejected = _burst(server)
        assert sum(statuses.values()) == CLIENTS * REQUESTS
        total += statuses
        refused += rejected
        if refused:
            break
    print(f"{CLIENTS} clients x {REQUESTS} requests: {dict(total)}")
    assert set(total) <= {200, 429}, dict(total)  # no 5xx, no other refusal
    assert total[200] >= 1 and total[429] >= 1, dict(total)
    for response in refused:
        assert response.headers["retry-after"].isdigit() and int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "rate_limit_error" and error["code"] == "server_overloaded"
    health = httpx.get(f"{server.base}/health", timeout=10).json()
    assert (health["running"], health["queue_depth"], health["in_flight"]) == (0, 0, 0), health
    assert server.alive()
    # Still serving after the burst.
    after = httpx.post(f"{server.base}/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=120)
    assert after.status_code == 200, after.text
