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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np

from . import _parallel_encode
from .errors import InvalidRequestError
from .types import TEMPLATE_ROLE, TEXT_ROLE, DeferredOffsets, Message, Offsets, Prompt

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


#: The transformers methods between a fast tokenizer's call and its Rust backend's ``encode_batch``
#: (4.x and 5.x); a class that overrides one of them does more than encode, so it is called as it is.
_CALL_PATH = ("__call__", "_call_one", "encode_plus", "_encode_plus", "_batch_encode_plus")
#: The transformers classes whose call is the backend's encoding (5.x, and 4.x's name).
_FAST_BASES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _backend(tokenizer: Any) -> Any:
    """The Rust tokenizer when calling ``tokenizer`` is exactly its ``encode``, else None.

    Calling the backend directly skips the wrapper's conversion of the encoding into Python lists,
    which costs as much as a tenth of the encoding itself on a long prompt. It is taken only for a
    plain fast tokenizer in its default state: no method of the call path overridden, special tokens
    not split, no truncation or padding set on the backend.
    """
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or getattr(tokenizer, "split_special_tokens", False):
        return None
    base = next((c for c in type(tokenizer).__mro__ if c.__name__ in _FAST_BASES), None)
    if base is None or any(getattr(type(tokenizer), m, None) is not getattr(base, m, None) for m in _CALL_PATH):
        return None
    try:
        if backend.truncation is not None or backend.padding is not None or backend.encode_special_tokens:
            return None
    except AttributeError:
        return None
    return backend


def _tokenize_deferred(
    tokenizer: Any, text: str, add_special_tokens: bool
) -> tuple[list[int], Callable[[], Sequence[tuple[int, int]]]]:
    """The ids, and a function that computes the offsets (from the Rust encodings, on the fast path)."""
    backend = _backend(tokenizer)
    if backend is not None:
        # A long text in pieces on several cores where that is exact (`_parallel_encode`), else whole.
        return _parallel_encode.encode_deferred(backend, text, add_special_tokens)
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    ids = [int(i) for i in enc["input_ids"]]
    offsets = [(int(a), int(b)) for a, b in enc["offset_mapping"]]
    return ids, lambda: offsets


def _tokenize(tokenizer: Any, text: str, add_special_tokens: bool) -> tuple[list[int], Sequence[tuple[int, int]]]:
    ids, offsets = _tokenize_deferred(tokenizer, text, add_special_tokens)
    return ids, offsets()


def _special_mask(ids: Sequence[int], special_ids: set[int]) -> np.ndarray:
    """Which ids are special, computed in numpy rather than a Python test per token."""
    if not special_ids or not ids:
        return np.zeros(len(ids), dtype=bool)
    return np.isin(np.asarray(ids, dtype=np.int64), np.fromiter(special_ids, dtype=np.int64))


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
    ids, compute = _tokenize_deferred(tokenizer, text, add_special_tokens=True)
    n = len(ids)
    # Offsets on first read: many requests never read them (`DeferredOffsets`); protected spans do.
    if protected_spans:
        offsets = tuple(compute())
        protected = _protect_spans(offsets, protected_spans)
    else:
        offsets, protected = cast("Offsets", DeferredOffsets(n, compute)), (False,) * n
    # A text prompt has few special tokens (a BOS): mark those, not test every token in Python.
    marked = np.flatnonzero(_special_mask(ids, _special_ids(tokenizer))).tolist()
    special, roles = [False] * n, [TEXT_ROLE] * n
    for t in marked:
        special[t], roles[t] = True, TEMPLATE_ROLE
    return Prompt(
        token_ids=tuple(ids),
        text=text,
        roles=tuple(roles),
        message_index=(0,) * n,
        offsets=offsets,
        special=tuple(special),
        protected=protected,
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
    special = _special_mask(ids, _special_ids(tokenizer))
    codes, msg_idx, generation_start = _locate(
        offsets, segs, content_spans, special, add_gen and segs[-1][0] < len(full)
    )
    table = [m.role for m in messages] + [TEMPLATE_ROLE]
    roles = list(map(table.__getitem__, codes))
    return Prompt(
        token_ids=tuple(ids),
        text=full,
        roles=tuple(roles),
        message_index=tuple(msg_idx),
        offsets=tuple(offsets),
        special=tuple(special.tolist()),
        protected=_protect_spans(offsets, protected_spans),
        generation_start=generation_start,
        messages=tuple(messages),
    )


def _locate(
    offsets: Sequence[tuple[int, int]],
    segs: Sequence[tuple[int, int]],
    content_spans: Sequence[tuple[int, int]],
    special: np.ndarray,
    generation: bool,
) -> tuple[list[int], list[int], int]:
    """Each token's role code (``len(messages)``: template) and message (-1: template glue), and the
    index where the generation prompt starts, computed in numpy rather than token by token.

    A token belongs to the message segment that holds its first character (for an empty span, the
    character before it); the segments of `_segments` are sorted and disjoint, so that segment is
    the last one starting at or before it.
    """
    n = len(offsets)
    bounds = np.asarray(segs[:-1], dtype=np.int64).reshape(-1, 2)
    starts, ends = bounds[:, 0], bounds[:, 1]
    spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    first, last = spans[:, 0], spans[:, 1]
    # An empty span (a token of no characters) belongs where the character before it does.
    pos = np.where(last > first, first, np.maximum(first - 1, 0))
    seg = np.searchsorted(starts, pos, side="right") - 1
    safe = np.clip(seg, 0, None)
    inside = (seg >= 0) & (pos < ends[safe]) if len(bounds) else np.zeros(n, dtype=bool)
    index = np.where(inside, seg, -1)
    content = np.asarray(content_spans, dtype=np.int64).reshape(-1, 2)
    in_content = inside & ~special
    if len(content):
        in_content &= (content[safe, 0] <= pos) & (pos < content[safe, 1])
    codes = np.where(in_content, index, len(segs) - 1)
    generation_start = n
    if generation:
        after = np.flatnonzero(first >= segs[-1][0])
        if len(after):
            generation_start = int(after[0])
    return codes.tolist(), index.tolist(), generation_start


def _protect_spans(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> tuple[bool, ...]:
    if not spans:
        return (False,) * len(offsets)
    for s in spans:
        if len(s) != 2 or s[0] < 0 or s[1] < s[0]:
            raise InvalidRequestError(
                f"protected span {s!r} must be (start, end) with 0 <= start <= end", param="protected_spans"
            )
    return tuple(any(a < e and s < b for s, e in spans) for a, b in offsets)
