"""`SpecPrefillDocumentCompressor`: shorten retrieved documents against the query, keeping each one apart."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict, Field, PrivateAttr

from specprefill_sdk.interfaces import Selector
from specprefill_sdk.pipeline import Pipeline
from specprefill_sdk.policies import resolve_pipeline
from specprefill_sdk.textmode import CompressedText, compress_documents

__all__ = ["SpecPrefillDocumentCompressor"]

logger = logging.getLogger(__name__)


class SpecPrefillDocumentCompressor(BaseDocumentCompressor):
    """Keep the parts of each document that a draft model attends to while it reads the query.

    Each document is scored in a prompt holding the document and then the query; the policy's
    selector keeps tokens of the document only, and the kept characters form the new
    ``page_content``. Documents stay separate, in order, with their ``id`` and metadata; the
    metadata gains ``specprefill_keep_ratio`` (and the token counts). ``shared_budget=True`` scores
    all documents in one prompt under one budget, so relevant documents keep more than others.

    Example::

        from langchain_classic.retrievers import ContextualCompressionRetriever
        from specprefill_langchain import SpecPrefillDocumentCompressor

        compressor = SpecPrefillDocumentCompressor(policy="paper", keep_rate=0.3)
        retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=base)
        docs = retriever.invoke("Who founded the company?")
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pipeline: Any = Field(default=None, exclude=True)
    """A ready `specprefill_sdk.Pipeline` (scorer and selector are used; nothing is generated)."""
    model: str = "smollm2-135m"
    """The model whose tokenizer and draft score the documents (when no pipeline is given)."""
    policy: str = "paper"
    policy_overrides: dict[str, Any] = Field(default_factory=dict)
    keep_rate: float | None = None
    """Keep this share of each document's tokens (of all of them with ``shared_budget``)."""
    token_budget: int | None = None
    """Keep this many tokens per document (in all with ``shared_budget``) instead of a rate."""
    shared_budget: bool = False
    """Score all documents in one prompt and select across them under one budget."""
    gap: str = " "
    """Put where text was dropped; whitespace is added only between words that would touch."""
    metadata_prefix: str = "specprefill_"
    """Prefix of the metadata keys added to each document (``keep_ratio``, ``tokens``, ``kept_tokens``)."""

    _resolved: Pipeline | None = PrivateAttr(default=None)
    _selector: Selector | None = PrivateAttr(default=None)

    def get_pipeline(self) -> Pipeline:
        """The pipeline that scores documents (built on first use when none was given)."""
        if self._resolved is None:
            self._resolved = resolve_pipeline(
                self.pipeline, policy=self.policy, model=self.model, overrides=self.policy_overrides
            )
        return self._resolved

    def _selector_for(self, pipeline: Pipeline) -> Selector | None:
        if self._selector is None:
            from specprefill_sdk.policies import override_selector

            self._selector = override_selector(
                self.policy, self.policy_overrides, keep_rate=self.keep_rate, token_budget=self.token_budget
            )
        return self._selector

    def _document(self, doc: Document, result: CompressedText) -> Document:
        p = self.metadata_prefix
        metadata = {
            **doc.metadata,
            f"{p}keep_ratio": result.keep_ratio,
            f"{p}tokens": result.tokens,
            f"{p}kept_tokens": result.kept_tokens,
        }
        if result.fallback:
            metadata[f"{p}fallback"] = result.fallback
        return Document(page_content=result.text, metadata=metadata, id=doc.id)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """Compress ``documents`` against ``query``; one document out for each one in, in order."""
        if not documents:
            return []
        pipeline = self.get_pipeline()
        results = compress_documents(
            pipeline,
            [d.page_content for d in documents],
            query,
            shared_budget=self.shared_budget,
            selector=self._selector_for(pipeline),
            gap=self.gap,
        )
        out = [self._document(d, r) for d, r in zip(documents, results, strict=True)]
        logger.debug(
            "compressed %d documents: %d of %d tokens kept",
            len(out),
            sum(r.kept_tokens for r in results),
            sum(r.tokens for r in results),
        )
        return out

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """Async `compress_documents`: the draft model runs in a worker thread."""
        return await asyncio.to_thread(self.compress_documents, documents, query, callbacks)
