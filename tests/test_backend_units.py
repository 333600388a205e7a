"""Backend building blocks: token sampling, incremental detokenization, stop strings, other architectures."""

from __future__ import annotations

import pytest
import torch

from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.backends._detok import IncrementalDetokenizer, TextAssembler
from specprefill_sdk.backends._sampling import TokenSampler
from specprefill_sdk.models import LoadedModel
from specprefill_sdk.types import CompressedPrompt, Prompt, SamplingParams, Selection


# ----------------------------------------------------------------------------- sampling
def test_greedy_takes_the_argmax() -> None:
    logits = torch.tensor([0.1, 3.0, -2.0, 2.9])
    assert TokenSampler(SamplingParams()).choose(logits) == 1
    assert TokenSampler(SamplingParams()).generator is None


def test_seeded_sampling_repeats_and_seeds_differ() -> None:
    logits = torch.zeros(50)
    params = SamplingParams(temperature=1.0, seed=123)
    first = [TokenSampler(params).choose(logits) for _ in range(3)]
    sampler = TokenSampler(params)
    run = [sampler.choose(logits) for _ in range(40)]
    again = TokenSampler(params)
    assert run == [again.choose(logits) for _ in range(40)]
    assert len(set(first)) == 1  # a fresh sampler with the same seed starts the same way
    other = TokenSampler(SamplingParams(temperature=1.0, seed=124))
    assert run != [other.choose(logits) for _ in range(40)]
    assert len(set(run)) > 10  # uniform logits really are sampled


def test_top_p_keeps_only_the_nucleus() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    narrow = TokenSampler(SamplingParams(temperature=1.0, top_p=0.5, seed=0))
    assert {narrow.choose(logits) for _ in range(200)} == {0}
    wider = TokenSampler(SamplingParams(temperature=1.0, top_p=0.75, seed=0))
    assert {wider.choose(logits) for _ in range(300)} == {0, 1}
    full = TokenSampler(SamplingParams(temperature=1.0, top_p=1.0, seed=0))
    assert {full.choose(logits) for _ in range(600)} == {0, 1, 2, 3}


def test_low_temperature_concentrates() -> None:
    logits = torch.tensor([1.0, 1.5, 0.0])
    cold = TokenSampler(SamplingParams(temperature=0.01, seed=1))
    assert {cold.choose(logits) for _ in range(100)} == {1}


# ----------------------------------------------------------------------------- detokenization
@pytest.mark.slow
def test_incremental_detokenizer_never_splits_characters(tokenizer) -> None:
    text = "Grüße aus Köln — 北京欢迎你 🎉🚀 naïve café, ok."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text) / 4
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.add(i) for i in ids]
    deltas.append(detok.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text
    # Some tokens carry only part of a character: their delta is empty until the character completes.
    assert any(d == "" for d in deltas[:-1])


@pytest.mark.slow
def test_special_tokens_are_skipped(tokenizer) -> None:
    ids = tokenizer("<|im_start|>assistant\nHi there<|im_end|>", add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer)
    text = "".join(detok.add(i) for i in ids) + detok.flush()
    assert text == "assistant\nHi there"


def feed(assembler: TextAssembler, ids: list[int]) -> list[str]:
    deltas = []
    for i in ids:
        deltas.append(assembler.add(i))
        if assembler.stopped:
            break
    deltas.append(assembler.finish())
    return deltas


@pytest.mark.slow
def test_stop_string_text_is_cut_and_its_start_held_back(tokenizer) -> None:
    ids = tokenizer("The answer is 42.\n\nQuestion: why?", add_special_tokens=False)["input_ids"]
    asm = TextAssembler(tokenizer, stop=("\n\nQuestion",))
    deltas = feed(asm, ids)
    assert asm.stopped and asm.text == "The answer is 42."
    assert "".join(deltas) == "The answer is 42."
    assert all("\n" not in d for d in deltas)  # the newlines were held back, then dropped


@pytest.mark.slow
def test_earliest_of_several_stop_strings_wins(tokenizer) -> None:
    ids = tokenizer("alpha beta gamma delta", add_special_tokens=False)["input_ids"]
    asm = TextAssembler(tokenizer, stop=(" delta", " beta"))
    assert "".join(feed(asm, ids)) == "alpha"
    start = TextAssembler(tokenizer, stop=("alpha",))
    assert "".join(feed(start, ids)) == "" and start.stopped


@pytest.mark.slow
def test_held_back_prefix_is_released_when_no_stop_follows(tokenizer) -> None:
    ids = tokenizer("one two thr", add_special_tokens=False)["input_ids"]
    asm = TextAssembler(tokenizer, stop=("three",))
    deltas = feed(asm, ids)
    assert not asm.stopped and "".join(deltas) == "one two thr"
    assert deltas[-1].endswith("thr")  # "thr" may begin "three": it waited for the end


# ----------------------------------------------------------------------------- other architectures
def tiny(kind: str, attn: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=255,
        bos_token_id=1,
        pad_token_id=0,
    )
    if kind == "llama":
        config = LlamaConfig(**common)
    elif kind == "qwen2":
        config = Qwen2Config(**common)
    else:
        config = Gemma3TextConfig(
            **common,
            head_dim=16,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "attn"), [("llama", "eager"), ("qwen2", "sdpa"), ("gemma3", "sdpa"), ("gemma3", "eager")]
)
def test_other_architectures_match_plain_transformers(kind, attn, tokenizer) -> None:
    model = tiny(kind, attn)
    lm = LoadedModel(
        name=f"tiny-{kind}",
        model=model,
        tokenizer=tokenizer,
        device=torch.device("cpu"),
        dtype=torch.float32,
        source="config",
    )
    backend = TransformersBackend(lm)
    ids = [1, *torch.randint(2, 250, (22,), generator=torch.Generator().manual_seed(3)).tolist()]
    dense = CompressedPrompt(tuple(ids), tuple(range(len(ids))), len(ids))
    with torch.no_grad():
        full = model(torch.tensor([ids])).logits[0, -1]
        hf = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
        )
    state = backend.prefill(dense)
    assert torch.allclose(state.logits[0], full, atol=1e-5, rtol=0)
    completion = backend.generate(dense, SamplingParams(max_tokens=8))
    assert list(completion.token_ids) == hf[0, len(ids) :].tolist()[: len(completion.token_ids)]
    # A sparse prompt and a dense one in one padded batch give what they give alone.
    keep = [0, 2, 3, 7, 8, 9, 14, 15, 20, 21, 22]
    sparse = CompressedPrompt.from_selection(
        Prompt.from_token_ids(ids), Selection(tuple(keep), len(ids), (False,) * len(keep))
    )
    params = SamplingParams(max_tokens=6)
    assert [c.token_ids for c in backend.generate_batch([sparse, dense], params)] == [
        backend.generate(sparse, params).token_ids,
        backend.generate(dense, params).token_ids,
    ]


@pytest.mark.parametrize(("temperature", "top_p"), [(1e-300, 1.0), (1e-300, 1e-12), (0.7, 1e-12)])
def test_sampler_extreme_temperature_and_top_p_pick_the_argmax(temperature: float, top_p: float) -> None:
    logits = torch.randn(500, generator=torch.Generator().manual_seed(3))
    sampler = TokenSampler(SamplingParams(temperature=temperature, top_p=top_p, seed=1))
    assert sampler.choose(logits) == int(logits.argmax())
