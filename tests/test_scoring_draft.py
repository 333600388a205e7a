"""`DraftAttentionScorer` and `SelfInformationScorer` on real and tiny random drafts, against slow references."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from tiny_models import tiny_model

from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.eval.corpora import haystack
from specprefill_sdk.models import LoadedModel
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.scoring import DraftAttentionScorer, SelfInformationScorer
from specprefill_sdk.scoring._alignment import project_scores
from specprefill_sdk.scoring.draft_attention import greedy_look_ahead, reference_draft_attention_scores
from specprefill_sdk.types import Prompt

pytestmark = pytest.mark.slow

RTOL = 1e-4


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Within 1e-4 relative to the largest score (scores far below the peak are ~1e-4 of it anyway)."""
    assert actual.shape == expected.shape and actual.dtype == torch.float32
    err = float((actual - expected).abs().max())
    assert err <= RTOL * float(expected.abs().max()), f"max abs error {err} vs peak {float(expected.abs().max())}"


@pytest.fixture(scope="module")
def texts():
    return [haystack(500, start=2), haystack(350, start=5), haystack(650, start=9)]


@pytest.fixture(scope="module")
def fp32_scorer(smollm_fp32):
    return DraftAttentionScorer(smollm_fp32)


def test_smollm_scores_match_the_eager_reference(fp32_scorer, smollm_fp32, texts):
    prompt = build_prompt(smollm_fp32.tokenizer, [{"role": "user", "content": texts[0] + "\nWhat is this about?"}])
    scores = fp32_scorer.score(prompt)
    expected, continuation = reference_draft_attention_scores(smollm_fp32, prompt.token_ids)
    assert scores.info["look_ahead_token_ids"] == tuple(continuation)
    assert scores.info["look_ahead"] == 1 + len(continuation) == 8
    assert scores.info["draft"] == "smollm2-135m" and scores.info["n"] == prompt.n
    assert scores.info["projected"] is False
    assert_matches(scores.values, expected)


@pytest.mark.parametrize("kind", ["qwen2", "gemma3", "gemma3-sliding"])
def test_tiny_models_match_the_eager_reference(kind, tokenizer, texts):
    loaded = tiny_model(kind, tokenizer)
    scorer = DraftAttentionScorer(loaded, look_ahead=6, pool_kernel=5)
    prompts = [build_prompt(tokenizer, t) for t in texts]
    assert all(p.n > 4 * 16 for p in prompts)  # longer than the sliding window
    for prompt, scores in zip(prompts, scorer.score_batch(prompts), strict=True):
        expected, continuation = reference_draft_attention_scores(loaded, prompt.token_ids, look_ahead=6, pool_kernel=5)
        assert scores.info["look_ahead_token_ids"] == tuple(continuation)
        assert_matches(scores.values, expected)


def test_look_ahead_one_reads_the_last_prompt_token_only(fp32_scorer, smollm_fp32, texts):
    prompt = build_prompt(smollm_fp32.tokenizer, texts[1])
    scores = fp32_scorer.with_options(look_ahead=1).score(prompt)
    assert scores.info["look_ahead"] == 1 and scores.info["look_ahead_token_ids"] == ()
    expected, _ = reference_draft_attention_scores(smollm_fp32, prompt.token_ids, look_ahead=1)
    assert_matches(scores.values, expected)


def test_with_options_shares_the_model_and_changes_the_settings(fp32_scorer):
    other = fp32_scorer.with_options(look_ahead=3, pool_kernel=1)
    assert other.loaded is fp32_scorer.loaded and other.model_name == "smollm2-135m"
    assert (other.look_ahead, other.pool_kernel) == (3, 1)
    assert (fp32_scorer.look_ahead, fp32_scorer.pool_kernel) == (8, 13)
    with pytest.raises(InvalidRequestError):
        fp32_scorer.with_options(look_ahead=0)
    with pytest.raises(InvalidRequestError):
        fp32_scorer.with_options(pool_kernel=-1)


