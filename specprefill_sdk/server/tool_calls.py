"""Tool calls in generated text: the Hermes / Qwen format ``<tool_call>{json}</tool_call>``.

Models trained on this format (Qwen2.5 and Qwen3, Hermes 2/3, many fine-tunes) answer a call as
one JSON object ``{"name": ..., "arguments": {...}}`` between the two tags, one block per call.
`ToolCallParser` splits text into content and calls as it streams: content outside the blocks is
released as soon as it cannot be the start of a block, a call once its block is closed. Whitespace
that only separates content from a block is dropped, so the streamed content joins to exactly the
content `parse_tool_calls` gives for the whole text (both run the same parser).

A block whose JSON does not parse is content, as written (the model's text is never lost); a block
left open at the end (the answer hit ``max_tokens`` or ended without the closing tag) is a call when
its JSON is complete.

Example::

    content, calls = parse_tool_calls('<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>')
    # content is None; calls == [ToolCall(id="call_...", name="f", arguments='{"x": 1}')]
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from ..types import ToolCall

__all__ = ["CLOSE_TAG", "OPEN_TAG", "ToolCallParser", "new_call_id", "parse_tool_calls"]

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"

#: What `ToolCallParser` releases: content text, or a whole call.
Piece = str | ToolCall


def new_call_id() -> str:
    """A fresh tool-call id in OpenAI's form (``call_`` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(body: str, new_id: Callable[[], str]) -> ToolCall | None:
    """The call a block's JSON describes, or None when it is not one."""
    try:
        data: Any = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    # Some fine-tunes write "parameters" (Llama 3's word) for "arguments".
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return None
        if not isinstance(parsed, dict):
            return None
        text = arguments
    elif isinstance(arguments, dict):
        text = json.dumps(arguments, ensure_ascii=False)
    else:
        return None
    return ToolCall(id=new_id(), name=data["name"], arguments=text)


def _open_prefix(text: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of `OPEN_TAG` (a block may begin there)."""
    for size in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if OPEN_TAG.startswith(text[-size:]):
            return size
    return 0


class ToolCallParser:
    """Splits generated text into content and tool calls, one delta at a time.

    Example::

        parser = ToolCallParser()
        for delta in deltas:
            for piece in parser.feed(delta):
                ...  # str: content to show now; ToolCall: a whole call
        rest = parser.finish()
    """

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        self._new_id = new_id
        self._buffer = ""  # text not decided yet
        self._inside = False  # the buffer is the body of an open block
        self._before = ""  # the whitespace dropped before the open block (given back if it is no call)
        self._after_call = False  # leading whitespace of the next content only separates it from a call
        #: the calls released so far
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[Piece]:
        """Take one delta of generated text; return what can be released now."""
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[Piece]:
        """The generation ended: release everything still held."""
        return self._drain(final=True)

    def _content(self, text: str, out: list[Piece]) -> None:
        if self._after_call:
            text = text.lstrip()
        if text:
            self._after_call = False
            out.append(text)

    def _drain(self, *, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while True:
            if self._inside:
                end = self._buffer.find(CLOSE_TAG)
                if end < 0 and not final:
                    return out
                body = self._buffer if end < 0 else self._buffer[:end]
                call = _call(body.strip(), self._new_id)
                raw = OPEN_TAG + body + ("" if end < 0 else CLOSE_TAG)
                self._buffer = "" if end < 0 else self._buffer[end + len(CLOSE_TAG) :]
                self._inside = False
                if call is None:
                    self._content(self._before + raw, out)
                else:
                    self.calls.append(call)
                    out.append(call)
                    self._after_call = True
                self._before = ""
                if end < 0:
                    return out
                continue
            start = self._buffer.find(OPEN_TAG)
            if start >= 0:
                text = self._buffer[:start]
                kept = text.rstrip()
                self._content(kept, out)
                self._before = text[len(kept) :]
                self._buffer = self._buffer[start + len(OPEN_TAG) :]
                self._inside = True
                continue
            if final:
                text, self._buffer = self._buffer, ""
                self._content(text.rstrip() if self.calls else text, out)
                return out
            # Hold back a tail that may begin a block, and the whitespace before it.
            hold = len(self._buffer) - _open_prefix(self._buffer)
            head = self._buffer[:hold]
            kept = head.rstrip()
            self._content(kept, out)
            self._buffer = self._buffer[len(kept) :]
            return out


def parse_tool_calls(text: str, new_id: Callable[[], str] = new_call_id) -> tuple[str | None, list[ToolCall]]:
    """``(content, calls)`` of a whole generated text.

    Without calls the content is ``text`` itself; with calls it is the text outside their blocks
    (None when there is none), as `ToolCallParser` streams it.
    """
    parser = ToolCallParser(new_id)
    pieces = [*parser.feed(text), *parser.finish()]
    if not parser.calls:
        return text, []
    content = "".join(p for p in pieces if isinstance(p, str))
    return content or None, parser.calls
