"""The side interfaces of `specprefill_sdk.interfaces`: the stages that offer one satisfy its protocol."""

from __future__ import annotations

from typing import Any

import pytest

from specprefill_sdk.interfaces import (
    Backend,
    DraftModelScorer,
    IncrementalScorer,
    LookAheadScorer,
    ModelScorer,
    ProviderBackend,
    RemoteBackend,
    Scorer,
    SessionBackend,
    SessionState,
)

pytestmark = pytest.mark.slow


def test_the_transformers_backend_keeps_sessions(smollm: Any) -> None:
    from specprefill_sdk import TransformersBackend

    backend = TransformersBackend(smollm)
    assert isinstance(backend, Backend) and isinstance(backend, SessionBackend)
    assert backend.capabilities.supports_sessions
    state = backend.new_state()
    assert isinstance(state, SessionState)
    assert state.cached_positions() == [] and state.last_prefilled == 0
    assert not isinstance(backend, RemoteBackend)


def test_the_http_backend_keeps_no_sessions_and_names_its_server(smollm: Any) -> None:
    from specprefill_sdk.backends.openai import OpenAIBackend

    backend = OpenAIBackend("http://127.0.0.1:9/v1", model="remote", tokenizer=smollm.tokenizer, mode="text")
    assert not isinstance(backend, SessionBackend)
    assert isinstance(backend, RemoteBackend) and isinstance(backend, ProviderBackend)
    assert backend.provider_name == "openai"


def test_scorers_declare_their_draft(smollm: Any) -> None:
    from specprefill_sdk.scoring import DraftAttentionScorer, RecencyScorer, SelfInformationScorer

    draft = DraftAttentionScorer(smollm, look_ahead=2)
    assert isinstance(draft, IncrementalScorer) and isinstance(draft, LookAheadScorer)
    assert draft.model_name == smollm.name
    information = SelfInformationScorer(smollm)
    assert isinstance(information, DraftModelScorer)
    assert not isinstance(information, IncrementalScorer) and not isinstance(information, LookAheadScorer)
    recency = RecencyScorer()
    assert isinstance(recency, Scorer) and not isinstance(recency, ModelScorer)


def test_an_incremental_scorer_opens_sessions_on_its_own_draft_and_lock(smollm: Any) -> None:
    from specprefill_sdk.interfaces import ScoringSession
    from specprefill_sdk.models import model_lock
    from specprefill_sdk.scoring import DraftAttentionScorer, SelfInformationScorer

    draft = DraftAttentionScorer(smollm, look_ahead=2)
    session = draft.new_session()
    assert isinstance(session, ScoringSession)
    assert session.scorer is draft and draft.lock is model_lock(smollm.model)
    # A scorer of another kind on the same weights takes turns with it on the same lock.
    assert SelfInformationScorer(smollm)._lock is draft.lock
