"""How long a node whose payload is still rendering should wait: the 503's `Retry-After`.

A constant (it was 5 s) is wrong both ways: with 5,000 renders queued at 6 a second, nodes
come back 150 times each for nothing (in the issue's cold start the fetching client's retries
took 557 s of the same cores' CPU); with one render queued they wait longer than it takes.
The owner follows its render queue (depth, renders done) and estimates the rate; the wait
asked is the time to render half the queue: a node's render is anywhere in it (half of it on
average), and a node still not served by then is told again, with a queue that is shorter by
then. Clamped to [1, 300] s; with nothing queued (a NodePool waiting for its inputs, or a
render just finished) the old 5 s.
"""

from __future__ import annotations

import math

IDLE_S = 5  # nothing queued: a render about to be scheduled, or inputs awaited
MIN_S, MAX_S = 1, 300
HALF_LIFE_S = 5.0  # of the rate's moving average: follows a change of pace within seconds


class RenderWait:
    """Fed (depth, renders done so far, now) by the owner; `seconds()` is the Retry-After."""

    def __init__(self, half_life: float = HALF_LIFE_S) -> None:
        self._half_life = half_life
        self._depth = 0.0
        self._rate: float | None = None  # renders a second; None until two observations
        self._last: tuple[float, float] | None = None

    def observe(self, depth: float, renders: float, now: float) -> None:
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
        if self._depth <= 0 or self._rate is None:
            return IDLE_S
        if self._rate <= 0:
            return MAX_S  # queued and nothing finishing: come back late rather than hammer
        return max(MIN_S, min(MAX_S, math.ceil(self._depth / 2 / self._rate)))
