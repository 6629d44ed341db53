"""No fault in handling one object stops the reconciler (issue 9, item 1).

The real file source polls, the real reconciler and housekeeping run as the server runs
them; a fault is injected at one step of one object (the victim), and a NodePool added
afterwards must still be applied within a few polls, the fault counted by step and logged
once with the object's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ignition_server.auth.rotation_policy import RotationPolicy
from ignition_server.auth.tokens import TokenAuthenticator
from ignition_server.metrics import ServerMetrics
from ignition_server.model.objects import ObjectKey
from ignition_server.model.token_secret import is_token_secret
from ignition_server.reconcile import reconciler as reconciler_module
from ignition_server.reconcile.outputs import PointerSettings, TokenOutputs
from ignition_server.reconcile.status import written_status
from ignition_server.reconcile.wiring import build_reconciliation
from ignition_server.render.payload import render_payload
from ignition_server.sources.files import FileSource
from payload_cache import CacheConfig, PayloadCache
from testsupport.clock import T0, Clock
from testsupport.harness import write_manifests
from testsupport.reconcile_world import open_reconciliation, pool_secret, reopenable_world, settle


@pytest.fixture
def world(tmp_path: Path):
    return reopenable_world(tmp_path)


CA = b"-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n"
POLL = 0.05
VICTIM = "clusters-a/token-v-00000000"
STEPS = ["parse", "render", "status", "write-back", "rotation", "expiry", "user-data", "edge"]


class Injected(Exception):
    """A fault no code path expects (none of them catches it by name)."""


class FaultySource(FileSource):
    """The real file source, with writes of one object made to fail."""

    fail_writes: set[str]

    async def write_back(self, key: ObjectKey, mutate: Any) -> dict[str, Any] | None:
        if key.ref in self.fail_writes:
            raise Injected(f"write of {key.ref} injected to fail")
        return await super().write_back(key, mutate)

    async def put(self, obj: dict[str, Any], *, beside: ObjectKey) -> None:
        if beside.ref in self.fail_writes and obj["metadata"]["name"].startswith("user-data-"):
            raise Injected(f"user-data of {beside.ref} injected to fail")
        await super().put(obj, beside=beside)


async def wait_until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout}s: {condition.__doc__ or condition}")
        await asyncio.sleep(0.02)


def errors(metrics: ServerMetrics, step: str) -> float:
    return metrics.registry.get_sample_value("ign_server_watch_errors_total", {"step": step}) or 0.0


@pytest.mark.parametrize("step", STEPS)
async def test_a_fault_in_one_object_leaves_later_changes_applied(step: str, tmp_path: Path, monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    source_dir = tmp_path / "source"
    source_dir.mkdir()
    cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache"))
    source = FaultySource(source_dir, poll_interval=POLL, retain=lambda obj: not is_token_secret(obj))
    source.fail_writes = set()
    edge_map = tmp_path / "edge" / "tokens.map"
    if step == "edge":
        (tmp_path / "edge").write_text("a file where the edge directory should be")  # a real write failure
    outputs = TokenOutputs(source, edge_map, PointerSettings("https://127.0.0.1:1", CA), delay=0.01)

    def renderer(inputs):
        if step == "render" and inputs.nodepool == "clusters/v":
            raise Injected("render of the victim injected to fail")
        return render_payload(inputs)

    metrics = ServerMetrics()
    reconciliation = build_reconciliation(
        source=source, cache=cache, renderer=renderer, policy=RotationPolicy(ttl=100.0),
        metrics=metrics, clock=clock, outputs=outputs, debounce=0.0,
    )
    reconciler = reconciliation.reconciler
    auth = TokenAuthenticator(cache, clock)

    # The victim and its fault.
    victim_path = source_dir / "v.yaml"
    if step == "parse":
        real_parse = reconciler_module.parse_token_secret

        def parse(obj):
            if obj["metadata"]["name"] == "token-v-00000000":
                raise Injected("parse of the victim injected to fail")
            return real_parse(obj)

        monkeypatch.setattr(reconciler_module, "parse_token_secret", parse)
    if step in ("status", "write-back", "rotation", "user-data"):
        source.fail_writes.add(VICTIM)
    victim = pool_secret("v", "tok-v", generation_time=T0 - 60 if step == "rotation" else T0)
    victim["metadata"]["creationTimestamp"] = "2027-01-01T00:00:00Z"
    write_manifests(victim_path, victim)

    tasks = [
        asyncio.create_task(source.run(reconciler.handle)),
        asyncio.create_task(reconciliation.housekeeping.run(tick=POLL)),
    ]
    try:
        if step == "expiry":
            # The operator's scenario: the Secret's file broken by hand, then a newer generation.
            await wait_until(lambda: written_status(yaml.safe_load(victim_path.read_text())).reason == "AsExpected")
            broken = victim_path.read_text().replace("kind: Secret", "kind: [Secret")
            victim_path.write_text(broken)
            newer = pool_secret("v", "tok-v2", suffix="11111111")
            newer["metadata"]["creationTimestamp"] = "2027-01-02T00:00:00Z"
            write_manifests(source_dir / "v2.yaml", newer)
        if step == "write-back":
            await wait_until(lambda: VICTIM in {s.ref for s in reconciler.tokens.secrets.values()})
            reconciler.write_backs.note_served(VICTIM)

        await wait_until(lambda: errors(metrics, step) >= 1)
        # A NodePool added after the fault is applied: its token opens its payload.
        write_manifests(source_dir / "q.yaml", pool_secret("q", "tok-q"))

        def q_served() -> bool:
            "the new NodePool's token opens its payload"
            try:
                grant = auth.authenticate("tok-q")
            except Exception:
                return False
            return cache.get_render(grant.secret) is not None

        await wait_until(q_served)

        # Retried with back-off, and logged once (not per tick or per retry).
        if step == "render":
            clock.now = T0 + 5  # the render retry timer runs on the reconciler's clock
        await wait_until(lambda: errors(metrics, step) >= 2)
        where = str(tmp_path / "edge" / "tokens.map") if step == "edge" else VICTIM
        named = [r for r in caplog.records if r.levelno >= logging.ERROR and where in r.getMessage()]
        assert len(named) == 1, [r.getMessage() for r in named]
        assert any(why in named[0].getMessage() for why in ("injected", "Not a directory", "no longer parses"))
        assert not any("Task exception was never retrieved" in r.getMessage() for r in caplog.records)
        if step == "expiry":
            assert victim_path.read_text() == broken  # left exactly as the operator left it
        if step == "render":
            # Where the object can still be written, it says why.
            await wait_until(lambda: written_status(yaml.safe_load(victim_path.read_text())).reason == "InvalidConfig")
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await reconciler.drain(1.0)


async def test_rotation_overdue_gauge_counts_secrets_whose_rotation_cannot_happen(world) -> None:
    _make, clock, source_dir = world
    reconciliation, source, _cache = open_reconciliation(source_dir, clock)  # with its housekeeping, which rotates
    reconciler = reconciliation.reconciler
    path = write_manifests(source_dir / "p.yaml", pool_secret("p", "tok-p"))
    write_manifests(source_dir / "q.yaml", pool_secret("q", "tok-q"))
    await settle(reconciler, source)
    good = path.read_text()
    path.write_text(good.replace("kind: Secret", "kind: [Secret"))  # broken by hand: p cannot rotate
    overdue = lambda: reconciler.metrics.registry.get_sample_value("ign_server_rotation_overdue_secrets")  # noqa: E731
    housekeeping = asyncio.create_task(reconciliation.housekeeping.run(tick=POLL))
    try:
        clock.now = T0 + 101  # past the TTL (100): q rotates, p cannot
        await wait_until(lambda: overdue() == 1 and errors(reconciler.metrics, "rotation") >= 1)
        assert reconciler.rotation.overdue(clock.now) == 1
        path.write_text(good)  # fixed: the retry (with back-off) rotates it
        await source.poll_once()
        await wait_until(lambda: overdue() == 0, timeout=30)
    finally:
        housekeeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await housekeeping
