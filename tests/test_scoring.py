"""Scorers without a real model: baselines, pooling, the attention hook, score projection, errors."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from specprefill_sdk.errors import InvalidRequestError
from specprefill_sdk.interfaces import Scorer
from specprefill_sdk.scoring import HeadTailScorer, RandomScorer, RecencyScorer, UniformScorer
from specprefill_sdk.scoring._alignment import DraftTokens, project_scores, to_draft_tokens
from specprefill_sdk.scoring.draft_attention.hook import (
    QueryRecorder,
    ScoreCollector,
    install,
    pool_rows,
    skipped_layers,
)
from specprefill_sdk.types import Prompt


def _prompt(n: int, start: int = 0) -> Prompt:
    return Prompt.from_token_ids(range(start, start + n))


# --- baselines ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("scorer", [UniformScorer(), RandomScorer(3), RecencyScorer(), HeadTailScorer(0.3)])
def test_baselines_fit_the_scorer_protocol(scorer):
    assert isinstance(scorer, Scorer)
    prompts = [_prompt(17), _prompt(5, start=100), _prompt(40, start=7)]
    batch = scorer.score_batch(prompts)
    for p, s in zip(prompts, batch, strict=True):
        assert s.values.dtype == torch.float32 and len(s) == p.n
        assert s.scorer == scorer.name
        assert torch.equal(s.values, scorer.score(p).values)


def test_uniform_gives_every_token_the_same_score():
    assert torch.equal(UniformScorer().score(_prompt(9)).values, torch.ones(9))


def test_random_is_reproducible_and_depends_on_seed_and_prompt():
    p = _prompt(200)
    a, b = RandomScorer(seed=1).score(p).values, RandomScorer(seed=1).score(p).values
    assert torch.equal(a, b)
    assert not torch.equal(a, RandomScorer(seed=2).score(p).values)
    assert not torch.equal(a, RandomScorer(seed=1).score(_prompt(200, start=1)).values)
    assert float(a.min()) >= 0.0 and float(a.max()) < 1.0


def test_recency_increases_to_one():
    v = RecencyScorer().score(_prompt(10)).values
    assert bool((v[1:] > v[:-1]).all()) and v[-1].item() == 1.0


@pytest.mark.parametrize(("head", "k", "expected_head"), [(0.25, 40, 10), (0.5, 20, 10), (0.0, 30, 0), (1.0, 30, 30)])
def test_head_tail_splits_any_top_k_by_the_head_share(head, k, expected_head):
    n = 100
    kept = HeadTailScorer(head).score(_prompt(n)).values.topk(k).indices
    from_head = int((kept < n // 2).sum())
    assert abs(from_head - expected_head) <= 1
    # what is kept is a prefix and a suffix
    front = sorted(i for i in kept.tolist() if i < n // 2)
    back = sorted(i for i in kept.tolist() if i >= n // 2)
    assert front == list(range(len(front)))
    assert back == list(range(n - len(back), n))


@pytest.mark.parametrize(
    "make", [lambda: RandomScorer(seed="1"), lambda: HeadTailScorer(1.5), lambda: HeadTailScorer(-0.1)]
)
def test_baselines_reject_bad_settings(make):
    with pytest.raises(InvalidRequestError):
        make()


def test_scorers_reject_empty_prompts_and_non_prompts():
    with pytest.raises(InvalidRequestError):
        RecencyScorer().score(Prompt.from_token_ids([]))
    with pytest.raises(InvalidRequestError):
        UniformScorer().score([1, 2, 3])  # type: ignore[arg-type]


# --- pooling -----------------------------------------------------------------------------------------


def test_pooling_equals_avg_pool_without_counting_padding():
    rows = torch.rand(2, 3, 50)
    valid = torch.ones(2, 1, 50, dtype=torch.bool)
    expected = F.avg_pool1d(rows, 13, stride=1, padding=6, count_include_pad=False)
    torch.testing.assert_close(pool_rows(rows, valid, 13), expected)


def test_pooling_does_not_damp_edges():
    rows = torch.full((1, 1, 30), 0.5)
    pooled = pool_rows(rows, torch.ones(1, 1, 30, dtype=torch.bool), 13)
    torch.testing.assert_close(pooled, rows)  # a constant row stays constant up to both ends


def test_pooling_ignores_left_padding_columns():
    row = torch.rand(1, 1, 20)
    padded = torch.cat([torch.zeros(1, 1, 7), row], dim=-1)
    valid = torch.arange(27)[None, None, :] >= 7
    alone = pool_rows(row, torch.ones(1, 1, 20, dtype=torch.bool), 13)
    torch.testing.assert_close(pool_rows(padded, valid, 13)[..., 7:], alone)


def test_pooling_even_kernel_keeps_length_and_kernel_one_is_identity():
    rows = torch.rand(1, 2, 11)
    valid = torch.ones(1, 1, 11, dtype=torch.bool)
    assert pool_rows(rows, valid, 4).shape == rows.shape
    assert torch.equal(pool_rows(rows, valid, 1), rows)
    # column 5 with kernel 4 averages columns 3..6
    torch.testing.assert_close(pool_rows(rows, valid, 4)[..., 5], rows[..., 3:7].mean(-1))


# --- projection between tokenizers -------------------------------------------------------------------


def test_projection_takes_the_max_of_overlapping_draft_tokens_and_the_nearest_for_empty_spans():
    draft_offsets = [(0, 0), (0, 3), (3, 5), (5, 9)]  # a BOS, then three pieces
    scores = torch.tensor([9.0, 1.0, 2.0, 3.0])
    target_offsets = [(0, 0), (0, 4), (4, 9), (9, 9)]
    out = project_scores(scores, draft_offsets, target_offsets)
    assert out.dtype == torch.float32
    assert out.tolist() == [9.0, 2.0, 3.0, 3.0]


def test_projection_gives_a_target_token_inside_one_draft_token_that_token_score():
    out = project_scores(torch.tensor([0.1, 0.7]), [(0, 4), (4, 10)], [(0, 2), (2, 4), (4, 6), (6, 10)])
    torch.testing.assert_close(out, torch.tensor([0.1, 0.1, 0.7, 0.7]))


def test_draft_tokens_read_ids_directly_without_text_and_refuse_unknown_ids():
    class NoTokenizer:
        bos_token = None

    p = _prompt(5, start=10)
    assert to_draft_tokens(p, NoTokenizer(), vocab_size=100, same_vocab=None) == DraftTokens(ids=p.token_ids)
    with pytest.raises(InvalidRequestError):
        to_draft_tokens(p, NoTokenizer(), vocab_size=12, same_vocab=None)
    with pytest.raises(InvalidRequestError):
        to_draft_tokens(p, NoTokenizer(), vocab_size=100, same_vocab=False)  # nothing to re-tokenize


# --- the attention hook on a tiny random model --------------------------------------------------------


def _tiny_qwen2(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(config).eval()


def test_hooked_model_computes_exactly_what_sdpa_computes():
    plain, hooked = _tiny_qwen2(), _tiny_qwen2()
    install(hooked)
    assert hooked.config._attn_implementation == "specprefill_sdpa"
    install(hooked)  # idempotent
    ids = torch.randint(0, 512, (2, 23))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with torch.inference_mode():
        assert torch.equal(plain(ids).logits, hooked(ids).logits)
        assert torch.equal(plain(ids, attention_mask=mask).logits, hooked(ids, attention_mask=mask).logits)


def test_hook_reports_only_to_the_thread_that_scores():
    model = _tiny_qwen2()
    install(model)
    collector = ScoreCollector(
        pad=torch.zeros(1, dtype=torch.long),
        prompt_len=9,
        num_queries=1,
        pool_kernel=1,
        skip=frozenset(),
        device=torch.device("cpu"),
    )
    ids = torch.randint(0, 512, (1, 9))
    with collector.active():
        worker = threading.Thread(target=lambda: model(ids))
        worker.start()
        worker.join()
    assert not collector.layers_seen and float(collector.best.sum()) == 0.0
    with collector.active(), torch.inference_mode():
        model(ids)
    assert collector.layers_seen == {0, 1}
    # a max over heads and layers of softmax rows: at least one, each entry a probability
    assert float(collector.best.sum()) >= 1.0 - 1e-6 and float(collector.best.max()) <= 1.0


def test_sliding_layers_are_skipped_only_next_to_full_layers():
    from transformers import Gemma3TextConfig, MistralConfig, Qwen2Config

    gemma = Gemma3TextConfig(num_hidden_layers=6, sliding_window=16)
    assert skipped_layers(gemma) == frozenset({0, 1, 2, 3, 4})
    assert skipped_layers(Gemma3TextConfig(num_hidden_layers=2, layer_types=["sliding_attention"] * 2)) == frozenset()
    assert skipped_layers(Qwen2Config(num_hidden_layers=3)) == frozenset()
    assert skipped_layers(MistralConfig(num_hidden_layers=3)) == frozenset()


@pytest.mark.parametrize(("group_elements", "skip"), [(1 << 24, frozenset()), (1, frozenset({1})), (3000, frozenset())])
def test_stacked_reduction_equals_layer_by_layer_and_query_by_query(group_elements, skip):
    """`observe_stacked` (all layers, grouped) gives what `observe` gives one layer and one query at a time."""
    gen = torch.Generator().manual_seed(5)
    layers, batch, heads, kv_heads, count, dim, width = 4, 2, 6, 2, 3, 8, 29
    pad = torch.tensor([0, 7])
    queries = torch.randn(layers, batch, heads, count, dim, generator=gen)
    keys = torch.randn(layers, batch, kv_heads, width + count + 5, dim, generator=gen)  # slots past the prompt
    scalings = [0.3, 0.3, 0.5, 0.3]

    def collector() -> ScoreCollector:
        return ScoreCollector(
            pad=pad, prompt_len=width, num_queries=count, pool_kernel=5, skip=skip, device=torch.device("cpu")
        )

    one_by_one = collector()
    for layer in range(layers):
        module = type("Attention", (), {"layer_idx": layer})()
        for j in range(count):
            one_by_one.begin_step(j)
            q = queries[layer, :, :, j : j + 1]
            k = keys[layer, :, :, : width + j]
            one_by_one.observe(module, q, k, k, scalings[layer], None, None)
    stacked = collector()
    stacked.group_elements = group_elements
    stacked.observe_stacked(queries, keys, scalings)
    torch.testing.assert_close(stacked.best, one_by_one.best, rtol=1e-5, atol=1e-7)
    assert stacked.layers_seen == one_by_one.layers_seen == set(range(layers)) - skip
    assert float(stacked.best[1, :, :5].abs().sum()) == 0.0  # padding beyond the pool's reach scores nothing


@pytest.mark.parametrize("slots", [700, 4096 + 1024, 8192])
def test_one_query_attention_over_a_masked_buffer_equals_sdpa(slots):
    """The look-ahead step's attention (split into blocks on long buffers) is SDPA's, GQA included."""
    gen = torch.Generator().manual_seed(slots)
    query = torch.randn(2, 6, 1, 16, generator=gen)
    key, value = torch.randn(2, 2, slots, 16, generator=gen), torch.randn(2, 2, slots, 16, generator=gen)
    mask = torch.zeros(2, 1, 1, slots)
    mask[0, ..., slots - 100 :] = torch.finfo(torch.float32).min  # unused slots
    mask[1, ..., :37] = torch.finfo(torch.float32).min  # left padding
    out = QueryRecorder.attend(query, key, value, mask, 0.3)
    expected = F.scaled_dot_product_attention(
        query, key.repeat_interleave(3, 1), value.repeat_interleave(3, 1), attn_mask=mask, scale=0.3
    )
    assert out.shape == (2, 1, 6, 16)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=1e-5, atol=1e-6)


def test_scoring_restores_cudnn_attention_that_another_library_turned_off():
    """vLLM calls ``enable_cudnn_sdp(False)`` at import; the scorer's prefill context turns it back on."""
    from specprefill_sdk.runtime.attention import check_attention_backends, sdpa_context

    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        with sdpa_context(check_attention_backends(["cudnn", "flash"]), torch.device("cuda")):
            assert torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
            assert not torch.backends.cuda.math_sdp_enabled()
        assert not torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
        with sdpa_context(check_attention_backends(["cudnn"]), torch.device("cpu")):  # CPU: nothing changes
            assert not torch.backends.cuda.cudnn_sdp_enabled()
        with sdpa_context(None, torch.device("cuda")):
            assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.mark.parametrize("value", [[], ["fast"], ("flash", "vulkan")])
def test_unknown_attention_backends_are_refused(value):
    from specprefill_sdk.runtime.attention import check_attention_backends

    with pytest.raises(InvalidRequestError, match="attention_backends"):
        check_attention_backends(value)
