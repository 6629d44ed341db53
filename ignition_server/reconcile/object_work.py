"""Follow-up work per object (write-backs, expiries, retries of a parse), on a work queue.

What the reconciler does for one object after the change that asked for it: queued by object
(work_queue.py: one object at a time, namespaces round-robin, a bound of writers), a newer job
of a step replacing the waiting one, a failure recorded in `Faults` (faults.py) and retried
after its back-off. No object's failure or slow write sits in the await chain of another's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from .faults import Faults
from .work_queue import WorkQueue

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
