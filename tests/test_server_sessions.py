"""Conversations kept on the server (``specprefill.conversation_id``): isolation, history, TTL, keys.

Real `specprefill serve` processes on 127.0.0.1 with SmolLM2: one with two API keys and room for four
conversations, one with a TTL of 1.5 s. The store itself is also tested directly with a fake clock.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest
from server_utils import ServerProcess, start_server

from specprefill_sdk.errors import NotFoundError
from specprefill_sdk.server.errors import ConflictError, TooManyConversationsError
from specprefill_sdk.server.sessions import ConversationStore, key_owner

MODEL = "smollm2-135m"
KEY_A, KEY_B = "key-alpha", "key-beta"
AUTH_A = {"Authorization": f"Bearer {KEY_A}"}
AUTH_B = {"Authorization": f"Bearer {KEY_B}"}
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
DENSE = {"enabled": False}  # every token kept: answers depend only on the history the server holds


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    log = tmp_path_factory.mktemp("sessions") / "server.log"
    args = ["--model", MODEL, "--device", "cpu", "--policy", "paper", "--api-key", KEY_A, "--api-key", KEY_B]
    args += ["--max-sessions", "4"]
    proc = start_server([*args, "--max-output-tokens", "64"], log)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=KEY_A, max_retries=0, timeout=300)


#: The policies prefill prompts this short whole; these tests ask for compression anyway.
COMPRESS_SHORT = {"min_prompt_tokens": 0}


def _chat(server: ServerProcess, messages: list[dict[str, str]], sp: dict[str, Any], **body: Any) -> httpx.Response:
    headers = body.pop("headers", AUTH_A)
    payload = {"model": MODEL, "messages": messages, "max_tokens": body.pop("max_tokens", 8), "specprefill": sp}
    return httpx.post(f"{server.api}/chat/completions", json={**payload, **body}, headers=headers, timeout=300)


def _start(server: ServerProcess, cid: str, text: str, max_tokens: int = 8) -> httpx.Response:
    sp = {"conversation_id": cid, "conversation_start": True, **DENSE}
    return _chat(server, [SYSTEM, {"role": "user", "content": text}], sp, max_tokens=max_tokens)


def _tokens(server: ServerProcess, messages: list[dict[str, str]]) -> int:
    response = httpx.post(f"{server.api}/tokenize", json={"messages": messages}, headers=AUTH_A, timeout=60)
    return int(response.json()["count"])


def _answer(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def _conversation_usage(response: httpx.Response) -> dict[str, Any]:
    return dict(response.json()["usage"]["specprefill"]["conversation"])


# ----------------------------------------------------------------------------- the store, without a model
class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _started(store: ConversationStore, owner: str, cid: str) -> None:
    entry = store.reserve(owner, cid)
    entry.conversation = object()  # type: ignore[assignment]  # the store never looks inside
    store.release(entry)


def test_store_expires_idle_conversations_and_says_why() -> None:
    clock = _Clock()
    store = ConversationStore(ttl_s=10, max_conversations=4, clock=clock)
    _started(store, "", "a")
    clock.now += 9
    store.release(store.claim("", "a"))  # a use restarts the TTL
    clock.now += 9
    assert store.claim("", "a").busy
    clock.now += 60  # a conversation in use never expires
    assert store.sweep() == 0
    store.release(store.peek("", "a"))
    clock.now += 10.5
    with pytest.raises(NotFoundError, match="expired after 10 s") as info:
        store.claim("", "a")
    assert info.value.code == "conversation_not_found" and len(store) == 0
    with pytest.raises(NotFoundError, match="no conversation 'b' is known"):
        store.claim("", "b")


def test_store_evicts_the_least_recently_used_idle_one_and_refuses_when_all_are_busy() -> None:
    store = ConversationStore(ttl_s=100, max_conversations=2, clock=_Clock())
    _started(store, "", "a")
    _started(store, "", "b")
    store.release(store.claim("", "a"))  # b is now the least recently used
    _started(store, "", "c")
    with pytest.raises(NotFoundError, match="evicted"):
        store.claim("", "b")
    busy = [store.claim("", "a"), store.claim("", "c")]
    with pytest.raises(TooManyConversationsError) as info:
        store.reserve("", "d")
    assert info.value.status_code == 429 and info.value.code == "too_many_conversations"
    with pytest.raises(ConflictError) as conflict:
        store.claim("", "a")
    assert conflict.value.status_code == 409 and conflict.value.code == "conversation_busy"
    with pytest.raises(ConflictError):
        store.delete("", "c")
    for entry in busy:
        store.release(entry)
    with pytest.raises(ConflictError) as exists:
        store.reserve("", "a")
    assert exists.value.code == "conversation_exists"


def test_store_gives_each_owner_a_share_and_evicts_its_own_idle_ones_first() -> None:
    store = ConversationStore(ttl_s=100, max_conversations=4, max_per_owner=2, clock=_Clock())
    alice, bob = key_owner("alpha"), key_owner("beta")
    _started(store, bob, "b1")
    _started(store, alice, "a1")
    _started(store, alice, "a2")
    _started(store, alice, "a3")  # beyond alice's share: her least recently used idle one goes
    with pytest.raises(NotFoundError, match="one API key may hold at most 2"):
        store.claim(alice, "a1")
    assert store.claim(bob, "b1").busy
    # Every one of alice's is busy: her start is refused, though the store has room and bob's is idle.
    busy = [store.claim(alice, "a2"), store.claim(alice, "a3")]
    store.release(store.peek(bob, "b1"))
    with pytest.raises(TooManyConversationsError, match="this API key may hold at most 2"):
        store.reserve(alice, "a4")
    for entry in busy:
        store.release(entry)


def test_a_full_store_evicts_the_callers_own_idle_one_then_the_largest_owners() -> None:
    store = ConversationStore(ttl_s=100, max_conversations=3, max_per_owner=2, clock=_Clock())
    alice, bob, carol = key_owner("alpha"), key_owner("beta"), key_owner("gamma")
    _started(store, bob, "b1")
    _started(store, alice, "a1")
    _started(store, alice, "a2")
    held = store.claim(alice, "a1")
    # Carol holds none: the idle one of the owner holding the most goes (not bob's older one, not a busy one).
    _started(store, carol, "c1")
    with pytest.raises(NotFoundError, match="evicted"):
        store.claim(alice, "a2")
    assert held.busy and store.peek(bob, "b1").id == "b1"
    store.release(held)
    # Full again: carol's next start evicts her own idle one before anyone else's.
    _started(store, carol, "c2")
    with pytest.raises(NotFoundError, match="evicted"):
        store.claim(carol, "c1")
    assert {store.peek(bob, "b1").id, store.peek(alice, "a1").id, store.peek(carol, "c2").id} == {"b1", "a1", "c2"}


def test_store_keys_conversations_by_owner_and_frees_refused_starts() -> None:
    store = ConversationStore(ttl_s=100, max_conversations=4, clock=_Clock())
    alice, bob = key_owner("alpha"), key_owner("beta")
    assert alice != bob and "alpha" not in alice and key_owner(None) == ""
    _started(store, alice, "same")
    with pytest.raises(NotFoundError, match="no conversation 'same' is known"):
        store.claim(bob, "same")
    _started(store, bob, "same")
    store.delete(bob, "same")
    assert store.peek(alice, "same").id == "same"
    refused = store.reserve(alice, "never")  # its first turn is refused: the id stays free
    store.release(refused)
    with pytest.raises(NotFoundError, match="is known"):
        store.claim(alice, "never")


# ----------------------------------------------------------------------------- a real server
@pytest.mark.slow
def test_two_conversations_do_not_see_each_other(client: openai.OpenAI, server: ServerProcess) -> None:
    facts = {
        "pelican": "Remember this: the secret word is PELICAN.",
        "wombat": "Remember this: the secret word is WOMBAT, and my cat is called Tiger.",
    }
    histories: dict[str, list[dict[str, str]]] = {}
    for cid, fact in facts.items():
        first = client.chat.completions.create(
            model=MODEL,
            messages=[SYSTEM, {"role": "user", "content": fact}],  # type: ignore[list-item]
            max_tokens=8,
            extra_body={"specprefill": {"conversation_id": cid, "conversation_start": True, **DENSE}},
        )
        usage = first.model_dump()["usage"]["specprefill"]["conversation"]
        assert usage["id"] == cid and usage["turn"] == 1 and usage["strategy"] == "incremental"
        histories[cid] = [SYSTEM, {"role": "user", "content": fact}]
        histories[cid].append({"role": "assistant", "content": first.choices[0].message.content or ""})
    question = {"role": "user", "content": "What is the secret word?"}
    for cid, other in (("pelican", "wombat"), ("wombat", "pelican")):
        second = client.chat.completions.create(
            model=MODEL,
            messages=[question],  # type: ignore[list-item]
            max_tokens=10,
            extra_body={"specprefill": {"conversation_id": cid}},
        )
        text = (second.choices[0].message.content or "").lower()
        assert cid in text and other not in text, text
        # The prompt was this conversation's own history plus the question, and nothing else.
        assert second.usage is not None
        assert second.usage.prompt_tokens == _tokens(server, [*histories[cid], question])
        usage = second.model_dump()["usage"]["specprefill"]["conversation"]
        assert usage["turn"] == 2 and usage["messages"] == 5
        # Incremental: the first turn's cache (its prompt and answer) is reused; only the rest is prefilled.
        assert usage["reused_tokens"] >= _tokens(server, histories[cid][:2])
        assert usage["prefilled_tokens"] == second.usage.prompt_tokens - usage["reused_tokens"] > 0
    held = httpx.get(f"{server.api}/conversations/wombat", headers=AUTH_A).json()
    assert [m["role"] for m in held["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert "PELICAN" not in str(held["messages"]) and [t["turn"] for t in held["turns"]] == [1, 2]


@pytest.mark.slow
def test_a_recompute_conversation_equals_resending_the_whole_history(server: ServerProcess) -> None:
    text = "Remember this: the meeting is on Tuesday in room 42, and Dana brings the slides."
    first = _chat(
        server,
        [SYSTEM, {"role": "user", "content": text}],
        {
            "conversation_id": "recompute-1",
            "conversation_start": True,
            "conversation_strategy": "recompute",
            **COMPRESS_SHORT,
        },
        max_tokens=6,
    )
    question = {"role": "user", "content": "Where is the meeting?"}
    turn = _chat(server, [question], {"conversation_id": "recompute-1"}, max_tokens=6)
    whole = [SYSTEM, {"role": "user", "content": text}, {"role": "assistant", "content": _answer(first)}, question]
    resent = _chat(server, whole, COMPRESS_SHORT, max_tokens=6)  # no id: the server answers from the messages alone
    assert _answer(turn) == _answer(resent)
    a, b = turn.json()["usage"], resent.json()["usage"]
    assert a["prompt_tokens"] == b["prompt_tokens"] == _tokens(server, whole)
    # The paper policy compressed both the same way: the whole history was scored and selected again.
    assert a["specprefill"]["kept_tokens"] == b["specprefill"]["kept_tokens"] < a["prompt_tokens"]
    assert a["specprefill"]["conversation"]["draft_tokens"] == a["prompt_tokens"]


@pytest.mark.slow
def test_each_api_key_sees_only_its_own_conversations(server: ServerProcess) -> None:
    assert _start(server, "shared-name", "Remember: the answer is BLUE.", max_tokens=2).status_code == 200
    question = [{"role": "user", "content": "What is the answer?"}]
    other = _chat(server, question, {"conversation_id": "shared-name"}, headers=AUTH_B)
    assert other.status_code == 404, other.text
    assert other.json()["error"]["code"] == "conversation_not_found"
    assert httpx.get(f"{server.api}/conversations/shared-name", headers=AUTH_B).status_code == 404
    assert httpx.delete(f"{server.api}/conversations/shared-name", headers=AUTH_B).status_code == 404
    # The same id under the other key is another conversation (started here with a stream).
    started = _chat(
        server,
        [{"role": "user", "content": "Remember: the answer is RED."}],
        {"conversation_id": "shared-name", "conversation_start": True, **DENSE},
        max_tokens=2,
        headers=AUTH_B,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert started.status_code == 200, started.text
    events = [json.loads(line[6:]) for line in started.text.splitlines() if line.startswith("data: {")]
    usage = events[-1]["usage"]["specprefill"]["conversation"]
    assert usage["id"] == "shared-name" and usage["turn"] == 1 and usage["messages"] == 2
    mine = httpx.get(f"{server.api}/conversations/shared-name", headers=AUTH_A).json()["messages"]
    theirs = httpx.get(f"{server.api}/conversations/shared-name", headers=AUTH_B).json()["messages"]
    assert "BLUE" in mine[1]["content"] and len(mine) == 3
    assert "RED" in theirs[0]["content"] and len(theirs) == 2
    deleted = httpx.delete(f"{server.api}/conversations/shared-name", headers=AUTH_B)
    assert deleted.json() == {"id": "shared-name", "object": "conversation.deleted", "deleted": True}
    assert httpx.get(f"{server.api}/conversations/shared-name", headers=AUTH_A).status_code == 200


@pytest.mark.slow
def test_bad_conversation_requests_get_clear_errors(server: ServerProcess) -> None:
    assert _start(server, "strict", "Hello there.", max_tokens=1).status_code == 200
    new = [{"role": "user", "content": "And then?"}]
    cases: list[tuple[list[dict[str, str]], dict[str, Any], int, str]] = [
        (new, {"conversation_id": "strict", "keep_rate": 0.5}, 400, "specprefill.keep_rate"),
        (
            new,
            {"conversation_id": "strict", "conversation_strategy": "refresh"},
            400,
            "specprefill.conversation_strategy",
        ),
        ([*new, *new], {"conversation_id": "strict"}, 400, "messages"),
        ([{"role": "assistant", "content": "Hi"}], {"conversation_id": "strict"}, 400, "messages"),
        (new, {"conversation_id": "strict", "conversation_start": True}, 409, "specprefill.conversation_id"),
        (new, {"conversation_strategy": "refresh"}, 400, "specprefill.conversation_id"),
        (new, {"conversation_id": "no such id"}, 400, "specprefill.conversation_id"),
        (new, {"conversation_id": "never-started"}, 404, "specprefill.conversation_id"),
    ]
    for messages, sp, status, param in cases:
        response = _chat(server, messages, sp, max_tokens=1)
        assert response.status_code == status, (sp, response.text)
        assert response.json()["error"]["param"] == param, response.text
    completion = httpx.post(
        f"{server.api}/completions",
        json={"prompt": "Hi", "max_tokens": 1, "specprefill": {"conversation_id": "strict"}},
        headers=AUTH_A,
    )
    assert completion.status_code == 400 and "chat/completions" in completion.json()["error"]["message"]
    # None of these touched the conversation.
    assert len(httpx.get(f"{server.api}/conversations/strict", headers=AUTH_A).json()["messages"]) == 3


@pytest.mark.slow
def test_a_conversation_answers_one_request_at_a_time(server: ServerProcess) -> None:
    assert _start(server, "busy", "Hello.", max_tokens=1).status_code == 200
    story = {"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}
    body = {"model": MODEL, "messages": [story], "max_tokens": 64, "stream": True}
    body["specprefill"] = {"conversation_id": "busy"}
    with httpx.stream("POST", f"{server.api}/chat/completions", json=body, headers=AUTH_A, timeout=300) as stream:
        assert stream.status_code == 200 and stream.headers["x-conversation-id"] == "busy"
        lines = stream.iter_lines()
        assert next(line for line in lines if '"content"' in line)  # the turn is running
        second = _chat(server, [{"role": "user", "content": "Stop."}], {"conversation_id": "busy"}, max_tokens=1)
        assert second.status_code == 409 and second.json()["error"]["code"] == "conversation_busy"
        assert httpx.delete(f"{server.api}/conversations/busy", headers=AUTH_A).status_code == 409
    # The client went away mid-answer: the partial answer joined the history and the conversation is free.
    deadline = time.monotonic() + 60
    go_on = [{"role": "user", "content": "Go on."}]
    while (after := _chat(server, go_on, {"conversation_id": "busy"}, max_tokens=1)).status_code == 409:
        assert time.monotonic() < deadline, "the conversation stayed busy after the stream closed"
        time.sleep(0.2)
    assert after.status_code == 200, after.text
    held = httpx.get(f"{server.api}/conversations/busy", headers=AUTH_A).json()["messages"]
    assert [m["role"] for m in held] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert held[4]["content"]


@pytest.mark.slow
def test_a_key_holds_its_share_and_never_evicts_another_keys_conversation(server: ServerProcess) -> None:
    # Four conversations, two keys: each key may hold two. Key B's conversation is the oldest.
    theirs = _chat(
        server,
        [{"role": "user", "content": "Hi."}],
        {"conversation_id": "tenant-b", "conversation_start": True, **DENSE},
        max_tokens=1,
        headers=AUTH_B,
    )
    assert theirs.status_code == 200, theirs.text
    ids = [f"lru-{i}" for i in range(4)]
    for cid in ids:
        assert _start(server, cid, "Hi.", max_tokens=1).status_code == 200
    for cid in ids[:2]:
        gone = _chat(server, [{"role": "user", "content": "Hello?"}], {"conversation_id": cid}, max_tokens=1)
        assert gone.status_code == 404
        assert "one API key may hold at most 2 conversations" in gone.json()["error"]["message"]
    assert all(httpx.get(f"{server.api}/conversations/{cid}", headers=AUTH_A).status_code == 200 for cid in ids[2:])
    assert httpx.get(f"{server.api}/conversations/tenant-b", headers=AUTH_B).status_code == 200
    card = httpx.get(f"{server.api}/models", headers=AUTH_A).json()["data"][0]["specprefill"]
    conversations = card["conversations"]
    assert conversations["max_conversations"] == 4 and conversations["max_conversations_per_key"] == 2
    assert conversations["default_strategy"] == "incremental"
    assert "conversation_id" in card["options"]
    assert httpx.get(f"{server.base}/health").json()["conversations"] == 3


@pytest.mark.slow
def test_an_expired_conversation_gets_a_clear_404(tmp_path: Any) -> None:
    proc = start_server(["--model", MODEL, "--device", "cpu", "--session-ttl", "1.5"], tmp_path / "ttl.log")
    try:
        first = _chat(
            proc,
            [{"role": "user", "content": "Hi."}],
            {"conversation_start": True, **DENSE},
            max_tokens=1,
            headers={},
        )
        cid = _conversation_usage(first)["id"]
        assert cid.startswith("conv_") and first.headers["x-conversation-id"] == cid
        time.sleep(2.5)
        late = _chat(proc, [{"role": "user", "content": "Still there?"}], {"conversation_id": cid}, headers={})
        assert late.status_code == 404, late.text
        error = late.json()["error"]
        assert error["code"] == "conversation_not_found" and error["type"] == "not_found_error"
        assert "expired after 1.5 s" in error["message"] and error["param"] == "specprefill.conversation_id"
        assert httpx.get(f"{proc.base}/health").json()["conversations"] == 0
    finally:
        proc.stop()
