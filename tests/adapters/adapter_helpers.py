"""Helpers shared by the adapter tests."""

from __future__ import annotations

#: How the adapters build pipelines by name in the tests: the same loaded model as the session fixtures.
MODEL_SETTINGS = {"model": "smollm2-135m", "device": "cpu", "dtype": "auto"}

_STOPWORDS = frozenset(
    (
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "did",
        "do",
        "does",
        "for",
        "from",
        "has",
        "have",
        "how",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "that",
        "the",
        "their",
        "they",
        "this",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "with",
    )
)


def hash_embedding(text: str, dim: int = 2048) -> list[float]:
    """A deterministic set-of-words embedding (hashed content words, L2-normalized): retrieval without a model.

    No embedding model can be downloaded here; this one still ranks documents by the words they share.
    """
    import math
    import re
    import zlib

    vector = [0.0] * dim
    for word in set(re.findall(r"[a-z0-9]+", text.lower())) - _STOPWORDS:
        vector[zlib.crc32(word.encode()) % dim] = 1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def words(text: str) -> set[str]:
    import re

    return set(re.findall(r"[A-Za-z0-9]+", text))


#: A visible gap marker: compressed texts split on it into pieces of their own source.
GAP = " … "


def assert_pieces_of(text: str, original: str, gap: str = GAP) -> None:
    """Every piece of ``text`` between gap markers is a substring of ``original``, in order."""
    cursor = 0
    for piece in text.split(gap):
        at = original.find(piece, cursor)
        assert at >= 0, f"{piece[:60]!r} is not in the source after position {cursor}"
        cursor = at + len(piece)


def is_subsequence(text: str, original: str) -> bool:
    """True when the characters of ``text`` occur in ``original`` in the same order."""
    it = iter(original)
    return all(ch in it for ch in text)


#: A chat of about 50 tokens: the kind of prompt the presets prefill whole.
SHORT_CHAT = (
    ("system", "You are a helpful assistant. Answer in one short sentence."),
    ("user", "What is the capital of France, and which river runs through it?"),
)


#: Short retrieval chunks (50-65 tokens) of real encyclopedic facts: (text, question, answer).
SHORT_FACTS = [
    (
        "The Louvre is the most-visited museum in the world and a landmark of Paris. It holds the Mona Lisa and "
        "the Venus de Milo. The building was a royal palace, begun under Philip II. The museum opened on "
        "10 August 1793 with 537 paintings.",
        "When did the Louvre museum open?",
        "1793",
    ),
    (
        "Mount Everest is Earth's highest mountain above sea level, in the Mahalangur Himal of the Himalayas. "
        "The border between China and Nepal runs across its summit. Its height, most recently set in 2020 by "
        "Chinese and Nepali authorities, is 8,849 metres.",
        "How high is Mount Everest?",
        "8,849",
    ),
    (
        "The Danube is the second-longest river in Europe, after the Volga. It flows through much of Central and "
        "Southeastern Europe, from the Black Forest into the Black Sea. It passes through ten countries, and its "
        "drainage basin covers 801,463 square kilometres.",
        "How large is the Danube's drainage basin?",
        "801,463",
    ),
    (
        "Marie Curie was a physicist and chemist who did pioneering research on radioactivity. She was the first "
        "woman to win a Nobel Prize and the only person to win one in two sciences. She was born in Warsaw, in "
        "what was then the Kingdom of Poland, in 1867.",
        "Where was Marie Curie born?",
        "Warsaw",
    ),
]
