"""Protection on real chat prompts built with SmolLM2's tokenizer and chat template."""

from __future__ import annotations

import pytest
import torch

from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.selection import Chunked, KeepRate, Protect
from specprefill_sdk.types import TokenScores

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chat(tokenizer, essay):
    messages = [
        {"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": essay[:3000]},
        {"role": "assistant", "content": "I have read the essays."},
        {"role": "user", "content": "Which city does the author mention first?"},
    ]
    return build_prompt(tokenizer, messages)


def test_generation_prompt_and_last_user_turn_survive_low_scores(chat, tokenizer) -> None:
    values = torch.ones(chat.n)
    values[chat.generation_start :] = -5.0
    last_user = [i for i, m in enumerate(chat.message_index) if m == 3]
    values[last_user] = -5.0
    sel = Protect(Chunked(KeepRate(0.1), 32), last_user_turn=True).select(chat, TokenScores(values))
    kept = set(sel.indices)
    assert set(range(chat.generation_start, chat.n)) <= kept
    assert set(last_user) <= kept
    assert 0 in kept
    question = tokenizer.decode([chat.token_ids[i] for i in last_user])
    assert "Which city" in question
    assert (
        tokenizer.decode([chat.token_ids[i] for i in range(chat.generation_start, chat.n)])
        .strip()
        .endswith("assistant")
    )
    # Protection counts toward the 10% budget, rounded up to whole chunks.
    assert sel.kept <= chat.n * 0.1 + 32 + len(last_user)


def test_system_role_and_template_tokens_can_be_protected(chat) -> None:
    zeros = TokenScores(torch.zeros(chat.n))
    sel = Protect(KeepRate(0.01), sink=0, tail=False, roles=("system",), special_tokens=True).select(chat, zeros)
    kept = set(sel.indices)
    system = {i for i, r in enumerate(chat.roles) if r == "system"}
    glue = {i for i, r in enumerate(chat.roles) if r == "template"}
    assert system and glue
    assert system | glue <= kept
    assert all(sel.protected)
