"""Scorers: one importance score per prompt token.

- `DraftAttentionScorer`: the SpecPrefill method, a draft model's attention while it starts to answer;
- `SelfInformationScorer`: surprisal under the draft (LLMLingua-style baseline);
- `UniformScorer`, `RandomScorer`, `RecencyScorer`, `HeadTailScorer`: model-free baselines;
- `ScoringQueue` and `QueuedScorer`: prompts from many threads scored together in batches.

Example::

    from specprefill_sdk.scoring import DraftAttentionScorer
    scores = DraftAttentionScorer("smollm2-135m").score(prompt)
"""

from __future__ import annotations

from .baselines import HeadTailScorer, RandomScorer, RecencyScorer, UniformScorer
from .draft_attention import DraftAttentionScorer
from .queue import QueuedScorer, ScoringQueue
from .self_information import SelfInformationScorer

__all__ = [
    "DraftAttentionScorer",
    "HeadTailScorer",
    "QueuedScorer",
    "RandomScorer",
    "RecencyScorer",
    "ScoringQueue",
    "SelfInformationScorer",
    "UniformScorer",
]
