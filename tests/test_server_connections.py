"""Slow and many clients against a real `specprefill serve` process on 127.0.0.1: raw sockets that send
part of a request head and stall (slowloris), the header timeout that closes them, and the connection
cap that refuses connections beyond it with a clear answer and serves again once they are gone.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_utils import ServerProcess, start_server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
#: A request head without its end (the blank line): the server waits for the rest, which never comes.
PARTIAL_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
STALLED = 100
CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Say hi."}]}


def _stall(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that each sent part of a request head and then nothing more."""
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        sock.sendall(PARTIAL_HEAD)
        sockets.append(sock)
    return sockets


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends on ``sock`` until it closes it (a socket timeout if it never does)."""
    received = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return received
        received += data


def _close(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("connections") / "server.log"
    args = ["--model", MODEL, "--device", "cpu", "--header-timeout", "3", "--max-connections", "400"]
    proc = start_server(args, log)
    try:
        yield proc
    finally:
        proc.stop()


def test_stalled_heads_do_not_keep_a_client_from_its_answer(slow_server: ServerProcess) -> None:
    stalled = _stall(slow_server.port, STALLED)
    try:
        response = httpx.post(f"{slow_server.api}/chat/completions", json=CHAT, timeout=120)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] is not None
    finally:
        _close(stalled)
    assert slow_server.alive()


def _trickle(sock: socket.socket, stop: threading.Event) -> None:
    """Send a head a byte at a time, far slower than the header timeout allows, until closed."""
    for byte in PARTIAL_HEAD * 10:
        if stop.is_set():
            return
        try:
            sock.send(bytes([byte]))
        except OSError:  # the server closed the connection
            return
        time.sleep(0.2)


def test_a_connection_whose_head_stalls_is_closed_after_the_header_timeout(slow_server: ServerProcess) -> None:
    stalled = _stall(slow_server.port, STALLED)
    idle = socket.create_connection(("127.0.0.1", slow_server.port), timeout=120)  # sends nothing at all
    slow = socket.create_connection(("127.0.0.1", slow_server.port), timeout=120)  # bytes keep coming
    stop = threading.Event()
    dripping = threading.Thread(target=_trickle, args=(slow, stop), daemon=True)
    dripping.start()
    try:
        # Without a header timeout recv() blocks until the socket timeout: a TimeoutError fails the test.
        answers = [_read_until_closed(sock) for sock in stalled]
        assert _read_until_closed(idle) == b""  # nothing came: closed without an answer
        # Each byte does not start the clock again. (Bytes sent after the close may reset the
        # connection before the 408 is read: closed either way.)
        with contextlib.suppress(ConnectionResetError):
            assert _read_until_closed(slow).startswith(b"HTTP/1.1 408 ")
    finally:
        stop.set()
        _close([*stalled, idle, slow])
        dripping.join(timeout=10)
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:200]
        error = json.loads(body)["error"]
        assert error["code"] == "request_timeout"
        assert set(error) == {"message", "type", "param", "code"}
    # the server still answers, and a client that sends its head in pieces in time is served
    with socket.create_connection(("127.0.0.1", slow_server.port), timeout=120) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        sock.sendall(b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert _read_until_closed(sock).startswith(b"HTTP/1.1 200 ")


def test_connections_beyond_the_cap_get_503_and_the_server_recovers(tmp_path: Path) -> None:
    cap = 20
    # A header timeout far above the test's duration: the stalled connections stay until closed here.
    args = ["--model", MODEL, "--device", "cpu", "--max-connections", str(cap), "--header-timeout", "600"]
    server = start_server(args, tmp_path / "server.log")
    try:
        stalled = _stall(server.port, cap)
        try:
            with httpx.Client(timeout=60) as client:
                refused = client.post(f"{server.api}/chat/completions", json=CHAT)
                assert refused.status_code == 503, refused.text
                assert refused.headers["retry-after"] == "1"
                assert refused.json() == {
                    "error": {
                        "message": refused.json()["error"]["message"],
                        "type": "service_unavailable_error",
                        "param": None,
                        "code": "too_many_connections",
                    }
                }
                assert str(cap) in refused.json()["error"]["message"]
                assert client.get(f"{server.base}/health").status_code == 503
        finally:
            _close(stalled)
        # The server notices the closed connections at once; the bound is generous for a loaded machine.
        deadline = time.monotonic() + 60
        while True:
            response = httpx.post(f"{server.api}/chat/completions", json=CHAT, timeout=120)
            if response.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert response.status_code == 200, response.text
        assert server.alive()
    finally:
        server.stop()


@pytest.mark.parametrize(
    "raw",
    [
        b"NOT AN HTTP REQUEST\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: a\r\nHost : b\r\n\r\n",
    ],
    ids=["not-http", "bad-content-length", "bad-header-name"],
)
def test_a_request_that_is_not_well_formed_http_gets_an_openai_error_body(
    slow_server: ServerProcess, raw: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", slow_server.port), timeout=60) as sock:
        sock.sendall(raw)
        answer = _read_until_closed(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "malformed_request"
    assert error["message"].startswith("malformed HTTP request")
    assert slow_server.alive()
