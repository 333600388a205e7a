"""A vLLM worker extension: registers the plugin inside every worker and reports its state.

`VLLMBackend` passes ``worker_extension_cls="specprefill_sdk.backends.vllm.worker.SpecPrefillWorkerExtension"``
to ``vllm.LLM``. vLLM imports this module in each worker process before the model is built, so the
model classes are registered there even when the package's entry point is not installed (a source
checkout) and worker processes are spawned rather than forked.
"""

from __future__ import annotations

from typing import Any

from .plugin import register

__all__ = ["SpecPrefillWorkerExtension"]

register()


class SpecPrefillWorkerExtension:
    """Mixed into vLLM's worker class; adds `specprefill_status` for ``collective_rpc``."""

    def specprefill_status(self) -> dict[str, Any]:
        """What this worker runs: runner, model state and model classes, and its ranks."""
        runner = getattr(self, "model_runner", None)
        state = getattr(runner, "model_state", None)
        model = getattr(runner, "model", None)
        status: dict[str, Any] = {
            "rank": getattr(self, "rank", None),
            "runner": f"{type(runner).__module__}.{type(runner).__qualname__}" if runner is not None else None,
            "state": type(state).__name__ if state is not None else None,
            "model": type(model).__name__ if model is not None else None,
        }
        try:
            from vllm.distributed import parallel_state

            status["tp_rank"] = parallel_state.get_tensor_model_parallel_rank()
            status["tp_size"] = parallel_state.get_tensor_model_parallel_world_size()
        except Exception:  # not initialised (a unit test) or another layout of vLLM
            status["tp_rank"], status["tp_size"] = None, None
        describe = getattr(state, "describe", None)
        if callable(describe):
            status.update(describe())
        return status
