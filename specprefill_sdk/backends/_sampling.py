"""Next-token choice from logits: greedy, or temperature + top-p sampling with a seeded generator.

Sampling always runs on the CPU with a CPU `torch.Generator`, so the same seed gives the same tokens
whether the model runs on CPU or GPU (given equal probabilities).

Example::

    sampler = TokenSampler(SamplingParams(temperature=0.7, top_p=0.9, seed=1))
    token = sampler.choose(logits)  # logits: 1-D tensor over the vocabulary
"""

from __future__ import annotations

import torch

from ..types import SamplingParams, TokenLogprob

__all__ = ["TokenSampler", "token_logprob"]


def token_logprob(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """``token``'s log-probability under 1-D ``logits`` and the ``top`` most likely tokens'.

    The distribution is the model's own (log-softmax of the logits, in float32), before temperature
    and top-p: vLLM's default (``logprobs_mode="raw_logprobs"``), so the numbers do not change with
    how the token was sampled.
    """
    logp = torch.log_softmax(logits.detach().float(), dim=-1)
    pairs: tuple[tuple[int, float], ...] = ()
    if top > 0:
        values, ids = torch.topk(logp, min(top, int(logp.shape[-1])))
        pairs = tuple(zip(map(int, ids.tolist()), map(float, values.tolist()), strict=True))
    return TokenLogprob(token_id=int(token), logprob=float(logp[int(token)].item()), top=pairs)


class TokenSampler:
    """Chooses one token per step for one sequence; holds that sequence's random generator."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device="cpu")
            if params.seed is not None:
                self.generator.manual_seed(int(params.seed))
            else:
                self.generator.seed()

    def choose(self, logits: torch.Tensor) -> int:
        """The next token id from 1-D ``logits`` (any device, any float dtype)."""
        if self.params.greedy:
            return int(torch.argmax(logits).item())
        # float64 keeps tiny temperatures finite; if they still overflow, the limit is greedy.
        scaled = logits.detach().double().cpu() / float(self.params.temperature)
        if not torch.isfinite(scaled).all():
            return int(torch.argmax(logits).item())
        probs = torch.softmax(scaled - scaled.max(), dim=-1)
        if self.params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is short.
            before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            keep = before < self.params.top_p
            keep[0] = True  # the most likely token always stays, however small top_p is
            sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
            pick = torch.multinomial(sorted_probs, 1, generator=self.generator)
            return int(order[pick].item())
        return int(torch.multinomial(probs, 1, generator=self.generator).item())
