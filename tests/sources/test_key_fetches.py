"""The Kubernetes source's watch-event fetches (issue 30): concurrent, one per key at a time,
the newest event of a key fetched after the one running, lanes (namespaces) taken round-robin,
a failed fetch tried again while its object is there."""

from __future__ import annotations

import asyncio
from typing import Any

from ignition_server.sources.kube.key_fetches import KeyFetches


class Fetcher:
    def __init__(self, fail: int = 0) -> None:
        self.done: list[tuple[str, str]] = []  # (key, version) in the order fetched
        self.running: set[str] = set()
        self.overlapped = False
        self.fail = fail
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, kind: str, obj: dict[str, Any]) -> None:
        key = obj["metadata"]["name"]
        self.overlapped |= key in self.running
        self.running.add(key)
        try:
            await self.gate.wait()
            await asyncio.sleep(0.001)
            if self.fail:
                self.fail -= 1
                raise ConnectionError("API server unreachable")
            self.done.append((key, obj["metadata"]["resourceVersion"]))
        finally:
            self.running.discard(key)


def event(namespace: str, name: str, version: int) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": f"{namespace}/{name}", "resourceVersion": str(version)}}


def fetches(fetcher: Fetcher, present: set[str] | None = None, concurrency: int = 2) -> KeyFetches[str]:
    return KeyFetches(run=fetcher, present=lambda key: present is None or key in present,
                      lane_of=lambda key: key.partition("/")[0], concurrency=concurrency)


async def settle(queue: KeyFetches[str]) -> None:
    while queue._workers:
        await asyncio.gather(*queue._workers)


async def test_another_namespace_is_fetched_within_a_turn_of_a_burst() -> None:
    fetcher = Fetcher()
    queue = fetches(fetcher)
    for i in range(200):
        obj = event("flood", f"s{i}", 1)
        queue.add(obj["metadata"]["name"], "Secret", obj)
    victim = event("victim", "s0", 1)
    queue.add("victim/s0", "Secret", victim)
    await settle(queue)
    order = [key for key, _ in fetcher.done]
    assert len(order) == 201 and order.index("victim/s0") <= 2, order.index("victim/s0")


async def test_one_fetch_per_key_and_the_newest_event_after_it() -> None:
    fetcher = Fetcher()
    fetcher.gate.clear()
    queue = fetches(fetcher, concurrency=4)
    queue.add("ns/a", "Secret", event("ns", "a", 1))
    await asyncio.sleep(0.01)  # a's first fetch is under way
    for version in (2, 3, 4):
        queue.add("ns/a", "Secret", event("ns", "a", version))
    fetcher.gate.set()
    await settle(queue)
    assert fetcher.done == [("ns/a", "1"), ("ns/a", "4")] and not fetcher.overlapped


async def test_a_failed_fetch_is_tried_again_while_its_object_is_there() -> None:
    fetcher = Fetcher(fail=2)
    queue = fetches(fetcher)
    queue._failures["ns/a"] = iter([0.01, 0.01, 0.01])  # back-off shortened for the test
    queue.add("ns/a", "Secret", event("ns", "a", 1))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if fetcher.done:
            break
    assert fetcher.done == [("ns/a", "1")]

    gone = Fetcher(fail=1)
    queue = fetches(gone, present=set())  # deleted meanwhile: not tried again
    queue.add("ns/b", "Secret", event("ns", "b", 1))
    await settle(queue)
    await asyncio.sleep(0.6)  # past the longest first back-off
    assert gone.done == [] and not queue._workers
