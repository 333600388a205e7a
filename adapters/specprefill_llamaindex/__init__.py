"""LlamaIndex integration of specprefill-sdk (install ``specprefill-sdk[llamaindex]``).

- `SpecPrefillNodePostprocessor`: shortens retrieved nodes against the query, keeping node ids,
  scores and metadata (each node on its own, or under one shared budget).
- `SpecPrefillLLM`: an LLM over a SpecPrefill `Pipeline` (complete, chat, streaming, async).

Example::

    from specprefill_llamaindex import SpecPrefillLLM, SpecPrefillNodePostprocessor

    engine = index.as_query_engine(llm=SpecPrefillLLM(policy="paper"),
                                   node_postprocessors=[SpecPrefillNodePostprocessor(policy="paper")])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {"SpecPrefillLLM": "llm", "SpecPrefillNodePostprocessor": "postprocessor"}

__all__ = ["SpecPrefillLLM", "SpecPrefillNodePostprocessor"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'specprefill_llamaindex' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from .llm import SpecPrefillLLM
    from .postprocessor import SpecPrefillNodePostprocessor
