"""Named policy presets: scorer + selector + protection settings, declared in TOML.

A policy says *how* a prompt is compressed; the model and backend are chosen separately. Presets
live in the top-level ``policies/`` folder of the repository and are shipped inside the wheel as
``specprefill_sdk/_policies``; any ``.toml`` file with the same layout works too.

This module also owns the registries of scorer and selector kinds (`SCORERS`, `SELECTORS`) and
decides how a policy is served by models a process has already loaded (`scorer_for`,
`build_pipeline`): the server asks it per request instead of re-deriving scorers itself.

Example::

    from specprefill_sdk.policies import load_pipeline, load_policy

    policy = load_policy("paper").with_overrides(keep_rate=0.2)
    policy.build_selector().name  # 'DenseBelow(Protect(Chunked(KeepRate(0.2), 32)), 256)'
    pipe = load_pipeline("paper", model="smollm2-135m", keep_rate=0.2)
"""

from __future__ import annotations

import importlib
import importlib.resources
import logging
import os
import sys
import threading
import warnings
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import InvalidRequestError, PolicyError
from .interfaces import LocalBackend
from .types import Aggregation, QueryReduction
from .validation import TEXT_CHUNK_MAX_SIZE, TEXT_CHUNK_MIN_SIZE, check_chunk_bounds, check_known

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from .interfaces import Backend, Scorer, Selector
    from .models import LoadedModel
    from .pipeline import Pipeline
    from .runtime.settings import ExecutionSettings
    from .scoring import DraftAttentionScorer

__all__ = [
    "CHUNKINGS",
    "DEFAULT_DENSE_BELOW_TOKENS",
    "DEFAULT_POLICY",
    "DEPRECATED_PRESETS",
    "MODEL_SCORERS",
    "OVERRIDE_KEYS",
    "RENAMED",
    "SCORERS",
    "SELECTORS",
    "Policy",
    "ProtectSettings",
    "ScorerSettings",
    "SelectorSettings",
    "build_pipeline",
    "list_policies",
    "load_pipeline",
    "load_policy",
    "override_selector",
    "policy_dirs",
    "preset_name",
    "resolve_pipeline",
    "scorer_class",
    "scorer_for",
    "selector_class",
]

logger = logging.getLogger(__name__)

# The same default as `models.DEFAULT_MODEL`, spelled out so that reading policies needs no torch.
_DEFAULT_MODEL = "smollm2-135m"
#: ``dense_below_tokens`` of a policy that names none (the presets among them): shorter prompts are
#: prefilled whole and the draft never runs. Below it, scoring and the kept prefill take longer than
#: prefilling everything and the answer changes the most; docs/benchmarks.md ("Where compression
#: starts to pay") has the measurement. An explicit ``dense_below_tokens = 0`` turns it off.
DEFAULT_DENSE_BELOW_TOKENS = 256
#: The preset used where none is named: `load_pipeline`, ``specprefill run`` and ``serve``, the adapters.
DEFAULT_POLICY = "auto"
#: Earlier preset names, still loaded, and the preset each now loads with the reason it was replaced.
DEPRECATED_PRESETS: dict[str, tuple[str, str]] = {
    "adaptive": (
        "auto",
        "its coverage rule kept fewer tokens than the paper policy on long prompts",
    ),
}
# The earlier names already logged in this process: a server resolves one per request.
_WARNED: set[str] = set()

ScorerKind = Literal["draft-attention", "self-information", "uniform", "random", "recency", "head-tail"]
SelectorKind = Literal["keep-rate", "token-budget", "adaptive"]
Chunking = Literal["fixed", "text"]

#: Scorer kinds and the classes of `specprefill_sdk.scoring` that implement them (see `scorer_class`).
SCORERS: dict[str, str] = {
    "draft-attention": "DraftAttentionScorer",
    "self-information": "SelfInformationScorer",
    "uniform": "UniformScorer",
    "random": "RandomScorer",
    "recency": "RecencyScorer",
    "head-tail": "HeadTailScorer",
}
#: Selector kinds and the classes of `specprefill_sdk.selection` that implement them (see `selector_class`).
SELECTORS: dict[str, str] = {"keep-rate": "KeepRate", "token-budget": "TokenBudget", "adaptive": "Adaptive"}
#: ``[selector] chunking`` values and the chunk selectors of `specprefill_sdk.selection` they build:
#: fixed windows of ``chunk_size``, or chunks cut at the text's sentence, line, paragraph and message breaks.
CHUNKINGS: dict[str, str] = {"fixed": "Chunked", "text": "StructuredChunks"}
#: The scorer kinds that run a draft model (the others load nothing).
MODEL_SCORERS = frozenset({"draft-attention", "self-information"})
assert set(SCORERS) == set(get_args(ScorerKind)) and set(SELECTORS) == set(get_args(SelectorKind))
assert set(CHUNKINGS) == set(get_args(Chunking))


