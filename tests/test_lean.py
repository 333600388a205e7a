"""`LeanModel`: the scorer's and the backend's passes computed from a Llama-style model's weights."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from tiny_models import tiny_model

from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.eval.corpora import haystack
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.runtime import ExecutionSettings
from specprefill_sdk.runtime.lean import LeanModel, greedy_token, sdpa_one_query
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.scoring.draft_attention.hook import QueryRecorder
from specprefill_sdk.types import CompressedPrompt, SamplingParams, Selection

pytestmark = pytest.mark.slow


def _tiny(kind: str, tokenizer):
    return tiny_model(kind, tokenizer, random_biases=True)  # zero biases would not show a lost bias


@pytest.fixture(scope="module")
def prompt(smollm):
    return build_prompt(smollm.tokenizer, [{"role": "user", "content": haystack(450, start=3) + "\nWhat is it?"}])


def test_build_accepts_llama_style_models_only(smollm, tokenizer) -> None:
    assert LeanModel.build(smollm.model, fused=True, compiled=False) is not None
    assert LeanModel.build(_tiny("qwen2", tokenizer).model, fused=True, compiled=False) is not None
    assert LeanModel.build(_tiny("qwen3", tokenizer).model, fused=True, compiled=False) is None  # q_norm / k_norm
    qwen3 = DraftAttentionScorer(_tiny("qwen3", tokenizer), look_ahead=4)
    assert qwen3._lean is None and qwen3.score(build_prompt(tokenizer, "a b c d e f")).values.shape == (6,)
    assert TransformersBackend(_tiny("qwen3", tokenizer))._lean is None
    eager = _tiny("qwen2", tokenizer)
    eager.model.set_attn_implementation("eager")  # attends causally only through a mask, which lean passes omit
    assert LeanModel.build(eager.model, fused=True, compiled=False) is None
    assert TransformersBackend(eager)._lean is None and DraftAttentionScorer(eager)._lean is None


@pytest.mark.parametrize("look_ahead", [8, 1])
def test_lean_scoring_equals_the_modules_bit_for_bit(smollm, prompt, look_ahead) -> None:
    lean = DraftAttentionScorer(smollm, look_ahead=look_ahead)
    modules = lean.with_options()
    modules._lean = None
    assert lean._lean is not None
    a, b = lean.score(prompt), modules.score(prompt)
    assert a.info["look_ahead_token_ids"] == b.info["look_ahead_token_ids"]
    assert a.info["look_ahead"] == look_ahead
    torch.testing.assert_close(a.values, b.values, rtol=0, atol=0)  # bf16 on CPU: the same operations


def test_lean_first_layers_and_biased_projections(smollm, tokenizer, prompt) -> None:
    early = DraftAttentionScorer(smollm, look_ahead=1, layers=12)
    reference = early.with_options()
    reference._lean = None
    torch.testing.assert_close(early.score(prompt).values, reference.score(prompt).values, rtol=0, atol=0)
    qwen = _tiny("qwen2", tokenizer)
    lean = DraftAttentionScorer(qwen, look_ahead=6)
    modules = lean.with_options()
    modules._lean = None
    a, b = lean.score(prompt), modules.score(prompt)
    assert a.info["look_ahead_token_ids"] == b.info["look_ahead_token_ids"]
    torch.testing.assert_close(a.values, b.values, rtol=0, atol=0)


def test_lean_steps_run_in_the_scorer(smollm, prompt, monkeypatch) -> None:
    calls = {"forward": 0, "step": 0}
    for name in calls:
        original = getattr(LeanModel, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(LeanModel, name, counted)
    DraftAttentionScorer(smollm, look_ahead=5).score(prompt)
    assert calls == {"forward": 1, "step": 4}


def test_release_picks_up_new_parameter_tensors(tokenizer, prompt) -> None:
    loaded = _tiny("qwen2", tokenizer)
    scorer = DraftAttentionScorer(loaded, look_ahead=3)
    before = scorer.score(prompt).values
    layer = loaded.model.model.layers[1].self_attn
    layer.q_proj.weight = torch.nn.Parameter(layer.q_proj.weight.detach() * 3.0)  # a new tensor, not a copy
    scorer.release()
    after = scorer.score(prompt).values
    modules = scorer.with_options()
    modules._lean = None
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, modules.score(prompt).values, rtol=0, atol=0)


def test_compile_is_cuda_only_and_changes_nothing_on_cpu(smollm, prompt, caplog) -> None:
    caplog.set_level("INFO", logger="specprefill_sdk")
    compiled = DraftAttentionScorer(smollm, look_ahead=4, execution=ExecutionSettings(compile=True))
    assert "compile=True has no effect on cpu" in caplog.text
    assert compiled.execution.compile and compiled._lean is not None and not compiled._lean.compiled
    assert not compiled._lean.packed  # packing goes with compiled steps only
    plain = DraftAttentionScorer(smollm, look_ahead=4)
    torch.testing.assert_close(compiled.score(prompt).values, plain.score(prompt).values, rtol=0, atol=0)
    assert compiled.with_options(look_ahead=2).execution.compile
    caplog.clear()
    backend = TransformersBackend(smollm, execution=ExecutionSettings(compile=True))
    assert backend._lean is not None and not backend._lean.compiled and not backend._lean.packed
    assert "the backend's passes run uncompiled" in caplog.text


@pytest.mark.parametrize("kind", ["smollm", "qwen2"])
def test_lean_backend_prefill_equals_the_modules_then_decodes_the_same(smollm, tokenizer, prompt, kind) -> None:
    loaded = smollm if kind == "smollm" else _tiny("qwen2", tokenizer)
    lean, modules = TransformersBackend(loaded), TransformersBackend(loaded, execution=ExecutionSettings(lean=False))
    assert lean._lean is not None and modules._lean is None
    keep = tuple(sorted({*range(0, prompt.n, 3), prompt.n - 1}))
    compressed = CompressedPrompt.from_selection(prompt, Selection(keep, prompt.n, (False,) * len(keep)))
    a, b = lean.prefill(compressed), modules.prefill(compressed)
    # The last layer runs its output part for the last row only: in float32 (the tiny model, and SmolLM2 where
    # "auto" loads fp32) a product of one row may round differently from the same row inside a larger one.
    if loaded.model.dtype == torch.bfloat16:
        torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0)
    else:
        torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-6)
    for layer_a, layer_b in zip(a.cache.layers, b.cache.layers, strict=True):
        torch.testing.assert_close(layer_a.keys, layer_b.keys, rtol=0, atol=0)
        torch.testing.assert_close(layer_a.values, layer_b.values, rtol=0, atol=0)
    params = SamplingParams(max_tokens=8)
    assert lean.generate(compressed, params).token_ids == modules.generate(compressed, params).token_ids


def _packed_copy(loaded):
    """A copy of ``loaded`` whose layers' weights a `LeanModel` packed, with that `LeanModel`."""
    copied = dataclasses.replace(loaded, model=copy.deepcopy(loaded.model))
    lean = LeanModel.build(copied.model, fused=True, compiled=False, packed=True)
    assert lean is not None and lean.packed
    return copied, lean


