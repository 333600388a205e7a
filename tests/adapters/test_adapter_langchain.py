"""LangChain adapter against the real langchain-core / langchain / langchain-classic and SmolLM2."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")

from adapter_helpers import GAP, MODEL_SETTINGS, SHORT_CHAT, SHORT_FACTS, assert_pieces_of, hash_embedding
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.vectorstores import InMemoryVectorStore

from specprefill_langchain import (
    ChatSpecPrefill,
    SpecPrefillDocumentCompressor,
    SpecPrefillMessageCompressor,
)
from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.policies import load_policy

QUESTION = "Where is the Louvre and what does it hold?"


class HashEmbeddings(Embeddings):
    """Deterministic bag-of-words vectors (no embedding model can be downloaded here)."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [hash_embedding(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return hash_embedding(text)


def _store(documents: list[str]) -> InMemoryVectorStore:
    store = InMemoryVectorStore(embedding=HashEmbeddings())
    docs = [
        Document(page_content=t, metadata={"source": f"doc-{i}.txt", "index": i}, id=f"id-{i}")
        for i, t in enumerate(documents)
    ]
    store.add_documents(docs)
    return store


# ----------------------------------------------------------------------------- chat model
def test_unknown_call_arguments_are_refused() -> None:
    chat = ChatSpecPrefill(model="smollm2-135m")
    with pytest.raises(InvalidRequestError, match="unsupported argument"):
        chat._params(None, {"frequency_penalty": 1.0})
    with pytest.raises(InvalidRequestError, match="serves 'smollm2-135m'"):
        chat._params(None, {"model": "gpt-4o"})
    params = chat._params(["\n\n"], {"max_tokens": 5, "stop": ["END"]})
    assert params.max_tokens == 5 and params.stop == ("\n\n", "END")


@pytest.mark.slow
def test_chat_model_reports_the_compression(paper_pipeline, essay) -> None:
    chat = ChatSpecPrefill(pipeline=paper_pipeline, max_tokens=8)
    assert chat.model_name == paper_pipeline.backend.model_name
    reply = chat.invoke([("system", "Answer in one sentence."), ("human", essay[:1000] + "\nWhat is the text about?")])
    info = reply.response_metadata["specprefill"]
    assert isinstance(reply, AIMessage) and reply.content
    assert info["kept_tokens"] < info["prompt_tokens"] == reply.usage_metadata["input_tokens"]
    assert 0 < info["keep_ratio"] < 0.6
    assert reply.usage_metadata["output_tokens"] <= 8
    assert reply.usage_metadata["input_token_details"] == {"specprefill_kept": info["kept_tokens"]}


@pytest.mark.slow
def test_token_counts_come_from_the_pipeline_s_tokenizer(paper_pipeline, tokenizer) -> None:
    chat = ChatSpecPrefill(pipeline=paper_pipeline)
    text = "The Louvre museum is in Paris. It opened in 1793."
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert chat.get_token_ids(text) == ids
    assert chat.get_num_tokens(text) == len(ids) > 0
    messages = [SystemMessage("Answer briefly."), HumanMessage(text)]
    sdk = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": text}]
    assert chat.get_num_tokens_from_messages(messages) == paper_pipeline.prompt(sdk).n > len(ids)
    with pytest.raises(InvalidRequestError, match="tools"):
        chat.get_num_tokens_from_messages(messages, tools=[{"name": "search"}])


@pytest.mark.slow
def test_the_default_chat_model_prefills_a_short_chat_whole_and_compresses_a_long_one(essay) -> None:
    auto = load_policy("auto").selector
    chat = ChatSpecPrefill(**MODEL_SETTINGS, max_tokens=4)  # the default policy (auto), as users get it
    info = chat.invoke(list(SHORT_CHAT)).response_metadata["specprefill"]
    assert 32 < info["prompt_tokens"] < auto.dense_below_tokens
    assert info["kept_tokens"] == info["prompt_tokens"] and info["score_ms"] == 0
    assert f"adaptive: dense below {auto.dense_below_tokens} tokens" in info["reason"]
    long = chat.invoke([("human", essay + "\nWhat is the text about?")]).response_metadata["specprefill"]
    assert long["prompt_tokens"] >= auto.dense_below_tokens
    assert long["kept_tokens"] <= auto.max_rate * long["prompt_tokens"] + auto.chunk_size  # its ceiling


