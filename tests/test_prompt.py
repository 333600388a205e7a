"""Prompt building: chat template applied, per-token message and role tracked, offsets kept."""

from __future__ import annotations

from typing import Any

import pytest

from specprefill_sdk import InvalidRequestError, build_prompt
from specprefill_sdk.types import Message, Prompt

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


def _per_token(tokenizer: Any, prompt: Any, **kwargs: Any) -> Prompt:
    """The Prompt as built token by token: the tokenizer called as a whole, each token placed in Python."""
    if isinstance(prompt, str) and not kwargs.get("chat_template"):
        enc = tokenizer(prompt, add_special_tokens=True, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        special_ids = set(tokenizer.all_special_ids) | {int(i) for i in tokenizer.added_tokens_decoder}
        special = tuple(i in special_ids for i in ids)
        return Prompt(
            token_ids=tuple(ids),
            text=prompt,
            roles=tuple("template" if s else "text" for s in special),
            message_index=(0,) * len(ids),
            offsets=tuple(offsets),
            special=special,
            protected=(False,) * len(ids),
            generation_start=len(ids),
        )
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    full = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    bounds = [0] + [len(tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)) for i in range(len(messages))]
    special_ids = set(tokenizer.all_special_ids) | {int(i) for i in tokenizer.added_tokens_decoder}
    roles, index, generation = [], [], len(ids)
    for t, (a, b) in enumerate(offsets):
        pos = a if b > a else max(a - 1, 0)
        if a >= bounds[-1] and generation == len(ids):
            generation = t
        i = next((i for i in range(len(messages)) if bounds[i] <= pos < bounds[i + 1]), -1)
        content = messages[i]["content"] if i >= 0 else ""
        at = full.find(content, bounds[i], bounds[i + 1]) if i >= 0 and content else -1
        inside = i >= 0 and at >= 0 and at <= pos < at + len(content) and ids[t] not in special_ids
        roles.append(messages[i]["role"] if inside else "template")
        index.append(i)
    return Prompt(
        token_ids=tuple(ids),
        text=full,
        roles=tuple(roles),
        message_index=tuple(index),
        offsets=tuple(offsets),
        special=tuple(i in special_ids for i in ids),
        protected=(False,) * len(ids),
        generation_start=generation,
        messages=tuple(Message(m["role"], m["content"]) for m in messages),
    )


@pytest.mark.parametrize(
    "prompt",
    [
        "Hello <|im_start|> world<|endoftext|>, héllo 😀\n\n\n  spaces",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi <|im_end|> there"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "An essay.\n\nWhat is it about?"},
        ],
        [{"role": "user", "content": ""}, {"role": "user", "content": "x"}],
    ],
    ids=["text", "chat", "empty-message"],
)
def test_the_prompt_equals_the_token_by_token_build(tokenizer: Any, prompt: Any) -> None:
    # build_prompt reads the Rust encoding directly and places tokens in numpy; the result is the same
    assert build_prompt(tokenizer, prompt) == _per_token(tokenizer, prompt)
