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


def test_a_dense_compressed_prompt_keeps_every_token_where_it_was() -> None:
    prompt = Prompt.from_token_ids([10, 11, 12, 13])
    cp = CompressedPrompt.dense(prompt)
    assert isinstance(cp, CompressedPrompt)
    assert (cp.token_ids, cp.position_ids, cp.n) == ((10, 11, 12, 13), (0, 1, 2, 3), 4)
    assert cp.is_dense is True and cp.keep_ratio == 1.0
    sparse = CompressedPrompt.from_selection(prompt, Selection(indices=(0, 3), n=4, protected=(False, False)))
    assert sparse.is_dense is False and sparse.keep_ratio == 0.5


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
        {"ignore_eos": "yes"},
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


def _chat_prompt() -> Prompt:
    messages = (Message("system", "Be brief."), Message("user", "Hi there"))
    return Prompt(
        token_ids=(1, 2, 3, 4, 5, 6),
        text="<s>Be brief.Hi there<a>",
        roles=("template", "system", "system", "user", "user", "template"),
        message_index=(-1, 0, 0, 1, 1, -1),
        offsets=((0, 3), (3, 6), (6, 12), (12, 14), (14, 20), (20, 23)),
        special=(True, False, False, False, False, True),
        protected=(False, False, True, False, False, False),
        generation_start=5,
        messages=messages,
    )


def test_prompt_take_keeps_each_tokens_provenance() -> None:
    prompt = _chat_prompt()
    tail = prompt.take(range(2, 6))
    assert tail.token_ids == (3, 4, 5, 6) and tail.text == prompt.text and tail.messages == prompt.messages
    assert tail.roles == ("system", "user", "user", "template") and tail.message_index == (0, 1, 1, -1)
    assert tail.offsets == ((6, 12), (12, 14), (14, 20), (20, 23)) and tail.protected == (True, False, False, False)
    assert tail.generation_start == 3  # still the generation prompt's first token
    picked = prompt.take([1, 4])
    assert picked.token_ids == (2, 5) and picked.generation_start == 2 and picked.special == (False, False)


def test_prompt_take_as_text_drops_the_chat_structure() -> None:
    text = _chat_prompt().take([1, 2, 4], as_text=True)
    assert text.token_ids == (2, 3, 5) and text.roles == ("text",) * 3 and text.message_index == (0, 0, 0)
    assert text.generation_start == 3 and text.messages is None and text.protected == (False, True, False)


def test_sampling_params_from_a_call_and_as_request_fields() -> None:
    given = SamplingParams(max_tokens=3)
    assert SamplingParams.from_call(given, {}) is given
    assert SamplingParams.from_call(None, {"max_tokens": 5, "stop": "END"}) == SamplingParams(5, stop=("END",))
    with pytest.raises(InvalidRequestError, match="not both"):
        SamplingParams.from_call(given, {"max_tokens": 5})
    with pytest.raises(InvalidRequestError, match="frequency_penalty"):
        SamplingParams.from_call(None, {"frequency_penalty": 1.0})
    assert SamplingParams(4).request_fields() == {"max_tokens": 4, "temperature": 0.0, "top_p": 1.0}
    fields = SamplingParams(4, temperature=0.5, stop=("a",), seed=7).request_fields()
    assert fields == {"max_tokens": 4, "temperature": 0.5, "top_p": 1.0, "stop": ["a"], "seed": 7}
    # vLLM's extension travels only when asked for: OpenAI's own API refuses fields it does not know
    assert SamplingParams(4, ignore_eos=True).request_fields()["ignore_eos"] is True
    assert "ignore_eos" not in SamplingParams(4, ignore_eos=False).request_fields()


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", True), ("max_tokens", 0), ("temperature", float("nan")), ("top_p", 0.0), ("top_p", "1")],
)
def test_sampling_params_refuse_what_the_shared_checks_refuse(field: str, value: object) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    assert info.value.param == field and field in str(info.value)


def test_completion_repr_is_one_short_line() -> None:
    from specprefill_sdk.types import Completion, Selection, Timings, Usage

    long_text = "word " * 200
    done = Completion(
        text=long_text,
        token_ids=tuple(range(500)),
        finish_reason="length",
        usage=Usage(prompt_tokens=1200, kept_tokens=140, completion_tokens=500),
        timings=Timings(score=12.5, prefill=30.0, ttft=45.25, total=900.0),
        model="smollm2-135m",
        fallback="dense below 256 tokens",
        selection=Selection.keep_all(1200),
    )
    text = repr(done)
    assert "\n" not in text and len(text) < 300
    assert "499" not in text and "(0, 1, 2" not in text  # no token ids, no selection indices
    assert "'length'" in text and "1200 prompt / 140 kept / 500 generated" in text
    assert "ttft=45.2 ms" in text and "total=900.0 ms" in text and "'smollm2-135m'" in text
    assert "dense below 256 tokens" in text and text.count("word") < 20 and "…" in text
    short = repr(Completion("Paris.", (1, 2), "stop", Usage(10, 10, 2)))
    assert short.startswith("Completion(text='Paris.', finish_reason='stop'") and "model=" not in short
