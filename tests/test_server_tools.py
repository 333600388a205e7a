"""Tool calling end to end: a `specprefill serve` process on 127.0.0.1, driven by the `openai` client.

The served model is SmolLM2 with a Hermes/Qwen-style chat template that renders tools, tool calls
and tool results (written into a copy of the model folder; the weights are linked, not copied).
Two earlier turns that call ``get_weather`` make the greedy answer to a third question a call too:
`test_the_greedy_answer_is_a_tool_call_in_the_hermes_format` checks that text first, so the other
tests check the server's wiring on an output known in advance.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_utils import ServerProcess, start_server

pytestmark = pytest.mark.slow

#: A Hermes/Qwen2.5-style template: tools in the system turn, calls in <tool_call> blocks, results as user turns.
TOOL_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{%- if messages[0].role == 'system' %}
{{ messages[0].content }}
{%- endif %}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}{% for tc in message.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def tool_model_folder(root: Path) -> Path:
    """A copy of the bundled SmolLM2 folder (weights linked) whose chat template renders tools."""
    from specprefill_sdk.models import resolve_model_path

    source = Path(resolve_model_path("smollm2-135m", progress=False))
    folder = root / "smollm2-tools"
    folder.mkdir()
    for item in source.iterdir():
        if item.name != "chat_template.jinja":
            (folder / item.name).symlink_to(item)
    (folder / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return folder


def messages(question: str = "Weather in Oslo?") -> list[dict[str, Any]]:
    """Two earlier questions answered by calls (arguments as JSON text, as OpenAI sends them), then ``question``."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "Answer every question with a tool call."}]
    for i, city in enumerate(("Paris", "Rome")):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
        }
        out += [
            {"role": "user", "content": f"Weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ]
    out.append({"role": "user", "content": question})
    return out


#: Dense prefill: the few-shot turns must reach the model whole for its answer to be the one checked.
DENSE = {"specprefill": {"enabled": False}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tool_model_folder(tmp_path_factory.mktemp("tools"))


@pytest.fixture(scope="module")
def tool_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    args = ["--model", str(folder), "--device", "cpu", "--dtype", "auto", "--policy", "paper"]
    proc = start_server([*args, "--served-model-name", "tools", "--max-output-tokens", "40"], folder / "server.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="none", max_retries=0, timeout=300)


def _ask(client: openai.OpenAI, **kwargs: Any) -> Any:
    body: dict[str, Any] = {"model": "tools", "messages": messages(), "tools": TOOLS, "max_tokens": 40}
    return client.chat.completions.create(**{**body, "extra_body": DENSE, **kwargs})


def test_the_greedy_answer_is_a_tool_call_in_the_hermes_format(client: openai.OpenAI) -> None:
    # tool_choice "none": the text as the model wrote it, nothing parsed.
    answer = _ask(client, tool_choice="none")
    choice = answer.choices[0]
    assert choice.message.content == CALL_TEXT and choice.finish_reason == "stop"
    assert choice.message.tool_calls is None


def test_a_tool_call_comes_back_as_tool_calls(client: openai.OpenAI) -> None:
    for extra in ({}, {"tool_choice": "auto"}):
        choice = _ask(client, **extra).choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}


def test_a_streamed_tool_call_comes_as_delta_tool_calls(client: openai.OpenAI) -> None:
    calls: list[Any] = []
    content: list[str] = []
    finish = []
    for chunk in _ask(client, stream=True):
        for choice in chunk.choices:
            calls += choice.delta.tool_calls or []
            content.append(choice.delta.content or "")
            finish.append(choice.finish_reason)
    assert "".join(content) == ""  # the block never leaks as content
    (call,) = calls
    assert call.index == 0 and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert [f for f in finish if f is not None] == ["tool_calls"]


def test_the_clients_stream_helper_assembles_the_call(client: openai.OpenAI) -> None:
    body: dict[str, Any] = {"model": "tools", "messages": messages(), "tools": TOOLS, "max_tokens": 40}
    with client.chat.completions.stream(**body, extra_body=DENSE) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert final.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}


def _with_result(call_arguments: str = '{"city": "Oslo"}') -> list[dict[str, Any]]:
    call = {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": call_arguments}}
    return [
        *messages(),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_9", "content": "Snow, -3 C"},
    ]


def test_tools_calls_and_results_render_through_the_template(tool_tokenizer: Any) -> None:
    from specprefill_sdk.prompt import build_prompt

    prompt = build_prompt(tool_tokenizer, _with_result(), tools=TOOLS)
    assert json.dumps(TOOLS[0]) in prompt.text  # the definitions, whole
    assert CALL_TEXT + "<|im_end|>" in prompt.text  # the call, its arguments an object again
    assert "<tool_response>\nSnow, -3 C\n</tool_response>" in prompt.text
    # The text the definitions add is protected, and only that: the messages stay compressible.
    kept = "".join(prompt.text[a:b] for (a, b), p in zip(prompt.offsets, prompt.protected, strict=True) if p)
    assert json.dumps(TOOLS[0]) in kept and "Weather in Paris?" not in kept


def test_a_conversation_with_a_tool_result_is_served(server: ServerProcess, tool_tokenizer: Any) -> None:
    from specprefill_sdk.prompt import build_prompt

    body = {"model": "tools", "messages": _with_result(), "tools": TOOLS, "max_tokens": 2, **DENSE}
    answer = httpx.post(f"{server.api}/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    # the server prefilled exactly the prompt the template writes for the call and its result
    expected = build_prompt(tool_tokenizer, _with_result(), tools=TOOLS)
    assert answer.json()["usage"]["prompt_tokens"] == expected.n
    # and its tokenize route counts the same ids (vLLM's tokenize takes tools too)
    body = {"model": "tools", "messages": _with_result(), "tools": TOOLS}
    tokens = httpx.post(f"{server.base}/tokenize", json=body, timeout=60)
    assert tokens.status_code == 200, tokens.text
    assert tokens.json()["tokens"] == list(expected.token_ids)


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_a_tool_choice_that_forces_a_call_is_refused(client: openai.OpenAI, choice: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, tool_choice=choice)
    assert info.value.param == "tool_choice" and info.value.code == "unsupported_parameter"
    assert "auto" in info.value.message


def test_tool_calls_with_invalid_arguments_are_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, messages=_with_result("{not json"))
    assert info.value.param == "messages" and "not JSON" in info.value.message


def test_tool_responses_parse_as_the_openai_packages_types(server: ServerProcess) -> None:
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    body = {"model": "tools", "messages": messages(), "tools": TOOLS, "max_tokens": 40, **DENSE}
    body |= {"logprobs": True, "top_logprobs": 1}
    answer = httpx.post(f"{server.api}/chat/completions", json=body, timeout=120)
    parsed = ChatCompletion.model_validate(answer.json(), strict=True)
    assert parsed.choices[0].message.tool_calls and not parsed.choices[0].message.model_extra
    assert parsed.choices[0].logprobs is not None and parsed.choices[0].logprobs.content
    with httpx.stream("POST", f"{server.api}/chat/completions", json={**body, "stream": True}, timeout=120) as response:
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(json.loads(d), strict=True) for d in data[:-1]]
    deltas = [call for c in chunks for choice in c.choices for call in choice.delta.tool_calls or []]
    assert [d.function.name for d in deltas if d.function] == ["get_weather"]
    for c in chunks:
        for choice in c.choices:
            assert not choice.delta.model_extra and not (choice.model_extra or {}).keys() - {"token_ids"}


def test_the_tool_definitions_are_kept_when_the_prompt_is_compressed(
    server: ServerProcess, tool_tokenizer: Any
) -> None:
    from specprefill_sdk.prompt import build_prompt

    body = {
        "model": "tools",
        "messages": messages(),
        "tools": TOOLS,
        "max_tokens": 1,
        "specprefill": {"keep_rate": 0.1, "min_prompt_tokens": 0},
    }
    answer = httpx.post(f"{server.api}/chat/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    prompt = build_prompt(tool_tokenizer, messages(), tools=TOOLS)
    protected = sum(prompt.protected)
    assert usage["prompt_tokens"] == prompt.n and usage["specprefill"]["score_ms"] > 0
    # far above the 10% asked for: every token of the tool definitions is kept on top
    assert usage["specprefill"]["kept_tokens"] >= protected > 0.3 * prompt.n
