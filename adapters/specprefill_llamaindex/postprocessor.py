"""`SpecPrefillNodePostprocessor`: shorten retrieved nodes against the query, each node on its own."""

from __future__ import annotations

import logging
from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import ImageNode, MetadataMode, NodeWithScore, QueryBundle, TextNode

from specprefill_sdk.components import PipelineFields
from specprefill_sdk.textmode import DEFAULT_WHOLE_BELOW, CompressedText, compress_documents

__all__ = ["SpecPrefillNodePostprocessor"]

logger = logging.getLogger(__name__)


class SpecPrefillNodePostprocessor(PipelineFields, BaseNodePostprocessor):
    """Keep the parts of each node that a draft model attends to while it reads the query.

    Each text node is scored in a prompt holding its text and then the query (from the
    ``query_bundle``); the policy's selector keeps tokens of the node only. Nodes keep their id,
    score, relationships and metadata, which gains ``specprefill_keep_ratio`` (hidden from the LLM
    and the embedder). ``shared_budget=True`` scores all nodes in one prompt under one budget.
    Image and other non-text nodes pass through, and nodes under ``whole_below_tokens`` tokens
    are kept whole.

    Example::

        from specprefill_llamaindex import SpecPrefillNodePostprocessor

        engine = index.as_query_engine(node_postprocessors=[SpecPrefillNodePostprocessor(policy="paper")])
    """

    # pipeline, draft, device, dtype, policy, keep_rate, token_budget and the other policy fields:
    # the fields every SpecPrefill component shares (`PipelineFields`). ``keep_rate`` and
    # ``token_budget`` apply to each node (to all of them with ``shared_budget``).
    model: str = Field(default="smollm2-135m", description="The model that scores the nodes (no pipeline).")
    shared_budget: bool = Field(default=False, description="Select across all nodes under one budget.")
    whole_below_tokens: int = Field(
        default=DEFAULT_WHOLE_BELOW, ge=0, description="Nodes with fewer tokens than this are kept whole."
    )
    gap: str = Field(default=" ", description="Put where text was dropped.")
    metadata_prefix: str = Field(default="specprefill_", description="Prefix of the metadata keys added.")

    @classmethod
    def class_name(cls) -> str:
        return "SpecPrefillNodePostprocessor"

    @classmethod
    def own_field_names(cls) -> list[str]:
        return ["shared_budget", "whole_below_tokens", "gap", "metadata_prefix"]

    def _node(self, item: NodeWithScore, result: CompressedText) -> NodeWithScore:
        node = item.node
        p = self.metadata_prefix
        added: dict[str, Any] = {
            f"{p}keep_ratio": result.keep_ratio,
            f"{p}tokens": result.tokens,
            f"{p}kept_tokens": result.kept_tokens,
        }
        if result.fallback:
            added[f"{p}fallback"] = result.fallback
        hidden_llm = list(dict.fromkeys([*node.excluded_llm_metadata_keys, *added]))
        hidden_embed = list(dict.fromkeys([*node.excluded_embed_metadata_keys, *added]))
        copy = node.model_copy(
            update={
                "text": result.text,
                "metadata": {**node.metadata, **added},
                "excluded_llm_metadata_keys": hidden_llm,
                "excluded_embed_metadata_keys": hidden_embed,
            }
        )
        return NodeWithScore(node=copy, score=item.score)

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        text_nodes = [
            i for i, n in enumerate(nodes) if isinstance(n.node, TextNode) and not isinstance(n.node, ImageNode)
        ]
        if not text_nodes:
            return list(nodes)
        query = query_bundle.query_str if query_bundle is not None else ""
        texts = [nodes[i].node.get_content(metadata_mode=MetadataMode.NONE) for i in text_nodes]
        results = compress_documents(
            self.get_pipeline(),
            texts,
            query,
            shared_budget=self.shared_budget,
            whole_below_tokens=self.whole_below_tokens,
            gap=self.gap,
        )
        out = list(nodes)
        for i, result in zip(text_nodes, results, strict=True):
            out[i] = self._node(nodes[i], result)
        logger.debug(
            "compressed %d nodes: %d of %d tokens kept",
            len(results),
            sum(r.kept_tokens for r in results),
            sum(r.tokens for r in results),
        )
        return out
