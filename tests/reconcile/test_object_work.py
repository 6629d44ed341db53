"""ObjectWork: follow-up work per object, on the work queue (retries by `add_later`, a bound of writers)."""

from __future__ import annotations

import asyncio

from ignition_server.reconcile.faults import Faults
from ignition_server.reconcile.object_work import ObjectWork


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def settle(work: ObjectWork) -> None:
    for _ in range(20):
        await asyncio.sleep(0)
    await work.queue.join()


async def test_a_failed_job_runs_again_after_its_backoff_on_the_queues_clock() -> None:
    clock = Clock()
    counted: list[str] = []
    work = ObjectWork(Faults(count=counted.append, clock=clock))
    runs: list[str] = []

    async def flaky() -> None:
        runs.append("status")
        if len(runs) == 1:
            raise OSError("the API said no")

    work.submit("ns-a/s", "status", flaky)
    await settle(work)
    assert runs == ["status"] and counted == ["status"]
    assert work.queue.waiting_later("ns-a/s") and not work.in_hand("ns-a/s", "status")
    clock.now += 0.5
    work.queue.run_due()
    await settle(work)
    assert runs == ["status"]  # still in its back-off (1 s)
    clock.now += 0.6
    work.queue.run_due()
    await settle(work)
    assert runs == ["status", "status"] and work.faults.failing("status", "ns-a/s") is None


async def test_a_newer_job_replaces_a_waiting_retry_and_runs_now() -> None:
    clock = Clock()
    work = ObjectWork(Faults(clock=clock))
    ran: list[str] = []

    async def old() -> None:
        ran.append("old")
        raise OSError("no")

    async def new() -> None:
        ran.append("new")

    work.submit("ns-a/s", "status", old)
    await settle(work)
    work.submit("ns-a/s", "status", new)
    await settle(work)
    clock.now += 10
    work.queue.run_due()
    await settle(work)
    assert ran == ["old", "new"]  # the old one's retry was replaced


async def test_cancel_and_discard_drop_a_waiting_retry() -> None:
    clock = Clock()
    work = ObjectWork(Faults(clock=clock))
    ran: list[str] = []

    async def failing() -> None:
        ran.append("x")
        raise OSError("no")

    work.submit("ns-a/gone", "status", failing)
    work.retry("ns-a/moot", "parse", failing, 1.0)
    await settle(work)
    work.cancel("ns-a/gone")
    work.discard("ns-a/moot", "parse")
    clock.now += 100
    work.queue.run_due()
    await settle(work)
    assert ran == ["x"]


async def test_one_object_at_a_time_and_at_most_concurrency_objects() -> None:
    work = ObjectWork(Faults(), concurrency=2)
    running: set[str] = set()
    most = 0
    overlaps = 0

    def job(name: str):
        async def run() -> None:
            nonlocal most, overlaps
            overlaps += name in running
            running.add(name)
            most = max(most, len(running))
            await asyncio.sleep(0.01)
            running.discard(name)
        return run

    for i in range(6):
        work.submit(f"ns-{i % 3}/s{i}", "status", job(f"ns-{i % 3}/s{i}"))
        work.submit(f"ns-{i % 3}/s{i}", "write-back", job(f"ns-{i % 3}/s{i}"))
    await work.drain(5.0)
    assert most == 2 and overlaps == 0 and not running
