"""`SpecPrefillDocumentCompressor`: shorten retrieved documents against the query, keeping each one apart."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict, Field

from specprefill_sdk.components import PipelineFields
from specprefill_sdk.textmode import DEFAULT_WHOLE_BELOW, CompressedText, compress_documents

__all__ = ["SpecPrefillDocumentCompressor"]

logger = logging.getLogger(__name__)


class SpecPrefillDocumentCompressor(PipelineFields, BaseDocumentCompressor):
    """Keep the parts of each document that a draft model attends to while it reads the query.

    Each document is scored in a prompt holding the document and then the query; the policy's
    selector keeps tokens of the document only, and the kept characters form the new
    ``page_content``. Documents stay separate, in order, with their ``id`` and metadata; the
    metadata gains ``specprefill_keep_ratio`` (and the token counts). ``shared_budget=True`` scores
    all documents in one prompt under one budget, so relevant documents keep more than others.
    Documents under ``whole_below_tokens`` tokens are kept whole.

    Example::

        from langchain_classic.retrievers import ContextualCompressionRetriever
        from specprefill_langchain import SpecPrefillDocumentCompressor

        compressor = SpecPrefillDocumentCompressor(policy="paper", keep_rate=0.3)
        retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=base)
        docs = retriever.invoke("Who founded the company?")
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    # pipeline, draft, device, dtype, policy, keep_rate, token_budget and the other policy fields:
    # the fields every SpecPrefill component shares (`PipelineFields`). ``keep_rate`` and
    # ``token_budget`` apply to each document (to all of them with ``shared_budget``).
    model: str = "smollm2-135m"
    """The model whose tokenizer and draft score the documents (when no pipeline is given)."""
    shared_budget: bool = False
    """Score all documents in one prompt and select across them under one budget."""
    whole_below_tokens: int = Field(default=DEFAULT_WHOLE_BELOW, ge=0)
    """Documents with fewer tokens than this are kept whole: a short chunk is often all answer."""
    gap: str = " "
    """Put where text was dropped; whitespace is added only between words that would touch."""
    metadata_prefix: str = "specprefill_"
    """Prefix of the metadata keys added to each document (``keep_ratio``, ``tokens``, ``kept_tokens``)."""

    @classmethod
    def own_field_names(cls) -> list[str]:
        return ["shared_budget", "whole_below_tokens", "gap", "metadata_prefix"]

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
            whole_below_tokens=self.whole_below_tokens,
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