def scorer_class(kind: str) -> type[Any]:
    """The scorer class of ``kind``, e.g. ``scorer_class("draft-attention") is DraftAttentionScorer``.

    Classes are imported on first use, so that reading policies loads no model code.

    Raises:
        PolicyError: an unknown kind (the message lists the valid ones).
    """
    return _registered(SCORERS, kind, "specprefill_sdk.scoring", "scorer")


def selector_class(kind: str) -> type[Any]:
    """The selector class of ``kind``, e.g. ``selector_class("keep-rate") is KeepRate``.

    Raises:
        PolicyError: an unknown kind (the message lists the valid ones).
    """
    return _registered(SELECTORS, kind, "specprefill_sdk.selection", "selector")


def _registered(registry: Mapping[str, str], kind: str, module: str, what: str) -> type[Any]:
    name = registry.get(kind)
    if name is None:
        raise PolicyError(f"unknown {what} kind {kind!r}; valid kinds: {', '.join(registry)}", param="kind")
    return cast("type[Any]", getattr(importlib.import_module(module), name))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ScorerSettings(_Section):
    """How token importance is scored. ``kind="draft-attention"`` is the method; the others are baselines."""

    kind: ScorerKind = "draft-attention"
    #: N: the last prompt token plus N-1 greedily decoded tokens query the prompt (draft-attention).
    look_ahead: int = Field(default=8, ge=1, le=256)
    #: Width of the average pool that smooths each attention row (1 = none).
    pool_kernel: int = Field(default=13, ge=1, le=1025)
    #: Score with the draft's first N layers only, which are all that run (needs ``look_ahead = 1``);
    #: None: every layer. See ``DraftAttentionScorer(layers=...)``.
    layers: int | None = Field(default=None, ge=1, le=1024)
    #: The same as ``layers`` as a share of the draft's depth: its first ``round(layer_share x depth)``
    #: layers (at least one), the same relative depth on any draft. Not with ``layers``; needs ``look_ahead = 1``.
    layer_share: float | None = Field(default=None, gt=0, le=1)
    #: How attention rows are reduced over layers and heads: ``max`` (the paper's), ``mean``,
    #: ``content-mean`` (sink and local window left out; keeps shallow ``layers`` near full depth)
    #: or ``last-layer`` (only the deepest scored layer votes, the mean over its heads).
    #: See ``DraftAttentionScorer(aggregation=...)``.
    aggregation: Aggregation = "max"
    #: How the queries' per-token scores are combined: ``mean`` (the paper's) or ``max`` (a token
    #: one look-ahead query needs strongly is not averaged away). See ``DraftAttentionScorer(queries=...)``.
    queries: QueryReduction = "mean"
    #: Seed of the ``random`` baseline.
    seed: int = 0
    #: Share of the kept tokens the ``head-tail`` baseline takes from the start, in [0, 1] (None: its default).
    head: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _layers_need_one_query(self) -> ScorerSettings:
        if self.layers is not None and self.layer_share is not None:
            raise ValueError(f"give layers ({self.layers}) or layer_share ({self.layer_share}), not both")
        for key, value in (("layers", self.layers), ("layer_share", self.layer_share)):
            if value is not None and self.look_ahead != 1:
                raise ValueError(f"{key} ({value}) needs look_ahead = 1: look-ahead tokens come from the whole draft")
        return self


