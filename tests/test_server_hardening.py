"""Hostile input against a real server on 127.0.0.1: text that is not Unicode, empty API keys,
repeated Authorization headers, the Host header of a keyless server, HEAD /health.

The in-process apps share the session's loaded SmolLM2; the key checks start `specprefill serve`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_utils import ROOT, free_port, serve_in_thread, wait_for_health

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
LONE = "caf\ud800e"


@pytest.fixture(scope="module")
def url(backend: Any) -> Iterator[str]:
    from specprefill_sdk.server import ServerConfig, create_app

    with serve_in_thread(create_app(ServerConfig(policy="paper", max_sessions=4), backend=backend)) as base:
        yield base


def _raw(text: str) -> str:
    # json.dumps writes a lone surrogate as the escape "\ud800", exactly what a client sends.
    import json

    return json.dumps(text)


def _chat(content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": content}], **extra}


LONE_SURROGATE_BODIES = {
    "chat content": ("/v1/chat/completions", _chat(LONE), "messages.0.content"),
    "content part": ("/v1/chat/completions", _chat([{"type": "text", "text": LONE}]), "messages.0.content.0.text"),
    "system message": (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "max_tokens": 2,
            "messages": [{"role": "system", "content": LONE}, {"role": "user", "content": "Hi"}],
        },
        "messages.0.content",
    ),
    "role": (
        "/v1/chat/completions",
        {"model": MODEL, "max_tokens": 2, "messages": [{"role": LONE, "content": "Hi"}]},
        "messages.0.role",
    ),
    "streamed request": ("/v1/chat/completions", _chat(LONE, stream=True), "messages.0.content"),
    "conversation start": (
        "/v1/chat/completions",
        _chat(LONE, specprefill={"conversation_start": True}),
        "messages.0.content",
    ),
    "completions prompt": ("/v1/completions", {"model": MODEL, "max_tokens": 2, "prompt": LONE}, "prompt"),
    "completions prompt list": ("/v1/completions", {"model": MODEL, "max_tokens": 2, "prompt": [LONE]}, "prompt.0"),
    "stop string": ("/v1/chat/completions", _chat("Hi", stop=[LONE]), "stop.0"),
    "tokenize prompt": ("/v1/tokenize", {"prompt": LONE}, "prompt"),
    "tokenize messages": ("/v1/tokenize", {"messages": [{"role": "user", "content": LONE}]}, "messages.0.content"),
}


@pytest.mark.parametrize("case", sorted(LONE_SURROGATE_BODIES))
def test_a_lone_surrogate_is_a_400_naming_the_field(url: str, case: str) -> None:
    import json

    path, body, param = LONE_SURROGATE_BODIES[case]
    payload = json.dumps(body)  # ensure_ascii: the surrogate travels as the escape \ud800
    assert "\\ud800" in payload
    response = httpx.post(f"{url}{path}", content=payload, headers={"Content-Type": "application/json"}, timeout=120)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert "surrogate" in error["message"]


def test_invalid_utf8_in_the_body_is_a_400(url: str) -> None:
    payload = (
        b'{"model": "smollm2-135m", "max_tokens": 2, "messages": [{"role": "user", "content": "caf\xed\xa0\x80e"}]}'
    )
    response = httpx.post(
        f"{url}/v1/chat/completions", content=payload, headers={"Content-Type": "application/json"}, timeout=120
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_the_server_still_answers_after_bad_text(url: str) -> None:
    response = httpx.post(f"{url}/v1/chat/completions", json=_chat("Say hi."), timeout=300)
    assert response.status_code == 200, response.text


def test_build_prompt_refuses_a_lone_surrogate_with_a_typed_error(tokenizer: Any) -> None:
    from specprefill_sdk.errors import InvalidRequestError
    from specprefill_sdk.prompt import build_prompt

    with pytest.raises(InvalidRequestError) as text_error:
        build_prompt(tokenizer, LONE)
    assert text_error.value.param == "prompt"
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": LONE}]},
    ]
    with pytest.raises(InvalidRequestError) as chat_error:
        build_prompt(tokenizer, messages)
    assert chat_error.value.param == "messages[1].content"


# ----------------------------------------------------------------------------- empty API keys
def _serve_command(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``specprefill serve ARGS`` as a process; it must exit on its own (bounded by the timeout)."""
    full_env = {k: v for k, v in os.environ.items() if k != "SPECPREFILL_API_KEY"}
    full_env.update(HF_HUB_OFFLINE="1", **env)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "specprefill_sdk", "serve", "--device", "cpu", "--host", "127.0.0.1"]
    command += ["--port", str(free_port()), *args]
    return subprocess.run(command, env=full_env, cwd=str(ROOT), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--api-key", ""], {}, "--api-key is empty"),
        (["--api-key", "good", "--api-key", "  "], {}, "--api-key is empty"),
        ([], {"SPECPREFILL_API_KEY": " , ,"}, "SPECPREFILL_API_KEY is set but holds no key"),
        ([], {"SPECPREFILL_API_KEY": ""}, "SPECPREFILL_API_KEY is set but holds no key"),
    ],
)
def test_an_empty_api_key_refuses_to_start(args: list[str], env: dict[str, str], named: str) -> None:
    done = _serve_command(args, env)
    assert done.returncode != 0, done.stdout + done.stderr
    assert named in done.stderr
    assert "Traceback" not in done.stderr


