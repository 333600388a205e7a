"""Turn text or chat messages into a `Prompt`: target token ids with per-token provenance.

Chat messages go through the tokenizer's chat template with the generation prompt appended. Each
token learns which message it came from by rendering the conversation one message at a time: the
characters that message ``i`` adds to the rendered text are its segment.

Tool definitions (OpenAI's ``tools``) and the ``tool_calls`` of assistant messages go to the chat
template too. A template that leaves them out of the text (it has no tool support) is refused
rather than let the model answer without them; the text the tool definitions add is protected, so
no selector drops part of a schema the model must follow.

Example::

    prompt = build_prompt(tokenizer, [{"role": "user", "content": "Hi"}])
    prompt.roles[-3:]  # ('template', 'template', 'template'): the generation prompt
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .errors import InvalidRequestError
from .types import TEMPLATE_ROLE, TEXT_ROLE, Message, Prompt

__all__ = ["PromptInput", "ToolsInput", "build_prompt", "check_text", "normalize_messages"]

logger = logging.getLogger(__name__)

#: What the SDK accepts as a prompt: plain text, or a sequence of chat messages.
PromptInput = str | Sequence[Message | Mapping[str, Any]]
#: Tool definitions as OpenAI's ``tools`` (``{"type": "function", "function": {"name", ...}}``).
ToolsInput = Sequence[Mapping[str, Any]]

#: The error code of tools (or tool calls) that the model's chat template does not render.
TOOLS_UNSUPPORTED = "tools_unsupported"


def check_text(text: str, param: str) -> str:
    """``text`` itself, or `InvalidRequestError` naming ``param`` when it is not encodable as UTF-8.

    A lone UTF-16 surrogate (JSON ``"\\ud800"``) is a valid Python ``str`` but not text: tokenizers
    and chat templates fail on it with errors that are not the caller's to read.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"{param} is not valid Unicode text: a lone surrogate {text[exc.start]!r} at character {exc.start}",
            param=param,
        ) from None
    return text


