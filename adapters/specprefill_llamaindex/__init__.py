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

from typing import TYPE_CHECKING

from specprefill_sdk._lazy import lazy_exports, require_extra

require_extra(__name__, "llamaindex", ("llama_index.core",))

__getattr__, __dir__, __all__ = lazy_exports(
    __name__, {"llm": ("SpecPrefillLLM",), "postprocessor": ("SpecPrefillNodePostprocessor",)}
)


if TYPE_CHECKING:
    from .llm import SpecPrefillLLM
    from .postprocessor import SpecPrefillNodePostprocessor
