"""Every Scorer, Selector and Backend of `contracts.py` through its protocol's contract.

Scorers: a `TokenScores` of length n, finite float32 values, ``score_batch`` equal to single calls,
typed errors. Selectors: a sorted `Selection` within [0, n) that keeps the protected tokens,
``decide_without_scores`` consistent with ``select``, typed errors. Backends: ``generate``,
``stream``, ``generate_batch``, ``agenerate`` and ``astream`` agree (greedy), usage counts what was
prefilled and generated, decoding continues at position n, ``ignore_eos`` generates past the end of
sequence, typed errors.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from contracts import BACKENDS, SCORERS, SELECTORS, Entry
from server_utils import ServerProcess, start_server

import specprefill_sdk
from specprefill_sdk import backends, scoring, selection
from specprefill_sdk.errors import ContextTooLongError, InvalidRequestError, SpecPrefillError
from specprefill_sdk.interfaces import Backend, BackendCapabilities, Scorer, Selector
from specprefill_sdk.models import cache_argument
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.types import (
    Completion,
    CompletionChunk,
    CompressedPrompt,
    Prompt,
    SamplingParams,
    Selection,
    TokenScores,
)


def _params(entries: list[Entry]) -> list[Any]:
    marks = lambda e: [pytest.mark.skip(reason=e.skip)] if e.skip else []  # noqa: E731
    return [pytest.param(e, id=e.id, marks=marks(e)) for e in entries]


def _component(request: pytest.FixtureRequest, cache: dict[str, Any], entry: Entry) -> Any:
    """Build each entry once per module (its models and servers come from shared fixtures)."""
    if entry.id not in cache:
        cache[entry.id] = entry.build(request.getfixturevalue)
    return cache[entry.id]


_BUILT: dict[str, Any] = {}


@pytest.fixture
def scorer(request: pytest.FixtureRequest) -> Any:
    return _component(request, _BUILT, request.param)


@pytest.fixture
def selector(request: pytest.FixtureRequest) -> Any:
    return _component(request, _BUILT, request.param)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Any:
    return _component(request, _BUILT, request.param)


@pytest.fixture(scope="module", autouse=True)
def _release_components() -> Iterator[None]:
    yield
    for component in _BUILT.values():
        close = getattr(component, "close", None)
        if callable(close):
            close()
    _BUILT.clear()


@pytest.fixture(scope="module")
def contract_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`specprefill serve` on 127.0.0.1 with the float32 SmolLM2 that the in-process entries use.

    Its default policy is ``dense``: what the text-mode entry sends is prefilled as it is.
    """
    log = tmp_path_factory.mktemp("contract-server") / "server.log"
    args = ["--model", "smollm2-135m", "--device", "cpu", "--dtype", "float32", "--policy", "dense"]
    server = start_server(args, log)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def prompts(tokenizer: Any, essay: str) -> dict[str, Prompt]:
    """A chat prompt with a system message, a plain-text prompt, and bare ids with a protected mask."""
    chat = [
        {"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": essay[:400] + "\n\nWhat is this text about?"},
    ]
    bare = Prompt.from_token_ids(range(300, 360)).with_protected([i % 7 == 0 for i in range(60)])
    return {"chat": build_prompt(tokenizer, chat), "text": build_prompt(tokenizer, essay[:300]), "bare": bare}


# ----------------------------------------------------------------------------- the list itself
def _exported_classes() -> set[type]:
    found = set()
    for package in (specprefill_sdk, scoring, selection, backends):
        for name in package.__all__:
            value = getattr(package, name)
            if inspect.isclass(value) and not getattr(value, "_is_protocol", False) and not inspect.isabstract(value):
                found.add(value)
    return found


def _kind(cls: type) -> str | None:
    """Which protocol an exported class implements, judged by its methods (as `typing.Protocol` would)."""
    has = lambda *names: all(callable(getattr(cls, n, None)) for n in names)  # noqa: E731
    if has("score", "score_batch"):
        return "Scorer"
    if has("select", "decide_without_scores"):
        return "Selector"
    own = getattr(cls, "generate", None) is not backends.BackendBase.generate  # not the bare mixin
    if has("generate", "stream", "generate_batch", "agenerate", "astream") and hasattr(cls, "max_context") and own:
        return "Backend"
    return None


