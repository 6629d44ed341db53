"""The cache's index (tokens and renders) to disk soon: callers arriving together share one flush.

A render is durable before its status says so, and a rotation's new token before it is
written anywhere (the status job nodepools.py hands WriteBacks, rotation.py); the housekeeping tick flushes what is left.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from payload_cache import PayloadCache


@dataclass
class IndexFlush:
    cache: PayloadCache
    delay: float = 0.05  # callers within this share one flush
    _next: asyncio.Future[None] | None = None

    async def __call__(self) -> None:
        """Flush the index soon, and return once it is on disk."""
        if self._next is None:
            self._next = asyncio.ensure_future(self._flush_later())
        await asyncio.shield(self._next)

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.delay)
        self._next = None  # changes from now on go into the next flush
        await asyncio.to_thread(self.cache.flush)
