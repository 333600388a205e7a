"""The runtime room: `ExecutionSettings`, its place in the scorer and the backend, the draft's own lock."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time

import pytest

from specprefill_sdk import ExecutionSettings, InvalidRequestError
from specprefill_sdk.backends import TransformersBackend
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.runtime.attention import DEFAULT_ATTENTION_BACKENDS
from specprefill_sdk.scoring import DraftAttentionScorer
from specprefill_sdk.scoring.draft_attention import DraftSession


def test_importing_the_runtime_imports_no_stage() -> None:
    code = (
        "import sys, specprefill_sdk.runtime, specprefill_sdk.runtime.lean, specprefill_sdk.runtime.norms\n"
        "print(sorted(m for m in sys.modules if m.startswith(('specprefill_sdk.scoring', 'specprefill_sdk.backends'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_execution_settings_are_frozen_validated_and_compared_by_value() -> None:
    default = ExecutionSettings()
    assert default == ExecutionSettings(attention_backends=list(DEFAULT_ATTENTION_BACKENDS))  # type: ignore[arg-type]
    assert ExecutionSettings(attention_backends="cudnn").attention_backends == ("cudnn",)  # type: ignore[arg-type]
    assert ExecutionSettings(attention_backends=None).attention_backends is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.compile = True  # type: ignore[misc]
    for bad in ({"compile": 1}, {"lean": "yes"}, {"cuda_graph": None}, {"fused_norms": 0}):
        with pytest.raises(InvalidRequestError, match=next(iter(bad))):
            ExecutionSettings(**bad)  # type: ignore[arg-type]
    for size in (0, -1, 2.5, True):
        with pytest.raises(InvalidRequestError, match="max_batch_tokens"):
            ExecutionSettings(max_batch_tokens=size)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="attention_backends"):
        ExecutionSettings(attention_backends=("flash", "vulkan"))
    with pytest.raises(InvalidRequestError, match="takes an attention mask"):
        ExecutionSettings(attention_backends=("flash",))  # the look-ahead steps' masked attention has no kernel
    with pytest.raises(InvalidRequestError, match="attention_backends"):
        dataclasses.replace(default, attention_backends=())  # replace validates again


@pytest.mark.parametrize("keyword", ["compile", "lean", "fused_norms", "cuda_graph", "attention_backends"])
def test_the_old_execution_keywords_are_errors(keyword: str) -> None:
    with pytest.raises(TypeError, match=keyword):
        DraftAttentionScorer("smollm2-135m", **{keyword: False})  # type: ignore[arg-type]
    if keyword in ("compile", "lean", "fused_norms"):
        with pytest.raises(TypeError, match=keyword):
            TransformersBackend("smollm2-135m", **{keyword: False})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_batch_tokens"):
        DraftAttentionScorer("smollm2-135m", max_batch_tokens=8)  # type: ignore[call-arg]


def test_execution_must_be_settings_and_is_checked_before_loading() -> None:
    with pytest.raises(InvalidRequestError, match="ExecutionSettings"):
        DraftAttentionScorer("no-such-model", execution={"compile": True})  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="ExecutionSettings"):
        TransformersBackend("no-such-model", execution=True)  # type: ignore[arg-type]


@pytest.mark.slow
def test_scorer_and_backend_expose_the_settings_they_share(smollm) -> None:
    execution = ExecutionSettings(fused_norms=False, lean=False)
    scorer = DraftAttentionScorer(smollm, look_ahead=2, execution=execution)
    backend = TransformersBackend(smollm, execution=execution)
    assert scorer.execution is execution and backend.execution is execution
    # The scorer-only switches are refused by the backend, never ignored.
    scorer_only = ExecutionSettings(cuda_graph=False, max_batch_tokens=64)
    assert DraftAttentionScorer(smollm, look_ahead=2, execution=scorer_only).execution is scorer_only
    with pytest.raises(InvalidRequestError, match=r"execution\.cuda_graph, execution\.max_batch_tokens"):
        TransformersBackend(smollm, execution=scorer_only)
    assert DraftAttentionScorer(smollm).execution == ExecutionSettings()
    assert scorer.with_options(look_ahead=1).execution is execution  # kept unless given
    plain = ExecutionSettings()
    assert scorer.with_options(execution=plain).execution is plain


@pytest.mark.slow
def test_the_draft_model_runs_one_scoring_at_a_time(smollm, monkeypatch) -> None:
    """Scorers on one draft (variants and sessions too) serialize themselves: callers hold no lock."""
    scorer = DraftAttentionScorer(smollm, look_ahead=2)
    variant = scorer.with_options(look_ahead=1)
    session = DraftSession(scorer)
    assert variant.lock is scorer.lock
    running, overlaps = [0], [0]
    guard = threading.Lock()

    def slow(original):
        def run(*args, **kwargs):
            with guard:
                running[0] += 1
                overlaps[0] = max(overlaps[0], running[0])
            time.sleep(0.05)
            try:
                return original(*args, **kwargs)
            finally:
                with guard:
                    running[0] -= 1

        return run

    for target in (scorer, variant, session):
        monkeypatch.setattr(target, "_score_ids", slow(target._score_ids))
    prompt = build_prompt(smollm.tokenizer, "The lock belongs to the scorer. " * 4 + "Whose lock is it?")
    calls = [scorer.score, variant.score, session.score, lambda p: scorer.score_batch([p, p])] * 2
    errors: list[BaseException] = []

    def call(fn):
        try:
            fn(prompt)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(fn,)) for fn in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert overlaps[0] == 1
