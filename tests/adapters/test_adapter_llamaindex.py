"""LlamaIndex adapter against the real llama-index-core and SmolLM2."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_index.core")

from adapter_helpers import GAP, SHORT_CHAT, assert_pieces_of, hash_embedding
from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatStartEvent
from llama_index.core.schema import TextNode
from pydantic import Field

from specprefill_llamaindex import SpecPrefillLLM, SpecPrefillNodePostprocessor
from specprefill_sdk.errors import InvalidRequestError

QUESTION = "Where is the Louvre and what does it hold?"


class HashEmbedding(BaseEmbedding):
    """Deterministic bag-of-words vectors: the embedding step only (no embedding model can be downloaded)."""

    def _get_query_embedding(self, query: str) -> list[float]:
        return hash_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return hash_embedding(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return hash_embedding(query)


class ChatRecorder(BaseEventHandler):
    """Keeps the messages of every LLM chat call (LlamaIndex instrumentation events)."""

    prompts: list[str] = Field(default_factory=list)

    def handle(self, event: object, **kwargs: object) -> None:
        if isinstance(event, LLMChatStartEvent):
            self.prompts.append("\n".join(str(m.content) for m in event.messages))


def _nodes(documents: list[str]) -> list[TextNode]:
    return [
        TextNode(text=t, id_=f"node-{i}", metadata={"source": f"doc-{i}.txt", "page": i})
        for i, t in enumerate(documents)
    ]


@pytest.mark.slow
def test_query_engine_keeps_node_ids_scores_and_metadata(paper_pipeline, dense_pipeline, documents) -> None:
    nodes = _nodes(documents)
    index = VectorStoreIndex(nodes, embed_model=HashEmbedding())
    llm = SpecPrefillLLM(pipeline=dense_pipeline, max_tokens=6)
    postprocessor = SpecPrefillNodePostprocessor(pipeline=paper_pipeline, gap=GAP)
    engine = index.as_query_engine(llm=llm, node_postprocessors=[postprocessor], similarity_top_k=3)

    retrieved = index.as_retriever(similarity_top_k=3).retrieve(QUESTION)
    recorder = ChatRecorder()
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(recorder)
    try:
        response = engine.query(QUESTION)
    finally:
        dispatcher.event_handlers.remove(recorder)

    assert isinstance(response.response, str) and response.response.strip()
    assert [n.node_id for n in response.source_nodes] == [n.node_id for n in retrieved]
    assert retrieved[0].node_id == "node-1"  # the hashing embedding ranks the Louvre node first
    originals = {n.node_id: n for n in nodes}
    for got, before in zip(response.source_nodes, retrieved, strict=True):
        original = originals[got.node_id]
        assert got.score == pytest.approx(before.score)
        assert {k: got.node.metadata[k] for k in original.metadata} == original.metadata
        assert 0 < got.node.metadata["specprefill_keep_ratio"] <= 1
        assert "specprefill_keep_ratio" in got.node.excluded_llm_metadata_keys
        assert_pieces_of(got.node.get_content(), original.text)
    shortened = [n for n in response.source_nodes if n.node.metadata["specprefill_keep_ratio"] < 1]
    assert shortened, "the long nodes should lose tokens"
    assert all(
        n.node.metadata["specprefill_keep_ratio"] == 1.0 or len(n.node.get_content()) < len(originals[n.node_id].text)
        for n in response.source_nodes
    )

    # The LLM read the shortened nodes, not the originals, and without the added metadata keys.
    assert len(recorder.prompts) == 1
    prompt = recorder.prompts[0]
    for node in shortened:
        assert node.node.get_content() in prompt
        assert originals[node.node_id].text not in prompt
    assert "specprefill_keep_ratio" not in prompt


@pytest.mark.slow
async def test_postprocessor_async_and_shared_budget(paper_pipeline, documents) -> None:
    from llama_index.core.schema import NodeWithScore

    items = [NodeWithScore(node=n, score=1.0 - 0.1 * i) for i, n in enumerate(_nodes(documents))]
    one_by_one = SpecPrefillNodePostprocessor(pipeline=paper_pipeline, gap=GAP)
    sync = one_by_one.postprocess_nodes(items, query_str=QUESTION)
    again = await one_by_one.apostprocess_nodes(items, query_str=QUESTION)
    assert [n.node.get_content() for n in again] == [n.node.get_content() for n in sync]

    shared = SpecPrefillNodePostprocessor(
        pipeline=paper_pipeline, policy="paper", shared_budget=True, token_budget=96, gap=GAP
    )
    out = shared.postprocess_nodes(items, query_str=QUESTION)
    assert [n.node_id for n in out] == [n.node_id for n in items]
    assert [n.score for n in out] == [n.score for n in items]
    kept = sum(n.node.metadata["specprefill_kept_tokens"] for n in out)
    assert kept <= 96 + 32 < sum(n.node.metadata["specprefill_tokens"] for n in out)
    for got, item in zip(out, items, strict=True):
        assert_pieces_of(got.node.get_content(), item.node.get_content())
    assert items[0].node.metadata == {"source": "doc-0.txt", "page": 0}  # the inputs are not modified


@pytest.mark.slow
async def test_llm_complete_chat_stream_and_async_agree(dense_pipeline) -> None:
    llm = SpecPrefillLLM(pipeline=dense_pipeline, max_tokens=6)
    assert llm.metadata.is_chat_model and llm.metadata.context_window == dense_pipeline.backend.max_context
    done = llm.complete("Name a colour.")
    info = done.additional_kwargs["specprefill"]
    assert done.text and info["kept_tokens"] == info["prompt_tokens"]  # the auto policy: short prompts whole
    streamed = list(llm.stream_complete("Name a colour."))
    assert streamed[-1].text == done.text == "".join(r.delta or "" for r in streamed)
    assert (await llm.acomplete("Name a colour.")).text == done.text

    messages = [ChatMessage(role=MessageRole.SYSTEM, content="Be brief."), ChatMessage(role="user", content="Hi!")]
    reply = llm.chat(messages)
    assert reply.message.role == MessageRole.ASSISTANT and reply.message.content
    chunks = list(llm.stream_chat(messages))
    assert chunks[-1].message.content == reply.message.content
    assert (await llm.achat(messages)).message.content == reply.message.content
    gen = await llm.astream_chat(messages)
    assert [c.delta async for c in gen][-1] is not None


@pytest.mark.slow
def test_the_default_llm_prefills_a_short_chat_whole_and_compresses_a_long_one(essay) -> None:
    from specprefill_sdk.policies import load_policy

    auto = load_policy("auto").selector
    llm = SpecPrefillLLM(model="smollm2-135m", max_tokens=4)  # the default policy (auto), as users get it
    reply = llm.chat([ChatMessage(role=role, content=text) for role, text in SHORT_CHAT])
    info = reply.additional_kwargs["specprefill"]
    assert 32 < info["prompt_tokens"] < auto.dense_below_tokens and info["kept_tokens"] == info["prompt_tokens"]
    assert f"adaptive: dense below {auto.dense_below_tokens} tokens" in info["reason"]
    long = llm.complete(essay + "\nWhat is the text about?").additional_kwargs["specprefill"]
    assert long["prompt_tokens"] >= auto.dense_below_tokens
    assert long["kept_tokens"] <= auto.max_rate * long["prompt_tokens"] + auto.chunk_size  # its ceiling


@pytest.mark.slow
def test_llm_refuses_unknown_arguments_and_images(dense_pipeline) -> None:
    from llama_index.core.base.llms.types import ImageBlock

    llm = SpecPrefillLLM(pipeline=dense_pipeline)
    with pytest.raises(InvalidRequestError, match="unsupported argument"):
        llm.complete("hi", frequency_penalty=1.0)
    with pytest.raises(InvalidRequestError, match="only text"):
        llm.chat([ChatMessage(role="user", blocks=[ImageBlock(url="http://127.0.0.1/x.png")])])


@pytest.mark.slow
def test_token_counting_handler_sees_the_real_counts(dense_pipeline, tokenizer) -> None:
    from llama_index.core.callbacks import CallbackManager, TokenCountingHandler

    counter = TokenCountingHandler(tokenizer=lambda text: tokenizer.encode(text, add_special_tokens=False))
    llm = SpecPrefillLLM(pipeline=dense_pipeline, max_tokens=5, callback_manager=CallbackManager([counter]))
    assert llm.get_token_ids("Name a colour.") == tokenizer.encode("Name a colour.", add_special_tokens=False)
    done = llm.complete("Name a colour.")
    usage = done.raw["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["kept_tokens"] == done.additional_kwargs["specprefill"]["kept_tokens"]
    # the chat template's tokens count: more than the tokenizer finds in the bare prompt text
    assert counter.prompt_llm_token_count == usage["prompt_tokens"] > len(llm.get_token_ids("Name a colour."))
    assert counter.completion_llm_token_count == usage["completion_tokens"] > 0

    counter.reset_counts()
    chunks = list(llm.stream_chat([ChatMessage(role="user", content="Hi!")]))
    last = chunks[-1].raw["usage"]
    assert counter.prompt_llm_token_count == last["prompt_tokens"]
    assert counter.completion_llm_token_count == last["completion_tokens"]
