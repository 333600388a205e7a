"""`ExecutionSettings`: how the draft scorer and the transformers backend run their forward passes.

What a scorer computes is set by its own arguments (look-ahead, pool, layers); how its passes run
(kernels, compilation, CUDA graphs, batching) is this one object, shared with the backend::

    execution = ExecutionSettings(compile=False)   # None (the default): compiled on CUDA, not elsewhere
    backend = TransformersBackend("smollm2-135m", execution=execution)
    scorer = DraftAttentionScorer(backend.loaded, look_ahead=8, execution=execution)

None of these settings changes what is computed beyond the last bits of floating-point rounding
(see docs/scoring.md and docs/benchmarks.md for what each one buys).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, fields
from typing import Any

from ..errors import InvalidRequestError
from ..validation import check_int
from .attention import DEFAULT_ATTENTION_BACKENDS, check_attention_backends

__all__ = ["COMPILE_ENV", "ExecutionSettings", "compile_enabled"]

#: The variable that decides ``compile=None`` (auto): ``0``/``false``/``no``/``off`` turns compiling
#: off in every process that reads it (the server's ``SPECPREFILL_COMPILE`` is the same variable);
#: ``1``/``true``/``yes``/``on`` keeps it on (CUDA only, as always). Unset or empty: auto.
COMPILE_ENV = "SPECPREFILL_COMPILE"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def compile_enabled(compile: bool | None, device: Any, environ: Mapping[str, str] | None = None) -> bool:
    """Whether passes on ``device`` run compiled for a ``compile`` setting (True, False, or None: auto).

    Compiled passes exist on CUDA devices only, so on any other device (``"cpu"``, ``"mps"``) the
    answer is False whatever was asked. On CUDA, True and False are taken as given; None (auto) is
    on unless `COMPILE_ENV` in ``environ`` (default: the process's environment) turns it off.

    Example::

        compile_enabled(None, "cuda:0")  # True
        compile_enabled(None, "cpu")     # False
        compile_enabled(False, "cuda")   # False

    Raises:
        InvalidRequestError: ``compile`` is not True, False or None, or the variable holds something else
            than a switch.
    """
    _check_switch(compile)
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]
    if kind != "cuda" or compile is False:
        return False
    if compile is True:
        return True
    text = (os.environ if environ is None else environ).get(COMPILE_ENV, "").strip().lower()
    if text in _OFF:
        return False
    if text in _ON or not text or text == "auto":
        return True
    raise InvalidRequestError(
        f"{COMPILE_ENV} must be 1/true/yes/on, 0/false/no/off or auto, got {text!r}", param=COMPILE_ENV
    )


def _check_switch(compile: object) -> None:
    if compile is not None and not isinstance(compile, bool):
        raise InvalidRequestError(f"compile must be True, False or None (auto), got {compile!r}", param="compile")


@dataclass(frozen=True)
class ExecutionSettings:
    """How a `DraftAttentionScorer` and a `TransformersBackend` run their passes (frozen, validated).

    Change one with `dataclasses.replace` (validated again). The scorer reads every field; the
    backend reads ``fused_norms``, ``lean`` and ``compile`` (it runs no look-ahead, keeps torch's own
    attention kernel order and batches by prompts, ``TransformersBackend(max_batch_size=...)``).

    Args:
        fused_norms: run the model's Llama-style RMSNorm layers as torch's fused ``rms_norm`` plus
            the weight inside the SDK's own passes (two kernels instead of eight; the same function
            up to float32 summation order, bitwise equal on CPU). Outside those passes, and in other
            threads, the model computes exactly what transformers computes. For the scorer this
            applies to drafts scored over fixed buffers (every layer attends globally).
        lean: for Llama-style models (Llama, Qwen2, Mistral, SmolLM2), run the passes that allow it
            as plain functions of the model's weights instead of through transformers' modules: the
            same operations in the same order (on CPU, the same numbers) with far less Python per
            layer. The scorer's fixed-buffer prefill of an unpadded batch and its look-ahead steps,
            and the backend's prefill into an empty cache, run so; other passes run transformers'
            forward.
        compile: with ``lean`` on a CUDA device, fuse each layer's element-wise work (norms, rotary
            embedding, activation, residuals) with `torch.compile`: the scorer's look-ahead steps
            and long prefills, the backend's long prefills. Each layer's query/key/value and gate/up
            weights are then stored in one buffer per layer, in place (the parameters become views of
            it: same values, no memory added), so that a scorer and a backend sharing a model hold
            one copy. Compiling takes tens of seconds, once per process: `load_pipeline` (and so
            `Pipeline.from_policy`, the CLI and the server) runs `Pipeline.warmup` at load when the
            passes compile, so that no user's first request pays it; a pipeline built by hand does
            so when `Pipeline.warmup` is called (or in its first long prompts). Element-wise chains
            round once instead of after each operation, so results differ in the last bits.
            ``None`` (the default) is auto: on for a CUDA device, off elsewhere, and off when the
            `COMPILE_ENV` variable says ``0`` (`compile_enabled`); ``False`` turns it off. ``True``
            elsewhere than on CUDA changes nothing (logged).
        cuda_graph: on a CUDA device, replay the scorer's look-ahead decode steps as a CUDA graph
            (captured on first use, kept for later prompts that fit; `release` frees it): the steps
            then cost about what their memory traffic costs instead of what launching them costs.
        attention_backends: on a CUDA device, the SDPA kernels the draft's prefill and look-ahead
            steps may use during a scoring call, in order of preference (``"cudnn"``, ``"flash"``,
            ``"efficient"``, ``"math"``; the steps attend with a mask, so one of ``"cudnn"``,
            ``"efficient"`` and ``"math"`` must be among them); ``None`` leaves torch's process-wide
            settings as they are. The default is torch's own order on Hopper GPUs, restored for the
            scoring call because importing vLLM turns cuDNN attention off for the whole process
            (docs/scoring.md). The choice applies process-wide while a call runs.
        attention_bucket: on a CUDA device whose ``attention_backends`` put ``"cudnn"`` first, the
            draft's prefill attention runs on the prompt padded at its end to a multiple of this many
            tokens. A causal query never attends to a later token, so the prompt's results are those
            of the unpadded prompt; cuDNN builds an execution plan for each shape it meets, and the
            padding makes it one plan per bucket instead of one per prompt length (docs/scoring.md).
            1: no padding.
        max_batch_tokens: the scorer's `score_batch` runs prompts of similar length together while
            ``batch size x longest prompt`` stays within this many tokens.

    Raises:
        InvalidRequestError: a switch that is not a bool, an unknown attention kernel, or a
            ``max_batch_tokens`` below 1. A backend given a scorer-only field away from its default
            refuses it (`refuse_unused`) rather than ignore it.
    """

    fused_norms: bool = True
    lean: bool = True
    compile: bool | None = None
    cuda_graph: bool = True
    attention_backends: tuple[str, ...] | None = DEFAULT_ATTENTION_BACKENDS
    attention_bucket: int = 256
    max_batch_tokens: int = 16384

    def __post_init__(self) -> None:
        _check_switch(self.compile)
        for name in ("fused_norms", "lean", "cuda_graph"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise InvalidRequestError(f"{name} must be True or False, got {value!r}", param=name)
        backends: Sequence[str] | None = self.attention_backends
        object.__setattr__(self, "attention_backends", check_attention_backends(backends))
        check_int(self.attention_bucket, "attention_bucket", param="attention_bucket", minimum=1)
        check_int(self.max_batch_tokens, "max_batch_tokens", param="max_batch_tokens", minimum=1)

    def prompt_bucket(self, device: Any) -> int:
        """The draft's prompt-attention bucket on ``device``: `attention_bucket` where cuDNN runs first, else 1."""
        cudnn_first = (self.attention_backends or ())[:1] == ("cudnn",)
        return self.attention_bucket if cudnn_first and getattr(device, "type", None) == "cuda" else 1

    def compiles(self, device: Any) -> bool:
        """Whether passes on ``device`` run compiled under these settings (`compile_enabled` of ``compile``)."""
        return bool(self.lean) and compile_enabled(self.compile, device)

    def refuse_unused(self, used: AbstractSet[str], component: str) -> None:
        """Refuse fields set away from their defaults that ``component`` does not read.

        Raises:
            InvalidRequestError: naming the fields and the component that ignores them.
        """
        default = ExecutionSettings()
        unused = [
            f.name for f in fields(self) if f.name not in used and getattr(self, f.name) != getattr(default, f.name)
        ]
        if unused:
            raise InvalidRequestError(
                f"{component} does not use execution.{', execution.'.join(unused)} (the draft scorer's settings); "
                f"it reads {', '.join(sorted(used))}",
                param="execution",
            )

    @classmethod
    def of(cls, execution: Any) -> ExecutionSettings:
        """``execution`` itself, or the defaults for None.

        Raises:
            InvalidRequestError: anything else.
        """
        if execution is None:
            return cls()
        if not isinstance(execution, cls):
            raise InvalidRequestError(
                f"execution must be an ExecutionSettings or None, got {type(execution).__name__}", param="execution"
            )
        return execution
