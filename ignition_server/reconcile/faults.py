"""Faults in handling one object: counted, logged once, retried with back-off, kept apart.

A reconciler that lets one object's exception escape stops for every object (issue 9: one
hand-broken manifest raised out of a write-back and no later change was ever applied).
Everything the reconciler does for one object therefore goes through here: `Faults` records
a failure per (step, object) and says when to try again, and `ObjectWork` runs follow-up
work (write-backs) per object on a work queue (work_queue.py), so a failure or a slow write
of one object never sits in the await chain of another's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from .work_queue import WorkQueue

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


Job = Callable[[], Awaitable[Any]]


@dataclass
class _Job:
    run: Job
    not_before: float = 0.0  # a failed job waits out its back-off (on the queue's clock)


@dataclass
class ObjectWork:
    """Follow-up work per object (write-backs, retries of a parse), keyed by object on a WorkQueue.

    The queue runs one object at a time (its jobs in submission order), takes namespaces
    round-robin and bounds the objects written at once (`concurrency`: thousands of first
    statuses must not stand between the source and its next reading, nor flood an API
    server). A job submitted for a step that is still waiting replaces it (the newer status
    or expiry is the one to write), and runs now even if the one it replaced was backing off.
    A job that raises is recorded in `faults` and the object is queued again after its
    back-off (`add_later`), unless a newer job for the same step replaced it.
    """

    faults: Faults
    concurrency: int = 4
    queue: WorkQueue[str] = field(init=False)
    _jobs: dict[str, dict[str, _Job]] = field(default_factory=dict)  # object -> step -> job
    _running: dict[str, str] = field(default_factory=dict)  # object -> the step being run

    def __post_init__(self) -> None:
        self.queue = WorkQueue(process=self._run, lane_of=lambda name: name.partition("/")[0],
                               concurrency=self.concurrency, clock=self.faults.clock)

    def submit(self, name: str, step: str, job: Job) -> None:
        self._put(name, step, _Job(job))
        self.queue.add(name)

    def retry(self, name: str, step: str, job: Job, delay: float) -> None:
        """Run `job` after `delay` (a failure the caller recorded itself), unless replaced meanwhile."""
        self._put(name, step, _Job(job, self.faults.clock() + delay))
        self.queue.add_later(name, delay)

    def _put(self, name: str, step: str, job: _Job) -> None:
        jobs = self._jobs.setdefault(name, {})
        jobs.pop(step, None)  # to the back: jobs run in submission order
        jobs[step] = job

    def cancel(self, name: str) -> None:
        """The object is gone: nothing of it waits any more (a write in progress ends on its own)."""
        self._jobs.pop(name, None)
        self.queue.forget(name)

    def discard(self, name: str, step: str) -> None:
        """A waiting job (or retry) of `step` is moot (a newer version of the object arrived)."""
        jobs = self._jobs.get(name)
        if jobs is not None and jobs.pop(step, None) is not None and not jobs:
            del self._jobs[name]
            if name not in self._running:
                self.queue.forget(name)

    def in_hand(self, name: str, step: str) -> bool:
        """A job for `step` of `name` is queued or running (not: waiting out a back-off)."""
        job = self._jobs.get(name, {}).get(step)
        return self._running.get(name) == step or (job is not None and job.not_before <= self.faults.clock())

    def running(self) -> set[asyncio.Task[None]]:
        """The queue's workers: objects with work in hand (not the ones waiting out a back-off)."""
        return set(self.queue.workers())

    async def _run(self, name: str) -> None:
        jobs = self._jobs.get(name, {})
        while True:
            now = self.faults.clock()
            due = next((step for step, job in jobs.items() if job.not_before <= now), None)
            if due is None or self._jobs.get(name) is not jobs:  # nothing due, or the object was cancelled
                break
            job = jobs.pop(due)
            self._running[name] = due
            try:
                await job.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one object's fault stays with that object
                delay = self.faults.failed(due, name, exc)
                jobs.setdefault(due, _Job(job.run, self.faults.clock() + delay))  # unless replaced meanwhile
            else:
                self.faults.succeeded(due, name)
            finally:
                del self._running[name]
        if jobs and self._jobs.get(name) is jobs:  # what is left waits out its back-off
            self.queue.add_later(name, max(min(j.not_before for j in jobs.values()) - self.faults.clock(), 0.0))
        elif not jobs and self._jobs.get(name) is jobs:
            del self._jobs[name]

    async def drain(self, timeout: float) -> None:
        """Let the work in flight finish (a draining shutdown); pending retries are dropped."""
        workers = self.queue.workers()
        if workers:
            await asyncio.wait(workers, timeout=timeout)
        self.queue.cancel()
