"""The test clock: a time the test moves by hand, handed where the code takes `clock=`."""

from __future__ import annotations

T0 = 1_900_000_000.0


class Clock:
    """A clock the test moves (`clock.now = ...`)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
