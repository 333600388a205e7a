"""The settings every framework component shares: the pipeline it builds, and the check of the names given.

The LangChain, LlamaIndex and litellm components (chat models, LLMs, compressors, postprocessors,
middleware, callbacks) all take the same fields, with the same names and meaning:

- ``pipeline``: a ready `Pipeline`; or the models to load: ``draft``, ``device``, ``dtype`` (each
  component names its target ``model`` the way its framework does: ``model=`` everywhere);
- ``policy``: a preset name or a ``.toml`` path;
- every policy override as a field of its own (``keep_rate``, ``token_budget``, ``chunk_size``,
  ``dense_below_tokens``, ``look_ahead``, ``sink``, ...; ``protect_roles`` is the override
  ``roles``, because ``roles`` of the text-mode components says which messages to compress), and
  ``policy_overrides``, a mapping of the same overrides.

A name that is none of a component's fields is refused, naming the closest one
(``keep_rates`` -> ``keep_rate``), and so is a model setting that a given ``pipeline`` makes unused.
Values are checked at construction (`PolicyError`), before any model loads.

Example::

    class MyCompressor(PipelineFields, SomeFrameworkBase):
        model: str = "smollm2-135m"

    MyCompressor(policy="paper", keep_rate=0.3).get_pipeline().selector
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, SecretStr

from .errors import InvalidRequestError
from .pipeline import Pipeline
from .policies import DEFAULT_POLICY, OVERRIDE_KEYS, RENAMED, Policy, build_pipeline, load_policy, resolve_pipeline
from .types import Aggregation

__all__ = [
    "MODEL_FIELDS",
    "OVERRIDE_FIELDS",
    "PipelineFields",
    "PipelineSettings",
    "RemoteFields",
    "check_names",
    "closest_name",
]

#: Component field -> policy override key. Only ``roles`` is renamed: text-mode components use
#: ``roles`` for the messages they compress.
OVERRIDE_FIELDS: dict[str, str] = {("protect_roles" if k == "roles" else k): k for k in OVERRIDE_KEYS}

#: Fields that say which models to load: unused (and refused) when a ready ``pipeline`` is given.
MODEL_FIELDS: tuple[str, ...] = (
    "model",
    "model_name",
    "draft",
    "device",
    "dtype",
    "base_url",
    "api_key",
    "backend_mode",
)


#: Names a caller may reach for, and the field that carries them.
_ALIASES: dict[str, str] = {
    **{key: field for field, key in OVERRIDE_FIELDS.items() if field != key},
    **RENAMED,
}


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The known name most like ``name`` (a typo's intended field), or None when none is close."""
    found = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.6)
    return found[0] if found else None


def check_names(given: Iterable[str], known: Collection[str], component: str, *, listed: Iterable[str] = ()) -> None:
    """Refuse names outside ``known``; the message names the closest known one, else lists ``listed``.

    Raises:
        InvalidRequestError: the first unknown name, e.g. ``ChatSpecPrefill has no field 'keep_rates';
            did you mean 'keep_rate'?``
    """
    listed = list(listed)
    for name in given:
        if name in known:
            continue
        # A SpecPrefill field is likelier meant than a framework's own one (``roles`` -> ``protect_roles``).
        near = _ALIASES.get(name) or closest_name(name, listed) or closest_name(name, known)
        if near is not None and near not in known:
            near = None
        hint = f"; did you mean {near!r}?" if near else f"; its fields include {', '.join(listed or sorted(known))}"
        raise InvalidRequestError(f"{component} has no field {name!r}{hint}", param=name)


