"""Faults in handling one object: counted, logged once, retried with back-off, kept apart.

A reconciler that lets one object's exception escape stops for every object (issue 9: one
hand-broken manifest raised out of a write-back and no later change was ever applied).
Everything the reconciler does for one object therefore goes through here: `Faults` records
a failure per (step, object) and says when to try again; `ObjectWork` (object_work.py) runs
follow-up work (write-backs) per object on a work queue, recording its failures here, so a
failure or a slow write of one object never sits in the await chain of another's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("ignition_server.reconcile")

RETRY_MIN, RETRY_MAX = 1.0, 300.0

# The steps of handling one object, as the `step` label of ign_server_watch_errors_total.
STEPS = ("parse", "render", "write-back", "status", "rotation", "expiry", "user-data", "edge", "takeover")


def backoff(attempts: int) -> float:
    return min(RETRY_MAX, RETRY_MIN * 2 ** (max(attempts, 1) - 1))


@dataclass
class _Fault:
    attempts: int
    retry_at: float
    message: str
    kind: str  # what changed when it is logged again: the exception's type, or the message


@dataclass
class Faults:
    """Per (step, object name): how often it failed and when to try again."""

    count: Callable[[str], None] = lambda _step: None  # the metric, by step
    clock: Callable[[], float] = time.monotonic
    _faults: dict[tuple[str, str], _Fault] = field(default_factory=dict)
    # What was said of each object: one cause (a file broken by hand) failing several steps
    # (expiry, status, ignition-reached) is one log line, not one per step.
    _said: dict[str, set[str]] = field(default_factory=dict)

    def failed(self, step: str, name: str, error: BaseException | str) -> float:
        """Record a failure; log it once (until it recovers). Returns the back-off delay."""
        message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        kind = error if isinstance(error, str) else type(error).__name__  # temp names etc. vary
        self.count(step)
        previous = self._faults.get((step, name))
        attempts = previous.attempts + 1 if previous is not None else 1
        delay = backoff(attempts)
        self._faults[(step, name)] = _Fault(attempts, self.clock() + delay, message, kind)
        said = self._said.setdefault(name, set())
        if kind not in said:
            said.add(kind)
            log.error("%s of %s failed (retrying with back-off, logged once): %s", step, name, message)
        else:
            log.debug("%s of %s failed again (attempt %d): %s", step, name, attempts, message)
        return delay

    def succeeded(self, step: str, name: str) -> None:
        if self._faults.pop((step, name), None) is not None:
            log.info("%s of %s works again", step, name)
            if not any(key[1] == name for key in self._faults):
                self._said.pop(name, None)

    def forget(self, name: str) -> None:
        for step_name in [k for k in self._faults if k[1] == name]:
            del self._faults[step_name]
        self._said.pop(name, None)

    def waiting(self, step: str, name: str) -> bool:
        """True while a failed step is in its back-off (the caller skips it until then)."""
        fault = self._faults.get((step, name))
        return fault is not None and fault.retry_at > self.clock()

    def failing(self, step: str, name: str) -> str | None:
        fault = self._faults.get((step, name))
        return fault.message if fault is not None else None
