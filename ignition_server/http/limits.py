"""Failed-authentication floods, per source address.

A source that fails authentication more than `burst` times within `window` seconds has its
failed attempts answered 503 + Retry-After until its window ends, instead of their 4xx or 511:
never 429, which the Ignition client would take as final (any 4xx fails a boot for good).
Only what fails is throttled: a request whose credential opens a payload is served whatever
its address did, so nodes sharing an address (behind a NAT, or a Service that rewrites the
source) are never held back by one of them sending garbage.

A 511 (a well-formed token this server does not know) counts as a failure: a guess looks
exactly like it. A node whose token is simply not seen yet loses nothing by that: held, its
511 becomes a 503, which the client retries the same way, and the moment the token is known
it is served. The table is bounded (least recently used sources fall out first).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from cachetools import TTLCache

from ..auth.tokens import Refusal

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

    def answer_failed(self, refusal: Refusal, source: str | None) -> Refusal:
        """Count a refused attempt; what to answer it with (503 while its source is held)."""
        if refusal.status not in FAILED_STATUSES:
            return refusal
        self.failed(source)
        wait = self.retry_after(source)
        if wait is None:
            return refusal
        return Refusal(503, "too many failed attempts from this address", retry_after=wait)

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
