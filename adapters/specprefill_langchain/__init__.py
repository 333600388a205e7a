"""LangChain integration of specprefill-sdk (install ``specprefill-sdk[langchain]``).

- `ChatSpecPrefill`: a chat model over a SpecPrefill `Pipeline` (in process or over HTTP).
- `SpecPrefillDocumentCompressor`: shortens retrieved documents against the query, each on its own
  or under one shared budget (use it in ``ContextualCompressionRetriever``).
- `SpecPrefillMessageCompressor`: a `Runnable` that shortens chat messages for any chat model.
- `SpecPrefillMiddleware`: a LangChain 1.x agent middleware doing the same before every model call
  (needs the ``langchain`` package besides ``langchain-core``).

Example::

    from specprefill_langchain import ChatSpecPrefill

    chat = ChatSpecPrefill(model="smollm2-135m", policy="paper", max_tokens=64)
    print(chat.invoke("Summarize: " + long_text).content)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specprefill_sdk._lazy import lazy_exports, require_extra

require_extra(__name__, "langchain", ("langchain_core",))

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "chat_models": ("ChatSpecPrefill",),
        "document_compressors": ("SpecPrefillDocumentCompressor",),
        "message_compressor": ("SpecPrefillMessageCompressor",),
        "middleware": ("SpecPrefillMiddleware",),
    },
)


if TYPE_CHECKING:
    from .chat_models import ChatSpecPrefill
    from .document_compressors import SpecPrefillDocumentCompressor
    from .message_compressor import SpecPrefillMessageCompressor
    from .middleware import SpecPrefillMiddleware
