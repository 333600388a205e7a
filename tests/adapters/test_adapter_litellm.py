"""litellm adapter against the real litellm SDK and proxy, our server and SmolLM2 (processes on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("litellm")

import litellm
from adapter_helpers import GAP, SHORT_CHAT, assert_pieces_of
from litellm.integrations.custom_logger import CustomLogger
from litellm.types.utils import CallTypes

from specprefill_litellm import SpecPrefillCallback
from specprefill_sdk.policies import load_policy

pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning")  # litellm's own typed dicts

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the text about?"


def test_hooks_are_defined_on_the_class_itself() -> None:
    # The proxy runs async_pre_call_hook only when it is in the callback class's own __dict__.
    class Mine(SpecPrefillCallback):
        pass

    for cls in (SpecPrefillCallback, Mine):
        for hook in (
            "async_pre_call_hook",
            "async_pre_call_deployment_hook",
            "async_post_call_response_headers_hook",
            "async_post_call_streaming_iterator_hook",
        ):
            assert hook in vars(cls)
            assert getattr(cls, hook) is not getattr(CustomLogger, hook)


async def test_pass_through_sends_the_extension_with_the_request_s_own_fields_first() -> None:
    handler = SpecPrefillCallback(
        server_models=["ours"],
        options={"keep_rate": 0.2, "policy": "paper"},
        server_api_bases=["http://127.0.0.1:9/v1/"],
    )
    messages = [{"role": "user", "content": "hello"}]
    data = {"model": "ours", "messages": messages, "specprefill": {"keep_rate": 0.5}, "extra_body": {"x": 1}}
    out = await handler.async_pre_call_hook(None, None, data, "acompletion")
    assert out["extra_body"] == {"x": 1, "specprefill": {"keep_rate": 0.5, "policy": "paper"}}
    assert "specprefill" not in out and out["messages"] is messages
    embed = {"model": "ours", "input": ["x"]}
    assert await handler.async_pre_call_hook(None, None, dict(embed), "aembedding") == embed

    kwargs = {"model": "openai/any", "api_base": "http://127.0.0.1:9", "messages": messages}
    out = await handler.async_pre_call_deployment_hook(kwargs, CallTypes.acompletion)
    assert out is not None and out["extra_body"]["specprefill"] == {"keep_rate": 0.2, "policy": "paper"}
    assert await handler.async_pre_call_deployment_hook(out, None) is None  # already chosen: untouched


@pytest.mark.slow
async def test_text_mode_shortens_messages_and_keeps_their_fields(paper_pipeline, essay) -> None:
    handler = SpecPrefillCallback(paper_pipeline, roles=["user", "tool"], gap=GAP)
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Find the essay."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": essay[:1500]},
        {"role": "user", "content": [{"type": "text", "text": QUESTION}], "name": "ann"},
    ]
    data = {"model": "gpt-4o-mini", "messages": [dict(m) for m in messages], "metadata": {"team": "a"}}
    out = await handler.async_pre_call_hook(None, None, data, "acompletion")
    got = out["messages"]
    assert [m["role"] for m in got] == [m["role"] for m in messages]
    assert got[2] == messages[2] and got[0] == messages[0]
    assert got[3]["tool_call_id"] == "c1" and len(got[3]["content"]) < 0.7 * len(essay[:1500])
    assert_pieces_of(got[3]["content"], essay[:1500])
    assert got[4]["name"] == "ann"
    stats = out["metadata"]["specprefill"]
    assert out["metadata"]["team"] == "a" and stats["kept_tokens"] < stats["prompt_tokens"]
    before = [dict(m) for m in got]
    again = await handler.async_pre_call_deployment_hook(out, None)  # the marker: not compressed twice
    assert again is not None and again["messages"] == before


@pytest.mark.slow
async def test_text_mode_by_default_leaves_a_short_chat_whole_and_shortens_a_long_one(essay) -> None:
    handler = SpecPrefillCallback(model="smollm2-135m")  # the default policy, as users get it
    messages = [{"role": role, "content": text} for role, text in SHORT_CHAT]
    out = await handler.async_pre_call_hook(None, None, {"model": "gpt-4o-mini", "messages": messages}, "acompletion")
    stats = out["metadata"]["specprefill"]
    assert out["messages"] == messages and stats["kept_tokens"] == stats["prompt_tokens"] > 32
    auto = load_policy("auto").selector  # the default policy
    long = [{"role": "user", "content": essay + "\n" + QUESTION}]
    out = await handler.async_pre_call_hook(None, None, {"model": "gpt-4o-mini", "messages": long}, "acompletion")
    stats = out["metadata"]["specprefill"]
    assert stats["prompt_tokens"] >= auto.dense_below_tokens
    assert stats["kept_tokens"] <= auto.max_rate * stats["prompt_tokens"] + auto.chunk_size
    assert len(out["messages"][0]["content"]) < len(essay)


@pytest.mark.slow
async def test_sdk_deployment_hook_against_our_server(paper_pipeline, essay) -> None:
    from server_utils import serve_in_thread

    from specprefill_sdk.server import ServerConfig, create_app

    messages = [{"role": "user", "content": essay[:1500] + "\n" + QUESTION}]
    saved = list(litellm.callbacks)
    config = ServerConfig(model="smollm2-135m", device="cpu", dtype="auto", policy="paper")
    with serve_in_thread(create_app(config)) as base:
        try:
            litellm.callbacks = [
                SpecPrefillCallback(paper_pipeline, server_api_bases=[base], options={"keep_rate": 0.4})
            ]
            served = await litellm.acompletion(
                model="openai/smollm2-135m", api_base=f"{base}/v1", api_key="none", messages=messages, max_tokens=4
            )
            litellm.callbacks = [SpecPrefillCallback(paper_pipeline)]
            text = await litellm.acompletion(
                model="openai/smollm2-135m", api_base=f"{base}/v1", api_key="none", messages=messages, max_tokens=4
            )
        finally:
            litellm.callbacks = saved
    usage = served.usage.model_dump()
    # the server applied our options (keep 40%, not the paper policy's 10%) and says so in the usage
    assert 0.3 < usage["specprefill"]["keep_ratio"] < 0.6
    assert usage["specprefill"]["kept_tokens"] < usage["prompt_tokens"]
    # text mode: the server received shorter messages than the original prompt
    assert text.usage.prompt_tokens < 0.6 * usage["prompt_tokens"]
    assert served.choices[0].message.content and text.choices[0].message.content


_RECORDER = """
import json, os
from litellm.integrations.custom_logger import CustomLogger


