"""LangChain: retrieve documents, shorten them against the question, answer with a SpecPrefill chat model.

Needs ``pip install "specprefill-sdk[langchain]" langchain-classic`` (``ContextualCompressionRetriever``
lives in langchain-classic since LangChain 1.0). Runs on the bundled SmolLM2-135M-Instruct on CPU.
The retriever here is a small keyword matcher so the script runs offline; any LangChain retriever
(a vector store's ``as_retriever()``) fits in its place.

    python examples/langchain_rag.py [--keep 0.3] [--shared-budget 200] [--doc-chars 1200] [--max-tokens 24]
"""

from __future__ import annotations

import argparse
import re

from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda

from specprefill_langchain import ChatSpecPrefill, SpecPrefillDocumentCompressor
from specprefill_sdk.eval.corpora import haystack

QUESTION = "What is the secret code of the orange lighthouse?"
FACT = (
    "Harbour notes. The orange lighthouse stands on the north pier and was repainted in spring. "
    "Its keeper keeps a logbook of passing ships. The secret code of the orange lighthouse is 7193. "
    "Visitors may climb the tower on Sundays between ten and four, weather permitting."
)


def knowledge_base(chars: int = 1200) -> list[Document]:
    """Four essay passages of about ``chars`` characters and one harbour note, each with its source."""
    texts = [haystack(chars, start=i)[:chars] for i in range(4)] + [FACT]
    return [Document(page_content=t, metadata={"source": f"kb/{i}.txt"}, id=f"doc-{i}") for i, t in enumerate(texts)]


def keyword_retriever(docs: list[Document], k: int = 3) -> RunnableLambda[str, list[Document]]:
    """The ``k`` documents sharing the most words with the query."""

    def words(text: str) -> set[str]:
        return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 3}

    def retrieve(query: str) -> list[Document]:
        wanted = words(query)
        return sorted(docs, key=lambda d: -len(wanted & words(d.page_content)))[:k]

    return RunnableLambda(retrieve)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="the model that scores and answers")
    parser.add_argument("--keep", type=float, default=0.3, help="keep rate of each document")
    parser.add_argument("--shared-budget", type=int, default=0, help="one token budget over all documents")
    parser.add_argument("--doc-chars", type=int, default=1200, help="length of the essay passages")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args(argv)

    # Chunks of 16 tokens (the paper uses 32 for long prompts) suit short documents; a retriever's
    # passages are often shorter than the policies' dense threshold, so shorten them whatever their length.
    options = {"model": args.model, "chunk_size": 16, "dense_below_tokens": 0, "gap": " … "}
    if args.shared_budget:
        compressor = SpecPrefillDocumentCompressor(**options, token_budget=args.shared_budget, shared_budget=True)
    else:
        compressor = SpecPrefillDocumentCompressor(**options, keep_rate=args.keep)
    retriever = ContextualCompressionRetriever(
        base_compressor=compressor, base_retriever=keyword_retriever(knowledge_base(args.doc_chars))
    )
    docs = retriever.invoke(QUESTION)
    print(f"Question: {QUESTION}\n")
    for doc in docs:
        m = doc.metadata
        print(
            f"{doc.id} {m['source']}: kept {m['specprefill_kept_tokens']}/{m['specprefill_tokens']} tokens "
            f"({m['specprefill_keep_ratio']:.0%})"
        )
        print(f"    {doc.page_content[:160]!r}")

    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from the notes, briefly."), ("human", "Notes:\n{notes}\n\nQuestion: {question}")]
    )
    chat = ChatSpecPrefill(model=args.model, policy="paper", max_tokens=args.max_tokens)
    notes = "\n\n".join(f"[{d.metadata['source']}] {d.page_content}" for d in docs)
    reply = (prompt | chat).invoke({"notes": notes, "question": QUESTION})
    info = reply.response_metadata["specprefill"]
    print(f"\nAnswer: {reply.text.strip()}")
    print(f"(the chat model prefilled {info['kept_tokens']} of {info['prompt_tokens']} prompt tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
