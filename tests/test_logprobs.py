"""Log-probabilities of generated tokens: the transformers backend against a plain forward pass of
the whole sequence, in every generation path, and the token texts and bytes the server writes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.server.logprobs import TokenText, chat_logprobs, completion_logprobs
from specprefill_sdk.types import CompressedPrompt, SamplingParams, TokenLogprob

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def fp32(smollm_fp32: Any) -> Any:
    """The backend on float32 weights: the cached decode and a whole-sequence pass agree closely."""
    from specprefill_sdk.backends import TransformersBackend

    return TransformersBackend(smollm_fp32)


def _prompt(backend: Any) -> CompressedPrompt:
    return CompressedPrompt.dense(build_prompt(backend.tokenizer, CHAT))


@torch.inference_mode()
def _reference(backend: Any, prompt: CompressedPrompt, generated: tuple[int, ...]) -> torch.Tensor:
    """log_softmax of the logits that predicted each generated token, from one pass over the whole sequence."""
    ids = torch.tensor([[*prompt.token_ids, *generated]])
    logits = backend.loaded.model(input_ids=ids).logits[0].float()
    return torch.log_softmax(logits[prompt.n - 1 : prompt.n - 1 + len(generated)], dim=-1)


def _check(backend: Any, prompt: CompressedPrompt, token_ids: tuple[int, ...], entries: Any, top: int) -> None:
    assert entries is not None and len(entries) == len(token_ids)
    reference = _reference(backend, prompt, token_ids)
    for step, (token, entry) in enumerate(zip(token_ids, entries, strict=True)):
        assert entry.token_id == token
        assert entry.logprob == pytest.approx(float(reference[step, token]), abs=2e-3)
        assert len(entry.top) == top
        expected = torch.topk(reference[step], top)
        assert [t for t, _ in entry.top][:1] == expected.indices.tolist()[:1]
        assert [v for _, v in entry.top] == pytest.approx(expected.values.tolist(), abs=2e-3)


def test_greedy_logprobs_are_the_models_distribution_at_each_step(fp32: Any) -> None:
    backend = fp32
    prompt = _prompt(backend)
    completion = backend.generate(prompt, SamplingParams(max_tokens=6, logprobs=3))
    _check(backend, prompt, completion.token_ids, completion.logprobs, 3)
    for entry in completion.logprobs:
        assert entry.top[0] == (entry.token_id, entry.logprob)  # greedy picks the most likely token


def test_sampled_logprobs_are_taken_before_temperature(fp32: Any) -> None:
    backend = fp32
    prompt = _prompt(backend)
    completion = backend.generate(prompt, SamplingParams(max_tokens=6, temperature=0.4, seed=3, logprobs=2))
    # A temperature of 0.4 would scale every log-probability by 2.5 (before renormalising): far off.
    _check(backend, prompt, completion.token_ids, completion.logprobs, 2)


def test_streamed_chunks_carry_the_logprobs_of_their_tokens(backend: Any) -> None:
    prompt = _prompt(backend)
    params = SamplingParams(max_tokens=6, logprobs=1)
    chunks = list(backend.stream(prompt, params))
    final = chunks[-1].completion
    assert final is not None and final.logprobs is not None
    assert all(len(c.logprobs) == len(c.token_ids) == 1 for c in chunks)
    assert tuple(e for c in chunks for e in c.logprobs) == final.logprobs


def test_a_batch_gives_each_row_its_own_logprobs(fp32: Any) -> None:
    backend = fp32
    prompts = [_prompt(backend), CompressedPrompt.dense(build_prompt(backend.tokenizer, "The capital of France is"))]
    params = SamplingParams(max_tokens=4, logprobs=2)
    for prompt, completion in zip(prompts, backend.generate_batch(prompts, params), strict=True):
        _check(backend, prompt, completion.token_ids, completion.logprobs, 2)


def test_no_logprobs_unless_asked(backend: Any) -> None:
    prompt = _prompt(backend)
    chunks = list(backend.stream(prompt, SamplingParams(max_tokens=3)))
    assert all(c.logprobs == () for c in chunks)
    assert chunks[-1].completion is not None and chunks[-1].completion.logprobs is None
    zero = backend.generate(prompt, SamplingParams(max_tokens=3, logprobs=0))
    assert zero.logprobs is not None and all(e.top == () for e in zero.logprobs)


@pytest.mark.parametrize("value", [-1, 21, True, 2.0])
def test_sampling_params_bound_logprobs(value: Any) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(logprobs=value)
    assert info.value.param == "logprobs"


def test_token_bytes_are_exact_where_the_text_is_a_piece_of_a_character(tokenizer: Any) -> None:
    text = TokenText(tokenizer)
    ids = tokenizer.encode("🙂 café", add_special_tokens=False)
    pieces = [text(i) for i in ids]
    assert any("\ufffd" in token for token, _ in pieces)  # the emoji spans tokens: no token decodes alone
    assert b"".join(bytes(raw) for _, raw in pieces) == "🙂 café".encode()


def test_the_two_openai_shapes(tokenizer: Any) -> None:
    hello, world = tokenizer.encode("Hello world", add_special_tokens=False)
    entries = (
        TokenLogprob(hello, -0.5, ((hello, -0.5), (world, -1.5))),
        TokenLogprob(world, float("-inf"), ((hello, -0.1),)),
    )
    text = TokenText(tokenizer)
    chat = chat_logprobs(entries, text)
    assert chat["content"][0] == {
        "token": "Hello",
        "logprob": -0.5,
        "bytes": list(b"Hello"),
        "top_logprobs": [
            {"token": "Hello", "logprob": -0.5, "bytes": list(b"Hello")},
            {"token": " world", "logprob": -1.5, "bytes": list(b" world")},
        ],
    }
    assert chat["content"][1]["logprob"] == -9999.0  # JSON has no -inf
    legacy = completion_logprobs(entries, text, offset=3)
    assert legacy == {
        "tokens": ["Hello", " world"],
        "token_logprobs": [-0.5, -9999.0],
        "top_logprobs": [{"Hello": -0.5, " world": -1.5}, {"Hello": -0.1, " world": -9999.0}],
        "text_offset": [3, 8],
    }


def test_the_http_backend_refuses_logprobs_before_sending(tokenizer: Any) -> None:
    import asyncio

    from specprefill_sdk.backends.openai import OpenAIBackend

    # Nothing listens on port 1: a request that went out would fail as unreachable, not as refused.
    backend = OpenAIBackend("http://127.0.0.1:1/v1", model="m", tokenizer=tokenizer, mode="text")
    prompt = CompressedPrompt.dense(build_prompt(tokenizer, "Hello"))
    params = SamplingParams(max_tokens=2, logprobs=1)
    calls = [
        lambda: backend.generate(prompt, params),
        lambda: next(iter(backend.stream(prompt, params))),
        lambda: asyncio.run(backend.agenerate(prompt, params)),
    ]
    for call in calls:
        with pytest.raises(InvalidRequestError) as info:
            call()
        assert info.value.param == "logprobs" and info.value.code == "unsupported_parameter"
    backend.close()


def test_vllm_logprobs_become_token_logprob_entries() -> None:
    from types import SimpleNamespace

    from specprefill_sdk.backends.vllm.backend import _logprobs

    def lp(value: float, rank: int) -> SimpleNamespace:  # vLLM's Logprob(logprob, rank, decoded_token)
        return SimpleNamespace(logprob=value, rank=rank, decoded_token=None)

    # vLLM gives the `top` most likely tokens of each step and the sampled one, whatever its rank.
    out = SimpleNamespace(
        token_ids=[7, 9],
        logprobs=[{5: lp(-0.2, 1), 7: lp(-2.5, 3), 6: lp(-1.9, 2)}, {9: lp(-0.1, 1), 4: lp(-3.0, 2)}],
    )
    first, second = _logprobs(out, 2)
    assert first == TokenLogprob(7, -2.5, ((5, -0.2), (6, -1.9)))
    assert second == TokenLogprob(9, -0.1, ((9, -0.1), (4, -3.0)))
    assert [e.top for e in _logprobs(out, 0)] == [(), ()]