def test_every_exported_component_is_listed() -> None:
    listed = {"Scorer": SCORERS, "Selector": SELECTORS, "Backend": BACKENDS}
    found: dict[str, set[type]] = {kind: set() for kind in listed}
    for cls in _exported_classes():
        kind = _kind(cls)
        if kind:
            found[kind].add(cls)
    missing = [
        f"{kind} {cls.__module__}.{cls.__qualname__}: add it to tests/contracts.py"
        for kind, classes in found.items()
        for cls in sorted(classes - {e.cls for e in listed[kind]}, key=lambda c: c.__qualname__)
    ]
    assert not missing, "\n".join(missing)
    for kind, entries in listed.items():  # the detection sees every listed class: it is not vacuous
        assert {e.cls for e in entries} <= found[kind], kind
    ids = [e.id for entries in listed.values() for e in entries]
    assert len(set(ids)) == len(ids)


# ----------------------------------------------------------------------------- scorers
@pytest.mark.parametrize("scorer", _params(SCORERS), indirect=True)
def test_scorer_gives_one_finite_float32_score_per_token(scorer: Any, prompts: dict[str, Prompt]) -> None:
    assert isinstance(scorer, Scorer) and isinstance(scorer.name, str) and scorer.name
    for prompt in (prompts["chat"], prompts["bare"]):
        scores = scorer.score(prompt)
        assert isinstance(scores, TokenScores) and scores.scorer == scorer.name
        assert len(scores) == prompt.n and scores.values.shape == (prompt.n,)
        assert scores.values.dtype == torch.float32 and scores.values.device.type == "cpu"
        assert bool(torch.isfinite(scores.values).all())


@pytest.mark.parametrize("scorer", _params(SCORERS), indirect=True)
def test_scorer_batch_equals_single_calls(scorer: Any, prompts: dict[str, Prompt]) -> None:
    batch = [prompts["chat"], prompts["bare"], prompts["chat"]]  # lengths differ; one prompt twice
    together = scorer.score_batch(batch)
    assert isinstance(together, list) and len(together) == len(batch)
    for prompt, scores in zip(batch, together, strict=True):
        single = scorer.score(prompt).values
        assert isinstance(scores, TokenScores) and len(scores) == prompt.n
        err = float((scores.values - single).abs().max())
        assert err <= 1e-4 * max(1.0, float(single.abs().max())), f"batch differs from single by {err}"
    assert scorer.score_batch([]) == []


@pytest.mark.parametrize("scorer", _params(SCORERS), indirect=True)
def test_scorer_errors_are_typed(scorer: Any, prompts: dict[str, Prompt]) -> None:
    with pytest.raises(InvalidRequestError):
        scorer.score(Prompt.from_token_ids([]))
    with pytest.raises(InvalidRequestError):
        scorer.score("not a prompt")
    with pytest.raises(InvalidRequestError):
        scorer.score_batch([prompts["bare"], Prompt.from_token_ids([])])


@pytest.mark.parametrize("entry", _params([e for e in SCORERS if e.invalid]), ids=lambda e: e.id)
def test_scorer_refuses_invalid_settings(entry: Entry) -> None:
    for build in entry.invalid:
        with pytest.raises(SpecPrefillError):
            build()


# ----------------------------------------------------------------------------- selectors
def _scores(prompt: Prompt, seed: int) -> list[TokenScores]:
    generator = torch.Generator().manual_seed(seed)
    rand = torch.rand(prompt.n, generator=generator)
    ties = torch.ones(prompt.n)
    with_nan = rand.clone()
    with_nan[::5] = float("nan")
    return [TokenScores(rand), TokenScores(ties), TokenScores(with_nan), TokenScores(-rand * 100)]


@pytest.mark.parametrize("selector", _params(SELECTORS), indirect=True)
def test_selector_gives_a_sorted_selection_that_keeps_protected_tokens(
    selector: Any, prompts: dict[str, Prompt]
) -> None:
    assert isinstance(selector, Selector) and isinstance(selector.name, str) and selector.name
    for seed, prompt in enumerate(prompts.values()):
        for scores in _scores(prompt, seed):
            chosen = selector.select(prompt, scores)
            assert isinstance(chosen, Selection) and chosen.n == prompt.n
            assert 1 <= chosen.kept <= prompt.n
            assert list(chosen.indices) == sorted(set(chosen.indices))
            assert chosen.indices[0] >= 0 and chosen.indices[-1] < prompt.n
            kept = dict(zip(chosen.indices, chosen.protected, strict=True))
            must = [i for i in range(prompt.n) if prompt.protected[i]]
            mask = getattr(selector, "mask", None)
            if callable(mask):  # Protect: what it forces
                must += np.flatnonzero(mask(prompt)).tolist()
            assert all(i in kept and kept[i] for i in must), "a protected token was dropped or not marked"
            assert selector.select(prompt, scores) == chosen  # deterministic