class SelectorSettings(_Section):
    """How many tokens are kept and in what units."""

    kind: SelectorKind = "keep-rate"
    #: Share of the prompt kept (``keep-rate``), in (0, 1]; 1.0 prefills everything without the draft.
    keep_rate: float = Field(default=0.1, gt=0, le=1)
    #: Tokens kept (``token-budget``).
    token_budget: int | None = Field(default=None, ge=1)
    #: Select whole chunks of this many tokens; 1 selects single tokens. With ``chunking = "text"``:
    #: the fixed window of prompts without text offsets (token ids only).
    chunk_size: int = Field(default=32, ge=1)
    #: ``fixed``: windows of ``chunk_size`` (`Chunked`); ``text``: chunks cut where the text breaks
    #: (sentences, lines, paragraphs, messages; `StructuredChunks`).
    chunking: Chunking = "fixed"
    #: ``text`` chunking: the shortest chunk (None: 8) ...
    min_chunk_size: int | None = Field(default=None, ge=1)
    #: ... and the longest (None: 64); at least ``2 * min_chunk_size - 1``.
    max_chunk_size: int | None = Field(default=None, ge=1)
    #: Prompts shorter than this are prefilled whole, without the draft (0: never).
    dense_below_tokens: int = Field(default=DEFAULT_DENSE_BELOW_TOKENS, ge=0)
    #: ``adaptive``: keep the fewest tokens holding this share of the score mass ...
    coverage: float = Field(default=0.9, gt=0, le=1)
    #: ... but at least this share of the prompt ...
    min_rate: float = Field(default=0.05, gt=0, le=1)
    #: ... and at most this share.
    max_rate: float = Field(default=0.5, gt=0, le=1)
    #: ``adaptive``: keep at least this many tokens (below ``max_rate``), so short prompts keep a larger share.
    min_tokens: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> SelectorSettings:
        if self.kind == "token-budget" and self.token_budget is None:
            raise ValueError("kind 'token-budget' needs token_budget")
        if self.min_rate > self.max_rate:
            raise ValueError(f"min_rate ({self.min_rate:g}) must not exceed max_rate ({self.max_rate:g})")
        if self.chunking == "fixed":
            for key in ("min_chunk_size", "max_chunk_size"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} needs chunking = 'text'; fixed chunks have one size, chunk_size")
        else:
            if self.chunk_size == 1:
                raise ValueError(
                    "chunk_size 1 (single tokens) contradicts chunking = 'text'; there chunk_size is the fixed "
                    "window of prompts without text offsets, 2 or more"
                )
            low, high = self.text_chunk_bounds()
            try:
                check_chunk_bounds(low, high, names=("min_chunk_size", "max_chunk_size"))
            except InvalidRequestError as exc:
                raise ValueError(exc.message) from None
        return self

    def text_chunk_bounds(self) -> tuple[int, int]:
        """``(min_chunk_size, max_chunk_size)`` with the defaults of `StructuredChunks` filled in."""
        low = TEXT_CHUNK_MIN_SIZE if self.min_chunk_size is None else self.min_chunk_size
        high = TEXT_CHUNK_MAX_SIZE if self.max_chunk_size is None else self.max_chunk_size
        return low, high


class ProtectSettings(_Section):
    """Tokens kept whatever their scores; they count toward the budget (see `selection.Protect`)."""

    #: The first ``sink`` tokens (the attention sink).
    sink: int = Field(default=1, ge=0)
    #: The generation prompt (or the last 8 tokens of plain text); an integer N adds the last N tokens.
    tail: bool | int = True
    #: Content tokens of messages with these roles, e.g. ``["system"]``.
    roles: tuple[str, ...] = Field(default=(), strict=False)
    #: The whole last user message.
    last_user_turn: bool = False
    #: Special tokens and chat-template glue.
    special_tokens: bool = False

    @field_validator("roles", mode="before")
    @classmethod
    def _roles(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @field_validator("tail", mode="before")
    @classmethod
    def _tail(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, int) and value >= 0):
            return value
        raise ValueError(f"tail must be true, false or a number of tokens >= 0, got {value!r}")


#: Per-request override keys of `Policy.with_overrides` and the section each one sets.
_OVERRIDES: dict[str, str] = {
    "keep_rate": "selector",
    "token_budget": "selector",
    "chunk_size": "selector",
    "dense_below_tokens": "selector",
    "coverage": "selector",
    "min_rate": "selector",
    "max_rate": "selector",
    "min_tokens": "selector",
    "look_ahead": "scorer",
    "pool_kernel": "scorer",
    "layers": "scorer",
    "layer_share": "scorer",
    "aggregation": "scorer",
    "sink": "protect",
    "tail": "protect",
    "roles": "protect",
    "last_user_turn": "protect",
    "special_tokens": "protect",
}
OVERRIDE_KEYS: tuple[str, ...] = tuple(_OVERRIDES)
#: Earlier names of settings, still read in policy files and overrides, and the names they now have.
#: The server's ``specprefill`` request extension keeps them on the wire and passes them on as they are.
RENAMED: dict[str, str] = {"min_prompt_tokens": "dense_below_tokens"}

_SECTIONS: dict[str, type[_Section]] = {
    "scorer": ScorerSettings,
    "selector": SelectorSettings,
    "protect": ProtectSettings,
}


