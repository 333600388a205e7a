"""LangChain messages <-> SDK messages, and text-mode compression of LangChain messages."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, ChatMessage

from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.textmode import CompressedMessages, compress_messages
from specprefill_sdk.types import Message

__all__ = ["compress_langchain_messages", "plain_text", "role_of", "to_sdk_messages"]

logger = logging.getLogger(__name__)

_ROLES = {
    "human": "user",
    "ai": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "developer": "system",
}


def role_of(message: BaseMessage) -> str:
    """The chat-template role of a LangChain message (``human`` -> ``user``, ``ai`` -> ``assistant``)."""
    if isinstance(message, ChatMessage):
        return message.role
    return _ROLES.get(message.type, message.type)


def plain_text(message: BaseMessage) -> str | None:
    """The message's text when its content is text only (a string, or text blocks); else None."""
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            return None
    return "".join(parts)


def to_sdk_messages(messages: Sequence[BaseMessage]) -> list[Message]:
    """Convert for the SDK; only text content is accepted.

    Raises:
        InvalidRequestError: a message holds images, audio or other non-text content.
    """
    out = []
    for message in messages:
        text = plain_text(message)
        if text is None:
            raise InvalidRequestError("only text content is supported by this model", param="messages")
        out.append(Message(role=role_of(message), content=text))
    return out


def compress_langchain_messages(
    pipeline: Pipeline,
    messages: Sequence[BaseMessage],
    *,
    roles: Collection[str] | None = None,
    keep: Collection[int] = (),
    gap: str = " ",
) -> tuple[list[BaseMessage], CompressedMessages | None]:
    """Shorten the text of ``messages`` in text mode; every message keeps its type, id and fields.

    Messages with non-text content, with a role outside ``roles`` (None: every role) or whose index
    is in ``keep`` stay whole. Returns the new list and the compression (None when nothing could be
    compressed).
    """
    texts = [plain_text(m) for m in messages]
    whole = {
        i
        for i, (m, t) in enumerate(zip(messages, texts, strict=True))
        if t is None or i in keep or (roles is not None and role_of(m) not in roles)
    }
    if len(whole) == len(messages) or not any(t and t.strip() for t in texts):
        return list(messages), None
    sdk = [Message(role=role_of(m), content=t if t is not None else "") for m, t in zip(messages, texts, strict=True)]
    result = compress_messages(pipeline, sdk, keep_whole=sorted(whole), gap=gap)
    out: list[BaseMessage] = []
    for i, (message, part) in enumerate(zip(messages, result.parts, strict=True)):
        if i in whole or part is None or not part.dropped:
            out.append(message)
        else:
            out.append(message.model_copy(update={"content": part.text}))
    logger.debug(
        "compressed %d messages: %d of %d prompt tokens kept", len(messages), result.kept_tokens, result.prompt_tokens
    )
    return out, result


def as_messages(value: Any) -> list[BaseMessage]:
    """A chat model input (a string, a prompt value or messages) as a list of messages."""
    from langchain_core.messages import convert_to_messages
    from langchain_core.prompt_values import PromptValue

    if isinstance(value, PromptValue):
        return value.to_messages()
    if isinstance(value, str):
        return convert_to_messages([("human", value)])
    if isinstance(value, Sequence):
        return convert_to_messages(value)
    raise InvalidRequestError(f"expected a string, a prompt value or a list of messages, got {type(value).__name__}")
