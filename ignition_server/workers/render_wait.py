"""How long a node whose payload is still rendering should wait: the 503's `Retry-After`.

A constant (it was 5 s) is wrong both ways: with 5,000 renders queued at 6 a second, nodes
come back 150 times each for nothing (in the issue's cold start the fetching client's retries
took 557 s of the same cores' CPU); with one render queued they wait longer than it takes.
The owner follows its render queue (depth, renders done) and estimates the rate. A NodePool's
own wait is the renders queued ahead of it (its place in the round robin: work_queue.py's
`ahead_of`) at that rate, so the first lap's NodePools are told seconds and the last lap's
minutes (`seconds_for`). Without its place (a worker that could not ask the owner in time),
the time to render half the queue: a node's render is anywhere in it. Clamped to [1, 60] s:
a node told more would sleep through a queue that sped up or was overtaken by urgent work,
and one asking again after 60 s costs nothing. Nothing queued for it (inputs awaited, or a
render about to be scheduled): the old 5 s.

Ignition itself does not read `Retry-After` (internal/resource/http.go: 5xx retried after
0.2 s doubling to 5 s, whatever the headers); clients that do read it (curl --retry, scripts,
the bench's `--honour-retry-after`) come back when their payload should be there.
"""

from __future__ import annotations

import math

IDLE_S = 5  # nothing queued: a render about to be scheduled, or inputs awaited
MIN_S, MAX_S = 1, 60
HALF_LIFE_S = 5.0  # of the rate's moving average: follows a change of pace within seconds


class RenderWait:
    """Fed (depth, renders done so far, now) by the owner; `seconds()` is the Retry-After."""

    def __init__(self, half_life: float = HALF_LIFE_S) -> None:
        self._half_life = half_life
        self._depth = 0.0
        self._rate: float | None = None  # renders a second; None until two observations
        self._last: tuple[float, float] | None = None

    def observe(self, depth: float, renders: float, now: float) -> None:
        if self._rate is None and renders <= 0:
            # No render started yet (a first listing holds the queue while it is applied): a
            # rate of 0 from then would tell every node the longest wait just as renders begin.
            self._last, self._depth = (now, renders), depth
            return
        if self._last is not None:
            then, before = self._last
            elapsed = now - then
            if elapsed <= 0:
                return
            instant = max(renders - before, 0.0) / elapsed
            weight = 1 - 0.5 ** (elapsed / self._half_life)
            self._rate = instant if self._rate is None else self._rate + weight * (instant - self._rate)
        self._last = (now, renders)
        self._depth = depth

    def seconds(self) -> int:
        """For any NodePool still rendering: the time to render half the queue."""
        return IDLE_S if self._depth <= 0 else self._wait(self._depth / 2)

    def seconds_for(self, ahead: int | None) -> int:
        """For a NodePool with `ahead` renders before its own (None: not queued for one)."""
        return IDLE_S if ahead is None else self._wait(ahead + 1)

    def _wait(self, renders: float) -> int:
        if self._rate is None:
            return IDLE_S
        if self._rate <= 0:
            return MAX_S  # queued and nothing finishing: come back late rather than hammer
        return max(MIN_S, min(MAX_S, math.ceil(renders / self._rate)))
