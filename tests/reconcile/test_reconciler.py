"""The reconciler with a real file source, a real encrypted cache and the real renderer, on a test clock."""

from __future__ import annotations

import base64
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import yaml

from ignition_server.auth.rotation_policy import RotationPolicy
from ignition_server.auth.tokens import Refusal, TokenAuthenticator
from ignition_server.metrics import ServerMetrics
from ignition_server.model.token_secret import (
    ANNOTATION_TOKEN_EXPIRATION,
    format_time,
    is_token_secret,
    parse_token_secret,
)
from ignition_server.reconcile.wiring import build_reconciliation
from ignition_server.render.payload import render_payload
from ignition_server.sources.files import FileSource
from payload_cache import TokenState
from testsupport.clock import T0
from testsupport.harness import EXAMPLE_MACHINECONFIG, write_manifests
from testsupport.manifests import build_token_secret, token_status
from testsupport.reconcile_world import pool_secret, renders, reopenable_world, settle
from testsupport.reconciler_idle import wait_idle


@pytest.fixture
def world(tmp_path: Path):
    return reopenable_world(tmp_path)


async def test_expiration_annotation_refuses_the_secrets_tokens(world) -> None:
    make, clock, source_dir = world
    reconciler, source, cache = make()
    obj = pool_secret("p", "tok-1", old_token="tok-0")
    obj["metadata"]["annotations"][ANNOTATION_TOKEN_EXPIRATION] = format_time(T0 + 10)
    write_manifests(source_dir / "p.yaml", obj)
    await settle(reconciler, source)
    auth = TokenAuthenticator(cache, clock)
    assert auth.authenticate("tok-1").nodepool == "clusters/p"
    assert auth.authenticate("tok-0").nodepool == "clusters/p"
    clock.now = T0 + 11
    for token in ("tok-1", "tok-0"):
        with pytest.raises(Refusal) as refused:
            auth.authenticate(token)
        assert refused.value.status == 403
    # Expired Secrets are not rotated.
    assert await reconciler.rotation.rotate_due() == 0


async def test_a_newer_secret_outdates_the_older_one_for_two_hours(world) -> None:
    make, clock, source_dir = world
    reconciler, source, cache = make()
    old = pool_secret("p", "tok-old", suffix="old00000")
    old["metadata"]["creationTimestamp"] = "2027-01-01T00:00:00Z"
    write_manifests(source_dir / "old.yaml", old)
    await settle(reconciler, source)
    new = pool_secret("p", "tok-new", suffix="new00000")
    new["metadata"]["creationTimestamp"] = "2027-01-02T00:00:00Z"
    new["data"]["config"] = build_token_secret(
        namespace="x", nodepool="x/y", token="t", machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="newer")
    )["data"]["config"]
    write_manifests(source_dir / "new.yaml", new)
    await settle(reconciler, source)
    written = yaml.safe_load((source_dir / "old.yaml").read_text())
    expiry = parse_token_secret(written).expiration
    assert expiry == pytest.approx(T0 + 7200, abs=1)
    assert token_status(source_dir / "new.yaml").expiration is None
    # Both generations serve their own payload until then.
    auth = TokenAuthenticator(cache, clock)
    old_blob = cache.get_blob(cache.get_render(auth.authenticate("tok-old").secret).blob_id)
    new_blob = cache.get_blob(cache.get_render(auth.authenticate("tok-new").secret).blob_id)
    assert b"/etc/p.conf" in old_blob and b"/etc/newer.conf" in new_blob


