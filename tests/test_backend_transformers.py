"""TransformersBackend on the real SmolLM2: exact positions, equivalence with plain transformers, decoding."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from specprefill_sdk import ContextTooLongError, InvalidRequestError
from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.runtime import ExecutionSettings
from specprefill_sdk.types import CompressedPrompt, Prompt, SamplingParams, Selection

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backend32(smollm_fp32) -> TransformersBackend:
    return TransformersBackend(smollm_fp32)


@pytest.fixture(scope="module")
def backend16(smollm) -> TransformersBackend:
    return TransformersBackend(smollm)


@pytest.fixture(scope="module")
def question(smollm_fp32) -> Prompt:
    return build_prompt(
        smollm_fp32.tokenizer, [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    )


@pytest.fixture(scope="module")
def long_prompt(smollm_fp32, essay) -> Prompt:
    text = essay[:1400] + "\n\nIn one sentence, what is this text about?"
    return build_prompt(smollm_fp32.tokenizer, [{"role": "user", "content": text}])


def sparse(prompt: Prompt, step: int = 3) -> CompressedPrompt:
    """Every ``step``-th token plus the last 8 (the generation prompt): a non-contiguous selection."""
    keep = sorted(set(range(0, prompt.n, step)) | set(range(prompt.n - 8, prompt.n)))
    sel = Selection(indices=tuple(keep), n=prompt.n, protected=(False,) * len(keep))
    return CompressedPrompt.from_selection(prompt, sel)


def run_logits(backend: TransformersBackend, compressed: CompressedPrompt, steps: int) -> tuple[list[int], list]:
    """Greedy decode by hand, returning tokens and the logits the backend saw at each step."""
    state = backend.prefill(compressed)
    tokens, logits = [], []
    for token in backend.decode(state, SamplingParams(max_tokens=steps)):
        logits.append(state.logits[0].clone())
        tokens.append(token)
    return tokens, logits


# ----------------------------------------------------------------------------- hand-built reference
def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x`` [heads, tokens, dim] by the default RoPE at ``positions``."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = positions.double()[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def reference_forward(lm, ids: list[int], positions: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Eager Llama forward written out by hand: last-token logits and each layer's post-RoPE keys."""
    model = lm.model
    cfg = model.config
    theta = float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"])
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = cfg.hidden_size // heads
    pos = torch.tensor(positions)
    causal = pos[None, :] <= pos[:, None]

    def rms(x: torch.Tensor, norm) -> torch.Tensor:
        return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))

    keys = []
    with torch.no_grad():
        h = model.model.embed_tokens(torch.tensor(ids))
        for layer in model.model.layers:
            att = layer.self_attn
            x = rms(h, layer.input_layernorm)
            q = att.q_proj(x).view(-1, heads, head_dim).transpose(0, 1)
            k = att.k_proj(x).view(-1, kv_heads, head_dim).transpose(0, 1)
            v = att.v_proj(x).view(-1, kv_heads, head_dim).transpose(0, 1)
            q, k = rope(q, pos, theta), rope(k, pos, theta)
            keys.append(k)
            group = heads // kv_heads
            k_full, v_full = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
            scores = q @ k_full.transpose(1, 2) / math.sqrt(head_dim)
            scores = scores.masked_fill(~causal, float("-inf"))
            out = torch.softmax(scores, dim=-1) @ v_full
            h = h + att.o_proj(out.transpose(0, 1).reshape(len(ids), -1))
            x = rms(h, layer.post_attention_layernorm)
            h = h + layer.mlp.down_proj(torch.nn.functional.silu(layer.mlp.gate_proj(x)) * layer.mlp.up_proj(x))
        h = rms(h, model.model.norm)
        return model.lm_head(h[-1]).float(), keys


# ----------------------------------------------------------------------------- keep-all equivalence
def test_keep_all_matches_full_prefill_and_hf_generate(backend32, smollm_fp32, long_prompt) -> None:
    compressed = CompressedPrompt.dense(long_prompt)
    tokens, logits = run_logits(backend32, compressed, 8)
    ids = torch.tensor([long_prompt.token_ids])
    with torch.no_grad():
        out = smollm_fp32.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=8,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=smollm_fp32.tokenizer.pad_token_id,
        )
    hf_tokens = out.sequences[0, ids.shape[1] :].tolist()
    assert tokens == hf_tokens[: len(tokens)]
    for mine, theirs in zip(logits, out.logits, strict=False):
        assert torch.allclose(mine, theirs[0].float(), atol=1e-4, rtol=0), (mine - theirs[0]).abs().max()
    completion = backend32.generate(compressed, SamplingParams(max_tokens=8))
    assert list(completion.token_ids) == hf_tokens
    assert completion.text == smollm_fp32.tokenizer.decode(hf_tokens, skip_special_tokens=True)