def _storage_bytes(model) -> int:
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(storages.values())


@pytest.mark.parametrize("kind", ["smollm", "qwen2"])
def test_packing_keeps_the_values_and_the_memory(smollm, tokenizer, prompt, kind) -> None:
    loaded = smollm if kind == "smollm" else _tiny("qwen2", tokenizer)
    ids = torch.tensor([prompt.token_ids])
    with torch.inference_mode():
        before = loaded.model(ids).logits
    values = {name: p.detach().clone() for name, p in loaded.model.named_parameters()}
    packed, lean = _packed_copy(loaded)
    model = packed.model
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    assert lean.split == (
        config.num_attention_heads * head_dim,
        config.num_key_value_heads * head_dim,
        config.num_key_value_heads * head_dim,
    )
    for name, p in model.named_parameters():
        assert torch.equal(p, values[name]), name
    for layer, weights in zip(model.model.layers, lean.layers, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        assert weights.wqkv is not None and weights.w_gate_up is not None
        assert torch.equal(weights.wqkv, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        assert attn.q_proj.weight.data_ptr() == weights.wqkv.data_ptr()  # views of the buffer, not copies
        assert attn.v_proj.weight.data_ptr() == weights.wqkv[-lean.split[2] :].data_ptr()
        assert mlp.up_proj.weight.data_ptr() == weights.w_gate_up[config.intermediate_size :].data_ptr()
        assert (weights.bqkv is None) == (kind == "smollm")
        if weights.bqkv is not None:
            assert attn.k_proj.bias.data_ptr() == weights.bqkv[lean.split[0] :].data_ptr()
    # no parameter is held twice: the storages hold exactly the parameters' bytes
    assert _storage_bytes(model) == sum(p.numel() * p.element_size() for p in model.parameters())
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)  # the modules see the same weights
    again = LeanModel.build(model, fused=True, compiled=False, packed=True)
    assert again is not None and again.layers[0].wqkv.data_ptr() == lean.layers[0].wqkv.data_ptr()  # not repacked
    unpacked = LeanModel.build(model, fused=True, compiled=False)
    assert unpacked is not None and not unpacked.packed and unpacked.layers[0].wqkv is None


def test_packed_weights_follow_loaded_state_and_save(tokenizer, prompt, tmp_path) -> None:
    loaded, lean = _packed_copy(_tiny("qwen2", tokenizer))
    model = loaded.model
    model.load_state_dict({name: t * 1.5 for name, t in model.state_dict().items()})  # copied into the views
    attn = model.model.layers[2].self_attn
    assert torch.equal(lean.layers[2].wqkv, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert torch.equal(lean.layers[2].bqkv, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
    ids = torch.tensor([prompt.token_ids[:64]])
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    with torch.inference_mode():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_models_that_cannot_be_packed_are_left_as_they_are(tokenizer) -> None:
    loaded = _tiny("qwen2", tokenizer)
    loaded.model.model.layers[1].self_attn.v_proj.bias = None  # one layer's is enough
    lean = LeanModel.build(loaded.model, fused=True, compiled=False, packed=True)
    assert lean is not None and not lean.packed and lean.layers[0].wqkv is None
    mixed = _tiny("qwen2", tokenizer)
    mlp = mixed.model.model.layers[0].mlp
    mlp.up_proj.weight = torch.nn.Parameter(mlp.up_proj.weight.detach().double())
    before = mlp.up_proj.weight
    lean = LeanModel.build(mixed.model, fused=True, compiled=False, packed=True)
    assert lean is not None and not lean.packed and mlp.up_proj.weight is before


@pytest.mark.parametrize("kind", ["smollm", "qwen2"])
def test_packed_scoring_and_prefill_match_the_unpacked(smollm, tokenizer, prompt, kind) -> None:
    loaded = smollm if kind == "smollm" else _tiny("qwen2", tokenizer)
    packed, lean = _packed_copy(loaded)
    plain = DraftAttentionScorer(loaded, look_ahead=8)
    scorer = DraftAttentionScorer(packed, look_ahead=8)
    scorer._lean = lean
    a, b = scorer.score(prompt), plain.score(prompt)
    assert a.info["look_ahead_token_ids"] == b.info["look_ahead_token_ids"]
    # the decode steps multiply by the packed buffers: one product may sum in another order than three
    torch.testing.assert_close(a.values, b.values, rtol=1e-3, atol=1e-6 * float(b.values.max()))
    backend, reference = TransformersBackend(packed), TransformersBackend(loaded)
    backend._lean = lean
    keep = tuple(sorted({*range(0, prompt.n, 2), prompt.n - 1}))
    compressed = CompressedPrompt.from_selection(prompt, Selection(keep, prompt.n, (False,) * len(keep)))
    x, y = backend.prefill(compressed), reference.prefill(compressed)
    torch.testing.assert_close(x.logits, y.logits, rtol=0, atol=0)  # prefills multiply by the views, as before
    params = SamplingParams(max_tokens=8)
    assert backend.generate(compressed, params).token_ids == reference.generate(compressed, params).token_ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_one_query_attends_like_the_recorder(dtype) -> None:
    """The compiled step's attention (CUDA only in the scorer) against `QueryRecorder.attend`, here on CPU."""
    gen = torch.Generator().manual_seed(3)
    batch, heads, kv_heads, slots, dim = 2, 8, 2, 4096, 16
    query = torch.randn(batch, heads, 1, dim, generator=gen).to(dtype)
    keys = torch.randn(batch, kv_heads, slots, dim, generator=gen).to(dtype)
    values = torch.randn(batch, kv_heads, slots, dim, generator=gen).to(dtype)
    visible = torch.zeros(batch, slots, dtype=torch.bool)
    visible[0, :3000] = True
    visible[1, 100:2000] = True  # left padding and unwritten slots are masked
    mask = torch.zeros(batch, 1, 1, slots, dtype=dtype).masked_fill(~visible[:, None, None, :], torch.finfo(dtype).min)
    got = sdpa_one_query(query, keys, values, mask, 0.3)
    want = QueryRecorder.attend(query, keys, values, mask, 0.3)
    assert got.shape == want.shape == (batch, 1, heads, dim)
    exact = torch.softmax(
        (query.double() @ keys.double().repeat_interleave(heads // kv_heads, 1).transpose(-1, -2)) * 0.3
        + mask.double().clamp(min=-1e30),
        dim=-1,
    ) @ values.double().repeat_interleave(heads // kv_heads, 1)
    exact = exact.transpose(1, 2)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # outputs up to about 0.3; a lost mask is off by 0.1
    torch.testing.assert_close(got.double(), exact, rtol=0, atol=tolerance)
    torch.testing.assert_close(want.double(), exact, rtol=0, atol=tolerance)


@pytest.mark.parametrize("kind", ["smollm", "qwen2"])
def test_greedy_token_is_the_argmax_of_the_logits(smollm, tokenizer, kind) -> None:
    loaded = smollm if kind == "smollm" else _tiny(kind, tokenizer)
    lean = LeanModel.build(loaded.model, fused=True, compiled=False)
    assert lean is not None
    torch.manual_seed(0)
    h = torch.randn(3, 2, lean.hidden, dtype=loaded.model.dtype)
    norm, head = lean.base.norm, loaded.model.lm_head
    got = greedy_token(h, norm.weight, float(norm.variance_epsilon), head.weight, head.bias, False)
    assert got.shape == (3, 1)
    with torch.inference_mode():  # transformers' own final norm and head
        want = head(norm(h))[:, -1].argmax(-1, keepdim=True)
    assert torch.equal(got, want)


def test_prompt_attention_in_buckets_gives_the_unpadded_scores(smollm, tokenizer, prompt) -> None:
    """Padding the prompt's rows at the end changes nothing before it: causal rows never see later ones.

    In float32 the scores agree to rounding; in bf16 (SmolLM2) the attention's sums run in other
    blocks and the scores differ in the last bits, as between two kernels, and the kept tokens agree.
    """
    assert len(prompt.token_ids) % 64  # the prompt does get padding
    for loaded, look_ahead in ((_tiny("qwen2", tokenizer), 6), (smollm, 8)):
        plain = DraftAttentionScorer(loaded, look_ahead=look_ahead)
        padded = plain.with_options()
        assert plain._lean is not None and padded._lean is not None and padded._lean is not plain._lean
        assert plain._lean.bucket == 1  # CPU: no padding
        padded._lean.bucket = 64
        a, b = plain.score(prompt), padded.score(prompt)
        assert a.info["look_ahead_token_ids"] == b.info["look_ahead_token_ids"]
        if loaded is not smollm:
            torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-7)
        else:
            k = len(prompt.token_ids) // 10
            top_a, top_b = (set(v.topk(k).indices.tolist()) for v in (a.values, b.values))
            assert len(top_a & top_b) >= k - 2


def test_the_prompt_bucket_is_for_cudnn_first_on_cuda_only() -> None:
    run = ExecutionSettings(attention_bucket=256)
    assert run.prompt_bucket(torch.device("cuda")) == 256 and run.prompt_bucket(torch.device("cpu")) == 1
    assert (
        ExecutionSettings(attention_bucket=256, attention_backends=("flash", "efficient")).prompt_bucket(
            torch.device("cuda")
        )
        == 1
    )
    assert ExecutionSettings(attention_bucket=256, attention_backends=None).prompt_bucket(torch.device("cuda")) == 1
    with pytest.raises(InvalidRequestError, match="attention_bucket must be an integer >= 1"):
        ExecutionSettings(attention_bucket=0)
