"""Token ids -> text deltas, for streaming: whole characters only, stop strings cut and held back.

`IncrementalDetokenizer` turns one token at a time into the text it adds. A token that ends in the
middle of a multi-byte character adds nothing until the character is complete (the decoder shows an
incomplete character as U+FFFD). Each step decodes only a short window of recent tokens (the
prefix/read offsets of text-generation-inference and vLLM), so the cost per token stays constant.

`TextAssembler` puts the deltas together, cuts the text before the first stop string and holds back
any tail that could still become a stop string, so no streamed delta ever has to be taken back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["IncrementalDetokenizer", "TextAssembler"]

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Decodes a growing list of token ids into text deltas that join to the whole text."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # tokens up to here have been turned into text

    def _decode(self, ids: Sequence[int]) -> str:
        return str(
            self.tokenizer.decode(
                list(ids), skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
            )
        )

    def add(self, token_id: int) -> str:
        """Append one token; return the new complete text (may be empty)."""
        self.ids.append(int(token_id))
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end is given as decoded)."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read == len(self.ids):
            return ""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and (final or not after.endswith(_REPLACEMENT)):
            self._prefix, self._read = self._read, len(self.ids)
            return after[len(before) :]
        if final:
            self._prefix, self._read = self._read, len(self.ids)
        return ""


class TextAssembler:
    """Joins deltas into the output text; finds stop strings; decides what may be streamed.

    Example::

        asm = TextAssembler(tokenizer, stop=("\\n\\n",))
        for token in tokens:
            delta = asm.add(token)   # safe to show now
            if asm.stopped:
                break
        tail = asm.finish()          # the rest, once generation has ended
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self._detok = IncrementalDetokenizer(tokenizer)
        self.stop = tuple(stop)
        self._longest_stop = max((len(s) for s in self.stop), default=0)
        self.text = ""  # all decoded text so far (cut at a stop string once found)
        self.emitted = 0  # characters of `text` already handed out
        self.stopped = False

    def _held_back(self) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        for size in range(min(self._longest_stop - 1, len(self.text)), 0, -1):
            tail = self.text[-size:]
            if any(s.startswith(tail) for s in self.stop):
                return size
        return 0

    def _append(self, delta: str) -> str:
        if self.stopped or not delta:
            return ""
        start = max(len(self.text) - self._longest_stop + 1, 0)
        self.text += delta
        if self.stop:
            hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                return self._emit(len(self.text))
            return self._emit(len(self.text) - self._held_back())
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        if upto <= self.emitted:
            return ""
        out = self.text[self.emitted : upto]
        self.emitted = upto
        return out

    def add(self, token_id: int) -> str:
        """Feed one generated token (not EOS); return the text that can be shown now."""
        return self._append(self._detok.add(token_id))

    def finish(self) -> str:
        """Generation ended: the text still held back."""
        out = self._append(self._detok.flush())
        return out + self._emit(len(self.text))