async def test_rotation_on_the_clock_and_across_a_restart(world) -> None:
    make, clock, source_dir = world
    reconciler, source, cache = make()
    path = write_manifests(source_dir / "p.yaml", pool_secret("p", "tok-0"))
    await settle(reconciler, source)
    before = renders(reconciler)
    clock.now = T0 + 49
    assert await reconciler.rotation.rotate_due() == 0
    clock.now = T0 + 50
    assert await reconciler.rotation.rotate_due() == 1
    first = token_status(path)
    assert first.old_token == "tok-0" and first.token not in (None, "tok-0")
    clock.now = T0 + 100
    assert await reconciler.rotation.rotate_due() == 1
    second = token_status(path)
    assert second.old_token == first.token
    auth = TokenAuthenticator(cache, clock)
    assert cache.lookup_token("tok-0").state is TokenState.RETIRED
    with pytest.raises(Refusal) as refused:
        auth.authenticate("tok-0")
    assert refused.value.status == 403
    assert auth.authenticate(first.token).secret == "clusters-a/token-p-00000000"
    assert renders(reconciler) == before  # rotation never re-renders
    cache.flush()
    # A new process: the retired token is still refused, and forgotten one TTL later.
    reconciler2, source2, cache2 = make()
    await settle(reconciler2, source2)
    auth2 = TokenAuthenticator(cache2, clock)
    with pytest.raises(Refusal) as refused:
        auth2.authenticate("tok-0")
    assert refused.value.status == 403
    assert renders(reconciler2) == 0
    clock.now = T0 + 100 + 101
    cache2.forget_expired(clock.now)
    with pytest.raises(Refusal) as refused:
        auth2.authenticate("tok-0")
    assert refused.value.status == 511


async def test_secret_deleted_while_down_is_forgotten_after_the_first_listing(world) -> None:
    make, clock, source_dir = world
    reconciler, source, cache = make()
    write_manifests(source_dir / "a.yaml", pool_secret("a", "tok-a"))
    write_manifests(source_dir / "b.yaml", pool_secret("b", "tok-b"))
    await settle(reconciler, source)
    cache.flush()
    (source_dir / "b.yaml").unlink()
    reconciler2, source2, cache2 = make()
    auth = TokenAuthenticator(cache2, clock)
    assert auth.authenticate("tok-b")  # before the first listing: served from the index
    await settle(reconciler2, source2)
    with pytest.raises(Refusal) as refused:
        auth.authenticate("tok-b")
    assert refused.value.status == 403
    assert cache2.get_render("clusters-a/token-b-00000000") is None
    assert auth.authenticate("tok-a")


async def test_read_only_source_rotates_in_the_cache_dir(world) -> None:
    make, clock, source_dir = world
    reconciler, source, cache = make(read_only=True)
    path = write_manifests(source_dir / "p.yaml", pool_secret("p", "tok-0"))
    before = path.read_bytes()
    await settle(reconciler, source)
    clock.now = T0 + 50
    assert await reconciler.rotation.rotate_due() == 1
    clock.now = T0 + 100
    assert await reconciler.rotation.rotate_due() == 1
    assert path.read_bytes() == before  # never written
    current = reconciler.tokens.secrets[next(iter(reconciler.tokens.secrets))]
    auth = TokenAuthenticator(cache, clock)
    assert auth.authenticate(current.token) and auth.authenticate(current.old_token)
    with pytest.raises(Refusal):
        auth.authenticate("tok-0")
    cache.flush()
    # The rotation state survives a restart (sealed in the cache), and the token is not on disk in clear.
    reconciler2, source2, cache2 = make(read_only=True)
    await settle(reconciler2, source2)
    assert reconciler2.tokens.secrets[current.key].token == current.token
    for file in (source_dir.parent / "cache").rglob("*"):
        if file.is_file():
            assert current.token.encode() not in file.read_bytes()
    # When the source's own token changes (rotated elsewhere), the source wins.
    write_manifests(path, pool_secret("p", "tok-from-elsewhere"))
    await settle(reconciler2, source2)
    assert reconciler2.tokens.secrets[current.key].token == "tok-from-elsewhere"


def test_render_command_prints_the_payload(tmp_path: Path) -> None:
    write_manifests(tmp_path / "p.yaml", pool_secret("workers", "tok"))
    result = subprocess.run(
        [sys.executable, "-m", "ignition_server", "render", "--source", str(tmp_path), "--nodepool", "clusters/workers"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert '"path":"/etc/workers.conf"' in result.stdout
    assert "pull-secret not in the source" in result.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "ignition_server", "render", "--source", str(tmp_path), "--nodepool", "clusters/nope"],
        capture_output=True, text=True, timeout=60,
    )
    assert missing.returncode == 1 and "clusters/workers" in missing.stderr


