"""`LeanModel`: the scorer's and the backend's passes computed from a Llama-style model's weights."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model

from specprefill_sdk._lean import LeanModel
from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.eval.corpora import haystack
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.scoring import DraftAttentionScorer
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
    compiled = DraftAttentionScorer(smollm, look_ahead=4, compile=True)
    assert "compile=True has no effect on cpu" in caplog.text
    assert compiled.compile and compiled._lean is not None and not compiled._lean.compiled
    plain = DraftAttentionScorer(smollm, look_ahead=4)
    torch.testing.assert_close(compiled.score(prompt).values, plain.score(prompt).values, rtol=0, atol=0)
    assert compiled.with_options(look_ahead=2).compile
    caplog.clear()
    backend = TransformersBackend(smollm, compile=True)
    assert backend._lean is not None and not backend._lean.compiled
    assert "the backend's passes run uncompiled" in caplog.text


@pytest.mark.parametrize("kind", ["smollm", "qwen2"])
def test_lean_backend_prefill_equals_the_modules_then_decodes_the_same(smollm, tokenizer, prompt, kind) -> None:
    loaded = smollm if kind == "smollm" else _tiny("qwen2", tokenizer)
    lean, modules = TransformersBackend(loaded), TransformersBackend(loaded, lean=False)
    assert lean._lean is not None and modules._lean is None
    keep = tuple(sorted({*range(0, prompt.n, 3), prompt.n - 1}))
    compressed = CompressedPrompt.from_selection(prompt, Selection(keep, prompt.n, (False,) * len(keep)))
    a, b = lean.prefill(compressed), modules.prefill(compressed)
    # The last layer runs its output part for the last row only: in float32 (the tiny model) a product
    # of one row may round differently from the same row inside a larger product.
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0 if kind == "smollm" else 1e-6)
    for layer_a, layer_b in zip(a.cache.layers, b.cache.layers, strict=True):
        torch.testing.assert_close(layer_a.keys, layer_b.keys, rtol=0, atol=0)
        torch.testing.assert_close(layer_a.values, layer_b.values, rtol=0, atol=0)
    params = SamplingParams(max_tokens=8)
    assert lean.generate(compressed, params).token_ids == modules.generate(compressed, params).token_ids