class Recorder(CustomLogger):
    # What litellm hands every logger (and writes to spend logs): its standard logging payload.
    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        payload = kwargs.get("standard_logging_object") or {}
        with open(os.environ["SPECPREFILL_TEST_RECORD"], "a") as out:
            out.write(json.dumps({"model": payload.get("model_group"), "metadata": payload.get("metadata")}) + "\\n")


recorder = Recorder()
"""


@pytest.mark.slow
def test_litellm_proxy_example_end_to_end(tmp_path) -> None:
    """examples/litellm_proxy.py: `specprefill serve` and the litellm proxy as processes, an openai client."""
    # The example's config and callback module, plus a logger that records litellm's logging payload.
    config = (ROOT / "examples" / "litellm_config.yaml").read_text()
    config = config.replace(
        "callbacks: litellm_callbacks.handler", "callbacks: [litellm_callbacks.handler, recorder.recorder]"
    )
    (tmp_path / "litellm_config.yaml").write_text(config)
    (tmp_path / "litellm_callbacks.py").write_text((ROOT / "examples" / "litellm_callbacks.py").read_text())
    (tmp_path / "recorder.py").write_text(_RECORDER)
    record = tmp_path / "record.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "adapters"), str(ROOT), str(tmp_path)]),
        "SPECPREFILL_TEST_RECORD": str(record),
    }
    args = ["--json", "--stream", "--max-tokens", "6", "--chars", "1500", "--logs", str(tmp_path)]
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "litellm_proxy.py"),
            *args,
            "--config",
            str(tmp_path / "litellm_config.yaml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("*.log"))
    assert done.returncode == 0, done.stdout + done.stderr + logs
    answers = {r["model"]: r for r in map(json.loads, done.stdout.strip().splitlines())}
    served, text = answers["smollm2"], answers["smollm2-text"]
    assert served["answer"].strip() and text["answer"].strip()
    extension = served["usage"]["specprefill"]
    assert extension["kept_tokens"] < served["usage"]["prompt_tokens"]
    assert 0.2 < extension["keep_ratio"] < 0.5  # the callback's keep_rate=0.3 reached the server
    assert text["usage"]["prompt_tokens"] < 0.6 * served["usage"]["prompt_tokens"]  # shortened by the proxy

    # streamed through the proxy, the usage still carries the server's report
    assert served["stream_answer"].strip()
    assert served["stream_usage"]["specprefill"]["kept_tokens"] == extension["kept_tokens"]
    assert "specprefill" in text["stream_usage"]

    # text mode's counts: response headers, and litellm's logging payload (what spend logs record)
    headers = text["headers"]
    assert int(headers["x-specprefill-kept-tokens"]) < int(headers["x-specprefill-prompt-tokens"])
    assert not served["headers"]  # the pass-through compresses nothing in the proxy
    logged = [json.loads(line) for line in record.read_text().splitlines()]
    text_logged = [r for r in logged if r["model"] == "smollm2-text"]
    assert len(text_logged) == 2  # the plain and the streamed request
    for entry in text_logged:
        stats = entry["metadata"]["spend_logs_metadata"]["specprefill"]
        assert stats["kept_tokens"] == int(headers["x-specprefill-kept-tokens"])
        assert stats["prompt_tokens"] == int(headers["x-specprefill-prompt-tokens"])


@pytest.mark.slow
def test_sync_completion_is_warned_about_once(paper_pipeline, server_base, caplog, monkeypatch) -> None:
    import specprefill_litellm.callback as module

    monkeypatch.setattr(module, "_SYNC_WARNED", False)  # once per process: this test's process may have warned
    saved = list(litellm.callbacks)
    messages = [{"role": "user", "content": "Name a colour."}]
    call = {"model": "openai/smollm2-135m", "api_base": f"{server_base}/v1", "api_key": "none", "max_tokens": 2}
    try:
        litellm.callbacks = [SpecPrefillCallback(paper_pipeline)]
        with caplog.at_level("WARNING", logger="specprefill_litellm.callback"):
            for _ in range(2):
                assert litellm.completion(messages=messages, **call).choices[0].message.content is not None
    finally:
        litellm.callbacks = saved
    warned = [r for r in caplog.records if r.name == "specprefill_litellm.callback"]
    assert len(warned) == 1 and "sync litellm.completion" in warned[0].getMessage()


def test_policy_fields_are_sent_to_servers_unless_options_say_otherwise() -> None:
    handler = SpecPrefillCallback(policy="conservative", keep_rate=0.3, dense_below_tokens=200, server_models=["s"])
    assert handler.options == {"policy": "conservative", "keep_rate": 0.3, "min_prompt_tokens": 200}
    assert SpecPrefillCallback(keep_rate=0.3, options={"keep_rate": 0.5}).options == {"keep_rate": 0.5}
    assert SpecPrefillCallback().options == {}