@pytest.mark.parametrize("selector", _params(SELECTORS), indirect=True)
def test_selector_decides_without_scores_as_it_selects(selector: Any, prompts: dict[str, Prompt]) -> None:
    for seed, prompt in enumerate(prompts.values()):
        decided = selector.decide_without_scores(prompt)
        if decided is None:
            continue
        assert isinstance(decided, Selection) and decided.n == prompt.n
        for scores in _scores(prompt, seed):
            chosen = selector.select(prompt, scores)
            assert (chosen.indices, chosen.protected) == (decided.indices, decided.protected)


@pytest.mark.parametrize("selector", _params(SELECTORS), indirect=True)
def test_selector_errors_are_typed(selector: Any, prompts: dict[str, Prompt]) -> None:
    for prompt in prompts.values():
        with pytest.raises(InvalidRequestError):
            selector.select(prompt, TokenScores(torch.ones(prompt.n + 1)))


@pytest.mark.parametrize("entry", _params([e for e in SELECTORS if e.invalid]), ids=lambda e: e.id)
def test_selector_refuses_invalid_settings(entry: Entry) -> None:
    for build in entry.invalid:
        with pytest.raises(SpecPrefillError):
            build()


# ----------------------------------------------------------------------------- backends
GREEDY = SamplingParams(max_tokens=5)


@pytest.fixture(scope="module")
def compressed(prompts: dict[str, Prompt]) -> dict[str, CompressedPrompt]:
    """The chat prompt whole, and with every third token plus its last eight kept."""
    chat = prompts["chat"]
    keep = sorted({*range(0, chat.n, 3), *range(chat.n - 8, chat.n)})
    sparse = Selection(indices=tuple(keep), n=chat.n, protected=(False,) * len(keep))
    return {"dense": CompressedPrompt.dense(chat), "sparse": CompressedPrompt.from_selection(chat, sparse)}


def _same(a: Completion, b: Completion) -> None:
    assert (a.text, a.token_ids, a.finish_reason) == (b.text, b.token_ids, b.finish_reason)


def reference_greedy(loaded: Any, prompt: CompressedPrompt, steps: int, start: int) -> list[int]:
    """Greedy tokens of the kept ids prefilled at their positions, decoded at ``start``, ``start + 1``, ..."""
    from transformers import DynamicCache

    model = loaded.model
    k = prompt.kept
    cache = {cache_argument(model): DynamicCache(config=model.config)}
    mask = torch.tril(torch.ones(k, k, dtype=torch.bool))[None, None]
    out: list[int] = []
    with torch.inference_mode():
        logits = model(
            input_ids=torch.tensor([prompt.token_ids]),
            position_ids=torch.tensor([prompt.position_ids]),
            attention_mask=mask,
            use_cache=True,
            **cache,
        ).logits[0, -1]
        for step in range(steps):
            token = int(logits.argmax())
            out.append(token)
            if token in loaded.eos_token_ids:
                break
            logits = model(
                input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[start + step]]), use_cache=True, **cache
            ).logits[0, -1]
    return out


@pytest.mark.parametrize("backend", _params(BACKENDS), indirect=True)
def test_backend_declares_what_it_is(backend: Any) -> None:
    assert isinstance(backend, Backend)
    assert isinstance(backend.capabilities, BackendCapabilities)
    assert isinstance(backend.model_name, str) and backend.model_name
    assert isinstance(backend.max_context, int) and backend.max_context > 0
    assert callable(getattr(backend.tokenizer, "decode", None))


@pytest.mark.parametrize("backend", _params(BACKENDS), indirect=True)
def test_backend_generate_and_stream_agree_and_count_usage(
    backend: Any, compressed: dict[str, CompressedPrompt]
) -> None:
    for prompt in compressed.values():
        completion = backend.generate(prompt, GREEDY)
        assert isinstance(completion, Completion) and isinstance(completion.text, str) and completion.text
        assert all(isinstance(t, int) for t in completion.token_ids)
        assert completion.finish_reason in ("stop", "length")
        assert 1 <= len(completion.token_ids) <= GREEDY.max_tokens
        if completion.finish_reason == "length":
            assert len(completion.token_ids) == GREEDY.max_tokens
        usage = completion.usage
        assert (usage.prompt_tokens, usage.kept_tokens) == (prompt.n, prompt.kept)
        assert usage.completion_tokens == len(completion.token_ids)

        chunks = list(backend.stream(prompt, GREEDY))
        assert all(isinstance(c, CompletionChunk) for c in chunks)
        assert chunks[-1].finish_reason == completion.finish_reason and chunks[-1].completion is not None
        assert all(c.finish_reason is None for c in chunks[:-1])
        assert "".join(c.text for c in chunks) == completion.text
        _same(chunks[-1].completion, completion)