async def test_large_configs_are_not_held_in_memory_but_render(world) -> None:
    import base64 as b64
    import os

    from ignition_server.model.objects import LargeValue, ObjectKey

    make, clock, source_dir = world
    reconciler, source, cache = make()
    noise = b64.b64encode(os.urandom(200 * 1024)).decode()  # does not compress: a large `config`
    big = EXAMPLE_MACHINECONFIG.format(name="big").replace(
        "source: data:,hello%20from%20big%0A", f"source: data:;base64,{noise}"
    )
    obj = build_token_secret(namespace="clusters-a", nodepool="clusters/big", token="tok-big",
                             machineconfigs_yaml=big, generation_time=T0)
    write_manifests(source_dir / "big.yaml", obj)
    await settle(reconciler, source)
    key = ObjectKey("Secret", "clusters-a", "token-big-00000000")
    assert isinstance(source.get(key)["data"]["config"], LargeValue)
    assert source.get_full(key)["data"]["config"] == obj["data"]["config"]
    payload = cache.get_blob(cache.get_render("clusters-a/token-big-00000000").blob_id)
    assert noise[:1000].encode() in payload
    # Unchanged on a new listing (same digest): no second render.
    before = renders(reconciler)
    reconciler2, source2, _cache2 = make()
    await settle(reconciler2, source2)
    assert renders(reconciler2) == 0 and before == 1


async def test_a_manifest_broken_while_down_keeps_serving_its_last_good_payload(world, tmp_path: Path) -> None:
    make, clock, source_dir = world
    reconciler, source, cache = make()
    source.state = cache  # the listing snapshot, as the server wires it
    path = write_manifests(source_dir / "p.yaml", pool_secret("p", "tok-p"))
    await source.run(reconciler.handle, iterations=0)
    await wait_idle(reconciler)
    await source.flush()
    cache.flush()
    path.write_text(path.read_text().replace("kind: Secret", "kind: [Secret"))  # broken YAML while down
    reconciler2, source2, cache2 = make()
    source2.state = cache2
    await source2.run(reconciler2.handle, iterations=0)
    # Not forgotten as "deleted while down": the token still opens its payload.
    assert TokenAuthenticator(cache2, clock).authenticate("tok-p").nodepool == "clusters/p"
    assert cache2.get_render("clusters-a/token-p-00000000") is not None


async def test_a_config_broken_then_put_back_says_as_expected_again(world) -> None:
    make, clock, source_dir = world
    reconciler, source, cache = make()
    path = write_manifests(source_dir / "p.yaml", pool_secret("p", "tok-p"))
    good_config = yaml.safe_load(path.read_text())["data"]["config"]
    await settle(reconciler, source)

    def status() -> str | None:
        return token_status(path).reason

    assert status() == "AsExpected"
    broken = yaml.safe_load(path.read_text())
    broken["data"]["config"] = build_token_secret(namespace="x", nodepool="x/y", token="t",
                                                  machineconfigs_yaml="kind: [broken")["data"]["config"]
    write_manifests(path, broken)
    await settle(reconciler, source)
    await source.poll_once()
    assert status() == "InvalidConfig"
    fixed = yaml.safe_load(path.read_text())  # the operator puts the old config back; the status stays as written
    fixed["data"]["config"] = good_config
    write_manifests(path, fixed)
    await settle(reconciler, source)
    await source.poll_once()
    assert status() == "AsExpected"