@dataclass
class _WithEos(LoadedModel):
    eos: tuple[int, ...] = ()

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.eos


def test_look_ahead_stops_at_an_end_of_sequence_id(tokenizer, texts):
    loaded = tiny_model("qwen2", tokenizer)
    prompt = build_prompt(tokenizer, texts[0])
    free = greedy_look_ahead(_WithEos(**vars(loaded)), prompt.token_ids, 8)
    assert len(free) == 7
    stop = free[2]  # the third look-ahead token ends the sequence: queries = last prompt token + 2
    first = free.index(stop)
    with_eos = _WithEos(**vars(loaded), eos=(stop,))
    scores = DraftAttentionScorer(with_eos).score(prompt)
    assert scores.info["look_ahead"] == 1 + first and scores.info["look_ahead_token_ids"] == tuple(free[:first])
    expected, _ = reference_draft_attention_scores(with_eos, prompt.token_ids, look_ahead=8)
    assert_matches(scores.values, expected)
    # the same as asking for that many queries without an end-of-sequence id
    assert_matches(DraftAttentionScorer(loaded, look_ahead=1 + first).score(prompt).values, scores.values)


def test_a_batch_of_different_lengths_equals_single_calls(fp32_scorer, smollm_fp32, texts):
    tok = smollm_fp32.tokenizer
    prompts = [build_prompt(tok, [{"role": "user", "content": t + "\nSummarize."}]) for t in texts]
    assert len({p.n for p in prompts}) == 3
    batch = fp32_scorer.score_batch(prompts)
    assert [len(s) for s in batch] == [p.n for p in prompts]
    for prompt, scores in zip(prompts, batch, strict=True):
        single = fp32_scorer.score(prompt)
        assert scores.info["look_ahead_token_ids"] == single.info["look_ahead_token_ids"]
        assert_matches(scores.values, single.values)


def test_the_draft_refuses_ids_outside_its_vocabulary(fp32_scorer):
    with pytest.raises(InvalidRequestError):
        fp32_scorer.score(Prompt.from_token_ids([1, 2, 10**6]))
    with pytest.raises(InvalidRequestError):
        fp32_scorer.score(Prompt.from_token_ids([]))


def test_the_reference_leaves_the_shared_model_hooked(fp32_scorer, smollm_fp32):
    reference_draft_attention_scores(smollm_fp32, [1, 2, 3, 4], look_ahead=2)
    assert smollm_fp32.model.config._attn_implementation == "specprefill_sdpa"


def test_a_draft_with_another_tokenizer_projects_by_characters(tokenizer, texts):
    from specprefill_sdk.errors import ModelLoadError
    from specprefill_sdk.models import load_model

    try:
        gemma = load_model("gemma3-270m", device="cpu", dtype="float32", progress=False)
    except ModelLoadError as exc:  # the model packages are optional (and large)
        pytest.skip(f"gemma3-270m is not available: {exc}")
    assert gemma.tokenizer.get_vocab() != tokenizer.get_vocab()
    prompt = build_prompt(tokenizer, texts[1])  # SmolLM2's tokens
    own = build_prompt(gemma.tokenizer, texts[1])  # the same text in Gemma's tokens
    plain = DraftAttentionScorer(gemma)
    own_scores = plain.score(own)
    assert own_scores.info["projected"] is False
    expected = project_scores(own_scores.values, own.offsets, prompt.offsets)
    for scorer in (DraftAttentionScorer(gemma, target_tokenizer=tokenizer), plain):
        scores = scorer.score(prompt)
        assert scores.info["projected"] is True and len(scores) == prompt.n
        assert scores.info["draft_tokens"] == own.n
        assert_matches(scores.values, expected)


