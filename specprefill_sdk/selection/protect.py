"""`Protect`: tokens that are always kept, whatever their scores (attention sink, generation prompt, ...)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidRequestError
from ..interfaces import KeepEstimating, Selector
from ..types import TEMPLATE_ROLE, Prompt, Selection, TokenScores
from ..validation import check_int
from .base import FillSelector, bool_array, dense_selection, prompt_protected, selection_from_mask

__all__ = ["TEXT_TAIL_TOKENS", "Protect"]

#: With ``tail=True``, a prompt without a generation prompt (plain text) keeps its last this many
#: tokens: the question or instruction usually ends the prompt, and the first generated token is
#: predicted from the last one.
TEXT_TAIL_TOKENS = 8


def _spans(value: object) -> tuple[tuple[int, int], ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidRequestError("spans must be a list of (start, end) character spans", param="spans")
    out = []
    for span in value:
        if (
            not isinstance(span, Sequence)
            or isinstance(span, str | bytes)
            or len(span) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in span)
            or span[0] < 0
            or span[1] < span[0]
        ):
            raise InvalidRequestError(f"span {span!r} must be (start, end) with 0 <= start <= end", param="spans")
        out.append((int(span[0]), int(span[1])))
    return tuple(out)


def _roles(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Sequence) or not all(isinstance(r, str) and r for r in value):
        raise InvalidRequestError(f"roles must be a list of role names, got {value!r}", param="roles")
    return tuple(value)


@dataclass(frozen=True)
class Protect:
    """Always keep some tokens, then let ``inner`` fill the rest of its budget.

    Kept by force (each can be switched off):

    - ``sink``: the first ``sink`` tokens (the attention sink; 1 by default);
    - ``tail``: the generation prompt (``prompt.generation_start`` to the end), or, for a prompt
      without one (plain text), its last `TEXT_TAIL_TOKENS` tokens; an integer ``N`` keeps the
      generation prompt and the last ``N`` tokens; ``False`` keeps neither;
    - ``roles``: every content token of messages with these roles (e.g. ``("system",)``);
    - ``last_user_turn``: the whole last user message, template tokens included (chat prompts);
    - ``spans``: tokens overlapping these character spans of ``prompt.text``;
    - ``special_tokens``: special tokens and chat-template glue (``<|im_start|>``, role headers);
    - always: ``prompt.protected`` (spans given when the prompt was built).

    Protected tokens count toward the budget and ``inner`` fills the rest: ``Protect(KeepRate(0.1))``
    keeps ``ceil(0.1 * n)`` tokens in all, protected ones included. When the protected tokens alone
    exceed the budget, all of them are kept and nothing else. ``Selection.protected`` marks them.
    An ``inner`` selector without a ``fill`` method (any other `Selector`) selects on its own and the
    protected tokens are added on top.

    Example::

        Protect(Chunked(KeepRate(0.1), 32), roles=("system",), last_user_turn=True)

    Raises:
        InvalidRequestError: a negative ``sink`` or ``tail``, or malformed ``roles`` or ``spans``.
    """

    inner: Selector
    sink: int = 1
    tail: bool | int = True
    roles: tuple[str, ...] = ()
    last_user_turn: bool = False
    spans: tuple[tuple[int, int], ...] = ()
    special_tokens: bool = False

    def __post_init__(self) -> None:
        if not callable(getattr(self.inner, "select", None)):
            raise InvalidRequestError(f"Protect wraps a selector, got {self.inner!r}", param="selector")
        check_int(self.sink, "sink", param="sink", minimum=0)
        if not isinstance(self.tail, bool):
            check_int(self.tail, "tail", param="tail", minimum=0)
        object.__setattr__(self, "roles", _roles(self.roles))
        object.__setattr__(self, "spans", _spans(self.spans))
        for flag in ("last_user_turn", "special_tokens"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidRequestError(f"{flag} must be true or false, got {getattr(self, flag)!r}", param=flag)

    @property
    def name(self) -> str:
        options: list[str] = []
        defaults: dict[str, Any] = {
            "sink": 1,
            "tail": True,
            "roles": (),
            "last_user_turn": False,
            "spans": (),
            "special_tokens": False,
        }
        for key, default in defaults.items():
            value = getattr(self, key)
            if value != default or type(value) is not type(default):
                options.append(f"{key}={value!r}")
        return f"Protect({', '.join([self.inner.name, *options])})"

    def mask(self, prompt: Prompt) -> np.ndarray:
        """The tokens of ``prompt`` this selector keeps by force (a bool array of length ``n``)."""
        n = prompt.n
        mask = prompt_protected(prompt)
        if n == 0:
            return mask
        mask[: self.sink] = True
        if self.tail is not False:
            if prompt.generation_start < n:
                mask[prompt.generation_start :] = True
            tail = TEXT_TAIL_TOKENS if self.tail is True and prompt.generation_start >= n else int(self.tail)
            if tail > 0:
                mask[max(0, n - tail) :] = True
        if self.roles:
            wanted = set(self.roles)
            mask |= bool_array([r in wanted for r in prompt.roles])
        if self.last_user_turn and prompt.messages:
            users = [i for i, m in enumerate(prompt.messages) if m.role == "user"]
            if users:
                mask |= np.fromiter(prompt.message_index, dtype=np.int64, count=n) == users[-1]
        if self.spans:
            mask |= bool_array([any(a < e and s < b for s, e in self.spans) for a, b in prompt.offsets])
        if self.special_tokens:
            template = bool_array([r == TEMPLATE_ROLE for r in prompt.roles])
            mask |= bool_array(prompt.special) | template
        return mask

    def decide_without_scores(self, prompt: Prompt) -> Selection | None:
        """Dense when ``inner`` decides so or every token is protected; protected tokens are marked."""
        forced = self.mask(prompt)
        if prompt.n and bool(forced.all()):
            return dense_selection(forced, "every token is protected", requested_rate=None)
        decided = self.inner.decide_without_scores(prompt)
        if decided is None:
            return None
        keep = decided.mask().numpy() | forced
        return selection_from_mask(
            keep,
            forced,
            requested_rate=decided.requested_rate,
            chunk_size=decided.chunk_size,
            reason=decided.reason,
            dense=decided.dense,
        )

    def expected_kept(self, prompt: Prompt) -> int | None:
        """``inner``'s estimate, or the protected tokens when they are more (None when ``inner`` cannot say)."""
        if not isinstance(self.inner, KeepEstimating):
            return None
        estimate = self.inner.expected_kept(prompt)
        if estimate is None:
            return None
        forced = int(self.mask(prompt).sum())
        # protected tokens count toward a fill selector's budget, and come on top of another's
        total = max(estimate, forced) if isinstance(self.inner, FillSelector) else estimate + forced
        return min(prompt.n, total)

    def select(self, prompt: Prompt, scores: TokenScores) -> Selection:
        """Keep the protected tokens and let ``inner`` fill the rest of its budget."""
        return self.fill(prompt, scores, np.zeros(prompt.n, dtype=bool))

    def fill(self, prompt: Prompt, scores: TokenScores, forced: np.ndarray) -> Selection:
        """Like `select`, with ``forced`` kept as well (so `Protect` can wrap a `Protect`)."""
        forced = np.asarray(forced, dtype=bool) | self.mask(prompt)
        if isinstance(self.inner, FillSelector):
            return self.inner.fill(prompt, scores, forced)
        chosen = self.inner.select(prompt, scores)
        keep = chosen.mask().numpy() | forced
        return selection_from_mask(
            keep,
            forced,
            requested_rate=chosen.requested_rate,
            chunk_size=chosen.chunk_size,
            reason=chosen.reason,
        )