class Policy(BaseModel):
    """A named, validated preset: scorer, selector and protection settings.

    Build one with `load_policy`, change it per request with `with_overrides`, turn it into stages
    with `build_selector` and `build_scorer` (or a whole pipeline with `load_pipeline`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    description: str = ""
    scorer: ScorerSettings = ScorerSettings()
    selector: SelectorSettings = SelectorSettings()
    protect: ProtectSettings = ProtectSettings()

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "settings") -> Policy:
        """Validate a mapping (e.g. parsed TOML) into a `Policy`.

        Raises:
            PolicyError: an unknown field (the message lists the valid ones) or a bad value.
        """
        selector = data.get("selector")
        if isinstance(selector, dict) and any(old in selector for old in RENAMED):
            data = {**data, "selector": _renamed(selector, "selector.")}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _policy_error(exc, source) from None

    def with_overrides(self, **fields: Any) -> Policy:
        """A copy with some settings replaced, e.g. per request: ``with_overrides(keep_rate=0.2)``.

        Keys are `OVERRIDE_KEYS`; ``None`` means "not given". ``keep_rate`` switches the selector to
        a fixed keep rate and ``token_budget`` to a token budget (not both at once). ``chunk_size`` asks
        for chunks of that many tokens, so it switches a policy with text chunks to fixed ones (there
        ``chunk_size`` alone would only size the windows of prompts without text). ``layers`` and
        ``layer_share`` replace each other; ``look_ahead`` above 1 without either scores with the whole
        draft (look-ahead tokens need every layer), whatever depth the policy had.

        Raises:
            PolicyError: an unknown key (the message lists the valid ones) or a bad value.
        """
        fields = _renamed(fields, "")
        check_known(fields, OVERRIDE_KEYS, "policy override", "overrides", error=PolicyError)
        given = {k: v for k, v in fields.items() if v is not None}
        if not given:
            return self
        if "keep_rate" in given and "token_budget" in given:
            raise PolicyError("give keep_rate or token_budget, not both", param="keep_rate")
        if "layers" in given and "layer_share" in given:
            raise PolicyError("give layers or layer_share, not both", param="layer_share")
        data = self.model_dump()
        scorer = data["scorer"]
        if "layers" in given or "layer_share" in given:
            scorer["layers"] = scorer["layer_share"] = None  # the one given replaces the policy's
        elif given.get("look_ahead", 1) > 1:
            # look-ahead tokens are decoded by the whole draft: a policy's first-layers setting yields
            scorer["layers"] = scorer["layer_share"] = None
        for key, value in given.items():
            data[_OVERRIDES[key]][key] = value
        if "keep_rate" in given:
            data["selector"]["kind"] = "keep-rate"
        if "token_budget" in given:
            data["selector"]["kind"] = "token-budget"
        if "chunk_size" in given:
            data["selector"].update(chunking="fixed", min_chunk_size=None, max_chunk_size=None)
        try:
            return Policy.model_validate(data)
        except ValidationError as exc:
            raise _policy_error(exc, "override", flat=set(given)) from None

    def build_selector(self) -> Selector:
        """The selector these settings describe, e.g. ``Protect(Chunked(KeepRate(0.1), 32))``."""
        from .selection import DenseBelow, Protect
        from .selection.base import BudgetSelector

        s, p = self.selector, self.protect
        cls = selector_class(s.kind)
        base: BudgetSelector
        if s.kind == "keep-rate":
            base = cls(s.keep_rate)
        elif s.kind == "token-budget":
            assert s.token_budget is not None
            base = cls(s.token_budget)
        else:
            base = cls(
                s.coverage, s.min_rate, s.max_rate, dense_below_tokens=s.dense_below_tokens, min_tokens=s.min_tokens
            )
        chunks = _registered(CHUNKINGS, s.chunking, "specprefill_sdk.selection", "chunking")
        selector: Selector
        if s.chunking == "text":
            low, high = s.text_chunk_bounds()
            selector = chunks(base, low, high, fallback_size=s.chunk_size)
        else:
            selector = chunks(base, s.chunk_size) if s.chunk_size > 1 else base
        if p.sink or p.tail is not False or p.roles or p.last_user_turn or p.special_tokens:
            selector = Protect(
                selector,
                sink=p.sink,
                tail=p.tail,
                roles=p.roles,
                last_user_turn=p.last_user_turn,
                special_tokens=p.special_tokens,
            )
        keeps_all = s.kind == "keep-rate" and s.keep_rate >= 1  # dense already: nothing to switch off
        if s.dense_below_tokens and s.kind != "adaptive" and not keeps_all:
            selector = DenseBelow(selector, s.dense_below_tokens)
        return selector

    def build_scorer(self, draft: str | LoadedModel = _DEFAULT_MODEL, **kwargs: Any) -> Scorer:
        """The scorer these settings describe; ``draft`` and ``kwargs`` go to model-based scorers.

        ``kwargs`` are e.g. ``device``, ``dtype`` and ``target_tokenizer`` for `DraftAttentionScorer`.
        Baselines (uniform, random, recency, head-tail) load no model and ignore both.
        """
        s = self.scorer
        cls = scorer_class(s.kind)
        if s.kind == "draft-attention":
            built = cls(
                draft,
                look_ahead=s.look_ahead,
                pool_kernel=s.pool_kernel,
                layers=s.layers,
                layer_share=s.layer_share,
                aggregation=s.aggregation,
                queries=s.queries,
                **kwargs,
            )
        elif s.kind == "self-information":
            built = cls(draft=draft, **kwargs)
        elif s.kind == "random":
            built = cls(seed=s.seed)
        elif s.kind == "head-tail" and s.head is not None:
            built = cls(head=s.head)
        else:
            built = cls()
        return cast("Scorer", built)

    def summary(self) -> str:
        """One line: the selector and scorer settings, e.g. for ``specprefill policies``."""
        s = self.selector
        if s.kind == "keep-rate" and s.keep_rate >= 1:
            return "keep everything (the draft never runs)"
        if s.kind == "keep-rate":
            keep = f"keep {s.keep_rate:g}"
        elif s.kind == "token-budget":
            keep = f"keep {s.token_budget} tokens"
        else:
            floor = f", at least {s.min_tokens} tokens" if s.min_tokens else ""
            keep = f"adaptive {s.min_rate:g}-{s.max_rate:g} (coverage {s.coverage:g}{floor})"
        if s.chunking == "text":
            low, high = s.text_chunk_bounds()
            chunking = f"text chunks {low}-{high} (fixed {s.chunk_size} without text offsets)"
        else:
            chunking = f"chunk {s.chunk_size}" if s.chunk_size > 1 else "token-level"
        parts = [keep, chunking]
        if s.dense_below_tokens:
            parts.append(f"dense below {s.dense_below_tokens} tokens")
        if self.scorer.kind == "draft-attention":
            parts.append(f"look-ahead {self.scorer.look_ahead}, pool {self.scorer.pool_kernel}")
            if self.scorer.layers is not None:
                parts.append(f"first {self.scorer.layers} draft layers")
            if self.scorer.layer_share is not None:
                parts.append(f"first {self.scorer.layer_share:g} of the draft's layers")
            if self.scorer.aggregation != "max":
                parts.append(f"aggregation {self.scorer.aggregation}")
            if self.scorer.queries != "mean":
                parts.append(f"queries {self.scorer.queries}")
        else:
            parts.append(f"scorer {self.scorer.kind}")
        return ", ".join(parts)


def _renamed(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``values`` with the earlier names of `RENAMED` replaced by the current ones (not both at once)."""
    out = dict(values)
    for old, new in RENAMED.items():
        if old in out:
            if new in out:
                raise PolicyError(f"give {where}{new} or its earlier name {old}, not both", param=new)
            out[new] = out.pop(old)
    return out


