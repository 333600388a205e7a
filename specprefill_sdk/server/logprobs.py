"""Token log-probabilities in OpenAI's two shapes, from the backend's `TokenLogprob` entries.

Chat: ``choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}]}``. Completions: ``choices[].logprobs = {tokens, token_logprobs, top_logprobs: [{token:
logprob}], text_offset}``, where each step's ``top_logprobs`` holds the chosen token too (as OpenAI's
legacy completions and vLLM give it). A token's text is its decoded string (a piece of a multi-byte
character decodes to U+FFFD); ``bytes`` are the token's own bytes, exact for byte-level BPE
tokenizers. ``-inf`` (a token the model rules out) is written as -9999.0, as vLLM does: JSON has no
infinity.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from ..types import TokenLogprob

__all__ = ["MIN_LOGPROB", "TokenText", "chat_logprobs", "completion_logprobs"]

#: What a log-probability of -inf is written as.
MIN_LOGPROB = -9999.0


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-character table, inverted: how byte-level BPE tokens spell their bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _number(value: float) -> float:
    return value if math.isfinite(value) else MIN_LOGPROB


class TokenText:
    """Each token id's text and bytes under one tokenizer (looked up once per id)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        """``(text, bytes)`` of ``token_id``."""
        found = self._cache.get(token_id)
        if found is None:
            text = str(self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False))
            raw = text.encode("utf-8")
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            decoder = _byte_decoder()
            if token_id not in self._special and isinstance(piece, str) and piece and all(c in decoder for c in piece):
                raw = bytes(decoder[c] for c in piece)
            found = self._cache[token_id] = (text, list(raw))
        return found


def _entry(text: TokenText, token_id: int, logprob: float) -> dict[str, Any]:
    token, raw = text(token_id)
    return {"token": token, "logprob": _number(logprob), "bytes": raw}


def chat_logprobs(entries: Sequence[TokenLogprob], text: TokenText) -> dict[str, Any]:
    """``choices[].logprobs`` of a chat answer (or of one streamed chunk)."""
    content = []
    for e in entries:
        item = _entry(text, e.token_id, e.logprob)
        item["top_logprobs"] = [_entry(text, t, lp) for t, lp in e.top]
        content.append(item)
    return {"content": content}


def completion_logprobs(entries: Sequence[TokenLogprob], text: TokenText, offset: int = 0) -> dict[str, Any]:
    """``choices[].logprobs`` of a text completion (or of one streamed chunk whose text starts at ``offset``)."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top: list[dict[str, float]] = []
    offsets: list[int] = []
    for e in entries:
        token = text(e.token_id)[0]
        offsets.append(offset)
        offset += len(token)
        tokens.append(token)
        token_logprobs.append(_number(e.logprob))
        step = {text(t)[0]: _number(lp) for t, lp in e.top}
        step.setdefault(token, _number(e.logprob))
        top.append(step)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}
