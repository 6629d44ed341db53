"""The cache's index (tokens and renders) to disk soon: callers arriving together share one flush.

A render is durable before its status says so, and a rotation's new token before it is
written anywhere (the status job nodepools.py hands WriteBacks, rotation.py); the housekeeping tick flushes what is left.

Flushes are spaced: each one encodes and seals the whole index (~2 MB at 5,280 NodePools,
~3.5 ms of the owner's CPU), and a cold start's renders, two at a time, asked for one every
few tens of milliseconds: ~6 % of the owner's CPU at 440 x 12 (py-spy). One at most every
`spacing` costs a status write-back that much delay, and serving nothing (the index in
memory, which the workers follow, is current at once).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from payload_cache import PayloadCache


@dataclass
class IndexFlush:
    cache: PayloadCache
    delay: float = 0.05  # callers within this share one flush
    spacing: float = 0.5  # a flush starts this long after the one before at the soonest
    _next: asyncio.Future[None] | None = None
    _last_started: float = -math.inf

    async def __call__(self) -> None:
        """Flush the index soon, and return once it is on disk."""
        if self._next is None:
            self._next = asyncio.ensure_future(self._flush_later())
        await asyncio.shield(self._next)

    async def _flush_later(self) -> None:
        await asyncio.sleep(max(self.delay, self._last_started + self.spacing - time.monotonic()))
        self._next = None  # changes from now on go into the next flush
        self._last_started = time.monotonic()
        await asyncio.to_thread(self.cache.flush)
