"""Prompt building: chat template applied, per-token message and role tracked, offsets kept."""

from __future__ import annotations

import pytest

from specprefill_sdk import InvalidRequestError, build_prompt

pytestmark = pytest.mark.slow


def test_chat_prompt_tracks_roles_messages_and_generation_prompt(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    p = build_prompt(tokenizer, messages)
    ref = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ref_ids = ref["input_ids"] if isinstance(ref, dict) or hasattr(ref, "keys") else ref
    assert list(p.token_ids) == list(ref_ids)
    decoded = {
        role: "".join(tokenizer.decode([t]) for t, r in zip(p.token_ids, p.roles, strict=True) if r == role)
        for role in ("system", "user")
    }
    assert decoded["system"] == "Be brief."
    assert decoded["user"] == "What is the capital of France?"
    assert tokenizer.decode(list(p.token_ids[p.generation_start :])) == "<|im_start|>assistant\n"
    assert set(p.message_index[p.generation_start :]) == {-1}
    assert all(p.special[i] for i, t in enumerate(p.token_ids) if t in tokenizer.all_special_ids)
    for (a, b), t in zip(p.offsets, p.token_ids, strict=True):
        assert p.text[a:b] == tokenizer.decode([t])


def test_plain_text_prompt_and_protected_spans(tokenizer) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    start = text.index("fox")
    p = build_prompt(tokenizer, text, protected_spans=[(start, start + 3)])
    assert p.messages is None and p.generation_start == p.n
    protected = [tokenizer.decode([t]) for t, keep in zip(p.token_ids, p.protected, strict=True) if keep]
    assert protected == [" fox"]


def test_plain_text_through_chat_template(tokenizer) -> None:
    p = build_prompt(tokenizer, "Hi there", chat_template=True)
    assert p.messages is not None and p.messages[0].role == "user"
    assert p.generation_start < p.n


@pytest.mark.parametrize(
    "bad",
    ["", "   ", b"bytes", [], [{"role": "user"}], [{"role": "user", "content": ""}], "x"[:0], [{"content": "x"}]],
)
def test_bad_prompts_raise_invalid_request(tokenizer, bad) -> None:
    with pytest.raises(InvalidRequestError):
        build_prompt(tokenizer, bad)


def test_protected_span_validation(tokenizer) -> None:
    with pytest.raises(InvalidRequestError):
        build_prompt(tokenizer, "hello", protected_spans=[(3, 1)])
