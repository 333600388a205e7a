"""Metrics: evidence-token recall of a selection, and answer accuracy (exact / contains).

Example::

    >>> contains_match("The numbers are 123 and 456.", ("456", "123"), "all")
    True
    >>> exact_match("Paris.", ("paris",), "any")
    True
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Literal

from ..types import Prompt, Selection

__all__ = [
    "contains_match",
    "evidence_recall",
    "exact_match",
    "normalize_answer",
    "token_mask_for_spans",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation + "\u2018\u2019\u201c\u201d"})


def normalize_answer(text: str) -> str:
    """SQuAD-style normalization: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def contains_match(output: str, answers: Sequence[str], match: Literal["all", "any"]) -> bool:
    """Whether the output contains every answer (``all``) or at least one (``any``), normalized.

    Answers are matched on word boundaries, so ``12`` is not found inside ``123``.
    """
    norm = f" {normalize_answer(output)} "
    found = [f" {normalize_answer(a)} " in norm for a in answers if normalize_answer(a)]
    if not found:
        return False
    return all(found) if match == "all" else any(found)


def exact_match(output: str, answers: Sequence[str], match: Literal["all", "any"]) -> bool:
    """Whether the output's first line is the answer and nothing else, normalized.

    ``any``: equal to one of the answers. ``all``: its words are exactly the answers' words, in any
    order (a list of all values and nothing more).
    """
    line = normalize_answer(_first_line(output))
    if not line:
        return False
    if match == "any":
        return any(line == normalize_answer(a) for a in answers)
    expected = sorted(w for a in answers for w in normalize_answer(a).split())
    got = sorted(w for w in line.split() if w != "and")
    return got == expected


def token_mask_for_spans(prompt: Prompt, spans: Sequence[tuple[int, int]], *, offset: int = 0) -> list[bool]:
    """Per prompt token: whether its characters overlap any of ``spans`` (shifted by ``offset``)."""
    shifted = sorted((a + offset, b + offset) for a, b in spans if b > a)
    out: list[bool] = []
    for start, end in prompt.offsets:
        if end <= start:
            out.append(False)
            continue
        out.append(any(a < end and start < b for a, b in shifted))
    return out


def evidence_recall(selection: Selection, evidence_mask: Sequence[bool]) -> float:
    """The share of evidence tokens that the selection keeps (1.0 when there is no evidence)."""
    if len(evidence_mask) != selection.n:
        raise ValueError(f"evidence mask has {len(evidence_mask)} entries for a selection of {selection.n}")
    total = sum(1 for e in evidence_mask if e)
    if total == 0:
        return 1.0
    kept = sum(1 for i in selection.indices if evidence_mask[i])
    return kept / total