@pytest.mark.slow
async def test_chat_model_stream_and_async_agree_with_invoke(dense_pipeline) -> None:
    chat = ChatSpecPrefill(pipeline=dense_pipeline, max_tokens=10)
    messages = [HumanMessage("Name three colours of the rainbow.")]
    text = chat.invoke(messages).text
    streamed = list(chat.stream(messages))
    assert "".join(c.text for c in streamed) == text
    assert streamed[-1].chunk_position == "last" and streamed[-1].usage_metadata is not None
    assert "specprefill_kept" in streamed[-1].usage_metadata["input_token_details"]
    assert (await chat.ainvoke(messages)).text == text
    assert "".join([c.text async for c in chat.astream(messages)]) == text


@pytest.mark.slow
async def test_chat_model_over_http_sends_exact_positions(server_base, essay) -> None:
    chat = ChatSpecPrefill(
        **MODEL_SETTINGS,
        base_url=f"{server_base}/v1",
        policy="paper",
        policy_overrides={"keep_rate": 0.3},
        max_tokens=4,
    )
    messages = [HumanMessage(essay[:1000] + "\nWhat is the text about?")]
    assert chat.get_pipeline().backend.mode == "positions"  # our server takes kept ids at their positions
    reply = chat.invoke(messages)
    info = reply.response_metadata["specprefill"]
    assert reply.text and info["kept_tokens"] < info["prompt_tokens"]
    streamed = [c.text async for c in chat.astream(messages)]
    assert "".join(streamed) == reply.text


