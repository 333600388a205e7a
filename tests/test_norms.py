"""Fused RMSNorm in scoring and backend passes: which norms convert, when the fused path runs, what it computes."""

from __future__ import annotations

import copy
import pickle
import threading

import pytest
import torch

from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.runtime import ExecutionSettings
from specprefill_sdk.runtime.norms import fused_norms, install_fused_norms
from specprefill_sdk.scoring import DraftAttentionScorer


class CountingRMSNorm(torch.nn.Module):
    """transformers' Llama formula, counting how often it runs."""

    calls = 0

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(size) + 0.5)
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        CountingRMSNorm.calls += 1
        dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(dtype)


class OffsetRMSNorm(CountingRMSNorm):
    """Gemma's formula: ``1 + weight``; it must keep its own forward."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (x * (1.0 + self.weight.float())).to(hidden_states.dtype)


def test_the_fused_path_runs_only_inside_the_context_of_this_thread() -> None:
    model = torch.nn.Sequential(CountingRMSNorm(32))
    assert install_fused_norms(model) == 1 and install_fused_norms(model) == 0
    norm = model[0]
    x = torch.randn(4, 32) * 3
    CountingRMSNorm.calls = 0
    expected = norm(x)
    assert CountingRMSNorm.calls == 1
    seen: list[int] = []
    with fused_norms():
        torch.testing.assert_close(norm(x), expected, rtol=1e-6, atol=1e-6)
        assert CountingRMSNorm.calls == 1  # the fused path, not the module's own forward

        def other_thread() -> None:
            norm(x)
            seen.append(CountingRMSNorm.calls)

        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert seen == [2]  # another thread runs transformers' forward
    norm(x)
    assert CountingRMSNorm.calls == 3


def test_a_converted_norm_pickles_and_copies_as_its_original_class() -> None:
    model = torch.nn.Sequential(CountingRMSNorm(32))
    install_fused_norms(model)
    x = torch.randn(4, 32)
    expected = model(x)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(clone[0]) is CountingRMSNorm
        torch.testing.assert_close(clone(x), expected, rtol=0, atol=0)
    assert install_fused_norms(clone) == 1


def test_a_norm_with_another_formula_keeps_its_forward() -> None:
    model = torch.nn.Sequential(OffsetRMSNorm(32), CountingRMSNorm(32))
    assert install_fused_norms(model) == 1
    assert type(model[0]) is OffsetRMSNorm and type(model[1]) is not CountingRMSNorm


def test_smollm_norms_are_fused_and_bf16_results_equal_transformers(smollm_bf16) -> None:
    model = copy.deepcopy(smollm_bf16.model)
    layers = model.config.num_hidden_layers
    assert install_fused_norms(model) == 2 * layers + 1
    norm = model.model.layers[3].post_attention_layernorm
    x = torch.randn(2, 9, model.config.hidden_size, dtype=torch.bfloat16) * 5
    plain = norm(x)
    with fused_norms():
        fused = norm(x)
    assert fused.dtype == plain.dtype == torch.bfloat16
    torch.testing.assert_close(fused, plain, rtol=0, atol=0)


@pytest.mark.parametrize("look_ahead", [1, 8])
def test_scores_with_and_without_fused_norms_agree(smollm_fp32, essay, look_ahead) -> None:
    prompt = build_prompt(smollm_fp32.tokenizer, essay[:2500] + "\nWhat is the essay about?")
    fused = DraftAttentionScorer(smollm_fp32, look_ahead=look_ahead).score(prompt)
    plain = DraftAttentionScorer(
        smollm_fp32, look_ahead=look_ahead, execution=ExecutionSettings(fused_norms=False)
    ).score(prompt)
    assert fused.info["look_ahead_token_ids"] == plain.info["look_ahead_token_ids"]
    torch.testing.assert_close(fused.values, plain.values, rtol=1e-4, atol=1e-7)


def test_the_backend_runs_fused_norms_in_its_own_passes_only(smollm_bf16, essay, monkeypatch) -> None:
    import specprefill_sdk.runtime.norms as norms
    from specprefill_sdk.backends import TransformersBackend
    from specprefill_sdk.types import CompressedPrompt, Prompt

    calls = []
    original = norms._fused

    def counting(module, hidden_states):
        calls.append(1)
        return original(module, hidden_states)

    monkeypatch.setattr(norms, "_fused", counting)
    prompt = CompressedPrompt.dense(Prompt.from_token_ids(smollm_bf16.tokenizer(essay[:800])["input_ids"]))
    modules = ExecutionSettings(lean=False)  # the passes run through the model's modules
    fused = TransformersBackend(smollm_bf16, execution=modules).prefill(prompt)
    per_pass = 2 * smollm_bf16.model.config.num_hidden_layers + 1
    assert len(calls) == per_pass
    plain = TransformersBackend(smollm_bf16, execution=ExecutionSettings(fused_norms=False, lean=False)).prefill(prompt)
    assert len(calls) == per_pass  # the other backend's passes ran transformers' norms
    torch.testing.assert_close(fused.logits, plain.logits, rtol=0, atol=0)  # bf16 on CPU: bitwise
    for norm in (True, False):  # the lean prefill computes the same norms without the modules
        lean = TransformersBackend(smollm_bf16, execution=ExecutionSettings(fused_norms=norm)).prefill(prompt)
        torch.testing.assert_close(lean.logits, fused.logits, rtol=0, atol=0)
    with torch.inference_mode():
        smollm_bf16.model(input_ids=torch.tensor([prompt.token_ids[:16]]))
    assert len(calls) == per_pass  # a plain call of the model outside the backend
