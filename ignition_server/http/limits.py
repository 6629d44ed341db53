"""Failed-authentication floods, per source address.

A source that fails authentication more than `burst` times within `window` seconds gets
503 + Retry-After until its window ends: never 429, which the Ignition client would take as
final (any 4xx fails a boot for good), and never anything that costs the other sources. A real
node retrying a 511 (its token not seen yet) asks a handful of times per window, far below
the burst. The table is bounded (least recently used sources fall out first).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from cachetools import TTLCache

FAILED_STATUSES = frozenset({401, 403, 404, 511})


@dataclass
class FailedAuthLimiter:
    burst: int = 30
    window: float = 10.0
    max_sources: int = 100_000
    clock: Callable[[], float] = time.monotonic
    _table: TTLCache = field(init=False, repr=False)  # source -> [failures, first failure's time]
    # Sources over the burst -> when their wait ends: what every request asks about, kept in a
    # plain dict (the TTL table's lookup was a microsecond per request, for the few held).
    _held: dict[str, float] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._table = TTLCache(maxsize=self.max_sources, ttl=self.window, timer=self.clock)

    def retry_after(self, source: str | None) -> int | None:
        """Seconds this source must wait, or None when it may try."""
        until = self._held.get(source or "")
        if until is None:
            return None
        remaining = until - self.clock()
        if remaining <= 0:
            self._held.pop(source or "", None)
            return None
        return max(1, math.ceil(remaining))

    def hold(self, source: str | None, seconds: float) -> None:
        """Refuse `source` for `seconds` (another process's limiter found it over the burst)."""
        self._hold(source or "", self.clock() + seconds)

    def failed(self, source: str | None) -> None:
        key = source or ""
        entry = self._table.get(key)
        if entry is None:
            self._table[key] = [1, self.clock()]  # the window starts at the first failure
        else:
            entry[0] += 1
            if entry[0] > self.burst:
                self._hold(key, entry[1] + self.window)

    def _hold(self, key: str, until: float) -> None:
        if key not in self._held and len(self._held) >= self.max_sources:
            now = self.clock()
            for stale in [source for source, ends in self._held.items() if ends <= now]:
                del self._held[stale]
            if len(self._held) >= self.max_sources:  # all still held: the longest-held goes first
                del self._held[next(iter(self._held))]
        self._held[key] = until
