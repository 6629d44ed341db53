"""One timer for many connections' deadlines of the same length.

Each connection had timers of its own (its first request's headers, the cut after its TLS
close): a TimerHandle made and cancelled per connection, which in a boot storm (a new TLS
connection per request) is most of what a connection costs the guard. Every deadline of one
kind has the same length, so they fall due in the order they were set: kept in an
insertion-ordered dict, the next one due is always the first, and one timer, armed for it,
is all a process needs. Setting or dropping a deadline is a dict insert or delete.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
# The event loop's clock and timers tick in milliseconds (uvloop): a deadline less than a tick
# away is due now. Re-armed for it instead, the timer fired again and again within one tick.
TICK = 0.001


class Deadlines(Generic[K]):
    """`expire(key)` is called `seconds` after `set(key)`, unless `drop(key)` came first.
    Used from the event loop only."""

    def __init__(self, seconds: float, expire: Callable[[K], None]) -> None:
        self.seconds = seconds
        self._expire = expire
        self._due: dict[K, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def set(self, key: K) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        # Dropped first: set again, a key goes to the back of the order with its later deadline;
        # kept in its old place, `_fire` stopped at it and keys behind it expired late.
        self._due.pop(key, None)
        self._due[key] = loop.time() + self.seconds
        if self._timer is None:
            self._timer = loop.call_at(self._due[key], self._fire)

    def drop(self, key: K) -> None:
        self._due.pop(key, None)  # the timer stays armed: it finds nothing due and re-arms

    def _fire(self) -> None:
        self._timer = None
        assert self._loop is not None
        now = self._loop.time() + TICK
        # One pass in order: the dict keeps a hole where each key was, so looking for the
        # first key again after each one expired went over every hole before it each time.
        expired: list[K] = []
        for key, at in self._due.items():
            if at > now:
                self._timer = self._loop.call_at(at, self._fire)
                break
            expired.append(key)
        for key in expired:
            if self._due.pop(key, None) is not None:
                self._expire(key)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due.clear()
