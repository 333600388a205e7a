"""Map a target-tokenized `Prompt` to a draft's tokens, and the draft's scores back to the target's tokens.

When the draft reads the prompt's own token ids (same vocabulary), nothing is mapped. Otherwise the
draft tokenizes ``prompt.text`` itself and its per-token scores are projected onto the target tokens
through character overlap:

- a target token with a non-empty character span gets the **maximum** score of the draft tokens whose
  spans overlap it (a target token is as important as its most important piece);
- a target token with an empty span (e.g. a BOS the tokenizer adds) or one that no draft token
  overlaps gets the score of the draft token nearest to it in characters (earlier one on a tie).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import InvalidRequestError
from ..types import Prompt

__all__ = ["DraftTokens", "check_prompt", "project_scores", "same_vocabulary", "to_draft_tokens"]


def check_prompt(prompt: Prompt) -> None:
    """Refuse what no scorer can score: a non-`Prompt` or an empty prompt."""
    if not isinstance(prompt, Prompt):
        raise InvalidRequestError(
            f"a scorer needs a Prompt (see build_prompt), got {type(prompt).__name__}", param="prompt"
        )
    if prompt.n == 0:
        raise InvalidRequestError("the prompt is empty", param="prompt")


def same_vocabulary(a: Any, b: Any) -> bool:
    """Whether two Hugging Face tokenizers map the same token strings to the same ids."""
    if a is b:
        return True
    return bool(a.get_vocab() == b.get_vocab())


@dataclass(frozen=True)
class DraftTokens:
    """The ids the draft reads; ``offsets`` is None when they are the prompt's own ids (no projection)."""

    ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...] | None = None

    @property
    def projected(self) -> bool:
        return self.offsets is not None


def _has_text(prompt: Prompt) -> bool:
    return bool(prompt.text) and any(b > a for a, b in prompt.offsets)


def _encode(tokenizer: Any, text: str, add_special_tokens: bool) -> tuple[list[int], list[tuple[int, int]]]:
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    return [int(i) for i in enc["input_ids"]], [(int(a), int(b)) for a, b in enc["offset_mapping"]]


def to_draft_tokens(prompt: Prompt, tokenizer: Any, vocab_size: int, same_vocab: bool | None) -> DraftTokens:
    """The draft's input for ``prompt``.

    ``same_vocab``: True reads ``prompt.token_ids`` directly; False re-tokenizes ``prompt.text``;
    None (target tokenizer unknown) reads the ids directly when the prompt has no text or when the
    draft tokenizer turns ``prompt.text`` into exactly these ids, and re-tokenizes otherwise.

    Raises:
        InvalidRequestError: ids outside the draft's vocabulary, or no text to re-tokenize.
    """
    direct = same_vocab is True
    encoded: tuple[list[int], list[tuple[int, int]]] | None = None
    if same_vocab is None:
        if not _has_text(prompt):
            direct = True
        else:
            bos = getattr(tokenizer, "bos_token", None)
            with_special = not (bos and prompt.text.startswith(bos))
            encoded = _encode(tokenizer, prompt.text, add_special_tokens=with_special)
            plain = encoded if not with_special else _encode(tokenizer, prompt.text, add_special_tokens=False)
            direct = tuple(encoded[0]) == prompt.token_ids or tuple(plain[0]) == prompt.token_ids
    if direct:
        given = prompt.token_ids
        # min/max run in C; the first offending id is looked for only when there is one.
        outside = bool(given) and (min(given) < 0 or max(given) >= vocab_size)
        bad = [t for t in given if not 0 <= t < vocab_size] if outside else []
        if bad:
            raise InvalidRequestError(
                f"token id {bad[0]} is outside the draft's vocabulary of {vocab_size}; give the prompt's text or "
                "a draft that shares the target's tokenizer",
                param="prompt",
            )
        return DraftTokens(ids=prompt.token_ids)
    if not _has_text(prompt):
        raise InvalidRequestError(
            "the draft has another vocabulary than the target and the prompt carries no text to re-tokenize",
            param="prompt",
        )
    if encoded is None:
        bos = getattr(tokenizer, "bos_token", None)
        encoded = _encode(tokenizer, prompt.text, add_special_tokens=not (bos and prompt.text.startswith(bos)))
    ids, offsets = encoded
    if not ids:
        raise InvalidRequestError("the draft tokenizer produced no tokens for this prompt", param="prompt")
    return DraftTokens(ids=tuple(ids), offsets=tuple(offsets))


def project_scores(
    draft_scores: torch.Tensor, draft_offsets: Sequence[tuple[int, int]], target_offsets: Sequence[tuple[int, int]]
) -> torch.Tensor:
    """Project per-draft-token scores onto target tokens by character overlap (see the module doc)."""
    scores = draft_scores.detach().float().cpu().numpy()
    d = np.asarray(draft_offsets, dtype=np.int64).reshape(-1, 2)
    t = np.asarray(target_offsets, dtype=np.int64).reshape(-1, 2)
    if len(scores) != len(d):
        raise ValueError(f"{len(scores)} draft scores for {len(d)} draft offsets")
    out = np.zeros(len(t), dtype=np.float32)
    nonempty = d[:, 1] > d[:, 0]
    ne_idx = np.flatnonzero(nonempty)
    ne_start, ne_end = d[ne_idx, 0], d[ne_idx, 1]
    # Running maxima keep ends monotone for searchsorted even if a tokenizer emits overlapping spans.
    ne_end_sorted = np.maximum.accumulate(ne_end) if len(ne_end) else ne_end
    for i, (a, b) in enumerate(t):
        if b > a and len(ne_idx):
            lo = int(np.searchsorted(ne_end_sorted, a, side="right"))
            hi = int(np.searchsorted(ne_start, b, side="left"))
            cand = ne_idx[lo:hi]
            cand = cand[(d[cand, 0] < b) & (d[cand, 1] > a)]
            if len(cand):
                out[i] = scores[cand].max()
                continue
        # Nearest draft token in characters: distance 0 inside a span; empty spans are points.
        dist = np.where(a < d[:, 0], d[:, 0] - a, np.where(a >= d[:, 1], a - np.maximum(d[:, 1] - 1, d[:, 0]), 0))
        out[i] = scores[int(np.argmin(dist))]
    return torch.from_numpy(out)
