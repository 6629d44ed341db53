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
    _table: TTLCache = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._table = TTLCache(maxsize=self.max_sources, ttl=self.window, timer=self.clock)

    def retry_after(self, source: str | None) -> int | None:
        """Seconds this source must wait, or None when it may try."""
        entry = self._table.get(source or "")
        if entry is None or entry[0] <= self.burst:
            return None
        return max(1, math.ceil(entry[1] + self.window - self.clock()))

    def hold(self, source: str | None, seconds: float) -> None:
        """Refuse `source` for `seconds` (another process's limiter found it over the burst)."""
        self._table[source or ""] = [self.burst + 1, self.clock() - self.window + seconds]

    def failed(self, source: str | None) -> None:
        key = source or ""
        entry = self._table.get(key)
        if entry is None:
            self._table[key] = [1, self.clock()]  # the window starts at the first failure
        else:
            entry[0] += 1