def _policy_error(exc: ValidationError, source: str, *, flat: AbstractSet[str] = frozenset()) -> PolicyError:
    """One readable line from pydantic's errors; ``flat`` names override keys shown without their section."""
    problems: list[str] = []
    first_param: str | None = None
    for err in exc.errors():
        loc = [str(x) for x in err["loc"]]
        message = str(err["msg"]).removeprefix("Value error, ")
        lead = message.split(" ", 1)[0]
        own_check = len(loc) == 1 and loc[0] in _SECTIONS  # a section's check across its fields
        if len(loc) >= 2 and loc[1] in flat:  # an override key: name it as the caller spelled it
            where, param = ".".join(loc[1:]), loc[1]
        elif len(loc) == 1 and lead in flat:  # a section's own check about one override key
            where, param = loc[0], lead
        elif own_check and lead in _SECTIONS[loc[0]].model_fields:  # it names one field first
            where, param = loc[0], f"{loc[0]}.{lead}"
        else:
            where = param = ".".join(loc) or "policy"
        first_param = first_param or param
        if err["type"] == "extra_forbidden":
            section = _SECTIONS.get(loc[0]) if len(loc) == 2 else None
            model: type[BaseModel] = section if section is not None else Policy
            scope = f" in [{loc[0]}]" if section is not None else ""
            problems.append(f"unknown field '{where}'; valid fields{scope}: {', '.join(model.model_fields)}")
        elif err["type"] == "literal_error":
            problems.append(f"{where}: {err['msg']}, got {err['input']!r}")
        elif own_check or message.startswith("tail must"):  # its input is the section, or the message shows it
            problems.append(f"{where}: {message}" if loc else message)
        else:
            problems.append(f"{where}: {message}, got {err['input']!r}")
    return PolicyError(f"invalid policy {source}: {'; '.join(problems)}", param=first_param)


