"""The index to disk for a burst of renders: every caller returns only once a flush that
started after its call is done (its render is durable before its status says so), and a
burst's callers share flushes spaced `spacing` apart (issue 33: a cold start's renders had
the whole ~2 MB index encoded and sealed 10-20 times a second, ~6 % of the owner's CPU)."""

from __future__ import annotations

import asyncio
import time
from typing import cast

from ignition_server.reconcile.index_flush import IndexFlush
from payload_cache import PayloadCache


class CountingCache:
    def __init__(self) -> None:
        self.started: list[float] = []

    def flush(self) -> None:
        self.started.append(time.monotonic())
        time.sleep(0.01)


async def test_a_burst_of_callers_shares_spaced_flushes_and_each_waits_for_one_after_its_call() -> None:
    cache = CountingCache()
    flush = IndexFlush(cast(PayloadCache, cache))
    calls: list[tuple[float, float]] = []

    async def caller() -> None:
        called = time.monotonic()
        await flush()
        calls.append((called, time.monotonic()))

    callers = []
    for _ in range(30):  # a render done every 50 ms for 1.5 s
        callers.append(asyncio.create_task(caller()))
        await asyncio.sleep(0.05)
    await asyncio.gather(*callers)
    assert len(calls) == 30
    # ~1.5 s of callers (longer on a loaded machine: measured), one flush every 0.5 s at most;
    # unspaced, a flush per 50 ms delay: ~30.
    span = max(called for called, _ in calls) - min(called for called, _ in calls)
    assert len(cache.started) <= span / 0.5 + 2, (span, cache.started)
    gaps = [later - earlier for earlier, later in zip(cache.started, cache.started[1:])]
    assert all(gap >= 0.5 - 0.01 for gap in gaps), gaps
    for called, returned in calls:
        assert any(called <= started <= returned for started in cache.started), (called, returned, cache.started)


async def test_a_lone_caller_waits_only_the_short_delay() -> None:
    cache = CountingCache()
    flush = IndexFlush(cast(PayloadCache, cache))
    started = time.monotonic()
    await flush()
    assert time.monotonic() - started < 0.4 and len(cache.started) == 1
