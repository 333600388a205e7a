"""The fast forward passes that the draft scorer and the transformers backend share.

- `lean`: a Llama-style model's layers as plain functions of its weights (`LeanModel`), optionally
  compiled and with packed projection weights;
- `norms`: Llama-style RMSNorm modules run as torch's fused ``rms_norm`` inside the SDK's passes;
- `attention`: the SDPA kernel order of a pass and the names of the hooked attention implementations;
- `settings`: `ExecutionSettings`, how a scorer or a backend runs (kernels, compilation, graphs).

This package knows models and tensors only: it never imports a scorer or a backend.
"""

from __future__ import annotations

from .settings import ExecutionSettings

__all__ = ["ExecutionSettings"]
