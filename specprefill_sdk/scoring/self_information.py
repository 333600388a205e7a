"""`SelfInformationScorer`: LLMLingua-style surprisal ``-log p(x_i | x_<i)`` under a draft model.

Tokens the draft could not predict carry information; predictable ones can go. This is the classic
prompt-compression baseline (Li et al. 2023, "Selective Context"; LLMLingua), here per token.

Example::

    scorer = SelfInformationScorer("smollm2-135m")
    scorer.score(prompt).values  # nats; the first token gets the largest score of the rest
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import SpecPrefillError
from ..models import DEFAULT_MODEL, LoadedModel, cache_argument, load_model, model_lock
from ..types import Prompt, TokenScores
from ..validation import check_int
from ._alignment import check_prompt, project_scores, same_vocabulary, to_draft_tokens

__all__ = ["SelfInformationScorer"]


class SelfInformationScorer:
    """Scores each token by its surprisal under the draft (larger: less predictable, more important).

    The first token has no context; it gets the largest score of the others so that it is kept like
    an attention sink. With another vocabulary than the target's, the draft re-tokenizes the text and
    scores are projected by character overlap, as for `DraftAttentionScorer`. ``chunk_size`` bounds the
    logits held at once (``chunk_size x vocabulary`` floats). Prompts are scored one by one: a padded
    batch would not be cheaper for a single forward pass without look-ahead on CPU, and one by one
    needs no masks. Calls from several threads take turns on the draft (`model_lock`).

    Example::

        SelfInformationScorer(scorer.loaded)   # share a draft already loaded
    """

    name = "self-information"

    def __init__(
        self,
        draft: str | LoadedModel = DEFAULT_MODEL,
        *,
        device: str | torch.device | None = "auto",
        dtype: str | torch.dtype | None = "auto",
        target_tokenizer: Any = None,
        chunk_size: int = 256,
    ) -> None:
        self.chunk_size = check_int(chunk_size, "chunk_size", param="chunk_size", minimum=1)
        self.loaded = draft if isinstance(draft, LoadedModel) else load_model(draft, device=device, dtype=dtype)
        model = self.loaded.model
        self._lock = model_lock(model)
        self._vocab_size = int(model.get_input_embeddings().num_embeddings)
        self._cache_arg = cache_argument(model)
        self._same_vocab: bool | None = (
            None if target_tokenizer is None else same_vocabulary(self.loaded.tokenizer, target_tokenizer)
        )

    @property
    def model_name(self) -> str:
        """The draft's name."""
        return self.loaded.name

    def __repr__(self) -> str:
        return f"SelfInformationScorer(draft={self.model_name!r})"

    def score(self, prompt: Prompt) -> TokenScores:
        """Surprisal in nats per prompt token (float32)."""
        check_prompt(prompt)
        draft = to_draft_tokens(prompt, self.loaded.tokenizer, self._vocab_size, self._same_vocab)
        if len(draft.ids) > self.loaded.max_context:
            raise SpecPrefillError(
                f"the prompt has {len(draft.ids)} draft tokens, more than the draft's context of "
                f"{self.loaded.max_context}",
                code="draft_context_exceeded",
            )
        with self._lock:
            values = self._surprisal(draft.ids)
        if draft.offsets is not None:
            values = project_scores(values, draft.offsets, prompt.offsets)
        info = {"draft": self.model_name, "n": prompt.n, "draft_tokens": len(draft.ids), "projected": draft.projected}
        return TokenScores(values=values, scorer=self.name, info=info)

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        """Score each prompt in turn; equal to ``[score(p) for p in prompts]``."""
        return [self.score(p) for p in prompts]

    def _surprisal(self, ids: tuple[int, ...]) -> torch.Tensor:
        from transformers import DynamicCache

        model, device = self.loaded.model, self.loaded.device
        tokens = torch.tensor([ids], dtype=torch.long, device=device)
        m = tokens.shape[1]
        out = torch.zeros(m, dtype=torch.float32)
        cache = {self._cache_arg: DynamicCache(config=model.config)}
        with torch.inference_mode():
            for start in range(0, m, self.chunk_size):
                piece = tokens[:, start : start + self.chunk_size]
                logits = model(input_ids=piece, use_cache=True, **cache).logits[0].float()
                targets = tokens[0, start + 1 : start + 1 + piece.shape[1]]
                logp = torch.log_softmax(logits[: targets.shape[0]], dim=-1)
                nll = -logp.gather(1, targets[:, None])[:, 0]
                out[start + 1 : start + 1 + targets.shape[0]] = nll.cpu()
        out[0] = out[1:].max() if m > 1 else 0.0
        return out