def test_self_information_matches_a_direct_computation(smollm_fp32, texts):
    prompt = build_prompt(smollm_fp32.tokenizer, texts[1])
    scores = SelfInformationScorer(smollm_fp32, chunk_size=37).score(prompt)  # chunks cut the prompt
    ids = prompt.ids_tensor()[None]
    with torch.inference_mode():
        logp = torch.log_softmax(smollm_fp32.model(ids).logits[0].float(), dim=-1)
    expected = -logp[:-1].gather(1, ids[0, 1:, None])[:, 0]
    torch.testing.assert_close(scores.values[1:], expected, rtol=1e-4, atol=1e-4)
    assert float(scores.values[0]) == float(scores.values[1:].max())
    assert scores.scorer == "self-information" and scores.info["projected"] is False


def test_self_information_finds_repeated_text_predictable(smollm):
    sentence = "The quick brown fox jumps over the lazy dog near the quiet river bank at dawn."
    prompt = build_prompt(smollm.tokenizer, sentence + " " + sentence)
    values = SelfInformationScorer(smollm).score_batch([prompt])[0].values
    half = prompt.n // 2
    assert float(values[half + 2 :].mean()) < 0.5 * float(values[1:half].mean())


def test_fixed_buffer_look_ahead_equals_step_by_step_decoding(fp32_scorer, smollm_fp32, texts):
    """Global-attention drafts decode over fixed buffers and score all look-ahead queries at once."""
    assert fp32_scorer._fixed_buffers  # SmolLM2 (Llama): every layer attends globally
    stepwise = fp32_scorer.with_options()
    stepwise._fixed_buffers = False  # the growing-cache path that windowed models take
    tok = smollm_fp32.tokenizer
    prompts = [build_prompt(tok, [{"role": "user", "content": t + "\nSummarize."}]) for t in texts]
    fixed, grown = fp32_scorer.score_batch(prompts), stepwise.score_batch(prompts)
    for a, b in zip(fixed, grown, strict=True):
        assert a.info["look_ahead"] == b.info["look_ahead"] == 8
        assert a.info["look_ahead_token_ids"] == b.info["look_ahead_token_ids"]
        assert_matches(a.values, b.values)
    assert fp32_scorer._runner is None  # buffers are kept between calls only for CUDA graphs


def test_look_ahead_steps_run_under_the_scorers_attention_kernels(fp32_scorer, smollm_fp32, texts, monkeypatch):
    """The prefill and every look-ahead step run inside `sdpa_context` (a compiled step keeps its traced kernel)."""
    import contextlib

    from specprefill_sdk.scoring.draft_attention import lookahead, scorer

    active = []
    seen: dict[str, list[bool]] = {"prefill": [], "run": []}

    @contextlib.contextmanager
    def recording_context(names, device):
        assert names == fp32_scorer.execution.attention_backends and device == smollm_fp32.device
        active.append(True)
        try:
            yield
        finally:
            active.pop()

    def recorded(name):
        original = getattr(lookahead.FixedBufferLookAhead, name)

        def call(self, *args, **kwargs):
            seen[name].append(bool(active))
            return original(self, *args, **kwargs)

        return call

    monkeypatch.setattr(scorer, "sdpa_context", recording_context)
    for name in seen:
        monkeypatch.setattr(lookahead.FixedBufferLookAhead, name, recorded(name))
    prompt = build_prompt(smollm_fp32.tokenizer, [{"role": "user", "content": texts[1] + "\nSummarize."}])
    assert fp32_scorer.score(prompt).info["look_ahead"] == 8
    assert seen == {"prefill": [True], "run": [True]}


def test_windowed_drafts_keep_the_step_by_step_path(tokenizer):
    assert not DraftAttentionScorer(tiny_model("gemma3", tokenizer), look_ahead=3)._fixed_buffers
    assert DraftAttentionScorer(tiny_model("qwen2", tokenizer), look_ahead=3)._fixed_buffers


