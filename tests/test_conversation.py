"""Multi-turn conversations on the real SmolLM2: strategies, cache exactness, dropped facts, overflow."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from specprefill_sdk import ContextTooLongError, InvalidRequestError, Pipeline
from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.conversation import Conversation
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.scoring import DraftAttentionScorer, UniformScorer
from specprefill_sdk.selection import Chunked, KeepRate, Protect
from specprefill_sdk.types import CompressedPrompt, Message, Prompt

pytestmark = pytest.mark.slow

FACT = "The secret code for the vault is 7419. "
QUESTION_1 = "\n\nIn one sentence, what is the first paragraph about?"
QUESTION_2 = "What is the secret code for the vault?"


@pytest.fixture(scope="module")
def backend32(smollm_fp32) -> TransformersBackend:
    return TransformersBackend(smollm_fp32)


@pytest.fixture(scope="module")
def backend16(smollm) -> TransformersBackend:
    return TransformersBackend(smollm)


@pytest.fixture(scope="module")
def dense16(backend16) -> Pipeline:
    return Pipeline(UniformScorer(), KeepRate(1.0), backend16)


@pytest.fixture(scope="module")
def document(essay) -> str:
    """About 330 tokens of essay with a fact in the middle that the first question does not need."""
    text = essay[:1200]
    cut = text.index(". ", 500) + 2
    return text[:cut] + FACT + text[cut:]


def fact_positions(prompt: Prompt) -> list[int]:
    start = prompt.text.index(FACT)
    return [i for i, (a, b) in enumerate(prompt.offsets) if b > start and a < start + len(FACT)]


@pytest.fixture(scope="module")
def fact_case(smollm, backend32, document) -> dict[str, Any]:
    """Two turns per strategy: turn 1 asks about the first paragraph, turn 2 asks for the fact."""
    scorer = DraftAttentionScorer(smollm, look_ahead=4)  # bf16 draft, fp32 target
    pipe = Pipeline(scorer, Protect(Chunked(KeepRate(0.2), 16), sink=1, tail=True), backend32)
    runs: dict[str, Any] = {}
    for name, strategy, exact in [
        ("recompute", "recompute", True),
        ("incremental", "incremental", True),
        ("refresh", "refresh", True),
        ("refresh-approx", "refresh", False),
    ]:
        conv = pipe.conversation(strategy=strategy, recompute_stale=exact)
        first = conv.send(document + QUESTION_1, max_tokens=8)
        second = conv.send(QUESTION_2, max_tokens=12)
        runs[name] = {"conv": conv, "first": first, "second": second}
    runs["pipe"] = pipe
    return runs


# ----------------------------------------------------------------------------- keep 1.0 = uncompressed
def test_keep_all_strategies_match_uncompressed_multi_turn(smollm_fp32, backend32, essay) -> None:
    model, tokenizer = smollm_fp32.model, smollm_fp32.tokenizer
    questions = [essay[:600] + "\n\nWhat is this text about?", "Say it in five words.", "Who might have written it?"]
    # The plain reference: every turn prefills the whole history and decodes greedily.
    messages: list[dict[str, str]] = []
    ref_logits, ref_replies = [], []
    for q in questions:
        messages.append({"role": "user", "content": q})
        ids = torch.tensor([build_prompt(tokenizer, messages).token_ids])
        with torch.no_grad():
            ref_logits.append(model(ids).logits[0, -1].float())
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=5,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        reply = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        ref_replies.append(reply)
        messages.append({"role": "assistant", "content": reply})

    first_logits: list[torch.Tensor] = []

    def hook(module, args, kwargs, output):  # the output head: lean prefills and the model's forward both call it
        first_logits.append(output[0, -1].float().clone())

    pipe = Pipeline(UniformScorer(), KeepRate(1.0), backend32)
    for strategy in ("recompute", "incremental", "refresh"):
        conv = pipe.conversation(strategy=strategy)
        for turn, q in enumerate(questions):
            first_logits.clear()
            handle = model.lm_head.register_forward_hook(hook, with_kwargs=True)
            try:
                completion = conv.send(q, max_tokens=5)
            finally:
                handle.remove()
            assert completion.text == ref_replies[turn], (strategy, turn)
            assert torch.allclose(first_logits[0], ref_logits[turn], atol=1e-4, rtol=0), (strategy, turn)
            assert completion.usage.kept_tokens == completion.usage.prompt_tokens
        stats = conv.turns
        assert [s.turn for s in stats] == [1, 2, 3]
        if strategy == "recompute":
            assert all(s.prefilled_tokens == s.prompt_tokens for s in stats)
        else:  # later turns reuse the cache: only the new tokens go through the model
            assert all(s.prefilled_tokens < s.prompt_tokens / 3 for s in stats[1:])
            assert all(s.reused_tokens + s.prefilled_tokens == s.prompt_tokens for s in stats)
        assert all(s.draft_tokens == 0 for s in stats)  # keep 1.0 never runs the draft


# ----------------------------------------------------------------------------- dropped facts
def test_dropped_fact_is_recovered_by_recompute_and_refresh_not_incremental(fact_case) -> None:
    pipe = fact_case["pipe"]
    for name in ("recompute", "incremental", "refresh", "refresh-approx"):
        run = fact_case[name]
        history = run["conv"].history
        turn1 = pipe.prompt(list(history[:1]))
        turn2 = pipe.prompt(list(history[:3]))
        facts = fact_positions(turn1)
        assert facts == fact_positions(turn2)  # the fact sits at the same positions in both turns
        kept1, kept2 = set(run["first"].selection.indices), set(run["second"].selection.indices)
        assert not kept1 & set(facts), name  # turn 1's selection dropped the fact
        recovered = len(kept2 & set(facts)) / len(facts)
        if name == "incremental":
            assert recovered == 0.0  # tokens dropped earlier stay dropped
            assert "7419" not in run["second"].text
        else:
            assert recovered >= 0.75, (name, recovered)
            assert "7419" in run["second"].text, (name, run["second"].text)


def cache_by_position(state, below: int) -> dict[int, int]:
    return {int(p): j for j, p in enumerate(state.positions[0].tolist()) if p < below}


def test_refresh_cache_equals_from_scratch_prefill_of_its_selection(fact_case, backend32) -> None:
    pipe, run = fact_case["pipe"], fact_case["refresh"]
    conv, second = run["conv"], run["second"]
    turn2 = pipe.prompt(list(conv.history[:3]))
    stats = conv.turns[-1]
    # The turn really refreshed: old tokens were inserted and others evicted, the rest reused.
    kept1 = set(run["first"].selection.indices)
    inserted = [p for p in second.selection.indices if p not in kept1 and p < conv.turns[0].prompt_tokens]
    assert inserted and stats.evicted_tokens > 0 and stats.reused_tokens > 0
    assert stats.prefilled_tokens < second.usage.kept_tokens
    mine = cache_by_position(conv.state, turn2.n)
    assert sorted(mine) == list(second.selection.indices)
    scratch = backend32.prefill(CompressedPrompt.from_selection(turn2, second.selection))
    theirs = cache_by_position(scratch, turn2.n)
    order_mine = torch.tensor([mine[p] for p in sorted(mine)])
    order_theirs = torch.tensor([theirs[p] for p in sorted(theirs)])
    for a, b in zip(conv.state.cache.layers, scratch.cache.layers, strict=True):
        assert torch.allclose(a.keys[0][:, order_mine], b.keys[0][:, order_theirs], atol=1e-4, rtol=1e-4)
        assert torch.allclose(a.values[0][:, order_mine], b.values[0][:, order_theirs], atol=1e-4, rtol=1e-4)


def test_refresh_without_recomputing_stale_tokens_is_cheaper_and_approximate(fact_case, backend32) -> None:
    pipe = fact_case["pipe"]
    exact, approx = fact_case["refresh"], fact_case["refresh-approx"]
    assert approx["second"].selection.indices == exact["second"].selection.indices
    assert approx["conv"].turns[-1].prefilled_tokens < exact["conv"].turns[-1].prefilled_tokens
    conv, second = approx["conv"], approx["second"]
    turn2 = pipe.prompt(list(conv.history[:3]))
    scratch = backend32.prefill(CompressedPrompt.from_selection(turn2, second.selection))
    mine, theirs = cache_by_position(conv.state, turn2.n), cache_by_position(scratch, turn2.n)
    positions = sorted(mine)
    first_insert = min(p for p in positions if p not in set(approx["first"].selection.indices))
    before = [p for p in positions if p < first_insert]
    layers = list(zip(conv.state.cache.layers, scratch.cache.layers, strict=True))

    def diff(layer: int, group: list[int]) -> float:
        a, b = layers[layer]
        ka = a.keys[0][:, [mine[p] for p in group]]
        kb = b.keys[0][:, [theirs[p] for p in group]]
        return float((ka - kb).abs().max())

    assert diff(0, positions) < 1e-4  # the first layer depends only on token and position
    assert diff(len(layers) - 1, before) < 1e-4  # nothing changed before the first insertion
    assert diff(len(layers) - 1, positions) > 1e-3  # later reused tokens never saw the inserted ones


# ----------------------------------------------------------------------------- bounds and API
def test_overflow_raises_or_drops_the_oldest_turns(dense16) -> None:
    long_question = "Please list three colours that you like and explain why, in detail, for each one. " * 2
    strict = dense16.conversation(strategy="incremental", system="Be brief.", max_context=160)
    strict.send(long_question, max_tokens=4)
    with pytest.raises(ContextTooLongError, match="drop_oldest"):
        for _ in range(4):
            strict.send(long_question, max_tokens=4)
    assert len(strict.history) < 10
    rolling = dense16.conversation(
        strategy="incremental", system="Be brief.", max_context=160, on_overflow="drop_oldest"
    )
    for _ in range(4):
        completion = rolling.send(long_question, max_tokens=4)
    assert rolling.history[0] == Message("system", "Be brief.")
    assert sum(s.dropped_messages for s in rolling.turns) >= 2
    assert all(s.prompt_tokens + 4 <= 160 for s in rolling.turns)
    assert completion.usage.prompt_tokens == rolling.turns[-1].prompt_tokens
    with pytest.raises(ContextTooLongError, match="alone"):
        rolling.send(long_question * 6, max_tokens=4)


def test_history_stream_async_reset(dense16) -> None:
    conv = dense16.conversation(
        strategy="refresh", system="You answer in one short sentence.", conversation_id="chat-1"
    )
    assert conv.id == "chat-1" and isinstance(conv, Conversation)
    chunks = list(conv.stream("What colour is the sky on a clear day?", max_tokens=8))
    final = chunks[-1].completion
    assert final is not None and "".join(c.text for c in chunks) == final.text
    assert [m.role for m in conv.history] == ["system", "user", "assistant"]
    assert conv.history[-1].content == final.text

    async def more() -> tuple[str, str]:
        answer = await conv.asend({"role": "user", "content": "And at night?"}, max_tokens=6)
        streamed = "".join([c.text async for c in conv.astream("Thanks!", max_tokens=4)])
        return answer.text, streamed

    answer, streamed = asyncio.run(more())
    assert conv.history[4].content == answer and conv.history[6].content == streamed
    assert len(conv.turns) == 3 and conv.state is not None
    # A caller that stops at the last chunk (without exhausting the stream) still completes the turn.
    for chunk in conv.stream("One more?", max_tokens=3):
        if chunk.completion is not None:
            break
    assert len(conv.turns) == 4 and conv.history[-1].content == chunk.completion.text
    # Stopping early keeps the partial answer.
    iterator = conv.stream("Tell me a long story about the sea.", max_tokens=30)
    partial = next(iterator).text + next(iterator).text
    iterator.close()
    assert conv.history[-1] == Message("assistant", partial)
    conv.reset()
    assert conv.history == (Message("system", "You answer in one short sentence."),)
    assert conv.turns == [] and conv.state is None
    assert conv.send("Hello!", max_tokens=3).usage.prompt_tokens == conv.turns[0].prompt_tokens


def test_bad_configurations_are_refused(dense16, tokenizer) -> None:
    with pytest.raises(InvalidRequestError, match="strategy"):
        dense16.conversation(strategy="forgetful")
    with pytest.raises(InvalidRequestError, match="on_overflow"):
        dense16.conversation(on_overflow="truncate")
    with pytest.raises(InvalidRequestError, match="empty"):
        dense16.conversation().send("   ")
    from specprefill_sdk.backends import OpenAIBackend

    remote = OpenAIBackend("http://127.0.0.1:9/v1", model="remote", tokenizer=tokenizer, mode="text")
    pipe = Pipeline(UniformScorer(), KeepRate(1.0), remote)
    with pytest.raises(InvalidRequestError, match="recompute"):
        pipe.conversation(strategy="incremental")
    assert pipe.conversation(strategy="recompute").strategy == "recompute"
