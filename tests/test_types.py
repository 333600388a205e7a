"""The data types validate what they are given."""

from __future__ import annotations

import pytest
import torch

from specprefill_sdk import (
    CompressedPrompt,
    InvalidRequestError,
    Message,
    Prompt,
    SamplingParams,
    Selection,
    TokenScores,
)
from specprefill_sdk.types import int64_tensor


def test_selection_keep_all_and_ratio() -> None:
    sel = Selection.keep_all(5)
    assert sel.indices == (0, 1, 2, 3, 4) and sel.dense and sel.keep_ratio == 1.0
    part = Selection(indices=(0, 3), n=8, protected=(True, False))
    assert part.kept == 2 and part.keep_ratio == 0.25 and part.protected_count == 1
    assert part.mask().tolist() == [True, False, False, True, False, False, False, False]


@pytest.mark.parametrize("indices", [(3, 1), (1, 1), (0, 9), (0, 2, 4, 4, 7), (0, 5, 3, 6)])
def test_selection_rejects_unsorted_or_out_of_range(indices: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        Selection(indices=indices, n=9, protected=(False,) * len(indices))


def test_compressed_prompt_from_selection_keeps_original_positions() -> None:
    prompt = Prompt.from_token_ids([10, 11, 12, 13, 14, 15])
    sel = Selection(indices=(0, 2, 5), n=6, protected=(True, False, True))
    cp = CompressedPrompt.from_selection(prompt, sel)
    assert cp.token_ids == (10, 12, 15)
    assert cp.position_ids == (0, 2, 5)
    assert cp.n == 6 and cp.kept == 3 and not cp.is_dense


def test_compressed_prompt_from_selection_of_one_token() -> None:
    prompt = Prompt.from_token_ids([10, 11, 12])
    cp = CompressedPrompt.from_selection(prompt, Selection(indices=(1,), n=3, protected=(False,)))
    assert cp.token_ids == (11,) and cp.position_ids == (1,)


@pytest.mark.parametrize("values", [(), (0,), (5, -3, 2**62, 128255), list(range(4096))])
def test_int64_tensor_equals_torch_tensor(values: tuple[int, ...] | list[int]) -> None:
    got = int64_tensor(values)
    assert got.dtype == torch.long and got.shape == (len(values),)
    assert torch.equal(got, torch.tensor(values, dtype=torch.long))


@pytest.mark.parametrize(
    ("ids", "pos", "n"),
    [
        ((1, 2), (0,), 5),
        ((1, 2), (2, 1), 5),
        ((1, 2), (0, 5), 5),
        ((), (), 3),
        ((1,), (-1,), 3),
        ((1, 2, 3), (0, 4, 4), 5),
    ],
)
def test_compressed_prompt_validates_positions(ids: tuple[int, ...], pos: tuple[int, ...], n: int) -> None:
    with pytest.raises(InvalidRequestError):
        CompressedPrompt(token_ids=ids, position_ids=pos, n=n)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"stop": ("",)},
    ],
)
def test_sampling_params_reject_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidRequestError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_sampling_params_accepts_single_stop_string() -> None:
    assert SamplingParams(stop="END").stop == ("END",)  # type: ignore[arg-type]
    assert SamplingParams().greedy and not SamplingParams(temperature=0.7).greedy


def test_token_scores_are_fp32_cpu_vectors() -> None:
    s = TokenScores(torch.tensor([1, 2, 3], dtype=torch.bfloat16))
    assert s.values.dtype == torch.float32 and len(s) == 3
    with pytest.raises(ValueError):
        TokenScores(torch.zeros(2, 2))


def test_message_coerce() -> None:
    assert Message.coerce({"role": "user", "content": "hi"}) == Message("user", "hi")
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert Message.coerce(parts).content == "ab"
    for bad in (
        {"role": "", "content": "x"},
        {"role": "user", "content": 3},
        "user: hi",
        {"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
    ):
        with pytest.raises(InvalidRequestError):
            Message.coerce(bad)  # type: ignore[arg-type]


def test_error_bodies_are_openai_shaped() -> None:
    from specprefill_sdk import ContextTooLongError, ModelLoadError

    body = ContextTooLongError("too long", param="messages").to_openai()
    assert body == {
        "error": {
            "message": "too long",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    assert ContextTooLongError.status_code == 400 and ModelLoadError.status_code == 404


def test_every_public_name_resolves() -> None:
    import specprefill_sdk

    for name in specprefill_sdk.__all__:
        assert getattr(specprefill_sdk, name) is not None, name
