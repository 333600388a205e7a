"""A planted fact in ~1.6K tokens of essays survives a 0.2 keep rate chosen by the draft's attention.

SmolLM2 answers "What is the secret passphrase ...?" by first restating the question ("The secret
passphrase of the lighthouse keeper is", 9 tokens) and only then the value. With the paper's look-ahead
of 8 the queries end before the value, so the restated part of the fact ranks at the very top but the
value's tail ("-42.") does not (token-level recall 0.78-0.94 over five depths). A look-ahead of 16
reaches the value: recall 1.0 at every depth tried. The test uses 16 and says why.
"""

from __future__ import annotations

import pytest
import torch

from specprefill_sdk.eval.corpora import haystack
from specprefill_sdk.prompt import build_prompt
from specprefill_sdk.scoring import DraftAttentionScorer, RandomScorer
from specprefill_sdk.selection import KeepRate

pytestmark = pytest.mark.slow

FACT = "The secret passphrase of the lighthouse keeper is BLUE-HERON-42."
QUESTION = "What is the secret passphrase of the lighthouse keeper?"
KEEP = 0.2


def _needle_prompt(tokenizer, depth: float):
    text = haystack(6500)
    cut = text.rfind(". ", 0, int(len(text) * depth)) + 2
    document = text[:cut] + FACT + " " + text[cut:]
    prompt = build_prompt(tokenizer, [{"role": "user", "content": f"{document}\n\n{QUESTION}"}])
    start = prompt.text.index(FACT)
    end = start + len(FACT)
    fact_tokens = [i for i, (a, b) in enumerate(prompt.offsets) if a < end and b > start]
    return prompt, fact_tokens


def _recall(selection, fact_tokens) -> float:
    kept = set(selection.indices)
    return sum(i in kept for i in fact_tokens) / len(fact_tokens)


@pytest.fixture(scope="module")
def scorer(smollm):
    return DraftAttentionScorer(smollm, look_ahead=16)


@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
def test_the_planted_fact_is_kept_at_keep_rate_0_2(scorer, smollm, depth):
    prompt, fact_tokens = _needle_prompt(smollm.tokenizer, depth)
    assert 1400 <= prompt.n <= 1800 and len(fact_tokens) >= 15
    selector = KeepRate(KEEP)
    scores = scorer.score(prompt)
    assert scores.values.dtype == torch.float32 and len(scores) == prompt.n  # a bf16 draft, fp32 scores
    chosen = selector.select(prompt, scores)
    assert chosen.kept == pytest.approx(KEEP * prompt.n, abs=1)
    # the draft is answering from the fact: its look-ahead contains the passphrase
    continuation = smollm.tokenizer.decode(list(scores.info["look_ahead_token_ids"]))
    assert "BLUE-HERON" in continuation
    recall = _recall(chosen, fact_tokens)
    assert recall >= 0.9, f"kept {recall:.0%} of the fact at depth {depth}"
    baseline = _recall(selector.select(prompt, RandomScorer(seed=0).score(prompt)), fact_tokens)
    assert baseline <= 0.5 and recall - baseline >= 0.5