def test_the_first_layers_only_match_the_reference_and_the_rest_never_runs(fp32_scorer, smollm_fp32, texts):
    model = smollm_fp32.model
    depth = model.config.num_hidden_layers
    scorer = fp32_scorer.with_options(look_ahead=1, layers=12)
    assert scorer.layers == 12 and "layers=12" in repr(scorer)
    tok = smollm_fp32.tokenizer
    prompts = [build_prompt(tok, [{"role": "user", "content": t + "\nSummarize."}]) for t in texts]
    ran: list[str] = []
    hooks = [
        model.model.layers[i].register_forward_pre_hook(lambda *_, i=i: ran.append(f"layer {i}")) for i in (11, 12)
    ]
    hooks.append(model.lm_head.register_forward_pre_hook(lambda *_: ran.append("head")))
    try:
        batch = scorer.score_batch(prompts)
        assert ran == ["layer 11"]  # one batch; layer 12 and the output head never ran
        ran.clear()
        model(torch.tensor([prompts[0].token_ids[:8]]))  # outside a scoring call the whole model runs
        assert ran == ["layer 11", "layer 12", "head"]
    finally:
        for h in hooks:
            h.remove()
    for prompt, scores in zip(prompts, batch, strict=True):
        expected, _ = reference_draft_attention_scores(smollm_fp32, prompt.token_ids, look_ahead=1, layers=12)
        assert scores.info["layers"] == 12 and scores.info["look_ahead"] == 1
        assert_matches(scores.values, expected)
        assert_matches(scorer.score(prompt).values, scores.values)
    # every layer: the same as not asking
    full = fp32_scorer.with_options(look_ahead=1, layers=depth)
    assert full.layers is None
    assert_matches(full.score(prompts[0]).values, fp32_scorer.with_options(look_ahead=1).score(prompts[0]).values)


@pytest.mark.parametrize(("kind", "layers"), [("qwen2", 2), ("gemma3", 2), ("gemma3", 3), ("gemma3-sliding", 2)])
def test_the_first_layers_of_tiny_models_match_the_reference(kind, layers, tokenizer, texts):
    loaded = tiny_model(kind, tokenizer)
    scorer = DraftAttentionScorer(loaded, look_ahead=1, pool_kernel=5, layers=layers)
    prompts = [build_prompt(tokenizer, t) for t in texts]
    for prompt, scores in zip(prompts, scorer.score_batch(prompts), strict=True):
        expected, _ = reference_draft_attention_scores(
            loaded, prompt.token_ids, look_ahead=1, pool_kernel=5, layers=layers
        )
        assert_matches(scores.values, expected)


def test_bad_layer_counts_are_refused(fp32_scorer, tokenizer):
    depth = fp32_scorer.loaded.model.config.num_hidden_layers
    for bad in (0, -1, depth + 1, True, 2.5, "3"):
        with pytest.raises(InvalidRequestError, match="layers must be an integer") as info:
            fp32_scorer.with_options(look_ahead=1, layers=bad)
        assert info.value.param == "layers"
    with pytest.raises(InvalidRequestError, match="needs look_ahead=1"):
        fp32_scorer.with_options(layers=4)  # look-ahead 8
    with pytest.raises(InvalidRequestError, match="needs look_ahead=1"):
        fp32_scorer.with_options(look_ahead=1, layers=4).with_options(look_ahead=2)
    with pytest.raises(InvalidRequestError, match="sliding window"):
        DraftAttentionScorer(tiny_model("gemma3", tokenizer), look_ahead=1, layers=1)


@pytest.mark.parametrize("aggregation", ["mean", "content-mean"])
def test_other_aggregations_match_the_eager_reference(fp32_scorer, smollm_fp32, texts, aggregation):
    prompt = build_prompt(smollm_fp32.tokenizer, [{"role": "user", "content": texts[0] + "\nWhat is this about?"}])
    scores = fp32_scorer.with_options(aggregation=aggregation).score(prompt)
    expected, _ = reference_draft_attention_scores(smollm_fp32, prompt.token_ids, aggregation=aggregation)
    assert_matches(scores.values, expected)
    shallow = fp32_scorer.with_options(look_ahead=1, layers=10, aggregation=aggregation).score(prompt)
    expected, _ = reference_draft_attention_scores(
        smollm_fp32, prompt.token_ids, look_ahead=1, layers=10, aggregation=aggregation
    )
    assert_matches(shallow.values, expected)


