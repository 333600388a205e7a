"""Async helpers shared by the pipeline, conversations and backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator

from .types import CompletionChunk

__all__ = ["chunks_in_threads"]


async def chunks_in_threads(iterator: Iterator[CompletionChunk]) -> AsyncGenerator[CompletionChunk, None]:
    """Drive a synchronous chunk iterator from async code: each step (and the final close) runs in a
    worker thread, never on the event loop. Closing the async iterator early closes ``iterator``."""
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
