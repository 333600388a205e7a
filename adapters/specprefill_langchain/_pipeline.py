"""The pipeline behind a LangChain component: a given one, or one built from a policy and shared."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, cast

from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.interfaces import Backend
from specprefill_sdk.pipeline import Pipeline

__all__ = ["resolve_pipeline"]

# Components are cheap to create and LangChain creates many; the models behind them load once.
_CACHE: dict[tuple[Any, ...], Pipeline] = {}
_LOCK = threading.Lock()


def _frozen(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def resolve_pipeline(
    pipeline: Any,
    *,
    policy: str,
    model: str,
    draft: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    mode: str = "auto",
    device: str = "auto",
    dtype: str = "auto",
    overrides: Mapping[str, Any] | None = None,
) -> Pipeline:
    """``pipeline`` when given, else the pipeline of ``policy`` over ``model`` (built once per setting).

    With ``base_url`` the target is a remote OpenAI-compatible server (`OpenAIBackend`, whose
    tokenizer is ``model``'s); the draft model runs here.

    Raises:
        InvalidRequestError: ``pipeline`` is not a `Pipeline`.
        PolicyError, ModelLoadError: from `specprefill_sdk.policies.load_pipeline`.
    """
    if pipeline is not None:
        if not isinstance(pipeline, Pipeline):
            raise InvalidRequestError(f"pipeline must be a specprefill_sdk.Pipeline, got {type(pipeline).__name__}")
        return pipeline
    items = tuple(sorted((k, _frozen(v)) for k, v in (overrides or {}).items()))
    key = (policy, model, draft, base_url, api_key, mode, device, dtype, items)
    with _LOCK:
        found = _CACHE.get(key)
        if found is None:
            from specprefill_sdk.policies import load_pipeline

            backend: Backend | None = None
            if base_url:
                from specprefill_sdk.backends.openai import OpenAIBackend

                remote = OpenAIBackend(base_url, model=model, tokenizer=model, mode=mode, api_key=api_key)  # type: ignore[arg-type]
                backend = cast(Backend, remote)
            found = load_pipeline(
                policy, model=model, draft=draft, device=device, dtype=dtype, backend=backend, **dict(items)
            )
            _CACHE[key] = found
        return found
