"""503 "payload is still rendering": its Retry-After follows the render queue (depth / rate),
so a node waits about as long as the queue needs instead of a fixed 5 s (issue 33: in a cold
start of 5,280 NodePools a client retrying on a fixed schedule spent more CPU than the renders)."""

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