def test_keep_all_greedy_text_equals_hf_generate_bf16(backend16, smollm, question) -> None:
    ids = torch.tensor([question.token_ids])
    with torch.no_grad():
        out = smollm.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=24,
            do_sample=False,
            pad_token_id=smollm.tokenizer.pad_token_id,
        )
    hf_tokens = out[0, ids.shape[1] :].tolist()
    completion = backend16.generate(CompressedPrompt.dense(question), SamplingParams(max_tokens=24))
    assert list(completion.token_ids) == hf_tokens
    assert completion.text == smollm.tokenizer.decode(hf_tokens, skip_special_tokens=True)
    assert completion.text.strip() and "<|im_end|>" not in completion.text


# ----------------------------------------------------------------------------- sparse prefill positions
@pytest.mark.parametrize("lean", [True, False])
def test_sparse_prefill_uses_original_positions_then_decodes_from_n(smollm_fp32, long_prompt, lean) -> None:
    backend = TransformersBackend(smollm_fp32, execution=ExecutionSettings(lean=lean))
    assert (backend._lean is not None) == lean
    compressed = sparse(long_prompt)
    assert compressed.kept < long_prompt.n
    positions: list[list[int]] = []
    masks: list[tuple[int, ...] | None] = []

    def rotary(module, args, kwargs):  # every pass, lean or not, asks the rotary embedding for its positions
        positions.append(kwargs["position_ids"][0].tolist())

    def forward(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        masks.append(None if mask is None else tuple(mask.shape))

    base = smollm_fp32.model.model
    handles = [
        base.rotary_emb.register_forward_pre_hook(rotary, with_kwargs=True),
        base.register_forward_pre_hook(forward, with_kwargs=True),
    ]
    try:
        completion = backend.generate(compressed, SamplingParams(max_tokens=5))
    finally:
        for handle in handles:
            handle.remove()
    assert completion.finish_reason == "length" and len(completion.token_ids) == 5
    assert completion.usage.prompt_tokens == long_prompt.n
    assert completion.usage.kept_tokens == compressed.kept
    assert completion.usage.completion_tokens == 5
    assert positions[0] == list(compressed.position_ids)
    n = long_prompt.n
    assert positions[1:] == [[n], [n + 1], [n + 2], [n + 3]]  # not kept, kept + 1, ...
    # One row in position order: the model's own causal mask is the position mask, so none is passed
    # (the lean prefill does not go through the model's forward at all; the decode steps do).
    assert masks == [None] * (4 if lean else 5)


def test_out_of_order_fill_gets_an_explicit_position_mask(backend32, smollm_fp32, long_prompt) -> None:
    compressed = sparse(long_prompt)
    state = backend32.prefill(compressed)
    gap = next(p for p in range(long_prompt.n) if p not in set(compressed.position_ids))
    fuller = CompressedPrompt(
        token_ids=tuple(long_prompt.token_ids[p] for p in sorted({*compressed.position_ids, gap})),
        position_ids=tuple(sorted({*compressed.position_ids, gap})),
        n=long_prompt.n,
    )
    seen: list[tuple[int, ...] | None] = []

    def hook(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        seen.append(None if mask is None else tuple(mask.shape))

    handle = smollm_fp32.model.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        backend32.prefill(fuller, state)  # the gap's slot comes after later positions: slot order != position order
    finally:
        handle.remove()
    assert seen and all(m is not None and len(m) == 4 for m in seen)
    assert state.next_position == long_prompt.n and state.slots == fuller.kept


def test_chunked_unmasked_prefill_equals_reference(smollm_fp32, long_prompt) -> None:
    compressed = sparse(long_prompt)
    backend = TransformersBackend(smollm_fp32, unmasked_chunk=29)  # several passes over a growing cache
    state = backend.prefill(compressed)
    ref_logits, _ = reference_forward(smollm_fp32, list(compressed.token_ids), list(compressed.position_ids))
    assert torch.allclose(state.logits[0], ref_logits, atol=1e-4, rtol=0)


def test_sparse_prefill_equals_hand_built_reference(backend32, smollm_fp32, long_prompt) -> None:
    compressed = sparse(long_prompt)
    state = backend32.prefill(compressed)
    ids, positions = list(compressed.token_ids), list(compressed.position_ids)
    ref_logits, ref_keys = reference_forward(smollm_fp32, ids, positions)
    assert torch.allclose(state.logits[0], ref_logits, atol=1e-4, rtol=0)
    layers = state.cache.layers
    for layer_index in (0, len(layers) // 2, len(layers) - 1):
        assert torch.allclose(layers[layer_index].keys[0], ref_keys[layer_index], atol=1e-4, rtol=0)
    # A contiguous forward at positions 0..kept-1 gives different logits: the positions matter.
    wrong, _ = reference_forward(smollm_fp32, ids, list(range(len(ids))))
    assert (wrong - ref_logits).abs().max() > 1e-2
    # The first decode step runs at position n over the compact cache.
    token = next(backend32.decode(state, SamplingParams(max_tokens=2)))
    step_logits, _ = reference_forward(smollm_fp32, [*ids, token], [*positions, long_prompt.n])
    backend32.feed(state, [token])
    assert torch.allclose(state.logits[0], step_logits, atol=1e-4, rtol=0)


def test_sparse_prefill_equals_manual_hf_forward(backend32, smollm_fp32, long_prompt) -> None:
    compressed = sparse(long_prompt, step=4)
    state = backend32.prefill(compressed)
    ids = torch.tensor([compressed.token_ids])
    pos = torch.tensor([compressed.position_ids])
    kept = compressed.kept
    mask = torch.tril(torch.ones(kept, kept, dtype=torch.bool))[None, None]
    with torch.no_grad():
        out = smollm_fp32.model(input_ids=ids, position_ids=pos, attention_mask=mask)
    assert torch.allclose(state.logits[0], out.logits[0, -1].float(), atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- decoding behaviour
def test_eos_ends_with_stop_and_is_not_in_text(backend16, smollm, question) -> None:
    completion = backend16.generate(CompressedPrompt.dense(question), SamplingParams(max_tokens=64))
    assert completion.finish_reason == "stop"
    assert completion.token_ids[-1] in smollm.eos_token_ids
    assert completion.usage.completion_tokens == len(completion.token_ids)
    assert "Paris" in completion.text and "<|im_end|>" not in completion.text
    assert completion.timings.prefill > 0 and completion.timings.ttft >= completion.timings.prefill
    assert completion.timings.total >= completion.timings.ttft


def test_max_tokens_gives_length(backend16, long_prompt) -> None:
    completion = backend16.generate(CompressedPrompt.dense(long_prompt), SamplingParams(max_tokens=3))
    assert completion.finish_reason == "length"
    assert len(completion.token_ids) == 3 and completion.usage.completion_tokens == 3


def test_stop_string_cuts_text_and_streams_without_it(backend16, long_prompt) -> None:
    compressed = sparse(long_prompt, step=2)
    full = backend16.generate(compressed, SamplingParams(max_tokens=24))
    words = full.text.split()
    assert len(words) >= 4, full.text
    stop = " " + words[2]  # a stop string in the middle of the greedy answer
    at = full.text.index(stop)
    stopped = backend16.generate(compressed, SamplingParams(max_tokens=24, stop=(stop, "\x00never")))
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[:at]
    assert len(stopped.token_ids) < len(full.token_ids)
    chunks = list(backend16.stream(compressed, SamplingParams(max_tokens=24, stop=(stop,))))
    assert "".join(c.text for c in chunks) == stopped.text
    assert all(stop not in c.text for c in chunks)
    assert chunks[-1].finish_reason == "stop" and chunks[-1].completion.text == stopped.text
    assert all(c.finish_reason is None and c.completion is None for c in chunks[:-1])


def test_stream_deltas_join_to_generate_text(backend16, long_prompt) -> None:
    compressed = sparse(long_prompt)
    params = SamplingParams(max_tokens=12)
    completion = backend16.generate(compressed, params)
    chunks = list(backend16.stream(compressed, params))
    assert "".join(c.text for c in chunks) == completion.text
    assert tuple(t for c in chunks for t in c.token_ids) == completion.token_ids
    final = chunks[-1].completion
    assert final is not None and final.usage == completion.usage and final.text == completion.text


def test_seeded_sampling_is_reproducible(backend16, long_prompt) -> None:
    compressed = sparse(long_prompt)
    a = backend16.generate(compressed, SamplingParams(max_tokens=10, temperature=1.2, seed=11))
    b = backend16.generate(compressed, SamplingParams(max_tokens=10, temperature=1.2, seed=11))
    c = backend16.generate(compressed, SamplingParams(max_tokens=10, temperature=1.2, seed=12))
    greedy = backend16.generate(compressed, SamplingParams(max_tokens=10))
    assert a.token_ids == b.token_ids and a.text == b.text
    assert c.token_ids != a.token_ids
    assert greedy.token_ids not in (a.token_ids, c.token_ids)
    narrow = backend16.generate(compressed, SamplingParams(max_tokens=10, temperature=1.2, top_p=1e-6, seed=3))
    assert narrow.token_ids == greedy.token_ids  # a tiny nucleus holds only the most likely token


# ----------------------------------------------------------------------------- batches and async
def test_generate_batch_equals_single_calls(backend16, long_prompt, question) -> None:
    backend = backend16
    prompts = [sparse(long_prompt, 3), CompressedPrompt.dense(question), sparse(long_prompt, 2)]
    params = SamplingParams(max_tokens=10)
    batch = backend.generate_batch(prompts, params)
    singles = [backend.generate(p, params) for p in prompts]
    for b, s in zip(batch, singles, strict=True):
        assert b.token_ids == s.token_ids and b.text == s.text and b.finish_reason == s.finish_reason
        assert b.usage == s.usage
    assert batch[1].finish_reason == "stop"  # a row that ends early leaves the batch; the others go on
    seeded = SamplingParams(max_tokens=6, temperature=0.9, seed=5)
    assert [c.token_ids for c in backend.generate_batch(prompts, seeded)] == [
        backend.generate(p, seeded).token_ids for p in prompts
    ]


def test_batched_prefill_logits_match_single_rows(backend32, long_prompt, question) -> None:
    prompts = [sparse(long_prompt, 3), CompressedPrompt.dense(question)]
    state = backend32._prefill_padded(prompts)
    for row, prompt in enumerate(prompts):
        single = backend32.prefill(prompt)
        assert torch.allclose(state.logits[row], single.logits[0], atol=1e-4, rtol=0)


def test_async_forms(backend16, question) -> None:
    compressed = CompressedPrompt.dense(question)
    params = SamplingParams(max_tokens=12)
    expected = backend16.generate(compressed, params)

    async def main() -> tuple[str, str]:
        completion = await backend16.agenerate(compressed, params)
        text = "".join([chunk.text async for chunk in backend16.astream(compressed, params)])
        return completion.text, text

    got, streamed = asyncio.run(main())
    assert got == expected.text == streamed


# ----------------------------------------------------------------------------- errors
def test_bad_input_raises_typed_errors(backend16) -> None:
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        backend16.generate(CompressedPrompt((1, backend16.vocab_size), (0, 1), 2), SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        backend16.generate(CompressedPrompt((1, -3), (0, 1), 2), SamplingParams(max_tokens=2))
    limit = backend16.max_context
    with pytest.raises(ContextTooLongError):
        backend16.generate(CompressedPrompt((1, 2), (0, limit + 5), limit + 6), SamplingParams(max_tokens=2))
    with pytest.raises(ContextTooLongError):
        backend16.generate(CompressedPrompt((1, 2), (0, limit - 10), limit - 9), SamplingParams(max_tokens=20))
    with pytest.raises(ContextTooLongError):
        backend16.generate_batch(
            [CompressedPrompt((1,), (0,), 1), CompressedPrompt((1, 2), (0, limit), limit + 1)],
            SamplingParams(max_tokens=2),
        )
    with pytest.raises(InvalidRequestError):
        backend16.generate_batch(CompressedPrompt((1,), (0,), 1), SamplingParams())


def test_backend_properties(backend16, smollm) -> None:
    assert backend16.model_name == "smollm2-135m"
    assert backend16.tokenizer is smollm.tokenizer
    assert backend16.max_context == 8192
    assert backend16.capabilities.supports_position_ids and backend16.capabilities.supports_sessions
    with pytest.raises(InvalidRequestError, match="device"):
        TransformersBackend(smollm, device="meta")
    by_name = TransformersBackend("smollm2-135m", device="cpu", dtype="auto")
    assert by_name.loaded is smollm  # loading by name shares the process-wide model