@pytest.mark.slow
def test_chat_model_refuses_images(dense_pipeline) -> None:
    chat = ChatSpecPrefill(pipeline=dense_pipeline, max_tokens=4)
    image = HumanMessage(content=[{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])
    with pytest.raises(InvalidRequestError, match="only text"):
        chat.invoke([image])


# ----------------------------------------------------------------------------- documents
@pytest.mark.slow
async def test_compressor_in_a_retriever_keeps_documents_apart(paper_pipeline, documents) -> None:
    from langchain_classic.retrievers import ContextualCompressionRetriever

    base = _store(documents).as_retriever(search_kwargs={"k": 3})
    retriever = ContextualCompressionRetriever(
        base_compressor=SpecPrefillDocumentCompressor(pipeline=paper_pipeline, gap=GAP), base_retriever=base
    )
    found = base.invoke(QUESTION)
    out = retriever.invoke(QUESTION)
    assert [d.id for d in out] == [d.id for d in found]
    assert found[0].id == "id-1"  # the hashing retriever ranks the Louvre document first
    by_id = {d.id: d for d in found}
    for doc in out:
        original = by_id[doc.id]
        assert {k: doc.metadata[k] for k in original.metadata} == original.metadata
        ratio = doc.metadata["specprefill_keep_ratio"]
        assert doc.metadata["specprefill_kept_tokens"] <= doc.metadata["specprefill_tokens"]
        assert 0 < ratio <= 1
        assert_pieces_of(doc.page_content, original.page_content)  # all of it from this very document
        if ratio < 1:
            assert len(doc.page_content) < len(original.page_content)
        else:
            assert doc.page_content == original.page_content
    assert any(d.metadata["specprefill_keep_ratio"] < 0.7 for d in out)
    again = await retriever.ainvoke(QUESTION)
    assert [(d.id, d.page_content) for d in again] == [(d.id, d.page_content) for d in out]


@pytest.mark.slow
def test_shared_budget_spends_one_budget_over_all_documents(paper_pipeline, documents) -> None:
    docs = [Document(page_content=t, metadata={"n": i}) for i, t in enumerate(documents)]
    shared = SpecPrefillDocumentCompressor(
        pipeline=paper_pipeline, policy="paper", shared_budget=True, token_budget=96, gap=GAP
    )
    out = shared.compress_documents(docs, QUESTION)
    assert [d.metadata["n"] for d in out] == [0, 1, 2]
    kept = sum(d.metadata["specprefill_kept_tokens"] for d in out)
    total = sum(d.metadata["specprefill_tokens"] for d in out)
    assert kept <= 96 + 32 < total  # one budget (rounded up to a chunk) over all documents
    ratios = [d.metadata["specprefill_keep_ratio"] for d in out]
    assert len(set(ratios)) > 1  # the budget is not split evenly
    for doc, text in zip(out, documents, strict=True):
        assert_pieces_of(doc.page_content, text)


@pytest.mark.slow
def test_short_retrieved_chunks_keep_their_answers(documents, essay) -> None:
    # Chunks of 50-65 tokens, retrieved for a question, with the settings the docs show.
    chunks = [text for text, _, _ in SHORT_FACTS] + [essay[i : i + 280] for i in range(0, 1400, 280)]
    base = _store(chunks).as_retriever(search_kwargs={"k": 2})
    documented = SpecPrefillDocumentCompressor(**MODEL_SETTINGS, policy="paper", keep_rate=0.3, gap=GAP)
    unruled = SpecPrefillDocumentCompressor(
        **MODEL_SETTINGS, policy="paper", keep_rate=0.3, gap=GAP, whole_below_tokens=0, dense_below_tokens=0
    )  # neither the size rule nor the policy's dense threshold, which would keep such chunks whole too
    lost = 0
    for text, question, answer in SHORT_FACTS:
        found = base.invoke(question)
        assert found[0].page_content == text  # the retriever finds the chunk that answers
        kept = documented.compress_documents(found, question)
        assert answer in kept[0].page_content and kept[0].metadata["specprefill_keep_ratio"] == 1.0
        lost += answer not in unruled.compress_documents(found, question)[0].page_content
    assert lost  # without the size rule, chunks this short lose answers
    long = documented.compress_documents([Document(page_content=essay[:1500])], "What is the essay about?")
    assert long[0].metadata["specprefill_keep_ratio"] < 0.6  # longer documents are still compressed


@pytest.mark.slow
def test_compressor_passes_empty_documents_through(paper_pipeline) -> None:
    compressor = SpecPrefillDocumentCompressor(pipeline=paper_pipeline)
    out = compressor.compress_documents([Document(page_content="  ", metadata={"a": 1})], QUESTION)
    assert out[0].page_content == "  " and out[0].metadata["specprefill_keep_ratio"] == 1.0
    assert compressor.compress_documents([], QUESTION) == []


# ----------------------------------------------------------------------------- messages
@pytest.mark.slow
def test_message_compressor_shortens_user_turns_before_any_model(paper_pipeline, dense_pipeline, essay) -> None:
    compressor = SpecPrefillMessageCompressor(pipeline=paper_pipeline, roles=["user"], gap=GAP)
    messages = [
        SystemMessage("You answer questions about essays.", id="s"),
        HumanMessage(essay[:1000], id="h1"),
        AIMessage("I have read it.", id="a"),
        HumanMessage("What is the essay about?", id="h2"),
    ]
    out = compressor.invoke(messages)
    assert [type(m) for m in out] == [type(m) for m in messages] and [m.id for m in out] == ["s", "h1", "a", "h2"]
    assert out[0].content == messages[0].content and out[2].content == messages[2].content
    assert len(out[1].content) < 0.7 * len(messages[1].content)
    assert_pieces_of(out[1].text, messages[1].text)

    template = ChatPromptTemplate.from_messages([("system", "Answer briefly."), ("human", "{text}\n\n{question}")])
    chain = template | compressor | ChatSpecPrefill(pipeline=dense_pipeline, max_tokens=4)
    values = {"text": essay[:1000], "question": "What is it about?"}
    reply = chain.invoke(values)
    assert isinstance(reply, AIMessage) and reply.content
    full = dense_pipeline.prompt(
        [{"role": m.type.replace("human", "user"), "content": m.text} for m in template.invoke(values).to_messages()]
    ).n
    assert reply.response_metadata["specprefill"]["prompt_tokens"] < 0.7 * full  # the model read the shorter prompt


@pytest.mark.slow
async def test_agent_middleware_shortens_every_model_call(paper_pipeline, dense_pipeline, essay) -> None:
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call

    from specprefill_langchain import SpecPrefillMiddleware

    seen: list[list[str]] = []

    @wrap_model_call
    def record(request, handler):  # type: ignore[no-untyped-def]
        seen.append([m.text for m in request.messages])
        return handler(request)

    @wrap_model_call
    async def arecord(request, handler):  # type: ignore[no-untyped-def]
        seen.append([m.text for m in request.messages])
        return await handler(request)

    question = essay[:1000] + "\nWhat is the essay about?"
    for inner in (record, arecord):
        agent = create_agent(
            model=ChatSpecPrefill(pipeline=dense_pipeline, max_tokens=6),
            tools=[],
            system_prompt="Answer briefly.",
            middleware=[SpecPrefillMiddleware(paper_pipeline, gap=GAP), inner],
        )
        state = {"messages": [HumanMessage(question)]}
        result = agent.invoke(state) if inner is record else await agent.ainvoke(state)
        assert result["messages"][0].text == question  # the agent's history keeps the full text
        assert isinstance(result["messages"][-1], AIMessage) and result["messages"][-1].text
    assert len(seen) == 2
    for texts in seen:
        assert len(texts[0]) < 0.7 * len(question)
        assert_pieces_of(texts[0], question)
