"""Model-free scorers to compare the draft-attention method against.

Each one gives every prompt token a float32 score; a selector then keeps the highest. Ties are left to
the selector.

Example::

    from specprefill_sdk.scoring import RecencyScorer
    RecencyScorer().score(prompt).values  # 1/n, 2/n, ..., 1.0
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch

from ..errors import InvalidRequestError
from ..types import Prompt, TokenScores
from ..validation import check_rate
from ._alignment import check_prompt

__all__ = ["HeadTailScorer", "RandomScorer", "RecencyScorer", "UniformScorer"]


class _BaselineScorer:
    name = "baseline"

    def _values(self, prompt: Prompt) -> torch.Tensor:
        raise NotImplementedError

    def score(self, prompt: Prompt) -> TokenScores:
        """One float32 score per prompt token."""
        check_prompt(prompt)
        return TokenScores(values=self._values(prompt).float(), scorer=self.name, info={"n": prompt.n})

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        """Score each prompt on its own (these scorers have no state to share)."""
        return [self.score(p) for p in prompts]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class UniformScorer(_BaselineScorer):
    """Every token scores 1.0: no preference at all.

    Example::

        UniformScorer().score(prompt).values.unique()  # tensor([1.])
    """

    name = "uniform"

    def _values(self, prompt: Prompt) -> torch.Tensor:
        return torch.ones(prompt.n)


class RandomScorer(_BaselineScorer):
    """Uniform random scores in [0, 1), reproducible: the same seed and token ids give the same scores.

    Example::

        a, b = RandomScorer(seed=1).score(prompt), RandomScorer(seed=1).score(prompt)
        torch.equal(a.values, b.values)  # True
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InvalidRequestError(f"seed must be an integer, got {seed!r}", param="seed")
        self.seed = seed

    def __repr__(self) -> str:
        return f"RandomScorer(seed={self.seed})"

    def _values(self, prompt: Prompt) -> torch.Tensor:
        # Mixing the token ids in gives different prompts of one length different draws.
        digest = zlib.crc32(torch.tensor(prompt.token_ids, dtype=torch.int64).numpy().tobytes())
        generator = torch.Generator().manual_seed((self.seed * 0x9E3779B1 + digest) % (2**63))
        return torch.rand(prompt.n, generator=generator)


class RecencyScorer(_BaselineScorer):
    """Later tokens score higher: ``s_i = (i + 1) / n``; top-k keeps the most recent tokens.

    Example::

        RecencyScorer().score(prompt).values[-1]  # tensor(1.)
    """

    name = "recency"

    def _values(self, prompt: Prompt) -> torch.Tensor:
        n = prompt.n
        return torch.arange(1, n + 1, dtype=torch.float32) / n


class HeadTailScorer(_BaselineScorer):
    """Tokens near either end score higher; any top-k takes a share ``head`` of its tokens from the start.

    ``s_i = max(1 - i / (head * n), 1 - (n - 1 - i) / ((1 - head) * n))``: a threshold on the scores
    keeps a prefix and a suffix whose lengths stand in the ratio ``head : 1 - head``. ``head=0`` is
    recency, ``head=1`` keeps a prefix.

    Example::

        HeadTailScorer(head=0.25)  # a quarter of the kept tokens from the start, the rest from the end
    """

    name = "head-tail"

    def __init__(self, head: float = 0.5) -> None:
        self.head = check_rate(head, "head", param="head", allow_zero=True)

    def __repr__(self) -> str:
        return f"HeadTailScorer(head={self.head})"

    def _values(self, prompt: Prompt) -> torch.Tensor:
        n = prompt.n
        i = torch.arange(n, dtype=torch.float64)
        minus_inf = torch.full((n,), float("-inf"), dtype=torch.float64)
        front = 1 - i / (self.head * n) if self.head > 0 else minus_inf
        back = 1 - (n - 1 - i) / ((1 - self.head) * n) if self.head < 1 else minus_inf
        return torch.maximum(front, back).float()
