"""`DraftSession`: a draft model's KV cache kept across the turns of a conversation.

A `DraftAttentionScorer` reads the whole prompt every time. In a conversation each prompt starts with
the previous one, so a `DraftSession` keeps the draft's (dense) cache of the token sequence it has
read, prefills only what is new, and then scores the *whole* prompt exactly as the scorer does: the
last prompt token and up to ``look_ahead - 1`` greedy look-ahead tokens attend to every prompt key
(cached or new), rows are smoothed and reduced over layers and heads and over the queries as the
scorer's ``aggregation`` and ``queries`` say (by default max, then mean). The
look-ahead tokens are removed from the cache afterwards. With a scorer of ``layers=N`` only the draft's
first N layers run, and only their cache is kept.

Example::

    session = DraftSession(DraftAttentionScorer("smollm2-135m"))
    scores = session.score(turn_1_prompt)          # prefills the whole prompt
    scores = session.score(turn_2_prompt)          # prefills only what turn 2 added
    session.last_prefilled                         # how many tokens that was
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import torch

from ...errors import SpecPrefillError
from ...interfaces import IncrementalScorer
from ...models import cache_argument
from ...runtime.attention import sdpa_context
from ...runtime.norms import fused_norms
from ...types import Prompt, TokenScores
from .._alignment import check_prompt, same_vocabulary, to_draft_tokens
from .hook import DraftStopped, LayerStop, ScoreCollector, skipped_layers

if TYPE_CHECKING:
    from .scorer import DraftAttentionScorer

__all__ = ["DraftSession"]

logger = logging.getLogger(__name__)

#: Draft tokens per forward pass when catching up on new tokens.
PREFILL_CHUNK = 4096


def _common_prefix(a: list[int], b: tuple[int, ...]) -> int:
    size = min(len(a), len(b))
    for i in range(size):
        if a[i] != b[i]:
            return i
    return size


class DraftSession:
    """Scores a growing prompt with a draft whose cache persists between calls.

    Prompts the draft cannot read by id (another vocabulary than the target's) are scored by the
    scorer from scratch each time; ``incremental`` tells which case applies to the last call.
    """

    def __init__(self, scorer: DraftAttentionScorer) -> None:
        if not isinstance(scorer, IncrementalScorer):
            raise TypeError(f"DraftSession needs a DraftAttentionScorer, got {type(scorer).__name__}")
        self.scorer = scorer
        self.loaded = scorer.loaded
        model = self.loaded.model
        self._vocab_size = int(model.get_input_embeddings().num_embeddings)
        self._skip = skipped_layers(model.config)
        self._cache_arg = cache_argument(model)
        self._eos = frozenset(self.loaded.eos_token_ids)
        target = scorer.target_tokenizer
        self._same_vocab: bool | None = None if target is None else same_vocabulary(self.loaded.tokenizer, target)
        self.token_ids: list[int] = []
        self._cache: Any = None
        self.last_prefilled = 0
        self.incremental = True

    @property
    def name(self) -> str:
        return self.scorer.name

    @property
    def cached_tokens(self) -> int:
        """Tokens held in the draft's cache (the bound is the draft's context)."""
        return len(self.token_ids)

    def reset(self) -> None:
        """Forget the cache."""
        self.token_ids = []
        self._cache = None

    def score(self, prompt: Prompt) -> TokenScores:
        """Scores for every token of ``prompt``, prefilling only the tokens not yet in the cache.

        Runs under the scorer's `DraftAttentionScorer.lock`, so it takes turns with every other use
        of the draft model.

        Raises:
            InvalidRequestError: an empty prompt or ids the draft cannot read.
            SpecPrefillError: a prompt longer than the draft's context.
        """
        with self.scorer.lock:
            return self._score(prompt)

    def _score(self, prompt: Prompt) -> TokenScores:
        check_prompt(prompt)
        draft = to_draft_tokens(prompt, self.loaded.tokenizer, self._vocab_size, self._same_vocab)
        if draft.projected:
            self.incremental = False
            self.reset()
            self.last_prefilled = len(draft.ids)
            return self.scorer.score(prompt)
        self.incremental = True
        ids = draft.ids
        n = len(ids)
        limit = self.loaded.max_context
        if n > limit:
            raise SpecPrefillError(
                f"the prompt has {n} draft tokens, more than the draft's context of {limit}",
                code="draft_context_exceeded",
            )
        values, used, continuation = self._score_ids(ids)
        info = {
            "draft": self.scorer.model_name,
            "n": prompt.n,
            "look_ahead": used,
            "look_ahead_requested": self.scorer.look_ahead,
            "look_ahead_token_ids": continuation,
            "pool_kernel": self.scorer.pool_kernel,
            "layers": self.scorer.layers,
            "aggregation": self.scorer.aggregation,
            "queries": self.scorer.queries,
            "draft_tokens": n,
            "draft_prefilled": self.last_prefilled,
            "projected": False,
        }
        return TokenScores(values=values, scorer=self.scorer.name, info=info)

    # ----------------------------------------------------------------- internals
    def _crop(self, length: int) -> None:
        if self._cache is None:
            return
        for layer in getattr(self._cache, "layers", []):
            keys = getattr(layer, "keys", None)
            if keys is not None and keys.numel() and keys.shape[-2] > length:
                layer.keys = keys[..., :length, :]
                layer.values = layer.values[..., :length, :]
        del self.token_ids[length:]

    def _forward(self, ids: list[int], start: int, observed: bool = False) -> torch.Tensor | None:
        """Extend the cache by ``ids`` at positions ``start...``; the last token's logits.

        ``observed``: a `ScoreCollector` is active (it stops the pass itself when the scorer has
        ``layers``); otherwise such a scorer's pass is stopped here. A stopped pass has no logits (None).
        """
        device = self.loaded.device
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        positions = torch.arange(start, start + len(ids), device=device)[None, :]
        layers = self.scorer.layers
        stop = LayerStop(layers - 1).active() if layers is not None and not observed else contextlib.nullcontext()
        kernels = sdpa_context(self.scorer.execution.attention_backends, device)  # as the scorer's own passes
        try:
            with fused_norms(self.scorer.execution.fused_norms), stop, kernels:
                out = self.loaded.model(
                    input_ids=input_ids,
                    position_ids=positions,
                    use_cache=True,
                    logits_to_keep=1,
                    **{self._cache_arg: self._cache},
                )
        except DraftStopped:
            out = None
        self.token_ids.extend(ids)
        return None if out is None else out.logits[0, -1]

    @torch.inference_mode()
    def _score_ids(self, ids: tuple[int, ...]) -> tuple[torch.Tensor, int, tuple[int, ...]]:
        from transformers import DynamicCache

        n = len(ids)
        # The last prompt token is always run again: its query is the first scoring query.
        keep = min(_common_prefix(self.token_ids, ids), n - 1)
        if self._cache is None:
            # Full layers only: windows (if any) come from the model's own masks, so cropping is exact.
            self._cache = DynamicCache()
            self.token_ids = []
            keep = 0
        self._crop(keep)
        for start in range(keep, n - 1, PREFILL_CHUNK):
            self._forward(list(ids[start : min(start + PREFILL_CHUNK, n - 1)]), start)
        self.last_prefilled = n - keep
        look_ahead = self.scorer.look_ahead
        device = self.loaded.device
        collector = ScoreCollector(
            pad=torch.zeros(1, dtype=torch.long),
            prompt_len=n,
            num_queries=look_ahead,
            pool_kernel=self.scorer.pool_kernel,
            skip=self._skip,
            device=device,
            aggregation=self.scorer.aggregation,
            last_layer=self.scorer.last_layer,
            queries=self.scorer.queries,
        )
        limit = self.loaded.max_context
        used = 1
        generated: list[int] = []
        if self.scorer.layers is not None:
            collector.stop_after = self.scorer.layers - 1
        with collector.active():
            collector.begin_step(0)
            logits = self._forward([ids[-1]], n - 1, observed=True)
            token = int(logits.argmax()) if logits is not None else -1  # no look-ahead with `layers`
            for step in range(1, look_ahead):
                if token in self._eos or n - 1 + step >= limit:
                    break
                generated.append(token)
                used += 1
                collector.begin_step(step)
                logits = self._forward([token], n - 1 + step, observed=True)
                assert logits is not None  # look-ahead > 1 runs every layer
                token = int(logits.argmax())
        if not collector.layers_seen:
            raise SpecPrefillError(
                f"{type(self.loaded.model).__name__} did not route its attention through the scoring hook; "
                "it cannot be used as a draft"
            )
        self._crop(n)  # drop the look-ahead tokens: the next turn continues from the prompt
        values = collector.token_scores(0, used).cpu()
        return values, used, tuple(generated)
