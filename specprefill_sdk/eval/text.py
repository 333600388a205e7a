"""A small rule-based sentence splitter for English prose (no model data needed).

RULER's text needs sentence boundaries to place needles and to name evidence sentences. The
splitter returns character spans, so a caller can map sentences back to the text they came from.

Example::

    >>> split_sentences("Dr. Smith left at 5 p.m. today. He was late! Why?")
    ['Dr. Smith left at 5 p.m. today.', 'He was late!', 'Why?']
"""

from __future__ import annotations

import re

__all__ = ["normalize_space", "sentence_spans", "split_sentences"]

# Words that end with a period without ending a sentence (compared lower-case, without the period).
_ABBREVIATIONS = frozenset(
    (
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "mt",
        "ft",
        "vs",
        "etc",
        "cf",
        "al",
        "fig",
        "figs",
        "eq",
        "no",
        "nos",
        "vol",
        "pp",
        "ed",
        "eds",
        "inc",
        "ltd",
        "co",
        "corp",
        "dept",
        "univ",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "mon",
        "tue",
        "wed",
        "thu",
        "fri",
        "sat",
        "sun",
        "gen",
        "col",
        "lt",
        "sgt",
        "capt",
        "rev",
        "gov",
        "sen",
        "rep",
        "pres",
        "approx",
        "est",
        "ca",
        "op",
        "ch",
        "sec",
        "art",
    )
)

# A candidate boundary: terminal punctuation, optional closing quotes/brackets, then either
# whitespace or (text with lost line breaks, as in RULER's essay dump) an upper-case letter.
_BOUNDARY = re.compile(r"""([.!?]+)(["'\u201d\u2019)\]]*)(\s+|(?=[A-Z\u201c"]))""")
_SPACE = re.compile(r"\s+")


def normalize_space(text: str) -> str:
    """Collapse every run of whitespace (line breaks included) into one space."""
    return _SPACE.sub(" ", text).strip()


def _word_before(text: str, end: int) -> str:
    start = end
    while start > 0 and not text[start - 1].isspace() and text[start - 1] not in "([\"'\u201c":
        start -= 1
    return text[start:end]


def _is_boundary(text: str, match: re.Match[str]) -> bool:
    punct, _closers, gap = match.group(1), match.group(2), match.group(3)
    after = match.end()
    if after >= len(text):
        return True
    nxt = text[after]
    if punct != ".":  # '!' and '?' (or '...'): a boundary unless lower-case text follows
        return not nxt.islower()
    word = _word_before(text, match.start())
    bare = word.rstrip(".").lower()
    if bare in _ABBREVIATIONS:
        return False
    # Initials and dotted abbreviations: "J.", "U.S.", "e.g.", "p.m."
    if len(bare) == 1 and bare.isalpha():
        return False
    if "." in word and all(len(p) <= 2 for p in word.split(".") if p):
        return not gap or (nxt.isupper() and len(word.replace(".", "")) > 3)
    if not gap:
        # A lost line break ("mistakes.If"): only after a lower-case word of two letters or more.
        return len(bare) >= 2 and bare[-1].islower() and nxt.isupper()
    return nxt.isupper() or nxt.isdigit() or nxt in "\"'\u201c([" or not nxt.isalpha()


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the sentences of ``text``, whitespace excluded."""
    spans: list[tuple[int, int]] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        if not _is_boundary(text, match):
            continue
        end = match.end(2)
        if text[start:end].strip():
            spans.append(_trim(text, start, end))
        start = match.end()
    if text[start:].strip():
        spans.append(_trim(text, start, len(text)))
    return spans


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` as strings (see `sentence_spans`)."""
    return [text[a:b] for a, b in sentence_spans(text)]