def test_server_config_refuses_empty_keys() -> None:
    from specprefill_sdk.errors import InvalidRequestError
    from specprefill_sdk.server import ServerConfig

    for keys in (("",), ("key", " "), ""):
        with pytest.raises(InvalidRequestError) as error:
            ServerConfig(api_keys=keys)  # type: ignore[arg-type]
        assert error.value.param == "api_keys"
    with pytest.raises(InvalidRequestError, match="SPECPREFILL_API_KEY is set but holds no key"):
        ServerConfig.from_env({"SPECPREFILL_API_KEY": ",,"})
    assert ServerConfig.from_env({}).api_keys == ()
    assert ServerConfig(api_keys=("k1", "k2")).api_keys == ("k1", "k2")


# ----------------------------------------------------------------------------- one Authorization header
KEYS = ("key-one", "key-two")


@pytest.fixture(scope="module")
def keyed_url(backend: Any) -> Iterator[str]:
    from specprefill_sdk.server import ServerConfig, create_app

    config = ServerConfig(policy="paper", api_keys=KEYS, max_sessions=4)
    with serve_in_thread(create_app(config, backend=backend)) as base:
        yield base


def _bearer(*keys: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {key}") for key in keys]


@pytest.mark.parametrize("keys", [("key-one", "key-two"), ("key-one", "key-one"), ("key-one", "wrong")])
def test_two_authorization_headers_are_refused(keyed_url: str, keys: tuple[str, str]) -> None:
    for method, path, body in (
        ("POST", "/v1/chat/completions", _chat("Hi", specprefill={"conversation_start": True})),
        ("GET", "/v1/conversations/anything", None),
        ("GET", "/v1/models", None),
    ):
        response = httpx.request(method, f"{keyed_url}{path}", json=body, headers=_bearer(*keys), timeout=120)
        assert response.status_code == 401, (path, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid_api_key"
        assert "one Authorization header" in error["message"]


def test_a_conversation_belongs_to_the_key_that_authenticated(keyed_url: str) -> None:
    body = _chat("Name a colour.", specprefill={"conversation_start": True, "conversation_id": "mine"})
    started = httpx.post(f"{keyed_url}/v1/chat/completions", json=body, headers=_bearer("key-one"), timeout=300)
    assert started.status_code == 200, started.text
    own = httpx.get(f"{keyed_url}/v1/conversations/mine", headers=_bearer("key-one"), timeout=30)
    assert own.status_code == 200, own.text
    other = httpx.get(f"{keyed_url}/v1/conversations/mine", headers=_bearer("key-two"), timeout=30)
    assert other.status_code == 404, other.text
    # "bearer" in any case and spaces around the key still name the same key, so the same owner.
    same = httpx.get(f"{keyed_url}/v1/conversations/mine", headers={"Authorization": "bearer   key-one"}, timeout=30)
    assert same.status_code == 200, same.text
    assert httpx.delete(f"{keyed_url}/v1/conversations/mine", headers=_bearer("key-one"), timeout=30).status_code == 200


# ----------------------------------------------------------------------------- HEAD /health
def test_head_health_answers_200_without_a_body(url: str) -> None:
    response = httpx.head(f"{url}/health", timeout=30)
    assert response.status_code == 200, response.text
    assert response.content == b""
    assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"


# ----------------------------------------------------------------------------- Host without keys
@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "127.0.0.1", "127.0.0.2:9", "[::1]", "[::1]:8000"])
def test_a_keyless_server_answers_loopback_hosts(url: str, host: str) -> None:
    response = httpx.get(f"{url}/v1/models", headers={"Host": host}, timeout=30)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "host", ["attacker.example", "attacker.example:8000", "localhost.attacker.example", "10.0.0.5", "[::1", "a:b"]
)
def test_a_keyless_server_refuses_other_hosts(url: str, host: str) -> None:
    for method, path, body in (
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", _chat("Hi")),
        ("GET", "/health", None),
    ):
        response = httpx.request(method, f"{url}{path}", json=body, headers={"Host": host}, timeout=30)
        assert response.status_code == 403, (path, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "host_not_allowed"


def test_a_keyed_server_answers_any_host(keyed_url: str) -> None:
    response = httpx.get(
        f"{keyed_url}/v1/models", headers={"Host": "api.example", **dict(_bearer("key-one"))}, timeout=30
    )
    assert response.status_code == 200, response.text


def test_a_keyless_server_bound_beyond_loopback_also_answers_ip_literals(backend: Any) -> None:
    from specprefill_sdk.server import ServerConfig, create_app
    from specprefill_sdk.server.limits import HostCheck

    # Configured for every interface (served here on 127.0.0.1): clients may come by address.
    with serve_in_thread(create_app(ServerConfig(policy="paper", host="0.0.0.0"), backend=backend)) as base:
        for host, status in (("10.0.0.5:8000", 200), ("[fe80::1]", 200), ("attacker.example", 403)):
            response = httpx.get(f"{base}/v1/models", headers={"Host": host}, timeout=30)
            assert response.status_code == status, (host, response.text)

    wide = HostCheck(ip_literals=True)
    assert wide.allows(b"10.0.0.5:8000") and wide.allows(b"[fe80::1]") and wide.allows(b"localhost")
    assert not wide.allows(b"attacker.example") and not wide.allows(b"gpu-box.local:8000")
    assert not HostCheck().allows(b"10.0.0.5")


# ----------------------------------------------------------------------------- the keyless-bind warning
def test_no_keyless_warning_for_a_loopback_bind_other_than_127_0_0_1(tmp_path: Any) -> None:
    """127.0.0.2 is loopback too: ``serve`` binds it without the warning meant for reachable addresses."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "SPECPREFILL_API_KEY"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "specprefill_sdk", "serve", "--device", "cpu", "--host", "127.0.0.2"]
    command += ["--port", str(port), "--log-level", "warning"]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_health(f"http://127.0.0.2:{port}", timeout=180, proc=proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    text = log.read_text(errors="replace")
    assert "without an API key" not in text, text


LAX_VALUES = {
    "extension switch as a word": (_chat("Hi", specprefill={"enabled": "no"}), "specprefill.enabled"),
    "extension number as a string": (_chat("Hi", specprefill={"look_ahead": "4"}), "specprefill.look_ahead"),
    "extension number as a bool": (_chat("Hi", specprefill={"sink": True}), "specprefill.sink"),
    "max_tokens as a bool": ({**_chat("Hi"), "max_tokens": True}, "max_tokens"),
    "seed as a string": (_chat("Hi", seed="7"), "seed"),
    "stream as a word": (_chat("Hi", stream="yes"), "stream"),
}


@pytest.mark.parametrize("case", sorted(LAX_VALUES))
def test_numbers_and_switches_of_another_type_are_refused_not_guessed(url: str, case: str) -> None:
    body, field = LAX_VALUES[case]
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 400, response.text  # a schema violation, as OpenAI answers it
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == field, error


def test_strict_fields_still_take_what_json_clients_send(url: str) -> None:
    # an integer where a float is expected is a number all the same
    body = _chat("Say hi.", temperature=0, top_p=1, specprefill={"keep_rate": 1, "enabled": True})
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
