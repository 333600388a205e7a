"""The SpecPrefill method: token importance from a small draft model's attention.

- `scorer`: `DraftAttentionScorer`, prefill + greedy look-ahead, scored layer by layer or at once;
- `hook`: the attention implementation that reads the draft's post-RoPE queries and keys;
- `lookahead`: the fixed buffers (and CUDA graph) of drafts whose every layer attends globally;
- `incremental`: `DraftSession`, a draft's KV cache kept across the turns of a conversation;
- `reference`: `reference_draft_attention_scores`, the slow, direct computation to check against.

Example::

    from specprefill_sdk.scoring.draft_attention import DraftAttentionScorer, DraftSession
    session = DraftSession(DraftAttentionScorer("smollm2-135m"))
"""

from __future__ import annotations

from .incremental import DraftSession
from .reference import greedy_look_ahead, reference_draft_attention_scores
from .scorer import AGGREGATIONS, QUERY_REDUCTIONS, DraftAttentionScorer, check_aggregation, check_queries

__all__ = [
    "AGGREGATIONS",
    "QUERY_REDUCTIONS",
    "DraftAttentionScorer",
    "DraftSession",
    "check_aggregation",
    "check_queries",
    "greedy_look_ahead",
    "reference_draft_attention_scores",
]