class PipelineFields(BaseModel):
    """The shared fields of a framework component (a pydantic mixin) and the pipeline they describe.

    A component declares its target ``model`` field itself (named as its framework names it) and
    returns it from `target_model`; generating components add their remote settings in
    `remote_settings`.
    """

    pipeline: Any = Field(default=None, exclude=True)
    """A ready `specprefill_sdk.Pipeline`; the policy fields below still apply to it when given."""
    draft: str | None = None
    """The draft model spec; default: the target itself, sharing its weights."""
    device: str = "auto"
    """Where models given by name are loaded (``auto``, ``cpu``, ``cuda``, ``cuda:1``)."""
    dtype: str = "auto"
    """How models given by name are loaded (``auto``, ``bfloat16``, ``float16``, ``float32``)."""
    policy: str = DEFAULT_POLICY
    """The policy preset (``specprefill policies`` lists them) or a ``.toml`` path."""
    policy_overrides: dict[str, Any] = Field(default_factory=dict)
    """Policy overrides as a mapping, e.g. ``{"keep_rate": 0.2}`` (the same names as the fields below)."""
    keep_rate: float | None = None
    """Keep this share of the tokens (switches the policy's selector to a keep rate)."""
    token_budget: int | None = None
    """Keep this many tokens (switches the policy's selector to a budget)."""
    chunk_size: int | None = None
    """Select whole chunks of this many tokens."""
    dense_below_tokens: int | None = None
    """Prompts shorter than this are prefilled whole, without the draft."""
    coverage: float | None = None
    """``adaptive`` selector: keep the fewest tokens holding this share of the score mass."""
    min_rate: float | None = None
    """``adaptive`` selector: keep at least this share."""
    max_rate: float | None = None
    """``adaptive`` selector: keep at most this share."""
    min_tokens: int | None = None
    """``adaptive`` selector: keep at least this many tokens (below ``max_rate``)."""
    look_ahead: int | None = None
    """Draft attention: the number of query tokens (the last prompt token and greedy look-ahead)."""
    pool_kernel: int | None = None
    """Draft attention: width of the average pool over each attention row."""
    layers: int | None = None
    """Draft attention: score with the first N layers only (needs ``look_ahead=1``)."""
    layer_share: float | None = None
    """Draft attention: score with the first ``round(layer_share x depth)`` layers (needs ``look_ahead=1``)."""
    aggregation: Aggregation | None = None
    """Draft attention: how attention rows are reduced over layers and heads (``max``, ``mean``,
    ``content-mean``, ``last-layer``)."""
    sink: int | None = None
    """Always keep the first N tokens."""
    tail: bool | int | None = None
    """Always keep the generation prompt (True) or the last N tokens."""
    protect_roles: list[str] | None = None
    """Always keep the content of messages with these roles (the policy override ``roles``)."""
    last_user_turn: bool | None = None
    """Always keep the last user message whole."""
    special_tokens: bool | None = None
    """Always keep special tokens and chat-template glue."""

    _resolved: Pipeline | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        cls = type(self)
        cls._check_fields(data, cls.__name__, cls.own_field_names())
        super().__init__(**data)
        self.policy_settings()  # bad values fail here, before any model loads

    @classmethod
    def _check_fields(cls, data: Mapping[str, Any], name: str, own: Iterable[str]) -> None:
        known = set(cls.model_fields)
        known.update(f.alias for f in cls.model_fields.values() if f.alias)
        known.update(own)
        check_names(data, known, name, listed=[*_shared_names(), *own])
        if data.get("pipeline") is not None:
            unused = [k for k in data if k in MODEL_FIELDS and not cls._names_pipeline(k)]
            if unused:
                raise InvalidRequestError(
                    f"{name}: {unused[0]} has no effect with pipeline= (its models are already loaded); "
                    "give one or the other",
                    param=unused[0],
                )
            if not isinstance(data["pipeline"], Pipeline):
                raise InvalidRequestError(
                    f"pipeline must be a specprefill_sdk.Pipeline, got {type(data['pipeline']).__name__}",
                    param="pipeline",
                )

    # ------------------------------------------------------------------ what a component provides
    @classmethod
    def own_field_names(cls) -> list[str]:
        """The component's own fields, for error messages (its framework's fields are left out)."""
        return []

    @classmethod
    def _names_pipeline(cls, field: str) -> bool:
        """True for a model field that only names a given pipeline (a chat model's ``model``)."""
        return False

    def target_model(self) -> str:
        """The target model spec (or the remote server's model id)."""
        return str(getattr(self, "model", "smollm2-135m"))

    def remote_settings(self) -> dict[str, Any]:
        """``base_url``, ``api_key`` and ``mode`` of a remote target (generating components only)."""
        return {}

    # ------------------------------------------------------------------ the pipeline
    def overrides(self) -> dict[str, Any]:
        """The policy overrides these fields ask for (field values and ``policy_overrides`` together).

        Raises:
            InvalidRequestError: an override given both as a field and in ``policy_overrides``.
        """
        out = {key: getattr(self, f) for f, key in OVERRIDE_FIELDS.items() if getattr(self, f) is not None}
        for key, value in self.policy_overrides.items():
            field = next((f for f, k in OVERRIDE_FIELDS.items() if k == key), key)
            if key in out:
                raise InvalidRequestError(
                    f"{key} is given twice: as {field}= and in policy_overrides; give it once", param=field
                )
            out[key] = value
        if isinstance(out.get("roles"), list):
            out["roles"] = tuple(out["roles"])
        return out

    def policy_settings(self) -> Policy:
        """The policy with the overrides applied.

        Raises:
            PolicyError: an unknown policy, an unknown override key or a bad value.
        """
        return load_policy(self.policy).with_overrides(**self.overrides())

    def get_pipeline(self) -> Pipeline:
        """The pipeline this component runs (built on first use; models load once per process)."""
        if self._resolved is None:
            self._resolved = self._build()
        return self._resolved

    def _build(self) -> Pipeline:
        overrides = self.overrides()
        given: Pipeline | None = self.pipeline
        if given is not None:
            if "policy" not in self.model_fields_set and not overrides:
                return given
            # The given pipeline's models with this policy's selector (and scorer knobs, on the same draft).
            return build_pipeline(self.policy_settings(), given.scorer, given.backend)
        return resolve_pipeline(
            None,
            policy=self.policy,
            model=self.target_model(),
            draft=self.draft,
            device=self.device,
            dtype=self.dtype,
            overrides=overrides,
            **self.remote_settings(),
        )


