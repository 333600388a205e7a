"""The server's scoring queue: a real `specprefill serve` process on 127.0.0.1, concurrent requests.

A batch waits for more prompts only while more requests run than prompts wait, so a long stream
that is decoding keeps the queue waiting (the wait itself is set to minutes): what the queue holds
is then decided by the test, not by timing, and ``/health`` shows it.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from server_utils import ServerProcess, start_server

from specprefill_sdk.cli.serve import add_arguments, config_from_args
from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.server import ServerConfig

MODEL = "smollm2-135m"
QUESTIONS = [
    "The keeper of the lighthouse wrote down the wind, the tide and every passing ship. What did he write down?",
    "Storms came from the west in winter and from the south in spring. Where did the storms come from in spring?",
    "The lamp burned from four in the afternoon until eight in the morning. When was the lamp put out?",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = ["--model", MODEL, "--device", "cpu", "--max-concurrency", "4", "--max-queue", "4"]
    queue = ["--scoring-batch-tokens", "16384", "--scoring-wait-ms", "600000"]
    proc = start_server([*args, *queue, "--warmup-tokens", "0"], log)
    yield proc
    proc.stop()


def _health(server: ServerProcess | str) -> dict[str, Any]:
    base = server if isinstance(server, str) else server.base
    return dict(httpx.get(f"{base}/health", timeout=30).json())


def _until(server: ServerProcess | str, predicate: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """Poll ``/health`` of a server or a base URL (bounded: about 5 minutes) until ``predicate`` holds."""
    for _ in range(1500):
        health = _health(server)
        if predicate(health):
            return health
        time.sleep(0.2)
    raise AssertionError(f"never happened: {what}; last /health: {health}")


def _body(question: str, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    # short questions: the policies' dense threshold would prefill them whole without the draft
    return {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "stream": stream,
        "specprefill": {"min_prompt_tokens": 0},
    }


@pytest.mark.slow
def test_concurrent_requests_are_scored_in_one_batch_and_gone_clients_are_dropped(server: ServerProcess) -> None:
    health = _health(server)
    assert health["scoring"] is not None and health["scoring"]["batches"] == 0
    assert health["scoring"]["max_wait_ms"] == 600000 and health["scoring"]["max_batch_tokens"] == 16384
    with httpx.Client(timeout=600) as client:
        # A long greedy count keeps one request decoding: it runs, and never waits to be scored.
        holder = _body("Count from 1 to 5000, one number per line.", 4000, stream=True)
        with client.stream("POST", f"{server.api}/chat/completions", json=holder) as stream:
            lines = stream.iter_lines()
            _until(server, lambda h: h["scoring"]["batches"] == 1, "the stream alone is scored at once")
            assert next(line for line in lines if line.startswith("data: "))

            # A client that goes away while its prompt waits: the prompt is dropped, never scored.
            request = json.dumps(_body(QUESTIONS[0], 8)).encode()
            with socket.create_connection(("127.0.0.1", server.port)) as sock:
                head = (
                    f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(request)}\r\n\r\n"
                )
                sock.sendall(head.encode() + request)
                _until(server, lambda h: h["scoring"]["depth"] == 1, "the prompt waits, the stream still running")
            health = _until(server, lambda h: h["scoring"]["cancelled"] == 1, "the gone client's prompt is dropped")
            assert health["scoring"]["depth"] == 0 and health["scoring"]["batches"] == 1
            # The same for a stream closed before its first token: its first step waited for scores.
            with client.stream("POST", f"{server.api}/chat/completions", json=_body(QUESTIONS[1], 8, True)) as gone:
                gone_lines = gone.iter_lines()  # kept: a dropped line iterator closes the connection
                assert next(gone_lines).startswith("data: ")  # the role chunk, sent before scoring
                _until(server, lambda h: h["scoring"]["depth"] == 1, "the stream's prompt waits")
            health = _until(server, lambda h: h["scoring"]["cancelled"] == 2, "the closed stream's prompt is dropped")
            assert health["scoring"]["batches"] == 1 and health["cancelled_streams"] == 1

            # Three requests at once: their prompts wait together while the stream runs ...
            answers: list[httpx.Response] = []

            def ask(question: str) -> None:
                answers.append(client.post(f"{server.api}/chat/completions", json=_body(question, 4)))

            askers = [threading.Thread(target=ask, args=(q,)) for q in QUESTIONS]
            for asker in askers:
                asker.start()
            health = _until(server, lambda h: h["scoring"]["depth"] == 3, "three prompts wait")
            assert health["running"] == 4 and health["scoring"]["batches"] == 1
        # ... and once it is gone, nothing else runs: they are scored in one batch
        for asker in askers:
            asker.join(600)
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    for answer in answers:
        usage = answer.json()["usage"]["specprefill"]
        assert usage["fallback"] is None and usage["score_ms"] > 0
    scoring = _until(server, lambda h: h["running"] == 0, "every request ended")["scoring"]
    assert (scoring["batches"], scoring["prompts"], scoring["largest_batch"]) == (2, 4, 3)
    assert scoring["mean_batch_size"] == 2.0 and scoring["scoring_ms"] > 0 and scoring["cancelled"] == 2


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_scoring_settings_from_the_command_line_and_the_environment() -> None:
    default = config_from_args(_args(), environ={})
    assert (default.scoring_queue, default.scoring_batch_tokens, default.scoring_wait_ms) == (None, None, 5.0)
    assert not default.scoring_queued and ServerConfig(max_concurrency=2).scoring_queued
    given = config_from_args(
        _args(
            "--no-scoring-queue", "--max-concurrency", "8", "--scoring-batch-tokens", "4096", "--scoring-wait-ms", "2"
        ),
        environ={},
    )
    assert (given.scoring_queue, given.scoring_queued, given.scoring_batch_tokens, given.scoring_wait_ms) == (
        False,
        False,
        4096,
        2.0,
    )
    assert config_from_args(_args("--scoring-queue"), environ={}).scoring_queued
    env = {
        "SPECPREFILL_SCORING_QUEUE": "yes",
        "SPECPREFILL_SCORING_BATCH_TOKENS": "512",
        "SPECPREFILL_SCORING_WAIT_MS": "0",
    }
    from_env = ServerConfig.from_env(env)
    assert (from_env.scoring_queued, from_env.scoring_batch_tokens, from_env.scoring_wait_ms) == (True, 512, 0.0)
    assert ServerConfig.from_env({"SPECPREFILL_SCORING_QUEUE": ""}).scoring_queue is None
    for argv in (["--scoring-wait-ms", "-1"], ["--scoring-batch-tokens", "0"]):
        with pytest.raises(SystemExit):
            _args(*argv)


@pytest.mark.parametrize(
    ("settings", "param"),
    [
        ({"scoring_queue": "yes"}, "scoring_queue"),
        ({"scoring_batch_tokens": 0}, "scoring_batch_tokens"),
        ({"scoring_wait_ms": -5}, "scoring_wait_ms"),
        ({"scoring_wait_ms": float("inf")}, "scoring_wait_ms"),
    ],
)
def test_bad_scoring_settings_are_refused(settings: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        ServerConfig(**settings)
    assert info.value.param == param
    with pytest.raises(InvalidRequestError):
        ServerConfig.from_env({f"SPECPREFILL_{param.upper()}": "maybe"})


@pytest.mark.slow
def test_by_default_the_queue_scores_every_prompt_alone(backend: Any) -> None:
    """A batch's rounding can change a prompt's selection: batching concurrent prompts is asked for, not assumed."""
    from server_utils import serve_in_thread

    from specprefill_sdk.scoring import DraftAttentionScorer
    from specprefill_sdk.server import create_app

    draft = DraftAttentionScorer(backend.loaded)
    batching = ServerConfig(max_concurrency=4, warmup_tokens=0, scoring_batch_tokens=16384)
    with serve_in_thread(create_app(batching, backend=backend, scorer=draft)) as base:
        assert _health(base)["scoring"]["max_batch_tokens"] == 16384

    # The wait for more prompts is set to minutes, as in the batching test above: with a stream decoding,
    # three prompts that arrive together would wait there until it ended. By default none waits.
    config = ServerConfig(max_concurrency=4, warmup_tokens=0, scoring_wait_ms=600000)
    with serve_in_thread(create_app(config, backend=backend, scorer=draft)) as base:
        assert _health(base)["scoring"]["max_batch_tokens"] == 1
        with httpx.Client(timeout=600) as client:
            # past its end-of-sequence token too: the stream decodes until the test closes it
            holder = {**_body("Count from 1 to 5000, one number per line.", 4000, stream=True), "ignore_eos": True}
            with client.stream("POST", f"{base}/v1/chat/completions", json=holder) as stream:
                lines = stream.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
                answers: list[httpx.Response] = []
                askers = [
                    threading.Thread(
                        target=lambda q: answers.append(client.post(f"{base}/v1/chat/completions", json=_body(q, 4))),
                        args=(question,),
                    )
                    for question in QUESTIONS
                ]
                for asker in askers:
                    asker.start()
                for asker in askers:
                    asker.join(300)
                # every answer came while the stream still decodes: no prompt waited for a batch
                health = _health(base)
                assert health["running"] == 1, health
        assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
        scoring = health["scoring"]
        assert (scoring["batches"], scoring["prompts"], scoring["largest_batch"]) == (4, 4, 1), scoring