def policy_dirs() -> list[Traversable]:
    """Where presets are looked up: inside the installed package, else the repository's ``policies/``."""
    dirs: list[Traversable] = []
    packaged = importlib.resources.files("specprefill_sdk") / "_policies"
    if packaged.is_dir():
        dirs.append(packaged)
    checkout = Path(__file__).resolve().parents[1]
    # Only a source checkout of this project: a bare site-packages/policies belongs to someone else.
    if (checkout / "policies").is_dir() and (checkout / "pyproject.toml").is_file():
        dirs.append(checkout / "policies")
    return dirs


def _presets() -> dict[str, Traversable]:
    found: dict[str, Traversable] = {}
    for folder in policy_dirs():
        for entry in folder.iterdir():
            if entry.name.endswith(".toml") and entry.is_file():
                found.setdefault(entry.name[: -len(".toml")], entry)
    return found


def list_policies() -> list[str]:
    """The names of the shipped presets, sorted: e.g. ``['auto', 'conservative', 'dense', 'paper']``.

    Earlier names (`DEPRECATED_PRESETS`) are not listed, though `load_policy` still reads them.
    """
    return sorted(_presets())


def preset_name(name: str) -> str:
    """``name``, or the preset an earlier name (`DEPRECATED_PRESETS`) now loads, with a warning.

    The warning is a `DeprecationWarning` on each call and one logged warning per name and process.
    """
    if name not in DEPRECATED_PRESETS:
        return name
    new, reason = DEPRECATED_PRESETS[name]
    message = f"policy {name!r} was replaced by {new!r} because {reason}; loading {new!r}"
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    if name not in _WARNED:
        _WARNED.add(name)
        logger.warning(message)
    return new


def _parse(text: str, name: str, source: str) -> Policy:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy {source} is not valid TOML: {exc}") from None
    data.setdefault("name", name)
    return Policy.from_dict(data, source=source)


