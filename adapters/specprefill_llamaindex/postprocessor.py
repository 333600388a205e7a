"""`SpecPrefillNodePostprocessor`: shorten retrieved nodes against the query, each node on its own."""

from __future__ import annotations

import logging
from typing import Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import ImageNode, MetadataMode, NodeWithScore, QueryBundle, TextNode

from specprefill_sdk.interfaces import Selector
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.policies import resolve_pipeline
from specprefill_sdk.textmode import CompressedText, compress_documents

__all__ = ["SpecPrefillNodePostprocessor"]

logger = logging.getLogger(__name__)


class SpecPrefillNodePostprocessor(BaseNodePostprocessor):
    """Keep the parts of each node that a draft model attends to while it reads the query.

    Each text node is scored in a prompt holding its text and then the query (from the
    ``query_bundle``); the policy's selector keeps tokens of the node only. Nodes keep their id,
    score, relationships and metadata, which gains ``specprefill_keep_ratio`` (hidden from the LLM
    and the embedder). ``shared_budget=True`` scores all nodes in one prompt under one budget.
    Image and other non-text nodes pass through.

    Example::

        from specprefill_llamaindex import SpecPrefillNodePostprocessor

        engine = index.as_query_engine(node_postprocessors=[SpecPrefillNodePostprocessor(policy="paper")])
    """

    pipeline: Any = Field(default=None, exclude=True, description="A ready specprefill_sdk Pipeline.")
    model: str = Field(default="smollm2-135m", description="The model that scores the nodes (no pipeline).")
    policy: str = Field(default="paper", description="The policy preset or a .toml path.")
    policy_overrides: dict[str, Any] = Field(default_factory=dict, description="Policy fields to change.")
    keep_rate: float | None = Field(default=None, description="Keep this share of each node's tokens.")
    token_budget: int | None = Field(default=None, description="Keep this many tokens per node (in all if shared).")
    shared_budget: bool = Field(default=False, description="Select across all nodes under one budget.")
    gap: str = Field(default=" ", description="Put where text was dropped.")
    metadata_prefix: str = Field(default="specprefill_", description="Prefix of the metadata keys added.")

    _resolved: Pipeline | None = PrivateAttr(default=None)
    _selector: Selector | None = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return "SpecPrefillNodePostprocessor"

    def get_pipeline(self) -> Pipeline:
        """The pipeline that scores the nodes (built on first use when none was given)."""
        if self._resolved is None:
            self._resolved = resolve_pipeline(
                self.pipeline, policy=self.policy, model=self.model, overrides=self.policy_overrides
            )
        return self._resolved

    def _selector_for(self) -> Selector | None:
        if self._selector is None:
            from specprefill_sdk.policies import override_selector

            self._selector = override_selector(
                self.policy, self.policy_overrides, keep_rate=self.keep_rate, token_budget=self.token_budget
            )
        return self._selector

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
            selector=self._selector_for(),
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