class RemoteFields(PipelineFields):
    """The shared fields plus a remote target: the fields of the generating components (chat models, LLMs)."""

    base_url: str | None = None
    """An OpenAI-compatible endpoint (``http://host:port/v1``) that serves the target; the draft runs here."""
    api_key: SecretStr | None = None
    """The key for ``base_url``."""
    backend_mode: Literal["auto", "positions", "text"] = "auto"
    """How a remote target receives the compressed prompt (exact positions, or text)."""

    def remote_settings(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "api_key": self.api_key.get_secret_value() if self.api_key else None,
            "mode": self.backend_mode,
        }


def _shared_names() -> list[str]:
    return [n for n in PipelineFields.model_fields if n != "pipeline"] + ["model", "pipeline"]


class PipelineSettings(PipelineFields):
    """The shared fields as a value of their own, for components that are not pydantic models.

    Example::

        settings = PipelineSettings(component="SpecPrefillMiddleware", own=("roles", "gap"), keep_rate=0.3)
        settings.get_pipeline()
    """

    model: str = "smollm2-135m"
    """The model whose tokenizer and draft score the text."""

    def __init__(self, *, component: str = "PipelineSettings", own: Iterable[str] = (), **data: Any) -> None:
        """Validate ``data`` for ``component``; ``own`` are the component's other argument names
        (an unknown name is refused naming the closest of these and the shared fields).

        Raises:
            InvalidRequestError: an unknown or unused field.
            PolicyError: a bad policy or override value.
        """
        type(self)._check_fields(data, component, list(own))
        BaseModel.__init__(self, **data)
        self.policy_settings()
