"""The fields every framework component shares (`specprefill_sdk.components`): each reaches the pipeline
the component builds, and a misspelt or unused one is refused naming the right field."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")
pytest.importorskip("litellm")

from adapter_helpers import MODEL_SETTINGS

from specprefill_langchain import (
    ChatSpecPrefill,
    SpecPrefillDocumentCompressor,
    SpecPrefillMessageCompressor,
    SpecPrefillMiddleware,
)
from specprefill_litellm import SpecPrefillCallback
from specprefill_llamaindex import SpecPrefillLLM, SpecPrefillNodePostprocessor
from specprefill_sdk.components import OVERRIDE_FIELDS, PipelineFields
from specprefill_sdk.errors import InvalidRequestError, PolicyError
from specprefill_sdk.policies import OVERRIDE_KEYS
from specprefill_sdk.selection import Adaptive, Chunked, DenseBelow, KeepRate, Protect, TokenBudget

pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning")  # litellm's own typed dicts

COMPONENTS: list[type[Any]] = [
    ChatSpecPrefill,
    SpecPrefillDocumentCompressor,
    SpecPrefillMessageCompressor,
    SpecPrefillMiddleware,
    SpecPrefillNodePostprocessor,
    SpecPrefillLLM,
    SpecPrefillCallback,
]
NAMES = [c.__name__ for c in COMPONENTS]


def _find(selector: Any, kind: type[Any]) -> Any:
    """The stage of ``kind`` inside a chain of wrapping selectors."""
    while selector is not None and not isinstance(selector, kind):
        selector = getattr(selector, "inner", None)
    assert selector is not None, f"no {kind.__name__} in the selector"
    return selector


def test_every_policy_override_is_a_field() -> None:
    assert sorted(OVERRIDE_FIELDS.values()) == sorted(OVERRIDE_KEYS)
    assert set(OVERRIDE_FIELDS) <= set(PipelineFields.model_fields)


#: (fields, check of the built pipeline)
CASES: list[tuple[dict[str, Any], Any]] = [
    ({"keep_rate": 0.5}, lambda p: _find(p.selector, KeepRate).rate == 0.5),
    ({"token_budget": 77}, lambda p: _find(p.selector, TokenBudget).k == 77),
    ({"chunk_size": 16}, lambda p: _find(p.selector, Chunked).size == 16),
    ({"dense_below_tokens": 300}, lambda p: _find(p.selector, DenseBelow).tokens == 300),
    (
        {"policy": "auto", "coverage": 0.8, "min_rate": 0.1, "max_rate": 0.6},
        lambda p: (lambda a: (a.coverage, a.min_rate, a.max_rate) == (0.8, 0.1, 0.6))(_find(p.selector, Adaptive)),
    ),
    ({"look_ahead": 4, "pool_kernel": 5}, lambda p: (p.scorer.look_ahead, p.scorer.pool_kernel) == (4, 5)),
    ({"look_ahead": 1, "layers": 2}, lambda p: p.scorer.layers == 2),
    (
        {"sink": 3, "tail": 5, "protect_roles": ["system"], "last_user_turn": True, "special_tokens": True},
        lambda p: (
            (lambda s: (s.sink, s.tail, s.roles, s.last_user_turn, s.special_tokens))(_find(p.selector, Protect))
            == (3, 5, ("system",), True, True)
        ),
    ),
    ({"policy_overrides": {"keep_rate": 0.4, "roles": ["system"]}}, lambda p: _find(p.selector, KeepRate).rate == 0.4),
]


@pytest.mark.slow
@pytest.mark.parametrize("component", COMPONENTS, ids=NAMES)
def test_each_policy_field_reaches_the_pipeline(component, paper_pipeline) -> None:
    assert component(pipeline=paper_pipeline).get_pipeline() is paper_pipeline  # nothing asked: as given
    for fields, check in CASES:
        # The fields apply to the named policy (auto when none is named): these checks are the paper's.
        built = component(pipeline=paper_pipeline, **{"policy": "paper", **fields}).get_pipeline()
        assert check(built), (fields, built.selector)
        assert built.backend is paper_pipeline.backend
        assert built.scorer.loaded is paper_pipeline.scorer.loaded  # the same draft, not a second copy


@pytest.mark.slow
@pytest.mark.parametrize("component", COMPONENTS, ids=NAMES)
def test_model_settings_reach_the_pipeline(component, smollm) -> None:
    import torch

    from specprefill_sdk.models import cache_dir

    same = component(**MODEL_SETTINGS, keep_rate=0.25).get_pipeline()
    assert same.backend.loaded is smollm  # device cpu, dtype auto: the model the fixtures loaded
    assert same.scorer.loaded is smollm  # no draft: the target's weights score
    assert _find(same.selector, KeepRate).rate == 0.25

    wide = component(model="smollm2-135m", device="cpu", dtype="float32").get_pipeline()
    assert wide.backend.loaded.dtype == torch.float32 and wide.backend.loaded.device.type == "cpu"

    folder = cache_dir() / "models" / "smollm2-135m"
    assert (folder / "config.json").exists()
    drafted = component(**MODEL_SETTINGS, draft=str(folder)).get_pipeline()
    assert drafted.backend.loaded is smollm and drafted.scorer.loaded is not smollm
    assert drafted.scorer.loaded.source == str(folder) or drafted.scorer.loaded.name == str(folder)


def test_remote_fields_reach_the_backend() -> None:
    for component in (ChatSpecPrefill, SpecPrefillLLM):
        built = component(
            **MODEL_SETTINGS, base_url="http://127.0.0.1:9/v1", api_key="k", backend_mode="text"
        ).get_pipeline()
        assert built.backend.mode == "text" and "127.0.0.1:9" in str(built.backend.base_url)


@pytest.mark.parametrize("component", COMPONENTS, ids=NAMES)
def test_misspelt_fields_are_refused_naming_the_right_one(component) -> None:
    with pytest.raises(InvalidRequestError, match=r"no field 'keep_rates'; did you mean 'keep_rate'\?"):
        component(keep_rates=0.5)
    with pytest.raises(InvalidRequestError, match=r"no field 'modle'; did you mean 'model'\?"):
        component(modle="smollm2-135m")
    with pytest.raises(InvalidRequestError, match=r"did you mean 'dense_below_tokens'\?"):
        component(min_prompt_tokens=100)  # the server's name of the setting
    with pytest.raises(InvalidRequestError, match=r"did you mean 'look_ahead'\?"):
        component(lookahead=4)
    with pytest.raises(PolicyError, match="keep_rate"):
        component(keep_rate=1.5)  # a bad value fails at construction, before a model loads
    with pytest.raises(InvalidRequestError, match="given twice"):
        component(keep_rate=0.3, policy_overrides={"keep_rate": 0.2})
    with pytest.raises(PolicyError, match="unknown policy override"):
        component(policy_overrides={"keep_rates": 0.2})


def test_protected_roles_have_their_own_name() -> None:
    # ``roles`` of a chat model would be the policy's protected roles: it is called protect_roles
    with pytest.raises(InvalidRequestError, match=r"did you mean 'protect_roles'\?"):
        ChatSpecPrefill(roles=["system"])
    assert SpecPrefillMessageCompressor(roles=["user"], protect_roles=["system"]).overrides() == {"roles": ("system",)}


@pytest.mark.slow
@pytest.mark.parametrize("component", COMPONENTS, ids=NAMES)
def test_model_settings_with_a_ready_pipeline_are_refused(component, paper_pipeline) -> None:
    for field, value in (("device", "cpu"), ("dtype", "float32"), ("draft", "smollm2-135m")):
        with pytest.raises(InvalidRequestError, match=f"{field} has no effect with pipeline="):
            component(pipeline=paper_pipeline, **{field: value})


@pytest.mark.slow
def test_chat_model_keep_rate_field_keeps_that_share(paper_pipeline, essay) -> None:
    chat = ChatSpecPrefill(pipeline=paper_pipeline, policy="paper", keep_rate=0.5, max_tokens=2)
    info = chat.invoke(essay[:1500] + "\nWhat is the text about?").response_metadata["specprefill"]
    assert 0.4 < info["keep_ratio"] < 0.65  # the paper policy alone keeps about 10%
