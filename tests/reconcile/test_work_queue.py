"""The reconciler's work queue on its own: coalescing, one run per key at a time, fair lanes,
urgent first, held batches, debounce, back-off on the clock, forgetting."""

from __future__ import annotations

import asyncio

from ignition_server.reconcile.work_queue import WorkQueue
from testsupport.clock import T0, Clock


class Recorder:
    """A `process` that records the keys it ran, optionally waiting on a gate for each."""

    def __init__(self, gate: asyncio.Event | None = None, fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.ran: list[str] = []
        self.running: set[str] = set()
        self.overlaps = 0
        self.gate = gate
        self.fail = fail

    async def __call__(self, key: str) -> None:
        if key in self.running:
            self.overlaps += 1
        self.running.add(key)
        try:
            if self.gate is not None:
                await self.gate.wait()
            else:
                await asyncio.sleep(0)
            self.ran.append(key)
            if key in self.fail:
                raise RuntimeError(f"{key} injected to fail")
        finally:
            self.running.discard(key)


def lane(key: str) -> str:
    return key.partition("/")[0]


def queue(process: Recorder, concurrency: int = 1, clock: Clock | None = None) -> WorkQueue[str]:
    return WorkQueue(process=process, lane_of=lane, concurrency=concurrency,
                     **({"clock": clock} if clock is not None else {}))


async def test_a_key_added_while_it_waits_runs_once() -> None:
    process = Recorder()
    q = queue(process)
    with q.held():
        for _ in range(5):
            q.add("a/1")
        q.add("a/2")
    await q.join()
    assert process.ran == ["a/1", "a/2"]


async def test_a_key_added_while_it_runs_runs_once_more_after_never_twice_at_once() -> None:
    gate = asyncio.Event()
    process = Recorder(gate)
    q = queue(process, concurrency=4)
    q.add("a/1")
    await asyncio.sleep(0.01)
    assert process.running == {"a/1"}
    for _ in range(3):
        q.add("a/1")
    await asyncio.sleep(0.01)
    assert process.running == {"a/1"}  # the second run waits for the first
    gate.set()
    await q.join()
    assert process.ran == ["a/1", "a/1"] and process.overlaps == 0


async def test_lanes_take_turns_so_a_flood_in_one_delays_another_by_one_turn() -> None:
    process = Recorder()
    q = queue(process)
    with q.held():
        for i in range(1000):
            q.add(f"flood/{i}")
        q.add("victim/1")
    await q.join()
    assert process.ran.index("victim/1") <= 1
    assert len(process.ran) == 1001


async def test_urgent_keys_go_before_every_routine_one_and_a_waiting_key_moves_up() -> None:
    process = Recorder()
    q = queue(process)
    with q.held():
        for i in range(50):
            q.add(f"a/{i}")
        for i in range(50):
            q.add(f"b/{i}")
        q.add("c/new", urgent=True)
        q.add("b/30", urgent=True)  # waiting as routine: now urgent, and still once
    await q.join()
    assert set(process.ran[:2]) == {"c/new", "b/30"}
    assert process.ran.count("b/30") == 1 and len(process.ran) == 101


async def test_each_waiting_key_knows_how_many_start_before_it() -> None:
    """What a 503's Retry-After is made of (issue 33): the fleet's round robin, lanes of
    uneven length, urgent keys in front; each key's count is its place in the order run."""
    process = Recorder()
    q = queue(process)
    with q.held():
        for name, length in (("a", 5), ("b", 2), ("c", 7), ("d", 1)):
            for i in range(length):
                q.add(f"{name}/{i}")
        q.add("e/0", urgent=True)
        q.add("c/new", urgent=True)
        keys = [f"{name}/{i}" for name, length in (("a", 5), ("b", 2), ("c", 7), ("d", 1)) for i in range(length)]
        ahead = {key: q.ahead_of(key) for key in keys + ["e/0", "c/new"]}
        assert q.ahead_of("z/0") is None  # not queued
    await q.join()
    assert ahead == {key: process.ran.index(key) for key in ahead}


async def test_a_key_deep_in_a_long_lane_is_placed_as_it_runs() -> None:
    """A tenant's long lane: each key's place is found by bisecting its lane, and still matches
    the order run, at every depth (a flood's 10,000 NodePools each asked their wait)."""
    process = Recorder()
    q = queue(process)
    lengths = (("a", 400), ("b", 3), ("c", 150), ("d", 1))
    with q.held():
        for name, length in lengths:
            for i in range(length):
                q.add(f"{name}/{i}")
        q.add("e/0", urgent=True)
        keys = [f"{name}/{i}" for name, length in lengths for i in range(length)] + ["e/0"]
        ahead = {key: q.ahead_of(key) for key in keys}
    await q.join()
    assert ahead == {key: process.ran.index(key) for key in ahead}


async def test_a_running_key_has_none_ahead_and_one_waiting_out_a_back_off_is_not_placed() -> None:
    gate = asyncio.Event()
    process = Recorder(gate)
    q = queue(process, clock=Clock(T0))
    q.add("a/1")
    q.add_later("b/1", 30.0)
    await asyncio.sleep(0.01)
    assert q.ahead_of("a/1") == 0 and q.ahead_of("b/1") is None
    gate.set()
    await asyncio.sleep(0.01)
    q.cancel()


async def test_nothing_starts_while_held() -> None:
    process = Recorder()
    q = queue(process, concurrency=2)
    with q.held():
        q.add("a/1")
        q.add("b/1")
        await asyncio.sleep(0.02)
        assert process.ran == [] and q.busy()
    await q.join()
    assert sorted(process.ran) == ["a/1", "b/1"]


async def test_a_debounced_burst_runs_once_and_counts_as_busy_meanwhile() -> None:
    process = Recorder()
    q = queue(process)
    for _ in range(10):
        q.add("a/1", debounce=0.05)
        await asyncio.sleep(0.001)
    assert q.busy() and process.ran == []
    await q.join()
    assert process.ran == ["a/1"]
    q.add("a/1", debounce=10.0)
    q.add("a/1")  # needed now: the debounce does not hold it back
    await q.join()
    assert process.ran == ["a/1", "a/1"]


async def test_a_retry_waits_on_the_clock_not_busy_and_an_add_runs_it_sooner() -> None:
    clock = Clock()
    process = Recorder()
    q = queue(process, clock=clock)
    q.add_later("a/1", 5.0)
    assert not q.busy() and q.queued("a/1")
    await asyncio.sleep(0.01)
    q.run_due()
    assert process.ran == []
    clock.now = T0 + 5
    q.run_due()
    await q.join()
    assert process.ran == ["a/1"]
    q.add_later("a/1", 5.0)
    q.add("a/1")
    await q.join()
    clock.now = T0 + 100
    q.run_due()
    await q.join()
    assert process.ran == ["a/1", "a/1"]  # the immediate add replaced the timer


async def test_a_retry_asked_for_during_the_run_waits_for_its_time() -> None:
    clock = Clock()
    q: WorkQueue[str]
    runs: list[str] = []

    async def process(key: str) -> None:
        runs.append(key)
        if len(runs) == 1:
            q.add_later(key, 3.0)  # failed: try again later

    q = WorkQueue(process=process, lane_of=lane, clock=clock)
    q.add("a/1")
    await q.join()
    assert runs == ["a/1"] and q.queued("a/1") and not q.busy()
    clock.now = T0 + 3
    q.run_due()
    await q.join()
    assert runs == ["a/1", "a/1"]


async def test_a_forgotten_key_does_not_run_and_a_running_one_does_not_run_again() -> None:
    gate = asyncio.Event()
    process = Recorder(gate)
    q = queue(process)
    q.add("a/1")
    await asyncio.sleep(0.01)
    q.add("a/1")  # would run again after
    q.add("a/2")
    q.add("a/3", debounce=0.01)
    q.forget("a/1")
    q.forget("a/2")
    q.forget("a/3")
    gate.set()
    await q.join()
    assert process.ran == ["a/1"] and q.depth() == 0


async def test_one_keys_exception_stops_no_other() -> None:
    process = Recorder(fail={"a/1"})
    q = queue(process)
    with q.held():
        q.add("a/1")
        q.add("a/2")
    await q.join()
    assert process.ran == ["a/1", "a/2"]
    q.add("a/3")
    await q.join()
    assert process.ran[-1] == "a/3"


async def test_depth_is_reported_as_it_changes() -> None:
    depths: list[int] = []
    q = WorkQueue(process=Recorder(), lane_of=lane, on_depth=depths.append)
    with q.held():
        q.add("a/1")
        q.add("b/1")
    await q.join()
    assert max(depths) == 2 and depths[-1] == 0
