"""Rotation on its own: a real file source written back, a real encrypted cache, a test clock."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ignition_server.auth.rotation_policy import RotationPolicy
from ignition_server.config import SUPERSEDED_GRACE
from ignition_server.metrics import ServerMetrics
from ignition_server.model.token_secret import ANNOTATION_TOKEN_EXPIRATION, TokenSecret, format_time
from ignition_server.reconcile.faults import Faults
from ignition_server.reconcile.index_flush import IndexFlush
from ignition_server.reconcile.object_work import ObjectWork
from ignition_server.reconcile.rotation import Rotation, rotation_name
from ignition_server.reconcile.tenancy import generation_group
from ignition_server.reconcile.token_secrets import TokenSecrets
from ignition_server.reconcile.write_backs import WriteBacks
from ignition_server.sources.files import FileSource
from payload_cache import CacheConfig, PayloadCache, TokenState
from testsupport.clock import T0, Clock
from testsupport.harness import write_manifests
from testsupport.manifests import build_token_secret, token_status

TTL = 100.0


def manifest(pool: str, token: str, *, suffix: str = "00000000", created: str = "2027-01-01T00:00:00Z",
             generation_time: float = T0) -> dict:
    obj = build_token_secret(namespace="clusters-a", nodepool=f"clusters/{pool}", token=token, suffix=suffix,
                             generation_time=generation_time)
    obj["metadata"]["creationTimestamp"] = created
    return obj


class World:
    """What the dispatcher would hand Rotation: the token Secrets fed from the source, the write-backs."""

    def __init__(self, tmp_path: Path, clock: Clock, *, read_only: bool = False, writer: bool = True) -> None:
        self.source_dir = tmp_path / "source"
        self.source_dir.mkdir(exist_ok=True)
        self.cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache"))
        self.source = FileSource(self.source_dir, read_only=read_only)
        self.metrics = ServerMetrics()
        faults = Faults()
        self.work = ObjectWork(faults)
        self.tokens = TokenSecrets(cache=self.cache, ttl=TTL, clock=clock)
        write_backs = WriteBacks(source=self.source, work=self.work, faults=faults, secret_of=self.tokens.get,
                                 writer=lambda: writer, clock=clock)
        self.rotation = Rotation(tokens=self.tokens, cache=self.cache, policy=RotationPolicy(TTL),
                                 write_backs=write_backs, work=self.work, faults=faults, metrics=self.metrics,
                                 persist_index=IndexFlush(self.cache), clock=clock)

    async def read(self, *paths: Path) -> list[TokenSecret]:
        """The source lists the files; each token Secret is indexed as the dispatcher does it."""
        await self.source.poll_once()
        read = []
        for path in paths:
            secret = token_status(path)
            self.tokens.seen(secret)
            secret = self.rotation.restore(secret)
            self.tokens.put(secret)
            read.append(secret)
        return read

    def rotations(self) -> float:
        return self.metrics.token_rotations._value.get()


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def test_a_due_secret_rotates_at_the_source_and_the_index_learns_the_new_token(tmp_path: Path, clock) -> None:
    world = World(tmp_path, clock)
    path = write_manifests(world.source_dir / "p.yaml", manifest("p", "tok-0"))
    [secret] = await world.read(path)
    clock.now = T0 + TTL / 2 - 1
    assert await world.rotation.rotate_due() == 0
    clock.now = T0 + TTL / 2
    assert await world.rotation.rotate_due() == 1
    written = token_status(path)
    assert written.old_token == "tok-0" and written.token not in (None, "tok-0")
    assert written.generation_time == pytest.approx(clock.now, abs=1)
    assert world.tokens.get(secret.key).token == written.token
    assert world.cache.lookup_token(written.token).state is TokenState.CURRENT
    assert world.cache.lookup_token("tok-0").state is TokenState.PREVIOUS
    assert world.rotations() == 1
    assert await world.rotation.rotate_due() == 0  # the new token is not due yet


async def test_only_the_writer_rotates(tmp_path: Path, clock) -> None:
    world = World(tmp_path, clock, writer=False)
    path = write_manifests(world.source_dir / "p.yaml", manifest("p", "tok-0"))
    before = path.read_bytes()
    await world.read(path)
    clock.now = T0 + TTL
    assert await world.rotation.rotate_due() == 0
    assert path.read_bytes() == before and world.rotations() == 0


async def test_a_read_only_source_rotates_in_the_cache_dir_until_the_source_moves_on(tmp_path: Path, clock) -> None:
    world = World(tmp_path, clock, read_only=True)
    path = write_manifests(world.source_dir / "p.yaml", manifest("p", "tok-0"))
    before = path.read_bytes()
    [secret] = await world.read(path)
    clock.now = T0 + TTL / 2
    assert await world.rotation.rotate_due() == 1
    assert path.read_bytes() == before  # never written
    rotated = world.tokens.get(secret.key)
    assert rotated.old_token == "tok-0" and rotated.token not in (None, "tok-0")
    world.cache.flush()
    # A new process: the rotation is sealed in the cache dir and applies to what the source holds.
    again = World(tmp_path, clock, read_only=True)
    [restored] = await again.read(path)
    assert (restored.token, restored.old_token) == (rotated.token, "tok-0")
    # The source's own token changed (rotated elsewhere): the source wins, the sealed state goes.
    write_manifests(path, manifest("p", "tok-elsewhere"))
    [moved] = await again.read(path)
    assert moved.token == "tok-elsewhere"
    assert again.cache.unseal(rotation_name(secret.ref)) is None


async def test_overdue_counts_the_live_secrets_whose_token_outlived_the_ttl(tmp_path: Path, clock) -> None:
    world = World(tmp_path, clock)
    p = write_manifests(world.source_dir / "p.yaml", manifest("p", "tok-p", suffix="11111111"))
    q = write_manifests(world.source_dir / "q.yaml", manifest("q", "tok-q", suffix="22222222",
                                                              generation_time=T0 + 50))
    await world.read(p, q)
    assert world.rotation.overdue(T0 + TTL) == 0
    assert world.rotation.overdue(T0 + TTL + 1) == 1  # p only: q's token is younger
    assert world.rotation.overdue(T0 + TTL + 51) == 2


async def test_older_generations_of_a_nodepool_get_an_expiry_the_newest_none(tmp_path: Path, clock) -> None:
    world = World(tmp_path, clock)
    old = write_manifests(world.source_dir / "old.yaml", manifest("p", "tok-old", suffix="11111111"))
    new = write_manifests(world.source_dir / "new.yaml", manifest("p", "tok-new", suffix="22222222",
                                                                  created="2027-01-02T00:00:00Z"))
    secrets = await world.read(old, new)
    world.rotation.expire_outdated({generation_group(secrets[0])})
    await world.work.drain(10.0)
    notes = yaml.safe_load(old.read_text())["metadata"]["annotations"]
    assert notes[ANNOTATION_TOKEN_EXPIRATION] == format_time(T0 + SUPERSEDED_GRACE)
    assert token_status(new).expiration is None