@pytest.mark.parametrize("backend", _params(BACKENDS), indirect=True)
def test_backend_batch_and_async_forms_equal_generate(backend: Any, compressed: dict[str, CompressedPrompt]) -> None:
    prompts = [compressed["sparse"], compressed["dense"]]
    singles = [backend.generate(p, GREEDY) for p in prompts]
    batch = backend.generate_batch(prompts, GREEDY)
    assert isinstance(batch, list) and len(batch) == len(prompts)
    for a, b in zip(batch, singles, strict=True):
        _same(a, b)
        assert a.usage == b.usage

    async def both() -> tuple[Completion, list[CompletionChunk]]:
        completion = await backend.agenerate(prompts[0], GREEDY)
        return completion, [chunk async for chunk in backend.astream(prompts[0], GREEDY)]

    completion, chunks = asyncio.run(both())
    _same(completion, singles[0])
    assert "".join(c.text for c in chunks) == singles[0].text and chunks[-1].completion is not None
    _same(chunks[-1].completion, singles[0])


@pytest.mark.parametrize("backend", _params([e for e in BACKENDS if e.exact]), indirect=True)
def test_backend_decodes_from_position_n(
    backend: Any, compressed: dict[str, CompressedPrompt], smollm_fp32: Any
) -> None:
    prompt = compressed["sparse"]
    assert backend.capabilities.supports_position_ids
    expected = reference_greedy(smollm_fp32, prompt, GREEDY.max_tokens, start=prompt.n)
    assert expected != reference_greedy(smollm_fp32, prompt, GREEDY.max_tokens, start=prompt.kept)  # it matters
    assert list(backend.generate(prompt, GREEDY).token_ids) == expected


@pytest.fixture(scope="module")
def at_eos(tokenizer: Any) -> CompressedPrompt:
    """A chat whose assistant answer is complete but for its end token: the greedy next token is EOS."""
    chat = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello! How can I help you?"}]
    ids = list(build_prompt(tokenizer, chat, add_generation_prompt=False).token_ids)
    end = max(i for i, t in enumerate(ids) if t == tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return CompressedPrompt.dense(Prompt.from_token_ids(ids[:end]))


@pytest.mark.parametrize("backend", _params(BACKENDS), indirect=True)
def test_backend_generates_past_eos_when_asked(backend: Any, at_eos: CompressedPrompt) -> None:
    stops = backend.generate(at_eos, SamplingParams(max_tokens=3))
    assert stops.finish_reason == "stop" and stops.usage.completion_tokens < 3  # EOS comes next
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    goes_on = backend.generate(at_eos, params)
    assert goes_on.finish_reason == "length" and goes_on.usage.completion_tokens == 3
    last = list(backend.stream(at_eos, params))[-1].completion
    assert last is not None and last.finish_reason == "length" and last.usage.completion_tokens == 3


@pytest.mark.parametrize("backend", _params(BACKENDS), indirect=True)
def test_backend_errors_are_typed(backend: Any, compressed: dict[str, CompressedPrompt]) -> None:
    prompt = compressed["dense"]
    with pytest.raises(InvalidRequestError):
        backend.generate("not a prompt", GREEDY)
    with pytest.raises(ContextTooLongError):
        backend.generate(prompt, SamplingParams(max_tokens=backend.max_context))
    with pytest.raises(ContextTooLongError):
        list(backend.stream(prompt, SamplingParams(max_tokens=backend.max_context)))
    if backend.capabilities.supports_position_ids:
        limit = backend.max_context
        with pytest.raises(ContextTooLongError):
            backend.generate(CompressedPrompt((1, 2), (0, limit + 5), limit + 6), GREEDY)
        with pytest.raises(InvalidRequestError):
            backend.generate(CompressedPrompt((1, 10**7), (0, 1), 2), GREEDY)