async def test_a_config_over_its_bounds_is_refused_once_not_retried(world) -> None:
    make, clock, source_dir = world
    reconciler, source, cache = make()
    flat = pool_secret("flat", "tok-flat")
    flat["data"]["config"] = base64.b64encode(
        zlib.compress(b"- a\n" * 250_000, 9, wbits=16 + zlib.MAX_WBITS)).decode()  # 1 MB of YAML, 2 KiB of gzip
    path = write_manifests(source_dir / "flat.yaml", flat)
    await settle(reconciler, source)
    await source.poll_once()
    status = token_status(path)
    assert status.reason == "InvalidConfig" and "nodes" in (status.message or "")

    def failures() -> float:
        return reconciler.metrics.render_failures._value.get()

    assert failures() == 1
    for _ in range(3):  # past every back-off: a retry would refuse the same bytes at the same cost again
        clock.now += 1000
        reconciler.nodepools.queue.run_due()
        await wait_idle(reconciler)
    assert failures() == 1


def refused_status(auth: TokenAuthenticator, token: str) -> int | None:
    try:
        auth.authenticate(token)
    except Refusal as refusal:
        return refusal.status
    return None


async def test_a_rotation_that_loses_to_another_writer_never_refuses_the_winners_token(world) -> None:
    # The Lease moved: the former writer rotated tok-0 -> tok-other, and this writer has not
    # read it yet when its own rotation falls due. Its write finds tok-other and writes
    # nothing; the token the source now holds (and its old_token) must keep opening.
    make, clock, source_dir = world
    reconciler, source, cache = make()
    path = write_manifests(source_dir / "p.yaml", pool_secret("p", "tok-0", old_token="tok-before"))
    await settle(reconciler, source)
    write_manifests(path, pool_secret("p", "tok-other", old_token="tok-0", generation_time=T0 + 49))
    clock.now = T0 + 50
    assert await reconciler.rotation.rotate_due() == 0
    auth = TokenAuthenticator(cache, clock)
    assert refused_status(auth, "tok-other") is None
    assert refused_status(auth, "tok-0") is None
    assert reconciler.tokens.secrets[next(iter(reconciler.tokens.secrets))].token == "tok-other"


class StalledSource(FileSource):
    """A file source whose write-backs wait for the test, or fail as an API outage does."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        import asyncio

        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()  # until the test holds writes back (the status write at the first listing)
        self.failing = False

    async def write_back(self, key, mutate):
        self.entered.set()
        await self.release.wait()
        if self.failing:
            raise RuntimeError("503 Service Unavailable")
        return await super().write_back(key, mutate)


async def test_a_rotation_changes_what_is_served_only_once_its_write_is_accepted(world, tmp_path: Path) -> None:
    import asyncio

    make, clock, source_dir = world
    _unused, _source, cache = make()
    source = StalledSource(source_dir, retain=lambda obj: not is_token_secret(obj))
    reconciler = build_reconciliation(source=source, cache=cache, renderer=render_payload, policy=RotationPolicy(ttl=100.0),
                                      metrics=ServerMetrics(), clock=clock).reconciler
    source.attach(reconciler.handle)
    path = write_manifests(source_dir / "p.yaml", pool_secret("p", "tok-1", old_token="tok-0"))
    await settle(reconciler, source)
    auth = TokenAuthenticator(cache, clock)
    clock.now = T0 + 50
    for outcome in ("failing", "accepted"):
        source.failing = outcome == "failing"
        source.entered.clear()
        source.release.clear()
        rotating = asyncio.ensure_future(reconciler.rotation.rotate_due())
        await source.entered.wait()
        # The write is in flight (an API taking its time): both listed tokens still open.
        assert refused_status(auth, "tok-1") is None and refused_status(auth, "tok-0") is None
        source.release.set()
        rotated = await rotating
        if outcome == "failing":
            # An outage: nothing written, nothing retired, whatever the clock says.
            assert rotated == 0 and refused_status(auth, "tok-0") is None and refused_status(auth, "tok-1") is None
            reconciler.faults.forget(next(iter(reconciler.tokens.secrets)).ref)  # no back-off wait in the test
    written = token_status(path)
    assert written.old_token == "tok-1" and refused_status(auth, written.token) is None
    assert refused_status(auth, "tok-1") is None and refused_status(auth, "tok-0") == 403
