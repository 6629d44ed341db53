"""Faults in handling one object: counted, logged once, retried with back-off, kept apart.

A reconciler that lets one object's exception escape stops for every object (issue 9: one
hand-broken manifest raised out of a write-back and no later change was ever applied).
Everything the reconciler does for one object therefore goes through here: `Faults` records
a failure per (step, object) and says when to try again, and `ObjectWork` runs follow-up
work (write-backs) in a task per object, so a failure or a slow write of one object never
sits in the await chain of another's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

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
class _Queue:
    jobs: dict[str, Job] = field(default_factory=dict)  # by step: a newer job replaces a waiting one
    task: asyncio.Task[None] | None = None
    running: str | None = None  # the step of the job being run


@dataclass
class ObjectWork:
    """Follow-up work per object, each object in its own task, failures retried with back-off.

    Jobs of one object run one at a time, in submission order; a job submitted for a step
    that is still waiting replaces it (the newer status or expiry is the one to write).
    A job that raises is recorded in `faults` and runs again after its back-off, unless a
    newer one for the same step replaced it.
    """

    faults: Faults
    _queues: dict[str, _Queue] = field(default_factory=dict)
    _versions: dict[tuple[str, str], int] = field(default_factory=dict)  # a retry runs only if not replaced
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def submit(self, name: str, step: str, job: Job) -> None:
        self._versions[(name, step)] = self._versions.get((name, step), 0) + 1
        queue = self._queues.setdefault(name, _Queue())
        queue.jobs.pop(step, None)
        queue.jobs[step] = job
        if queue.task is None or queue.task.done():
            queue.task = asyncio.create_task(self._run(name, queue), name=f"{step} {name}")
            self._tasks.add(queue.task)
            queue.task.add_done_callback(self._tasks.discard)

    def cancel(self, name: str) -> None:
        for name_step in [k for k in self._versions if k[0] == name]:
            del self._versions[name_step]
        queue = self._queues.pop(name, None)
        if queue is not None and queue.task is not None:
            queue.task.cancel()

    def running(self) -> set[asyncio.Task[None]]:
        """The objects' tasks with work in hand (not the ones waiting out a back-off)."""
        return {q.task for q in self._queues.values() if q.task is not None and not q.task.done()}

    async def _run(self, name: str, queue: _Queue) -> None:
        while queue.jobs:
            step, job = next(iter(queue.jobs.items()))
            del queue.jobs[step]
            queue.running = step
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one object's fault stays with that object
                delay = self.faults.failed(step, name, exc)
                self._retry_later(name, step, job, delay)
            else:
                self.faults.succeeded(step, name)
            finally:
                queue.running = None
        if self._queues.get(name) is queue:
            del self._queues[name]

    def in_hand(self, name: str, step: str) -> bool:
        """A job for `step` of `name` is queued or running (not: waiting out a back-off)."""
        queue = self._queues.get(name)
        return queue is not None and (step in queue.jobs or queue.running == step)

    def discard(self, name: str, step: str) -> None:
        """A waiting retry of `step` is moot (a newer version of the object arrived)."""
        if (name, step) in self._versions:
            self._versions[(name, step)] += 1
        queue = self._queues.get(name)
        if queue is not None:
            queue.jobs.pop(step, None)

    def retry(self, name: str, step: str, job: Job, delay: float) -> None:
        """Run `job` after `delay` (a failure the caller recorded itself), unless replaced meanwhile."""
        self._versions[(name, step)] = self._versions.get((name, step), 0) + 1
        self._retry_later(name, step, job, delay)

    def _retry_later(self, name: str, step: str, job: Job, delay: float) -> None:
        version = self._versions.get((name, step))

        async def later() -> None:
            await asyncio.sleep(delay)
            if self._versions.get((name, step)) == version:  # not replaced (nor cancelled) meanwhile
                self.submit(name, step, job)

        task = asyncio.create_task(later(), name=f"retry {step} {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout: float) -> None:
        """Let the work in flight finish (a draining shutdown); pending retries are dropped."""
        running = self.running()
        if running:
            await asyncio.wait(running, timeout=timeout)
        for task in list(self._tasks):
            task.cancel()
