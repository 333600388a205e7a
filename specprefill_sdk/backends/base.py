"""Shared defaults for backends: batch as a loop, async through worker threads."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence

from .._aio import chunks_in_threads
from ..types import Completion, CompletionChunk, CompressedPrompt, SamplingParams

__all__ = ["BackendBase"]


class BackendBase:
    """Mixin: `generate_batch`, `agenerate` and `astream` from `generate` and `stream`.

    Backends with native batch or async paths override these.
    """

    def generate(self, prompt: CompressedPrompt, params: SamplingParams) -> Completion:
        raise NotImplementedError

    def stream(self, prompt: CompressedPrompt, params: SamplingParams) -> Iterator[CompletionChunk]:
        raise NotImplementedError

    def generate_batch(self, prompts: Sequence[CompressedPrompt], params: SamplingParams) -> list[Completion]:
        return [self.generate(p, params) for p in prompts]

    async def agenerate(self, prompt: CompressedPrompt, params: SamplingParams) -> Completion:
        return await asyncio.to_thread(self.generate, prompt, params)

    async def astream(self, prompt: CompressedPrompt, params: SamplingParams) -> AsyncIterator[CompletionChunk]:
        async with contextlib.aclosing(chunks_in_threads(self.stream(prompt, params))) as chunks:
            async for chunk in chunks:
                yield chunk
