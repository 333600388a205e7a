"""Tiny randomly initialised models with SmolLM2's vocabulary (49152), for tests of other architectures."""

from __future__ import annotations

import torch

from specprefill_sdk.models import LoadedModel

_COMMON = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    attn_implementation="sdpa",
)


def tiny_model(kind: str, tokenizer, *, random_biases: bool = False) -> LoadedModel:
    """A float32 model on CPU, seeded: ``qwen2`` (biased q/k/v), ``qwen3`` (normalised queries and keys),
    ``gemma3`` (windowed layers next to global ones) or ``gemma3-sliding`` (every layer windowed).

    ``random_biases``: draw the 1-D parameters (biases, norm weights) instead of their zeros and ones.
    """
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(0)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=3, **_COMMON))
    elif kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=3, **_COMMON))
    elif kind in ("gemma3", "gemma3-sliding"):
        if kind == "gemma3":
            layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
        else:
            layer_types = ["sliding_attention"] * 3
        config = Gemma3TextConfig(
            num_hidden_layers=len(layer_types),
            sliding_window=16,
            query_pre_attn_scalar=24,
            layer_types=layer_types,
            **_COMMON,
        )
        model = Gemma3ForCausalLM(config)
    else:
        raise ValueError(kind)
    if random_biases:
        for param in model.parameters():
            if param.dim() == 1:
                param.data.normal_(0.0, 0.5)
    return LoadedModel(
        name=f"tiny-{kind}",
        model=model.eval(),
        tokenizer=tokenizer,
        device=torch.device("cpu"),
        dtype=torch.float32,
        source="random",
    )
