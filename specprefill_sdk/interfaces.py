"""The three stage contracts: `Scorer` -> `Selector` -> `Backend`.

Each is a `typing.Protocol`: any object with these methods fits, no inheritance needed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .types import Completion, CompletionChunk, CompressedPrompt, Prompt, SamplingParams, Selection, TokenScores

__all__ = ["Backend", "BackendCapabilities", "Scorer", "Selector"]


@runtime_checkable
class Scorer(Protocol):
    """Gives every prompt token an importance score."""

    @property
    def name(self) -> str:
        """A short name for logs, traces and results (e.g. ``draft-attention``)."""
        ...

    def score(self, prompt: Prompt) -> TokenScores:
        """Score one prompt: one float per token."""
        ...

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        """Score several prompts; equal to ``[score(p) for p in prompts]``."""
        ...


@runtime_checkable
class Selector(Protocol):
    """Decides which tokens the target prefills."""

    @property
    def name(self) -> str:
        """A short description of the policy (e.g. ``Chunked(KeepRate(0.1), 32)``)."""
        ...

    def select(self, prompt: Prompt, scores: TokenScores) -> Selection:
        """Choose the kept tokens from the scores."""
        ...

    def decide_without_scores(self, prompt: Prompt) -> Selection | None:
        """Return a selection when no scores are needed (keep-all, dense below a length), else None.

        The pipeline asks this first and skips the draft model when it gets a selection.
        """
        ...


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend can do, declared rather than guessed."""

    #: Prefills kept tokens at their original position ids (exact SpecPrefill). False means the
    #: backend only receives text (the kept spans rendered back), as with any OpenAI endpoint.
    supports_position_ids: bool
    #: Keeps KV state between calls (multi-turn conversations without re-prefill).
    supports_sessions: bool = False
    #: Streams tokens as they are generated.
    supports_streaming: bool = True


@runtime_checkable
class Backend(Protocol):
    """Prefills a compressed prompt, then decodes."""

    capabilities: BackendCapabilities

    @property
    def model_name(self) -> str:
        """The target model's name as reported in results."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The target's tokenizer (a Hugging Face ``PreTrainedTokenizerBase``): prompts are built with it."""
        ...

    @property
    def max_context(self) -> int:
        """The largest position the target supports (prompt + generated tokens)."""
        ...

    def generate(self, prompt: CompressedPrompt, params: SamplingParams) -> Completion:
        """Prefill ``prompt`` at its position ids, decode from position ``prompt.n``."""
        ...

    def stream(self, prompt: CompressedPrompt, params: SamplingParams) -> Iterator[CompletionChunk]:
        """Like `generate`, yielding text deltas; the last chunk carries the `Completion`."""
        ...

    def generate_batch(self, prompts: Sequence[CompressedPrompt], params: SamplingParams) -> list[Completion]:
        """Generate for several prompts; equal to ``[generate(p, params) for p in prompts]``."""
        ...

    async def agenerate(self, prompt: CompressedPrompt, params: SamplingParams) -> Completion:
        """Async form of `generate`."""
        ...

    def astream(self, prompt: CompressedPrompt, params: SamplingParams) -> AsyncIterator[CompletionChunk]:
        """Async form of `stream`."""
        ...
