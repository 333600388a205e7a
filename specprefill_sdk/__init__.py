"""specprefill-sdk: Speculative Prefill middleware.

A small draft model scores every prompt token by its attention; only the important tokens, at their
original position ids, are prefilled by the target model, which then decodes as usual.

Compose ``Scorer -> Selector -> Backend`` in a `Pipeline`::

    from specprefill_sdk import Chunked, DraftAttentionScorer, KeepRate, Pipeline, Protect, TransformersBackend

    backend = TransformersBackend("smollm2-135m")
    pipe = Pipeline(DraftAttentionScorer("smollm2-135m"), Protect(Chunked(KeepRate(0.1), 32)), backend)
    print(pipe.generate("...long text... Question: ...", max_tokens=32).text)

Public names are imported lazily, so ``import specprefill_sdk`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # types
    "Message": "types",
    "Prompt": "types",
    "TokenScores": "types",
    "Selection": "types",
    "CompressedPrompt": "types",
    "SamplingParams": "types",
    "Usage": "types",
    "Timings": "types",
    "Completion": "types",
    "CompletionChunk": "types",
    # errors
    "SpecPrefillError": "errors",
    "InvalidRequestError": "errors",
    "ContextTooLongError": "errors",
    "PolicyError": "errors",
    "ModelLoadError": "errors",
    "NotFoundError": "errors",
    "BackendUnavailableError": "errors",
    # interfaces
    "Scorer": "interfaces",
    "Selector": "interfaces",
    "Backend": "interfaces",
    "BackendCapabilities": "interfaces",
    # pipeline, prompts, models
    "Pipeline": "pipeline",
    "Compression": "pipeline",
    "build_prompt": "prompt",
    "load_model": "models",
    "LoadedModel": "models",
    "BUNDLED_MODELS": "models",
    "DEFAULT_MODEL": "models",
    # scorers
    "DraftAttentionScorer": "scoring",
    "UniformScorer": "scoring",
    "RandomScorer": "scoring",
    "RecencyScorer": "scoring",
    "HeadTailScorer": "scoring",
    "SelfInformationScorer": "scoring",
    # selectors
    "KeepRate": "selection",
    "TokenBudget": "selection",
    "Chunked": "selection",
    "Adaptive": "selection",
    "Protect": "selection",
    "DenseBelow": "selection",
    # backends
    "TransformersBackend": "backends",
    "OpenAIBackend": "backends",
    "VLLMBackend": "backends",
    # how the scorer's and the backend's passes run
    "ExecutionSettings": "runtime",
    # policies, conversations
    "Policy": "policies",
    "load_policy": "policies",
    "list_policies": "policies",
    "load_pipeline": "policies",
    "Conversation": "conversation",
}

__all__ = [
    "BUNDLED_MODELS",
    "DEFAULT_MODEL",
    "Adaptive",
    "Backend",
    "BackendCapabilities",
    "BackendUnavailableError",
    "Chunked",
    "Completion",
    "CompletionChunk",
    "CompressedPrompt",
    "Compression",
    "ContextTooLongError",
    "Conversation",
    "DenseBelow",
    "DraftAttentionScorer",
    "ExecutionSettings",
    "HeadTailScorer",
    "InvalidRequestError",
    "KeepRate",
    "LoadedModel",
    "Message",
    "ModelLoadError",
    "NotFoundError",
    "OpenAIBackend",
    "Pipeline",
    "Policy",
    "PolicyError",
    "Prompt",
    "Protect",
    "RandomScorer",
    "RecencyScorer",
    "SamplingParams",
    "Scorer",
    "Selection",
    "Selector",
    "SelfInformationScorer",
    "SpecPrefillError",
    "Timings",
    "TokenBudget",
    "TokenScores",
    "TransformersBackend",
    "UniformScorer",
    "Usage",
    "VLLMBackend",
    "__version__",
    "build_prompt",
    "list_policies",
    "load_model",
    "load_pipeline",
    "load_policy",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


if TYPE_CHECKING:
    from .backends import OpenAIBackend, TransformersBackend, VLLMBackend
    from .conversation import Conversation
    from .errors import (
        BackendUnavailableError,
        ContextTooLongError,
        InvalidRequestError,
        ModelLoadError,
        NotFoundError,
        PolicyError,
        SpecPrefillError,
    )
    from .interfaces import Backend, BackendCapabilities, Scorer, Selector
    from .models import BUNDLED_MODELS, DEFAULT_MODEL, LoadedModel, load_model
    from .pipeline import Compression, Pipeline
    from .policies import Policy, list_policies, load_pipeline, load_policy
    from .prompt import build_prompt
    from .runtime import ExecutionSettings
    from .scoring import (
        DraftAttentionScorer,
        HeadTailScorer,
        RandomScorer,
        RecencyScorer,
        SelfInformationScorer,
        UniformScorer,
    )
    from .selection import Adaptive, Chunked, DenseBelow, KeepRate, Protect, TokenBudget
    from .types import (
        Completion,
        CompletionChunk,
        CompressedPrompt,
        Message,
        Prompt,
        SamplingParams,
        Selection,
        Timings,
        TokenScores,
        Usage,
    )