def normalize_messages(messages: Sequence[Message | Mapping[str, Any]]) -> tuple[Message, ...]:
    """Validate and convert OpenAI-style message dicts into `Message` objects."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidRequestError("messages must be a list of {'role', 'content'} objects", param="messages")
    if not messages:
        raise InvalidRequestError("messages must not be empty", param="messages")
    out = tuple(Message.coerce(m) for m in messages)
    for i, m in enumerate(out):
        check_text(m.role, f"messages[{i}].role")
        check_text(m.content, f"messages[{i}].content")
    return out


def _render(
    tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool, tools: ToolsInput | None = None
) -> str:
    if not messages:
        return ""
    dicts = [m.to_dict() for m in messages]
    extra: dict[str, Any] = {} if tools is None else {"tools": [dict(t) for t in tools]}
    try:
        text = tokenizer.apply_chat_template(
            dicts, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )
    except Exception as exc:  # jinja raises plain exceptions for templates that refuse a role order
        raise InvalidRequestError(f"the chat template rejected these messages: {exc}", param="messages") from exc
    return str(text)


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(int(i) for i in added)
    return ids


def _tokenize(tokenizer: Any, text: str, add_special_tokens: bool) -> tuple[list[int], list[tuple[int, int]]]:
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    ids = [int(i) for i in enc["input_ids"]]
    offsets = [(int(a), int(b)) for a, b in enc["offset_mapping"]]
    return ids, offsets


def build_prompt(
    tokenizer: Any,
    prompt: PromptInput,
    *,
    add_generation_prompt: bool = True,
    chat_template: bool | None = None,
    protected_spans: Sequence[tuple[int, int]] = (),
    tools: ToolsInput | None = None,
) -> Prompt:
    """Tokenize ``prompt`` (text or messages) with the target's ``tokenizer``.

    Args:
        tokenizer: a Hugging Face fast tokenizer (offsets are needed).
        prompt: plain text, or a list of chat messages (`Message` or ``{"role", "content"}``).
        add_generation_prompt: append the assistant header (chat prompts only).
        chat_template: for plain text, wrap it as one user message through the chat template.
            ``None`` (default) leaves text as it is.
        protected_spans: character spans ``(start, end)`` of the *rendered* text that must be kept.
        tools: tool definitions for the chat template (chat prompts only); the text they add to the
            prompt is protected.

    Raises:
        InvalidRequestError: empty prompt, malformed messages, text that is not valid Unicode (a lone
            surrogate), or a template that rejects them; tools or tool calls the chat template does
            not render (``code="tools_unsupported"``).
    """
    if isinstance(prompt, bytes):
        raise InvalidRequestError("the prompt must be text (str), not bytes", param="prompt")
    if isinstance(prompt, str):
        check_text(prompt, "prompt")
        if not prompt.strip():
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if chat_template:
            return build_prompt(
                tokenizer,
                [Message("user", prompt)],
                add_generation_prompt=add_generation_prompt,
                protected_spans=protected_spans,
                tools=tools,
            )
        if tools is not None:
            raise InvalidRequestError("tools need chat messages (a chat template), not plain text", param="tools")
        return _from_text(tokenizer, prompt, protected_spans)
    messages = normalize_messages(prompt)
    if not any(m.content.strip() or m.tool_calls for m in messages):
        raise InvalidRequestError("every message is empty", param="messages")
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequestError(
            "this model's tokenizer has no chat template; send plain text instead of messages", param="messages"
        )
    return _from_messages(tokenizer, messages, add_generation_prompt, protected_spans, tools)


def _added_span(with_part: str, without: str) -> tuple[int, int]:
    """The span of ``with_part`` that is not in ``without``: what is left after their common prefix and suffix."""
    start = 0
    limit = min(len(with_part), len(without))
    while start < limit and with_part[start] == without[start]:
        start += 1
    end = 0
    while end < limit - start and with_part[-1 - end] == without[-1 - end]:
        end += 1
    return start, len(with_part) - end


def _check_tool_parts(
    tokenizer: Any, messages: Sequence[Message], add_gen: bool, tools: ToolsInput | None, full: str
) -> tuple[tuple[int, int], ...]:
    """Refuse tools or tool calls the template leaves out of ``full``; the span the tools add to it."""
    spans: tuple[tuple[int, int], ...] = ()
    if tools is not None:
        without = _render(tokenizer, messages, add_gen)
        if without == full:
            raise InvalidRequestError(
                "this model's chat template does not render tools (it has no tool support): the model would "
                "never see them; leave tools out, or serve a model whose chat template takes tools",
                param="tools",
                code=TOOLS_UNSUPPORTED,
            )
        spans = (_added_span(full, without),)
    if any(m.tool_calls for m in messages):
        bare = [replace(m, tool_calls=()) for m in messages]
        if _render(tokenizer, bare, add_gen, tools) == full:
            raise InvalidRequestError(
                "this model's chat template does not render the tool_calls of assistant messages (it has no "
                "tool support): the model would read a conversation without them",
                param="messages",
                code=TOOLS_UNSUPPORTED,
            )
    return spans


def _from_text(tokenizer: Any, text: str, protected_spans: Sequence[tuple[int, int]]) -> Prompt:
    ids, offsets = _tokenize(tokenizer, text, add_special_tokens=True)
    special_ids = _special_ids(tokenizer)
    n = len(ids)
    special = tuple(i in special_ids for i in ids)
    roles = tuple(TEMPLATE_ROLE if s else TEXT_ROLE for s in special)
    return Prompt(
        token_ids=tuple(ids),
        text=text,
        roles=roles,
        message_index=(0,) * n,
        offsets=tuple(offsets),
        special=special,
        protected=_protect_spans(offsets, protected_spans),
        generation_start=n,
        messages=None,
    )


def _segments(
    tokenizer: Any, messages: Sequence[Message], full: str, add_gen: bool, tools: ToolsInput | None = None
) -> list[tuple[int, int]]:
    """Character segment of each message in ``full``, plus the generation prompt's as the last entry."""
    bounds = [0]
    prefix_ok = True
    for i in range(1, len(messages) + 1):
        part = _render(tokenizer, messages[:i], add_generation_prompt=False, tools=tools)
        if not full.startswith(part) or len(part) < bounds[-1]:
            prefix_ok = False
            break
        bounds.append(len(part))
    if prefix_ok:
        segs = [(bounds[i], bounds[i + 1]) for i in range(len(messages))]
        segs.append((bounds[-1], len(full)) if add_gen else (len(full), len(full)))
        return segs
    # Templates that rewrite earlier turns (e.g. drop reasoning) break the prefix rule: locate contents.
    logger.debug("chat template is not prefix-stable; locating message contents by search")
    segs, cursor = [], 0
    for m in messages:
        at = full.find(m.content, cursor) if m.content else -1
        if at < 0:
            segs.append((cursor, cursor))
            continue
        segs.append((cursor, at + len(m.content)))
        cursor = at + len(m.content)
    segs.append((cursor, len(full)))
    return segs


