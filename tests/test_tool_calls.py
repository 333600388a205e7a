"""The Hermes/Qwen tool-call parser: whole texts, and the same texts streamed in every split."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import pytest

from specprefill_sdk.server.tool_calls import ToolCallParser, parse_tool_calls
from specprefill_sdk.types import ToolCall


def _fixed_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def test_a_single_call_has_no_content() -> None:
    content, calls = parse_tool_calls(WEATHER, _fixed_ids())
    assert content is None
    assert calls == [ToolCall(id="call_0", name="get_weather", arguments='{"city": "Oslo"}')]


def test_text_without_calls_is_the_content_itself() -> None:
    for text in ("", "Hello there.  ", "a < b and <tool but no call", "  spaced\n"):
        assert parse_tool_calls(text) == (text, [])


def test_content_around_calls_and_several_calls() -> None:
    text = f"Let me check.\n{WEATHER}\n" + WEATHER.replace("Oslo", "Rome") + "\nDone."
    content, calls = parse_tool_calls(text)
    assert content == "Let me check.Done."
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Oslo"}, {"city": "Rome"}]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


@pytest.mark.parametrize(
    ("body", "arguments"),
    [
        ('{"name": "f", "arguments": "{\\"x\\": 1}"}', '{"x": 1}'),  # arguments as JSON text
        ('{"name": "f", "parameters": {"x": 1}}', '{"x": 1}'),  # Llama 3's word
        ('{"name": "f"}', "{}"),  # no arguments
        ('{"name": "f", "arguments": {"s": "é"}}', '{"s": "é"}'),  # not escaped to \\u00e9
    ],
)
def test_argument_forms(body: str, arguments: str) -> None:
    _, calls = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert [c.arguments for c in calls] == [arguments]


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>not json</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>["f"]</tool_call>',
        '<tool_call>{"name": "f", "arguments": 3}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "not json"}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"x": 1}',  # open and incomplete
    ],
)
def test_a_block_that_is_no_call_stays_as_text(block: str) -> None:
    text = f"Before {block} after"
    assert parse_tool_calls(text) == (text, [])


def test_an_unclosed_block_with_complete_json_is_a_call() -> None:
    content, calls = parse_tool_calls("Sure. " + WEATHER.removesuffix("</tool_call>"))
    assert content == "Sure." and [c.name for c in calls] == ["get_weather"]


def _streamed(text: str, sizes: list[int]) -> tuple[str, list[ToolCall]]:
    parser = ToolCallParser(_fixed_ids())
    pieces = []
    at = 0
    for size in sizes:
        pieces += parser.feed(text[at : at + size])
        at += size
    pieces += parser.feed(text[at:])
    pieces += parser.finish()
    return "".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, ToolCall)]


STREAMED = [
    WEATHER,
    f"Checking <b>now</b> <tool {WEATHER}  \n" + WEATHER.replace("Oslo", "Rome") + " thanks  ",
    "No call here, only < and <tool_ and trailing space  ",
    "Bad <tool_call>{oops}</tool_call> block",
]


@pytest.mark.parametrize("text", STREAMED)
def test_streaming_in_any_split_gives_what_the_whole_text_gives(text: str) -> None:
    content, calls = parse_tool_calls(text, _fixed_ids())
    expected = ("" if content is None else content, calls)
    for size in (1, 2, 3, 5, 7, 11, 64):
        assert _streamed(text, [size] * (len(text) // size)) == expected, size


def test_content_is_released_as_soon_as_it_cannot_begin_a_call() -> None:
    parser = ToolCallParser()
    assert parser.feed("Hello wor") == ["Hello wor"]
    assert parser.feed("ld <tool") == ["ld"]  # " <tool" may begin a block: held back
    assert parser.feed("box>") == [" <toolbox>"]
    first = parser.feed("\n<tool_call>")
    assert first == []
    second = parser.feed('{"name": "f", "arguments": {}}</tool_call>')
    assert [type(p) for p in second] == [ToolCall]
    assert parser.finish() == []
