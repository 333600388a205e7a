"""Shared defaults for backends: batch as a loop, async through worker threads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence

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
        iterator = self.stream(prompt, params)
        done = object()
        try:
            while True:
                chunk = await asyncio.to_thread(next, iterator, done)
                if chunk is done:
                    break
                assert isinstance(chunk, CompletionChunk)
                yield chunk
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                await asyncio.to_thread(close)