def _from_messages(
    tokenizer: Any,
    messages: Sequence[Message],
    add_gen: bool,
    protected_spans: Sequence[tuple[int, int]],
    tools: ToolsInput | None = None,
) -> Prompt:
    full = _render(tokenizer, messages, add_generation_prompt=add_gen, tools=tools)
    protected_spans = (*protected_spans, *_check_tool_parts(tokenizer, messages, add_gen, tools, full))
    ids, offsets = _tokenize(tokenizer, full, add_special_tokens=False)
    if not ids:
        raise InvalidRequestError("the prompt is empty after applying the chat template", param="messages")
    segs = _segments(tokenizer, messages, full, add_gen, tools)
    # Where each message's content sits inside its segment: tokens outside it are template glue.
    content_spans = []
    for (a, b), m in zip(segs, messages, strict=False):
        at = full.find(m.content, a, b) if m.content else -1
        content_spans.append((at, at + len(m.content)) if at >= 0 else (b, b))
    special_ids = _special_ids(tokenizer)
    roles, msg_idx = [], []
    gen_a = segs[-1][0]
    generation_start = len(ids)
    for t, (start, end) in enumerate(offsets):
        pos = start if end > start else max(start - 1, 0)
        if add_gen and start >= gen_a and generation_start == len(ids) and gen_a < len(full):
            generation_start = t
        index = -1
        for i, (a, b) in enumerate(segs[:-1]):
            if a <= pos < b:
                index = i
                break
        if index < 0:
            roles.append(TEMPLATE_ROLE)
            msg_idx.append(-1)
            continue
        ca, cb = content_spans[index]
        in_content = ca <= pos < cb and ids[t] not in special_ids
        roles.append(messages[index].role if in_content else TEMPLATE_ROLE)
        msg_idx.append(index)
    return Prompt(
        token_ids=tuple(ids),
        text=full,
        roles=tuple(roles),
        message_index=tuple(msg_idx),
        offsets=tuple(offsets),
        special=tuple(i in special_ids for i in ids),
        protected=_protect_spans(offsets, protected_spans),
        generation_start=generation_start,
        messages=tuple(messages),
    )


def _protect_spans(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> tuple[bool, ...]:
    if not spans:
        return (False,) * len(offsets)
    for s in spans:
        if len(s) != 2 or s[0] < 0 or s[1] < s[0]:
            raise InvalidRequestError(
                f"protected span {s!r} must be (start, end) with 0 <= start <= end", param="protected_spans"
            )
    return tuple(any(a < e and s < b for s, e in spans) for a, b in offsets)
