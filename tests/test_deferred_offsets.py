"""A text prompt's offsets are computed on first read: the same values as the tokenizer's own, and never
computed on a path that does not read them (the ``paper`` policy served over HTTP).

The reference is the transformers tokenizer's own call with ``return_offsets_mapping=True`` on the whole
text, the real SmolLM2 tokenizer.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Iterator
from typing import Any
from unittest import mock

import httpx
import pytest
from server_utils import serve_in_thread

from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.types import DeferredOffsets, Prompt


@pytest.fixture(scope="module")
def long_text(essay: str) -> str:
    return essay * 3  # about 18,000 characters: cut into pieces on a machine of several cores


def _reference(tokenizer: Any, text: str) -> tuple[tuple[int, int], ...]:
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    return tuple((int(a), int(b)) for a, b in enc["offset_mapping"])


def _stored(prompt: Prompt) -> object:
    """What the prompt holds for its offsets, without reading them through the field."""
    return prompt.__dict__["offsets"]


def test_a_text_prompt_defers_its_offsets_and_reads_the_tokenizers_own(tokenizer: Any, long_text: str) -> None:
    prompt = build_prompt(tokenizer, long_text)
    assert isinstance(_stored(prompt), DeferredOffsets) and len(_stored(prompt)) == prompt.n  # type: ignore[arg-type]
    assert prompt.offsets == _reference(tokenizer, long_text)
    assert isinstance(_stored(prompt), tuple)  # computed once, then held
    assert prompt.offsets is prompt.offsets


def test_protected_spans_and_chat_prompts_read_their_offsets_at_once(tokenizer: Any, long_text: str) -> None:
    spanned = build_prompt(tokenizer, long_text, protected_spans=[(10, 40)])
    assert isinstance(_stored(spanned), tuple) and any(spanned.protected)
    chat = build_prompt(tokenizer, [{"role": "user", "content": long_text}])
    assert isinstance(_stored(chat), tuple)


@pytest.mark.parametrize(
    "copy_of",
    [
        lambda p: pickle.loads(pickle.dumps(p)),
        copy.deepcopy,
        copy.copy,
        lambda p: dataclasses.replace(p, generation_start=0),
    ],
    ids=["pickle", "deepcopy", "copy", "replace"],
)
def test_copies_hold_the_offsets_themselves(tokenizer: Any, long_text: str, copy_of: Any) -> None:
    expected = _reference(tokenizer, long_text)
    copied = copy_of(build_prompt(tokenizer, long_text))
    assert copied.offsets == expected


def test_deferred_prompts_compare_hash_and_print_as_eager_ones(tokenizer: Any, long_text: str) -> None:
    deferred = build_prompt(tokenizer, long_text)
    eager = dataclasses.replace(build_prompt(tokenizer, long_text), offsets=_reference(tokenizer, long_text))
    assert isinstance(_stored(eager), tuple)
    assert build_prompt(tokenizer, long_text) == eager and hash(deferred) == hash(eager)
    assert repr(build_prompt(tokenizer, long_text)) == repr(eager)
    with pytest.raises(dataclasses.FrozenInstanceError):
        deferred.offsets = ()  # type: ignore[misc]


def test_a_wrong_count_is_refused_when_built_and_when_computed() -> None:
    fields: dict[str, Any] = {
        "token_ids": (1, 2),
        "text": "ab",
        "roles": ("text", "text"),
        "message_index": (0, 0),
        "special": (False, False),
        "protected": (False, False),
        "generation_start": 2,
    }
    with pytest.raises(ValueError, match=r"Prompt\.offsets has 3 entries for 2 tokens"):
        Prompt(**fields, offsets=DeferredOffsets(3, lambda: [(0, 1)] * 3))
    short = Prompt(**fields, offsets=DeferredOffsets(2, lambda: [(0, 1)]))
    with pytest.raises(RuntimeError, match="computed 1 spans for 2 tokens"):
        _ = short.offsets


@pytest.fixture(scope="module")
def server(backend: Any, smollm: Any) -> Iterator[str]:
    from specprefill_sdk.scoring import DraftAttentionScorer
    from specprefill_sdk.server import ServerConfig, create_app

    # The scorer knows the target's tokenizer, as the policies build it: it reads the prompt's ids.
    scorer = DraftAttentionScorer(smollm, target_tokenizer=smollm.tokenizer)
    with serve_in_thread(create_app(ServerConfig(policy="auto"), backend=backend, scorer=scorer)) as base:
        yield base


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "reads"), [("paper", 0), ("auto", 1)])
def test_a_served_text_request_computes_offsets_only_where_its_policy_reads_them(
    server: str, essay: str, policy: str, reads: int
) -> None:
    body = {"model": "smollm2-135m", "prompt": essay, "max_tokens": 2, "specprefill": {"policy": policy}}
    with mock.patch.object(DeferredOffsets, "resolve", autospec=True, side_effect=DeferredOffsets.resolve) as spy:
        answer = httpx.post(f"{server}/v1/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert usage["specprefill"]["kept_tokens"] < usage["prompt_tokens"]  # the draft ran and selected
    assert spy.call_count == reads
