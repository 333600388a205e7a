"""A slow, direct implementation of draft-attention scoring, to check `DraftAttentionScorer` against.

It materialises everything the fast scorer avoids: the greedy look-ahead is decoded without a cache,
then one eager forward pass over prompt + look-ahead returns every layer's full attention matrix
(``output_attentions=True``), from which the rows of the queries and the columns of the prompt are cut.
Memory grows with ``layers x heads x (n + N)^2``: use it on short prompts only.

It switches the model to eager attention for the duration of the call and back afterwards, so it must
not run while another thread uses the same model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ...models import LoadedModel
from ...types import Aggregation, QueryReduction
from .hook import content_columns, content_rows, skipped_layers

__all__ = ["greedy_look_ahead", "reference_draft_attention_scores"]


def greedy_look_ahead(loaded: LoadedModel, token_ids: Sequence[int], look_ahead: int) -> list[int]:
    """Up to ``look_ahead - 1`` greedy tokens after the prompt, stopping before an end-of-sequence id."""
    model = loaded.model
    eos = set(loaded.eos_token_ids)
    seq = [int(t) for t in token_ids]
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(look_ahead - 1):
            logits = model(torch.tensor([seq], device=loaded.device), use_cache=False).logits[0, -1]
            token = int(logits.argmax())
            if token in eos or len(seq) >= loaded.max_context:
                break
            seq.append(token)
            out.append(token)
    return out


def reference_draft_attention_scores(
    loaded: LoadedModel,
    token_ids: Sequence[int],
    *,
    look_ahead: int = 8,
    pool_kernel: int = 13,
    layers: int | None = None,
    aggregation: Aggregation = "max",
    queries: QueryReduction = "mean",
) -> tuple[torch.Tensor, list[int]]:
    """``(scores, look-ahead tokens)`` for one prompt of draft token ids, the slow way.

    Rows ``n-1 .. n+N-2`` of each layer's eager attention, columns ``:n`` renormalised to sum to one
    (that equals a softmax over the prompt keys), average-pooled with ``count_include_pad=False``, max
    over layers and heads, mean over the queries. ``layers``: only the first that many layers count
    (the whole model still runs). ``aggregation``: ``"mean"`` / ``"content-mean"`` take the mean over
    layers and heads instead of the max, ``"content-mean"`` after restricting each row to
    `content_columns` and renormalising it; ``"last-layer"`` the mean over the heads of the last
    layer that counts. ``queries="max"``: the max over the queries instead of their mean.
    """
    model = loaded.model
    n = len(token_ids)
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        continuation = greedy_look_ahead(loaded, token_ids, look_ahead)
        seq = torch.tensor([[*token_ids, *continuation]], device=loaded.device)
        with torch.inference_mode():
            attentions = model(seq, output_attentions=True, use_cache=False).attentions
    finally:
        model.set_attn_implementation(previous)
    skip = skipped_layers(model.config)
    pooled_layers = []
    for layer, attn in enumerate(attentions):
        if layer in skip or (layers is not None and layer >= layers):
            continue
        rows = attn[0, :, n - 1 :, :n].float()  # [H, queries, n]
        rows = (rows / rows.sum(dim=-1, keepdim=True)).nan_to_num(0.0)
        if aggregation == "content-mean":
            rows = content_rows(rows, content_columns(torch.zeros(1, dtype=torch.long, device=rows.device), n)[0])
        heads, count, _ = rows.shape
        flat = rows.reshape(heads * count, 1, n)
        if pool_kernel > 1:
            flat = F.avg_pool1d(flat, pool_kernel, stride=1, padding=pool_kernel // 2, count_include_pad=False)
        pooled_layers.append(flat[..., :n].reshape(heads, count, n))
    if aggregation == "last-layer":
        pooled_layers = pooled_layers[-1:]
    stacked = torch.stack(pooled_layers)  # [L, H, queries, n]
    reduced = stacked.amax(dim=(0, 1)) if aggregation == "max" else stacked.mean(dim=(0, 1))
    combined = reduced.amax(dim=0) if queries == "max" else reduced.mean(dim=0)
    return combined.cpu(), continuation
