"""The three stage contracts: `Scorer` -> `Selector` -> `Backend`.

Each is a `typing.Protocol`: any object with these methods fits, no inheritance needed. Beside
them, the side interfaces that some stages offer and drivers use when they are there: a scorer's
draft model (`ModelScorer`, `LookAheadScorer`, `DraftModelScorer`), a draft that can keep its cache
across conversation turns (`IncrementalScorer`), a backend that keeps KV state (`SessionBackend`),
a backend's provider and server address for traces (`ProviderBackend`, `RemoteBackend`), a backend
that runs a loaded model in this process (`LocalBackend`), a stage's execution settings (`Executed`),
a stage that measures its own cost (`Calibrated`) and a selector that knows before scoring how many
tokens it will keep (`KeepEstimating`), both for the pipeline's cost model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .types import Completion, CompletionChunk, CompressedPrompt, Prompt, SamplingParams, Selection, TokenScores

if TYPE_CHECKING:
    import torch

    from .cost import CostCurve, WarmUpReport
    from .models import LoadedModel
    from .runtime.settings import ExecutionSettings

__all__ = [
    "Backend",
    "BackendCapabilities",
    "Calibrated",
    "DraftModelScorer",
    "Executed",
    "IncrementalScorer",
    "KeepEstimating",
    "LocalBackend",
    "LookAheadScorer",
    "ModelScorer",
    "ProviderBackend",
    "RemoteBackend",
    "Scorer",
    "ScoringSession",
    "Selector",
    "SessionBackend",
    "SessionState",
]


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
class ModelScorer(Scorer, Protocol):
    """A scorer that runs a draft model: results and traces name it."""

    @property
    def model_name(self) -> str | None:
        """The draft's name (None when a wrapper's inner scorer has none)."""
        ...


@runtime_checkable
class LookAheadScorer(Scorer, Protocol):
    """A scorer whose queries come from look-ahead decoding of the draft: traces report how many."""

    @property
    def look_ahead(self) -> int | None:
        """N, the number of queries (the last prompt token plus N-1 look-ahead tokens)."""
        ...


@runtime_checkable
class DraftModelScorer(ModelScorer, Protocol):
    """A scorer holding a loaded draft model: its context bounds what a conversation may hold."""

    @property
    def loaded(self) -> LoadedModel:
        """The draft model (and its tokenizer, device and context)."""
        ...


@runtime_checkable
@runtime_checkable
class ScoringSession(Protocol):
    """A draft's KV cache kept across conversation turns: each call scores only what is new."""

    #: tokens the last `score` ran through the draft
    last_prefilled: int

    def score(self, prompt: Prompt) -> TokenScores:
        """Score ``prompt``, which extends what was scored before (else the cache starts over)."""
        ...

    def reset(self) -> None:
        """Drop the cached tokens."""
        ...


@runtime_checkable
class IncrementalScorer(DraftModelScorer, Protocol):
    """A draft-attention scorer whose draft can keep its KV cache across conversation turns.

    These are the knobs a `specprefill_sdk.scoring.draft_attention.DraftSession` scores with, so that a
    session gives the scores the scorer gives for the whole prompt.
    """

    def new_session(self) -> ScoringSession:
        """A `ScoringSession` over this scorer's draft, with its knobs and its lock."""
        ...

    @property
    def look_ahead(self) -> int:
        """N, the number of queries."""
        ...

    @property
    def pool_kernel(self) -> int:
        """The width of the average pool over each attention row."""
        ...

    @property
    def layers(self) -> int | None:
        """Score with the draft's first ``layers`` layers only (None: all)."""
        ...

    @property
    def target_tokenizer(self) -> Any:
        """The target's tokenizer when known (reads the prompt's ids directly when vocabularies match)."""
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


@runtime_checkable
class SessionState(Protocol):
    """A target KV state kept between calls: which original positions it holds."""

    #: tokens the last prefill ran through the model
    last_prefilled: int

    def cached_positions(self) -> list[int]:
        """The original positions held, in slot order."""
        ...


@runtime_checkable
class SessionBackend(Protocol):
    """What a `Backend` that keeps KV state between calls offers a `Conversation`.

    A backend declares it with ``capabilities.supports_sessions``; the state type is the backend's own
    (``Any`` here, as each backend takes only the states it made).
    """

    def new_state(self) -> Any:
        """An empty `SessionState`."""
        ...

    def prefill(self, prompt: CompressedPrompt, state: Any = None) -> Any:
        """Bring ``state`` (or a new one) up to ``prompt``: kept tokens not yet cached are prefilled."""
        ...

    def feed(self, state: Any, tokens: Sequence[int]) -> None:
        """Append one token per row at each row's next position."""
        ...

    def decode(self, state: Any, params: SamplingParams) -> Iterator[int]:
        """Sample tokens from ``state``, feeding each back before the next."""
        ...

    def evict_positions(self, state: Any, positions: Sequence[int]) -> int:
        """Drop the cached tokens at these original positions; return how many were held."""
        ...

    def stream_from(self, state: Any, prompt: CompressedPrompt, params: SamplingParams) -> Iterator[CompletionChunk]:
        """Like `Backend.stream`, but extends ``state`` instead of starting from an empty cache."""
        ...


@runtime_checkable
class ProviderBackend(Protocol):
    """A backend that names its GenAI provider for traces (``gen_ai.provider.name``; default ``specprefill``)."""

    provider_name: str


@runtime_checkable
class RemoteBackend(Protocol):
    """A backend that talks to a server: traces report its address (``server.address``, ``server.port``)."""

    base_url: str


@runtime_checkable
class LocalBackend(Protocol):
    """A backend that runs a loaded model in this process: its weights can serve as the draft too."""

    @property
    def loaded(self) -> LoadedModel:
        """The loaded target (model, tokenizer, device, dtype)."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the target runs."""
        ...


@runtime_checkable
class Executed(Protocol):
    """A stage whose forward passes follow an `ExecutionSettings` (kernels, compilation, graphs)."""

    @property
    def execution(self) -> ExecutionSettings:
        """How its passes run."""
        ...


@runtime_checkable
class Calibrated(Protocol):
    """A stage that compiles and measures its own passes at load (`TransformersBackend`, `DraftAttentionScorer`).

    ``cost`` is what its pass costs for a prompt of ``n`` tokens on its hardware (None until
    `warmup` measured it); the pipeline's cost model (`specprefill_sdk.cost`) reads a backend's and
    a scorer's.
    """

    cost: CostCurve | None
    warmed_up: WarmUpReport | None

    @property
    def compiled(self) -> bool:
        """Whether its passes run compiled."""
        ...

    def warmup(self, lengths: Sequence[int] | None = None) -> WarmUpReport:
        """Run its passes at a few prompt lengths: compile now, and measure `cost`."""
        ...


@runtime_checkable
class KeepEstimating(Protocol):
    """A selector that says, before any score exists, how many tokens of a prompt it will keep."""

    def expected_kept(self, prompt: Prompt) -> int | None:
        """The tokens ``select`` will keep of ``prompt`` at most, as far as known without scores; None: unknown."""
        ...