@pytest.fixture(scope="module")
def short_prompts(smollm_fp32):
    tok = smollm_fp32.tokenizer
    return [build_prompt(tok, haystack(300, start=3) + "\nWhat is this about?"), build_prompt(tok, haystack(180))]


@pytest.mark.parametrize("lean", [True, False])
def test_the_max_over_the_queries_matches_the_eager_reference(smollm_fp32, short_prompts, lean):
    """Batched (left-padded) and single scoring, through the lean passes and through the model's forward."""
    from specprefill_sdk.runtime.settings import ExecutionSettings

    scorer = DraftAttentionScorer(smollm_fp32, look_ahead=4, queries="max", execution=ExecutionSettings(lean=lean))
    assert len({p.n for p in short_prompts}) == 2
    for prompt, scores in zip(short_prompts, scorer.score_batch(short_prompts), strict=True):
        expected, continuation = reference_draft_attention_scores(
            smollm_fp32, prompt.token_ids, look_ahead=4, queries="max"
        )
        assert scores.info["queries"] == "max" and scores.info["look_ahead"] == 1 + len(continuation) == 4
        assert_matches(scores.values, expected)
        mean, _ = reference_draft_attention_scores(smollm_fp32, prompt.token_ids, look_ahead=4)
        assert float((expected - mean).abs().max()) > 1e-3 * float(expected.max())  # the option changes the scores
        assert bool((expected >= mean - 1e-7).all())  # a max is at least the mean
    session = scorer.new_session()
    assert_matches(session.score(short_prompts[0]).values, scorer.score(short_prompts[0]).values)


@pytest.mark.parametrize("layers", [6, None])
def test_the_last_layer_aggregation_matches_the_eager_reference(smollm_fp32, short_prompts, layers):
    scorer = DraftAttentionScorer(smollm_fp32, look_ahead=1 if layers else 3, layers=layers, aggregation="last-layer")
    depth = scorer.depth
    assert scorer.last_layer == (layers or depth) - 1
    for prompt, scores in zip(short_prompts, scorer.score_batch(short_prompts), strict=True):
        expected, _ = reference_draft_attention_scores(
            smollm_fp32, prompt.token_ids, look_ahead=scorer.look_ahead, layers=layers, aggregation="last-layer"
        )
        assert scores.info["aggregation"] == "last-layer"
        assert_matches(scores.values, expected)
        # one layer votes: not the mean over every layer up to it
        mean, _ = reference_draft_attention_scores(
            smollm_fp32, prompt.token_ids, look_ahead=scorer.look_ahead, layers=layers, aggregation="mean"
        )
        assert float((expected - mean).abs().max()) > 1e-3 * float(expected.max())
    session = scorer.new_session()
    assert_matches(session.score(short_prompts[1]).values, scorer.score(short_prompts[1]).values)


def test_a_step_by_step_draft_supports_both_options(tokenizer, texts):
    """gemma3 (windowed layers next to global ones) decodes over a growing cache, layer by layer."""
    loaded = tiny_model("gemma3", tokenizer)
    prompt = build_prompt(tokenizer, texts[1])
    scorer = DraftAttentionScorer(loaded, look_ahead=4, pool_kernel=5, queries="max", aggregation="last-layer")
    assert scorer.last_layer is not None and scorer.last_layer not in scorer._skip
    expected, _ = reference_draft_attention_scores(
        loaded, prompt.token_ids, look_ahead=4, pool_kernel=5, queries="max", aggregation="last-layer"
    )
    assert_matches(scorer.score(prompt).values, expected)
    assert_matches(scorer.new_session().score(prompt).values, expected)
