"""LlamaIndex: a query engine whose retrieved nodes are shortened against the query before the LLM reads them.

Needs ``pip install "specprefill-sdk[llamaindex]"``. Runs on the bundled SmolLM2-135M-Instruct on CPU.
The index is a keyword table so the script runs offline (no embedding model); a vector index works
the same way.

    python examples/llamaindex_query_engine.py [--keep 0.3] [--doc-chars 1000] [--max-tokens 24]
"""

from __future__ import annotations

import argparse

from llama_index.core import Document, SimpleKeywordTableIndex

from specprefill_llamaindex import SpecPrefillLLM, SpecPrefillNodePostprocessor
from specprefill_sdk.eval.corpora import haystack

QUESTION = "What is the secret code of the orange lighthouse?"
FACT = (
    "Harbour notes. The orange lighthouse stands on the north pier and was repainted in spring. "
    "Its keeper keeps a logbook of passing ships. The secret code of the orange lighthouse is 7193. "
    "Visitors may climb the tower on Sundays between ten and four, weather permitting."
)


def documents(chars: int = 1000) -> list[Document]:
    """Three essay passages (about ``chars`` characters) that mention a lighthouse, and one harbour note."""
    essays = [haystack(chars, start=i)[:chars] + " The lighthouse was closed that year." for i in range(3)]
    return [Document(text=t, id_=f"doc-{i}", metadata={"source": f"kb/{i}.txt"}) for i, t in enumerate([*essays, FACT])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="the model that scores and answers")
    parser.add_argument("--keep", type=float, default=0.3, help="keep rate of each node")
    parser.add_argument("--doc-chars", type=int, default=1000, help="length of the essay passages")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args(argv)

    llm = SpecPrefillLLM(model=args.model, policy="paper", max_tokens=args.max_tokens)
    index = SimpleKeywordTableIndex.from_documents(
        documents(args.doc_chars), llm=llm
    )  # keywords by regex: the LLM idles
    engine = index.as_query_engine(
        llm=llm,
        node_postprocessors=[  # chunks of 16 tokens (the paper uses 32 for long prompts) suit short nodes
            SpecPrefillNodePostprocessor(model=args.model, keep_rate=args.keep, chunk_size=16, gap=" … ")
        ],
    )
    response = engine.query(QUESTION)
    print(f"Question: {QUESTION}\n")
    for item in response.source_nodes:
        m = item.node.metadata
        print(
            f"{item.node.node_id[:8]} {m['source']}: kept {m['specprefill_kept_tokens']}/{m['specprefill_tokens']} "
            f"tokens ({m['specprefill_keep_ratio']:.0%})"
        )
        print(f"    {item.node.get_content()[:160]!r}")
    print(f"\nAnswer: {str(response).strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
