"""503 "payload is still rendering": its Retry-After follows the render queue (the renders ahead
of that NodePool's, at the measured rate), so a node waits about as long as its payload needs
instead of a fixed 5 s (issue 33: in a cold start of 5,280 NodePools a client retrying on a
fixed schedule spent more CPU than the renders)."""

from __future__ import annotations

import time
from pathlib import Path

from ignition_server.workers.render_wait import IDLE_S, MAX_S, RenderWait
from testsupport import fleet
from testsupport.harness import ServerProcess, bearer


def test_the_wait_is_the_time_to_render_half_the_queue_at_the_measured_rate() -> None:
    wait = RenderWait()
    assert wait.seconds() == IDLE_S  # nothing known yet
    wait.observe(600, 0, 0.0)
    assert wait.seconds() == IDLE_S  # no rate measured yet
    for second in range(1, 31):  # 6 renders a second, the queue shrinking as they finish
        wait.observe(600 - 6 * second, 6 * second, float(second))
    assert wait.seconds() == 35  # 420 queued / 2 / 6 a second
    wait.observe(4, 200, 31.0)
    assert wait.seconds() == 1  # clamped below
    wait.observe(0, 204, 32.0)
    assert wait.seconds() == IDLE_S  # nothing queued: inputs awaited, or about to be scheduled


def test_a_nodepools_own_wait_is_the_renders_ahead_of_it_at_the_measured_rate() -> None:
    wait = RenderWait()
    assert wait.seconds_for(10) == IDLE_S  # no rate measured yet
    for second in range(31):  # 6 renders a second
        wait.observe(600 - 6 * second, 6 * second, float(second))
    assert wait.seconds_for(0) == 1  # rendering now: ask again in a second
    assert wait.seconds_for(59) == 10  # 60 renders to go, its own last, at 6 a second
    assert wait.seconds_for(5_000) == MAX_S == 60  # bounded: a queue may speed up
    assert wait.seconds_for(None) == IDLE_S  # not queued for a render: inputs awaited


def test_a_queue_that_does_not_move_asks_for_the_longest_wait() -> None:
    wait = RenderWait()
    wait.observe(50, 10, 0.0)
    for second in range(1, 60):
        wait.observe(50, 10, float(second))
    assert wait.seconds() == MAX_S


def test_retry_after_of_a_payload_still_rendering_follows_the_queue(tmp_path: Path) -> None:
    """A cold start of 120 NodePools, one render at a time, 2 workers serving: the 503s a
    NodePool gets while waiting carry a Retry-After beyond the old fixed 5 s while the queue is
    deep, shrinking as it drains."""
    meta = fleet.generate(tmp_path / "fleet", 3, 40, 300, progress=False)
    server = ServerProcess(Path(meta["source"]), tmp_path / "cache",
                           extra=["--workers", "2", "--render-concurrency", "1"]).start()
    try:
        nodepools = sorted(meta["tokens"])[::7]
        seen: list[tuple[float, int]] = []  # (seconds since start, Retry-After) of each 503
        waiting = set(nodepools)
        started = time.monotonic()
        while waiting and time.monotonic() - started < 240:
            for nodepool in sorted(waiting):
                status, headers, _ = server.get("/ignition", {**bearer(meta["tokens"][nodepool]), "NodePool": nodepool})
                if status == 200:
                    waiting.discard(nodepool)
                elif status == 503:
                    seen.append((time.monotonic() - started, int(headers["Retry-After"])))
            time.sleep(0.5)
        assert not waiting, "every NodePool was served in the end"
        values = [value for _, value in seen]
        assert max(values) > IDLE_S, seen  # a deep queue: more than the old constant
        deepest = values.index(max(values))
        assert min(values[deepest:]) < max(values), seen  # and less as the queue drains
    finally:
        server.stop()


def test_each_nodepool_is_told_its_own_wait_the_last_of_the_round_robin_longest(tmp_path: Path) -> None:
    """A cold start, one render at a time, 2 workers: in one pass over every NodePool still
    waiting, those whose render comes last are told to wait several times longer than those
    whose render comes soon (one wait for all of them before issue 33), and the ones told the
    shortest waits are served first."""
    meta = fleet.generate(tmp_path / "fleet", 3, 40, 300, progress=False)
    server = ServerProcess(Path(meta["source"]), tmp_path / "cache",
                           extra=["--workers", "2", "--render-concurrency", "1"]).start()
    try:
        nodepools = sorted(meta["tokens"])
        told: dict[str, int] = {}  # the first pass after the render rate is known
        served: dict[str, float] = {}
        started = time.monotonic()

        def ask(nodepool: str) -> tuple[int, dict[str, str], bytes]:
            return server.get("/ignition", {**bearer(meta["tokens"][nodepool]), "NodePool": nodepool})

        # Until the listing is in (one token at a time: a pass of 511s would have this address held off).
        while ask(nodepools[-1])[0] == 511 and time.monotonic() - started < 60:
            time.sleep(0.2)
        while len(served) < len(nodepools) and time.monotonic() - started < 240:
            told_now: dict[str, int] = {}
            for nodepool in nodepools:
                if nodepool in served:
                    continue
                status, headers, body = ask(nodepool)
                if status == 200:
                    served[nodepool] = time.monotonic()
                elif status == 503 and b"still rendering" in body:
                    told_now[nodepool] = int(headers["Retry-After"])
            if not told and len(told_now) >= 40 and max(told_now.values()) > IDLE_S:
                told = told_now  # the rate is measured: waits beyond the idle 5 s
            time.sleep(0.3)
        assert len(served) == len(nodepools), "every NodePool was served in the end"
        assert told, "a pass while the queue was deep"
        ordered = sorted(told, key=told.__getitem__)
        soonest, latest = ordered[: len(ordered) // 4], ordered[-(len(ordered) // 4):]
        assert max(told.values()) <= MAX_S
        assert told[latest[-1]] >= 3 * told[soonest[0]], told
        assert sum(served[n] for n in soonest) / len(soonest) < sum(served[n] for n in latest) / len(latest), (told, served)
    finally:
        server.stop()

