"""Watch events whose objects must be fetched (one GET each), fetched concurrently and fairly:
one fetch per key at a time (an event that arrives meanwhile is fetched after it, only the
newest such), and keys taken round-robin by lane (namespace), so one tenant's burst delays
another tenant's Secret by one turn, not by the burst.

A watch reads its stream one event at a time; awaiting each event's GET before reading the
next made a burst of one tenant's Secrets a queue every other tenant waited in (2,000 token
Secrets: another tenant's Secret known 12 s after it was created). Here the stream reads on
while `concurrency` fetches run, and what each finds is handed over as soon as it is found.
A fetch that fails is tried again with back-off for as long as its object is there (the
stream has moved past its event: nothing else would bring it back).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Generic, Hashable, Iterator, TypeVar

from .informer import backoff_delays

log = logging.getLogger("ignition_server.sources.kube")

K = TypeVar("K", bound=Hashable)
Event = tuple[str, dict[str, Any]]  # (kind, the object as the watch said it)


@dataclass
class KeyFetches(Generic[K]):
    run: Callable[[str, dict[str, Any]], Awaitable[None]]  # fetch, keep and hand over one event's object
    present: Callable[[K], bool]  # the object is still there (not deleted since its event)
    lane_of: Callable[[K], str]  # a namespace
    concurrency: int = 16
    _waiting: dict[K, Event] = field(default_factory=dict)  # the newest event of each key not running
    _lanes: OrderedDict[str, deque[K]] = field(default_factory=OrderedDict)
    _running: set[K] = field(default_factory=set)
    _workers: set[asyncio.Task[None]] = field(default_factory=set)
    _failures: dict[K, Iterator[float]] = field(default_factory=dict)  # back-off of keys failing now

    def add(self, key: K, kind: str, obj: dict[str, Any]) -> None:
        queued = key in self._waiting
        self._waiting[key] = (kind, obj)  # the newest event wins
        if not queued and key not in self._running:
            self._lanes.setdefault(self.lane_of(key), deque()).append(key)
        self._start()

    def forget(self, key: K) -> None:
        """The object is gone: no later fetch of it (one under way finds it gone: `present`)."""
        self._waiting.pop(key, None)
        self._failures.pop(key, None)

    def cancel(self) -> None:
        for task in list(self._workers):
            task.cancel()

    def _start(self) -> None:
        while self._lanes and len(self._workers) < self.concurrency:
            task = asyncio.get_running_loop().create_task(self._work(), name="watch event fetches")
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    def _next(self) -> tuple[K, Event] | None:
        while self._lanes:
            lane, keys = next(iter(self._lanes.items()))
            key = keys.popleft()
            if keys:
                self._lanes.move_to_end(lane)  # its turn is over
            else:
                del self._lanes[lane]
            event = self._waiting.pop(key, None)
            if event is not None:  # else forgotten since
                return key, event
        return None

    async def _work(self) -> None:
        while (picked := self._next()) is not None:
            key, event = picked
            self._running.add(key)
            try:
                await self.run(*event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(key, event, exc)
            else:
                self._failures.pop(key, None)
            finally:
                self._running.discard(key)
                if key in self._waiting:  # an event came while it ran: its turn again
                    self._lanes.setdefault(self.lane_of(key), deque()).append(key)

    def _failed(self, key: K, event: Event, exc: Exception) -> None:
        if not self.present(key):
            self._failures.pop(key, None)
            return
        delay = next(self._failures.setdefault(key, backoff_delays()))
        log.warning("fetching %s failed, again in %.1fs: %s: %s", key, delay, type(exc).__name__, exc)

        def again() -> None:
            if key not in self._waiting and self.present(key):
                self.add(key, *event)

        asyncio.get_running_loop().call_later(delay, again)