def load_policy(name_or_path: str | os.PathLike[str]) -> Policy:
    """Load a preset by name (``"paper"``) or a policy file by path (``"./mine.toml"``).

    An earlier preset name (`DEPRECATED_PRESETS`, e.g. ``"adaptive"``) loads the preset that replaced
    it, with a warning (`preset_name`).

    Raises:
        PolicyError: an unknown name (the message lists the presets), a missing or unreadable file,
            invalid TOML, or invalid settings.
    """
    if isinstance(name_or_path, os.PathLike) or str(name_or_path).endswith(".toml") or os.sep in str(name_or_path):
        path = Path(name_or_path).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PolicyError(f"policy file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(f"cannot read policy file {path}: {exc}") from None
        return _parse(text, path.stem, f"file {path}")
    if not isinstance(name_or_path, str) or not name_or_path:
        raise PolicyError(f"a policy name or .toml path is required, got {name_or_path!r}")
    presets = _presets()
    name_or_path = preset_name(name_or_path)
    entry = presets.get(name_or_path)
    if entry is None:
        valid = ", ".join(sorted(presets)) or "(none installed)"
        raise PolicyError(f"unknown policy {name_or_path!r}; valid policies: {valid} (or a path to a .toml file)")
    return _parse(entry.read_text(encoding="utf-8"), name_or_path, f"'{name_or_path}'")


def load_pipeline(
    policy: str | os.PathLike[str] | Policy = DEFAULT_POLICY,
    *,
    model: str | LoadedModel = _DEFAULT_MODEL,
    draft: str | LoadedModel | None = None,
    device: str = "auto",
    dtype: str = "auto",
    backend: Backend | None = None,
    scorer: Scorer | None = None,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    execution: ExecutionSettings | None = None,
    warmup: bool | None = None,
    dense_when_slower: bool = True,
    **overrides: Any,
) -> Pipeline:
    """Build a `Pipeline` from a policy: the policy's scorer and selector, a transformers backend.

    Args:
        policy: a preset name (default ``auto``, `DEFAULT_POLICY`), a ``.toml`` path or a `Policy`.
        model: the target (a model spec or a `LoadedModel`); ignored when ``backend`` is given.
        draft: the draft model; ``None`` uses the target itself, sharing its weights in memory.
        device, dtype: where and how models given by name are loaded.
        backend: a ready backend (e.g. an `OpenAIBackend`) instead of a `TransformersBackend`.
        scorer: a ready scorer instead of the policy's.
        tracer_provider, meter_provider: OpenTelemetry providers for the pipeline.
        execution: how the transformers backend and a draft-attention scorer run their passes
            (`ExecutionSettings`, e.g. ``ExecutionSettings(compile=True)``); None: the defaults.
            A deployment setting, not part of a policy; refused when backend and scorer are both given.
        warmup: run `Pipeline.warmup` before returning (compile the passes, measure the cost model);
            None (the default): when the backend's or the scorer's passes compile (on a CUDA device,
            unless ``compile=False``), so that compiling happens here and not in a first request.
        dense_when_slower: `Pipeline`'s check that prefills densely where the measured costs say
            scoring would not pay; False turns it off.
        overrides: `Policy.with_overrides` keys, e.g. ``keep_rate=0.2``.

    Raises:
        PolicyError: unknown policy or override, or a bad value.
        InvalidRequestError: ``execution`` given where nothing built here reads it.
        ModelLoadError: a model cannot be found or loaded.
    """
    from .models import LoadedModel, load_model
    from .pipeline import Pipeline

    pol = policy if isinstance(policy, Policy) else load_policy(policy)
    pol = pol.with_overrides(**overrides)
    if execution is not None and backend is not None and scorer is not None:
        # Only a backend or a draft-attention scorer built here reads it.
        raise InvalidRequestError(
            "execution has no effect here: both the backend and the scorer are given", param="execution"
        )
    selector = pol.build_selector()
    if backend is None:
        from .backends import TransformersBackend

        target = model if isinstance(model, LoadedModel) else load_model(model, device=device, dtype=dtype)
        backend = TransformersBackend(target, execution=execution)
    if scorer is None:
        target_loaded = backend.loaded if isinstance(backend, LocalBackend) else None
        same = draft is None or draft is model or (isinstance(draft, str) and draft == model)
        draft_spec: str | LoadedModel
        if same and isinstance(target_loaded, LoadedModel):
            draft_spec = target_loaded  # one copy of the weights serves as target and draft
        else:
            draft_spec = model if draft is None else draft
        kwargs: dict[str, Any] = {}
        if pol.scorer.kind in MODEL_SCORERS:
            kwargs["target_tokenizer"] = backend.tokenizer
        if pol.scorer.kind == "draft-attention" and execution is not None:
            kwargs["execution"] = execution
        if isinstance(draft_spec, str) and pol.scorer.kind in MODEL_SCORERS:
            kwargs.update(device=device, dtype=dtype)
        scorer = pol.build_scorer(draft_spec, **kwargs)
    if warmup is not None and not isinstance(warmup, bool):
        raise InvalidRequestError(f"warmup must be True, False or None, got {warmup!r}", param="warmup")
    logger.info("pipeline: policy %s, selector %s, scorer %s", pol.name, selector.name, scorer.name)
    pipe = Pipeline(
        scorer,
        selector,
        backend,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        dense_when_slower=dense_when_slower,
    )
    if warmup or (warmup is None and pipe.compiled):
        pipe.warmup()
    return pipe


def scorer_for(policy: Policy, loaded: Scorer | None, backend: Backend) -> Scorer:
    """The scorer ``policy`` asks for, built around ``loaded`` (a process's draft scorer) without a second model.

    ``loaded`` itself when it already is that scorer (its ``name`` is the policy's kind); a variant
    sharing its model when only the draft-attention knobs (look-ahead, pool, layers, aggregation, queries) differ; for
    another model-based kind, a new scorer on ``loaded``'s draft model. Baselines load nothing and
    are built from the settings. A server builds one scorer at start and asks this for every
    request's policy.

    Raises:
        PolicyError: the policy needs a draft model and ``loaded`` is None.
        InvalidRequestError: a knob the draft refuses (e.g. more layers than it has).
    """
    from .scoring import DraftAttentionScorer, SelfInformationScorer

    settings = policy.scorer
    if settings.kind not in MODEL_SCORERS:
        return policy.build_scorer()
    if loaded is None:
        raise PolicyError(
            f"policy {policy.name!r} scores with a draft model ({settings.kind}), and none is loaded",
            param="policy",
        )
    if loaded.name == settings.kind:  # a scorer's name is its kind (a caller's own scorer too)
        if not isinstance(loaded, DraftAttentionScorer):
            return loaded
        return cast("Scorer", draft_variant(settings, loaded))
    draft: str | LoadedModel = backend.model_name
    if isinstance(loaded, DraftAttentionScorer | SelfInformationScorer):
        draft = loaded.loaded
    return policy.build_scorer(draft, target_tokenizer=backend.tokenizer)


def draft_variant(settings: ScorerSettings, loaded: DraftAttentionScorer) -> DraftAttentionScorer:
    """``loaded`` itself when its knobs are ``settings``'; else the `with_options` variant that shares its model.

    Raises:
        InvalidRequestError: a knob the draft refuses (e.g. more layers than it has).
    """
    wanted = settings.layers
    if settings.layer_share is not None:
        wanted = loaded.layers_of_share(settings.layer_share)
    changes: dict[str, Any] = {}
    if settings.look_ahead != loaded.look_ahead:
        changes["look_ahead"] = settings.look_ahead
    if settings.pool_kernel != loaded.pool_kernel:
        changes["pool_kernel"] = settings.pool_kernel
    if (wanted or loaded.depth) != (loaded.layers or loaded.depth):
        changes["layers"] = wanted or loaded.depth  # with_options reads the draft's depth as every layer
    if settings.aggregation != loaded.aggregation:
        changes["aggregation"] = settings.aggregation
    if settings.queries != loaded.queries:
        changes["queries"] = settings.queries
    return loaded.with_options(**changes) if changes else loaded


def build_pipeline(
    policy: Policy | None,
    loaded: Scorer | None,
    backend: Backend,
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
) -> Pipeline:
    """The pipeline of ``policy`` over a process's loaded backend and draft scorer (see `scorer_for`).

    ``policy=None`` turns compression off: every token is kept (`KeepRate` of 1.0) and the draft
    never runs; the pipeline still names ``loaded``'s draft.

    Raises:
        PolicyError, InvalidRequestError: from `scorer_for`.
    """
    from .pipeline import Pipeline

    if policy is None:
        from .scoring import UniformScorer
        from .selection import KeepRate

        scorer: Scorer = loaded if loaded is not None else UniformScorer()
        selector: Selector = KeepRate(1.0)
    else:
        scorer, selector = scorer_for(policy, loaded, backend), policy.build_selector()
    return Pipeline(scorer, selector, backend, tracer_provider=tracer_provider, meter_provider=meter_provider)


# Framework components are cheap to create and frameworks create many; the models behind them load once.
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
    """``pipeline`` when given, else the pipeline of ``policy`` over ``model``, built once per setting.

    Framework adapters call this: their components are created often, their models must load once.

    With ``base_url`` the target is a remote OpenAI-compatible server (`OpenAIBackend`, whose
    tokenizer is ``model``'s); the draft model runs here.

    Raises:
        InvalidRequestError: ``pipeline`` is not a `Pipeline`.
        PolicyError, ModelLoadError: from `specprefill_sdk.policies.load_pipeline`.
    """
    from .pipeline import Pipeline

    if pipeline is not None:
        if not isinstance(pipeline, Pipeline):
            raise InvalidRequestError(f"pipeline must be a specprefill_sdk.Pipeline, got {type(pipeline).__name__}")
        return pipeline
    items = tuple(sorted((k, _frozen(v)) for k, v in (overrides or {}).items()))
    key = (policy, model, draft, base_url, api_key, mode, device, dtype, items)
    with _LOCK:
        found = _CACHE.get(key)
        if found is None:
            backend: Backend | None = None
            if base_url:
                from .backends.openai import OpenAIBackend

                remote = OpenAIBackend(base_url, model=model, tokenizer=model, mode=mode, api_key=api_key)  # type: ignore[arg-type]
                backend = cast("Backend", remote)
            found = load_pipeline(
                policy, model=model, draft=draft, device=device, dtype=dtype, backend=backend, **dict(items)
            )
            _CACHE[key] = found
        return found


def override_selector(
    policy: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    keep_rate: float | None = None,
    token_budget: int | None = None,
) -> Selector | None:
    """The selector of ``policy`` (with ``overrides``) set to ``keep_rate`` / ``token_budget``.

    ``None`` when neither is given: the pipeline's own selector applies. Framework components use
    this for a per-component budget on a shared pipeline.

    Raises:
        PolicyError: an unknown policy or an invalid override.
    """
    if keep_rate is None and token_budget is None:
        return None
    base = load_policy(policy).with_overrides(**(overrides or {}))
    return base.with_overrides(keep_rate=keep_rate, token_budget=token_budget).build_selector()
