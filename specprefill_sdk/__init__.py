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

# Each public name once, under the module that defines it (the TYPE_CHECKING imports below repeat
# them for static type checkers; tests/test_exports.py checks that both agree).
__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "types": (
            "Message",
            "Prompt",
            "TokenScores",
            "Selection",
            "CompressedPrompt",
            "SamplingParams",
            "Usage",
            "Timings",
            "Completion",
            "CompletionChunk",
            "TokenLogprob",
            "ToolCall",
        ),
        "errors": (
            "SpecPrefillError",
            "InvalidRequestError",
            "ContextTooLongError",
            "PolicyError",
            "ModelLoadError",
            "NotFoundError",
            "BackendUnavailableError",
        ),
        "interfaces": ("Scorer", "Selector", "Backend", "BackendCapabilities"),
        "pipeline": ("Pipeline", "Compression"),
        "prompt": ("build_prompt",),
        "models": ("load_model", "LoadedModel", "BUNDLED_MODELS", "DEFAULT_MODEL"),
        "scoring": (
            "DraftAttentionScorer",
            "UniformScorer",
            "RandomScorer",
            "RecencyScorer",
            "HeadTailScorer",
            "SelfInformationScorer",
        ),
        "selection": ("KeepRate", "TokenBudget", "Chunked", "StructuredChunks", "Adaptive", "Protect", "DenseBelow"),
        "backends": ("TransformersBackend", "OpenAIBackend", "VLLMBackend"),
        "runtime": ("ExecutionSettings",),  # how the scorer's and the backend's passes run
        "policies": ("Policy", "load_policy", "list_policies", "load_pipeline"),
        "conversation": ("Conversation",),
    },
    eager=("__version__",),
)


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
    from .selection import Adaptive, Chunked, DenseBelow, KeepRate, Protect, StructuredChunks, TokenBudget
    from .types import (
        Completion,
        CompletionChunk,
        CompressedPrompt,
        Message,
        Prompt,
        SamplingParams,
        Selection,
        Timings,
        TokenLogprob,
        TokenScores,
        ToolCall,
        Usage,
    )
