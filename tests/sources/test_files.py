"""The file source: listing, change events, atomic write-back that keeps the rest of the file."""

from __future__ import annotations

import base64
import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from ignition_server.auth.rotation_policy import RotationPolicy, rotation_mutation
from ignition_server.config import parse_duration, parse_hostport
from ignition_server.model.objects import ManifestError, ObjectKey
from ignition_server.model.token_secret import (
    decode_config,
    format_time,
    parse_time,
    parse_token_secret,
    token_secret_config,
)
from ignition_server.sources.events import Change
from ignition_server.sources.files import FileSource
from testsupport import REPO
from testsupport.manifests import build_token_secret, encode_config

EXAMPLE = REPO / "examples" / "token-secret.yaml"
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "ns"}, "data": {"a": "1"}}


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[Change]] = []

    async def __call__(self, changes: list[Change]) -> None:
        self.batches.append(changes)

    def flat(self) -> list[tuple[str, str]]:
        return [(c.type, c.key.name) for batch in self.batches for c in batch]


def aged_token_secrets(source_dir: Path, count: int = 3) -> Path:
    """`count` token Secret manifests in a new `source_dir`, older than the racy window (so a
    listing snapshot can vouch for them)."""
    source_dir.mkdir()
    for i in range(count):
        path = source_dir / f"p{i}.yaml"
        path.write_text(yaml.safe_dump(build_token_secret(namespace="ns", nodepool=f"ns/p{i}", token=f"t{i}")))
        old = time.time() - 60  # older than the racy window
        os.utime(path, (old, old))
    return source_dir


def test_example_secret_as_oc_prints_it_decodes() -> None:
    obj = yaml.safe_load(EXAMPLE.read_text())
    secret = parse_token_secret(obj)
    assert secret.nodepool == "clusters/example-np"
    assert secret.token == "7d3f6a0e-5c1b-4e8a-9b2f-1a2b3c4d5e6f"
    config = token_secret_config(obj)
    assert "kind: MachineConfig" in config and "/etc/motd" in config
    assert secret.release.startswith("quay.io/openshift-release-dev/ocp-release@sha256:")
    assert secret.preconditions["pull-secret-hash"] == "0f0f0f0f"


def test_string_data_and_data_are_equivalent() -> None:
    built = build_token_secret(namespace="ns", nodepool="ns/np", token="abc", machineconfigs_yaml="a: 1\n")
    as_string_data = dict(built)
    as_string_data["stringData"] = {k: base64.b64decode(v).decode() for k, v in built["data"].items()}
    del as_string_data["data"]
    # The same Secret either way; only the digest of how `config` is held differs.
    assert replace(parse_token_secret(built), config_digest="") == replace(parse_token_secret(as_string_data), config_digest="")
    assert token_secret_config(built) == token_secret_config(as_string_data) == "a: 1\n"


def test_bad_values_are_clear_errors() -> None:
    built = build_token_secret(namespace="ns", nodepool="ns/np", token="abc")
    built["data"]["token"] = "not base64!!"
    with pytest.raises(ManifestError, match="data.token is not valid base64"):
        parse_token_secret(built)
    with pytest.raises(ManifestError, match="gzip"):
        decode_config(base64.b64encode(b"plain text, not gzip"))
    assert decode_config(encode_config("x: 1\n")) == "x: 1\n"


def test_times_round_trip_with_nanoseconds() -> None:
    stamp = format_time(1700000000.123456789)
    assert stamp == "2023-11-14T22:13:20.123456835Z" or stamp.startswith("2023-11-14T22:13:20.1234")
    assert abs(parse_time(stamp) - 1700000000.123456) < 1e-5  # type: ignore[operator]
    assert parse_time("2024-01-01T00:00:00Z") == 1704067200.0


def test_durations_and_addresses() -> None:
    assert parse_duration("6s") == 6 and parse_duration("11h") == 39600 and parse_duration("1h30m") == 5400
    assert parse_duration("250ms") == 0.25 and parse_duration("90") == 90
    for bad in ("", "6x", "-1", "h"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert parse_hostport("0.0.0.0:9090", 1) == ("0.0.0.0", 9090)
    assert parse_hostport("[::1]:9", 1) == ("::1", 9)
    assert parse_hostport(":80", 1) == ("0.0.0.0", 80)


def test_rotation_policy() -> None:
    policy = RotationPolicy(ttl=10.0)
    fresh = parse_token_secret(build_token_secret(namespace="n", nodepool="n/p", token="t", generation_time=100.0))
    assert not policy.is_due(fresh, 104.9) and policy.is_due(fresh, 105.0)
    unstamped = parse_token_secret(build_token_secret(namespace="n", nodepool="n/p", token="t"))
    assert policy.is_due(unstamped, 0.0)
    obj = build_token_secret(namespace="n", nodepool="n/p", token="t1", old_token="t0")
    assert rotation_mutation("t1", "t2", 200.0)(obj)
    rotated = parse_token_secret(obj)
    assert (rotated.token, rotated.old_token, rotated.generation_time) == ("t2", "t1", 200.0)
    # A rotation based on a stale view writes nothing.
    assert not rotation_mutation("t1", "t3", 201.0)(obj)


async def test_listing_and_changes(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.yaml").write_text(yaml.safe_dump_all([CONFIGMAP, build_token_secret(namespace="ns", nodepool="ns/p", token="t")]))
    (tmp_path / "list.yml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull-secret", "namespace": "ns"}, "data": {}}]}))
    (tmp_path / "notes.txt").write_text("ignored")
    source = FileSource(tmp_path)
    recorder = Recorder()
    source.attach(recorder)
    await source.poll_once()
    assert sorted(recorder.flat()) == [("ADDED", "cm"), ("ADDED", "pull-secret"), ("ADDED", "token-p-00000000")]
    await source.poll_once()
    assert len(recorder.batches) == 1  # nothing changed: nothing handed over
    changed = dict(CONFIGMAP, data={"a": "2"})
    (tmp_path / "sub" / "a.yaml").write_text(yaml.safe_dump_all([changed, build_token_secret(namespace="ns", nodepool="ns/p", token="t")]))
    await source.poll_once()
    assert recorder.flat()[-1] == ("MODIFIED", "cm")
    (tmp_path / "list.yml").unlink()
    await source.poll_once()
    assert recorder.flat()[-1] == ("DELETED", "pull-secret")


async def test_unparseable_file_keeps_its_last_good_objects(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(CONFIGMAP))
    source = FileSource(tmp_path)
    source.attach(Recorder())
    await source.poll_once()
    path.write_text("kind: [unclosed\n")
    await source.poll_once()
    assert ObjectKey("ConfigMap", "ns", "cm") in source.objects()


async def test_write_back_rewrites_one_document_atomically(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    secret = build_token_secret(namespace="ns", nodepool="ns/p", token="t1")
    text = "# a comment the other document keeps\n" + yaml.safe_dump(CONFIGMAP) + "---\n" + yaml.safe_dump(secret) + "---\n# trailing\nkind: ConfigMap\napiVersion: v1\nmetadata: {name: z, namespace: ns}\n"
    path.write_text(text)
    path.chmod(0o640)
    source = FileSource(tmp_path)
    recorder = Recorder()
    source.attach(recorder)
    await source.poll_once()
    key = ObjectKey("Secret", "ns", "token-p-00000000")
    written = await source.write_back(key, rotation_mutation("t1", "t2", time.time()))
    assert written is not None
    new_text = path.read_text()
    assert new_text.startswith("# a comment the other document keeps\n" + yaml.safe_dump(CONFIGMAP))
    assert new_text.endswith("# trailing\nkind: ConfigMap\napiVersion: v1\nmetadata: {name: z, namespace: ns}\n")
    assert parse_token_secret(source.objects()[key]).token == "t2"
    assert recorder.flat()[-1] == ("MODIFIED", "token-p-00000000")
    assert path.stat().st_mode & 0o777 == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


async def test_write_back_applies_to_an_edit_made_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(build_token_secret(namespace="ns", nodepool="ns/p", token="t1")))
    source = FileSource(tmp_path)
    source.attach(Recorder())
    await source.poll_once()
    # Someone edits the file (adds a key) before the server has re-read it.
    edited = yaml.safe_load(path.read_text())
    edited["data"]["hc-configuration-hash"] = base64.b64encode(b"new").decode()
    path.write_text(yaml.safe_dump(edited))
    key = ObjectKey("Secret", "ns", "token-p-00000000")
    await source.write_back(key, rotation_mutation("t1", "t2", time.time()))
    result = yaml.safe_load(path.read_text())
    assert base64.b64decode(result["data"]["hc-configuration-hash"]) == b"new"
    assert base64.b64decode(result["data"]["token"]) == b"t2"


async def test_read_only_source_refuses_write_back(tmp_path: Path) -> None:
    source = FileSource(tmp_path, read_only=True)
    assert not source.writable
    with pytest.raises(PermissionError):
        await source.write_back(ObjectKey("Secret", "a", "b"), lambda obj: True)


async def test_write_back_never_clobbers_a_concurrent_in_place_edit(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(build_token_secret(namespace="ns", nodepool="ns/p", token="t1")))
    source = FileSource(tmp_path)
    source.attach(Recorder())
    await source.poll_once()
    key = ObjectKey("Secret", "ns", "token-p-00000000")
    calls = []

    def mutate_while_someone_edits(obj: dict) -> bool:
        if not calls:  # an operator writes the file in place while the server is mid-write-back
            edited = yaml.safe_load(path.read_text())
            edited["data"]["hc-configuration-hash"] = base64.b64encode(b"operator").decode()
            with open(path, "r+") as handle:
                handle.write(yaml.safe_dump(edited))
                handle.truncate()
        calls.append(1)
        obj["data"]["release-version"] = base64.b64encode(b"9.9.9").decode()
        return True

    await source.write_back(key, mutate_while_someone_edits)
    result = yaml.safe_load(path.read_text())
    assert base64.b64decode(result["data"]["hc-configuration-hash"]) == b"operator"
    assert base64.b64decode(result["data"]["release-version"]) == b"9.9.9"
    assert len(calls) == 2  # the mutation was applied again on top of the edit


async def test_a_restart_parses_only_files_changed_since_the_snapshot(tmp_path: Path) -> None:
    import os

    from payload_cache import CacheConfig, PayloadCache

    source_dir = tmp_path / "source"
    source_dir.mkdir()
    for i in range(5):
        path = source_dir / f"p{i}.yaml"
        path.write_text(yaml.safe_dump(build_token_secret(namespace="ns", nodepool=f"ns/p{i}", token=f"t{i}", machineconfigs_yaml="x: " + "y" * 70000)))
        old = time.time() - 60  # older than the racy window
        os.utime(path, (old, old))
    cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache"))

    class Counting(FileSource):
        parses = 0

        @staticmethod
        def _parse(raw: bytes):  # type: ignore[override]
            Counting.parses += 1
            return FileSource._parse(raw)

    first = Counting(source_dir, state=cache)
    recorder = Recorder()
    await first.run(recorder, iterations=0)
    assert Counting.parses == 5
    # While down: one file changes, one goes away.
    changed = source_dir / "p1.yaml"
    changed.write_text(yaml.safe_dump(build_token_secret(namespace="ns", nodepool="ns/p1", token="t1-new")))
    (source_dir / "p4.yaml").unlink()
    Counting.parses = 0
    second = Counting(source_dir, state=cache)
    recorder2 = Recorder()
    await second.run(recorder2, iterations=0)
    assert Counting.parses == 1  # only the changed file
    assert sorted(recorder2.flat()) == [("ADDED", f"token-p{i}-00000000") for i in range(4)]
    restored = second.get_full(ObjectKey("Secret", "ns", "token-p0-00000000"))
    assert restored is not None and restored["data"]["config"] == yaml.safe_load((source_dir / "p0.yaml").read_text())["data"]["config"]
    assert parse_token_secret(second.get(ObjectKey("Secret", "ns", "token-p1-00000000"))).token == "t1-new"
    # The snapshot is encrypted: no token in clear in the cache dir.
    for file in (tmp_path / "cache").rglob("*"):
        if file.is_file():
            assert b"t1-new" not in file.read_bytes() and base64.b64encode(b"t1-new") not in file.read_bytes()


async def test_a_damaged_snapshot_costs_only_a_parse_of_the_files_it_cannot_restore(tmp_path: Path) -> None:

    from ignition_server.sources import listing
    from payload_cache import CacheConfig, PayloadCache

    source_dir = aged_token_secrets(tmp_path / "source")
    cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache"))
    await FileSource(source_dir, state=cache).run(Recorder(), iterations=0)
    records = listing.unpack(cache.load_state(listing.SNAPSHOT_NAME) or b"", str(source_dir.resolve()))
    assert sorted(Path(p).name for p in records) == ["p0.yaml", "p1.yaml", "p2.yaml"]
    assert listing.unpack(cache.load_state(listing.SNAPSHOT_NAME) or b"", "/elsewhere") == {}  # another root: unused
    # One record damaged (a bit flipped inside the encryption would fail the whole snapshot;
    # this is a record that decrypts but does not decode).
    records[str(source_dir / "p1.yaml")] = b"not a record"
    cache.save_state(listing.SNAPSHOT_NAME, listing.pack(str(source_dir.resolve()), records))

    parsed: list[bytes] = []

    class Counting(FileSource):
        @staticmethod
        def _parse(raw: bytes):  # type: ignore[override]
            parsed.append(raw)
            return FileSource._parse(raw)

    recorder = Recorder()
    await Counting(source_dir, state=cache).run(recorder, iterations=0)
    assert len(parsed) == 1 and b"p1" in parsed[0]
    assert sorted(recorder.flat()) == [("ADDED", f"token-p{i}-00000000") for i in range(3)]
    # A truncated snapshot is not used at all: every file is read again.
    cache.save_state(listing.SNAPSHOT_NAME, (cache.load_state(listing.SNAPSHOT_NAME) or b"")[:-10])
    parsed.clear()
    await Counting(source_dir, state=cache).run(Recorder(), iterations=0)
    assert len(parsed) == 3


async def test_user_data_secrets_are_kept_as_digests_and_read_in_full_when_asked(tmp_path: Path) -> None:
    from ignition_server.model.objects import LargeValue, ObjectKey, value_digest
    from ignition_server.model.token_secret import is_user_data_secret
    from ignition_server.render.userdata import user_data_secret

    source_dir = tmp_path / "source"
    secret = user_data_secret(nodepool_name="p", namespace="ns", token_secret_name="token-p-12345678",
                              user_data=b'{"ignition":{"version":"3.2.0"}}')
    path = source_dir / "user-data.yaml"
    source_dir.mkdir()
    path.write_text(yaml.safe_dump(secret))
    other = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull-secret", "namespace": "ns"},
             "data": {".dockerconfigjson": base64.b64encode(b"{}").decode()}}
    (source_dir / "pull.yaml").write_text(yaml.safe_dump(other))
    source = FileSource(source_dir, digest_values=is_user_data_secret)
    await source.run(Recorder(), iterations=0)
    key = ObjectKey("Secret", "ns", secret["metadata"]["name"])
    kept = source.get(key)
    assert kept is not None and all(isinstance(v, LargeValue) for v in kept["data"].values())
    assert all(value_digest(kept, k) == value_digest(secret, k) for k in secret["data"])  # what the reconciler compares
    assert source.get_full(key) == secret
    pull = source.get(ObjectKey("Secret", "ns", "pull-secret"))
    assert pull is not None and pull["data"] == other["data"]  # other Secrets keep their values


async def test_files_read_soon_after_they_were_written_are_restored_once_they_aged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files this server writes (status, user-data Secrets) are read within the racy window of
    their stamp: once that passed they are read once more, so the snapshot's record is one a
    restart trusts. Before, such a record never was, and every restart after a fleet's status
    write-backs parsed all 10,560 manifests again (issue 33: 15 s of the owner's CPU)."""
    from ignition_server.sources import files
    from payload_cache import CacheConfig, PayloadCache

    monkeypatch.setattr(files, "_RACY_NS", 200_000_000)  # 0.2 s rather than 2 s, for the test's sake
    source_dir = tmp_path / "source"
    source_dir.mkdir()
    for i in range(3):
        (source_dir / f"p{i}.yaml").write_text(yaml.safe_dump(build_token_secret(namespace="ns", nodepool=f"ns/p{i}", token=f"t{i}")))
    cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache"))

    class Counting(FileSource):
        parses = 0

        @staticmethod
        def _parse(raw: bytes):  # type: ignore[override]
            Counting.parses += 1
            return FileSource._parse(raw)

    first = Counting(source_dir, state=cache)
    first.attach(Recorder())
    await first.poll_once()  # read at once: racy
    assert Counting.parses == 3
    time.sleep(0.3)
    await first.poll_once()  # aged: each read once more, not parsed (same content)
    await first.poll_once()  # and then left alone
    assert Counting.parses == 3
    await first.flush()
    Counting.parses = 0
    second = Counting(source_dir, state=cache)
    recorder = Recorder()
    await second.run(recorder, iterations=0)
    assert Counting.parses == 0  # every file restored from the snapshot
    assert sorted(recorder.flat()) == [("ADDED", f"token-p{i}-00000000") for i in range(3)]


class Ingest:
    """An `ingesting` hold that counts its entries and says whether it is held now."""

    def __init__(self) -> None:
        self.entered = 0
        self.held = False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        self.entered += 1
        self.held = True
        try:
            yield
        finally:
            self.held = False


async def test_a_poll_reads_changed_files_while_holding_ingesting_and_hands_them_over_after(tmp_path: Path) -> None:
    """The reconciler starts no render while a poll parses (issue 30: a flood of new files, parsed
    while renders took the GIL, held another tenant's token Secret back for seconds); a poll that
    finds nothing new holds nothing."""
    ingest, read_while = Ingest(), []
    for i in range(3):
        (tmp_path / f"cm-{i}.yaml").write_text(yaml.safe_dump({**CONFIGMAP, "metadata": {"name": f"cm-{i}", "namespace": "ns"}}))
    source = FileSource(tmp_path, poll_interval=0.01, retain=lambda _obj: read_while.append(ingest.held) or True)
    handed_while: list[bool] = []

    async def handler(changes: list[Change]) -> None:
        handed_while.append(ingest.held)

    await source.run(handler, ingesting=ingest, iterations=0)
    assert read_while == [True, True, True] and ingest.entered == 1 and handed_while == [False]
    backdate = time.time() - 10  # not "racily clean": a poll needs to read nothing
    for path in tmp_path.iterdir():
        os.utime(path, (backdate, backdate))
    await source.poll_once()  # re-reads the files written just now (their stamps could hide a rewrite)
    entered = ingest.entered
    await source.poll_once()
    assert ingest.entered == entered  # nothing changed: nothing held
    (tmp_path / "cm-0.yaml").write_text(yaml.safe_dump({**CONFIGMAP, "metadata": {"name": "cm-0", "namespace": "ns"},
                                                        "data": {"a": "2"}}))
    await source.poll_once()
    assert ingest.entered == entered + 1 and read_while[-1] is True and handed_while[-1] is False


async def test_kept_objects_share_their_short_strings_parsed_or_restored(tmp_path: Path) -> None:
    """5,280 NodePools' kept objects: keys, kinds and namespaces are one copy each (issue 33: a
    user-data Secret kept 2.4 KB of which ~40 % was its own copies of those), whether a file was
    parsed or restored from the listing snapshot; a token Secret's release text too."""
    from ignition_server.model.objects import LargeValue
    from ignition_server.model.token_secret import is_user_data_secret
    from payload_cache import CacheConfig, PayloadCache

    source_dir = tmp_path / "source"
    source_dir.mkdir()
    for i in range(2):
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}", "namespace": "tenant-a"},
              "data": {"mode": "enabled"}}
        (source_dir / f"cm-{i}.yaml").write_text(yaml.safe_dump(cm))
        secret = build_token_secret(namespace="tenant-a", nodepool=f"tenant-a/p{i}", token=f"t{i}")
        (source_dir / f"p{i}.yaml").write_text(yaml.safe_dump(secret))
        user_data = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                     "metadata": {"name": f"user-data-p{i}", "namespace": "tenant-a",
                                  "annotations": {"hypershift.openshift.io/nodePool": f"tenant-a/p{i}"}},
                     "data": {"value": base64.b64encode(b"x" * 100).decode()}}
        (source_dir / f"user-data-p{i}.yaml").write_text(yaml.safe_dump(user_data))
        old = time.time() - 60  # older than the racy window: restorable
        for path in source_dir.iterdir():
            os.utime(path, (old, old))
    cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache"))

    def check(source: FileSource, how: str) -> None:
        a, b = (source.get(ObjectKey("ConfigMap", "tenant-a", f"cm-{i}")) for i in range(2))
        assert a is not None and b is not None and a is not b
        assert [id(k) for k in a] == [id(k) for k in b], how
        assert a["metadata"]["namespace"] is b["metadata"]["namespace"], how
        assert a["data"]["mode"] is b["data"]["mode"], how
        keys = [k for k in source.objects() if k.kind == "ConfigMap"]
        assert keys[0].namespace is keys[1].namespace, how
        u0, u1 = (source.get(ObjectKey("Secret", "tenant-a", f"user-data-p{i}")) for i in range(2))
        assert u0 is not None and u1 is not None and isinstance(u0["data"]["value"], LargeValue)
        assert not hasattr(u0["data"]["value"], "__dict__"), how  # two in each of 5,280 Secrets
        assert u0["type"] is u1["type"] and u0["kind"] is u1["kind"], how
        t0, t1 = (parse_token_secret(source.get(ObjectKey("Secret", "tenant-a", f"token-p{i}-00000000")) or {})
                  for i in range(2))
        assert t0.release == t1.release and t0.release is t1.release, how
        assert not hasattr(t0, "__dict__"), how

    parsed = FileSource(source_dir, state=cache, digest_values=is_user_data_secret)
    await parsed.run(Recorder(), iterations=0)
    check(parsed, "parsed")
    restored = FileSource(source_dir, state=cache, digest_values=is_user_data_secret)
    await restored.run(Recorder(), iterations=0)
    check(restored, "restored from the snapshot")


async def test_polls_are_spaced_by_what_the_walk_costs(tmp_path: Path) -> None:
    """At 11,001 manifests a walk is ~45 ms of CPU and more beside the serving workers: polls
    then wait their turn (issue 33), a small source keeps its interval."""
    from ignition_server.sources.files import WALK_CPU_SHARE, poll_spacing

    assert poll_spacing(1.0, 0.002) == 1.0
    assert poll_spacing(1.0, 0.2) == pytest.approx(0.2 / WALK_CPU_SHARE) and poll_spacing(1.0, 0.2) >= 4.0
    for i in range(300):
        (tmp_path / f"cm-{i}.yaml").write_text(yaml.safe_dump({**CONFIGMAP, "metadata": {"name": f"cm-{i}", "namespace": "ns"}}))
    source = FileSource(tmp_path, poll_interval=0.01)
    await source.run(Recorder(), iterations=1)
    assert 0 < source._walk_cpu < 1.0  # the walk's own thread CPU, measured each poll


async def test_a_restart_that_restores_every_file_writes_no_snapshot(tmp_path: Path) -> None:
    """At the seeds' fleet the snapshot is ~10 MiB: packing and sealing it again right after a
    restart that changed nothing was a ~20 MiB transient in the owner while the workers served
    (issue 33). A file changed or gone while down, or written since, still saves it."""
    from payload_cache import CacheConfig, PayloadCache

    source_dir = aged_token_secrets(tmp_path / "source")

    class Counting(PayloadCache):
        saves = 0

        def save_state(self, name: str, data: bytes) -> None:
            Counting.saves += 1
            super().save_state(name, data)

    def cache() -> Counting:
        return Counting.open(CacheConfig(cache_dir=tmp_path / "cache"))  # type: ignore[return-value]

    await FileSource(source_dir, state=cache()).run(Recorder(), iterations=0)
    assert Counting.saves == 1  # the first listing, parsed
    Counting.saves = 0
    recorder = Recorder()
    restarted = FileSource(source_dir, state=cache())
    await restarted.run(recorder, iterations=0)
    assert len(recorder.flat()) == 3 and Counting.saves == 0  # all restored: the saved one stands
    await restarted.flush()
    assert Counting.saves == 0
    (source_dir / "p2.yaml").unlink()  # gone while down: its record goes
    await FileSource(source_dir, state=cache()).run(Recorder(), iterations=0)
    assert Counting.saves == 1
    Counting.saves = 0
    await FileSource(source_dir, state=cache()).run(Recorder(), iterations=0)
    assert Counting.saves == 0
    path = source_dir / "p1.yaml"  # changed while down
    path.write_text(yaml.safe_dump(build_token_secret(namespace="ns", nodepool="ns/p1", token="t1-new")))
    os.utime(path, (time.time() - 60, time.time() - 60))
    await FileSource(source_dir, state=cache()).run(Recorder(), iterations=0)
    assert Counting.saves == 1


@pytest.mark.parametrize("relative", [False, True])
async def test_a_file_the_source_creates_is_the_file_its_polls_find(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: bool) -> None:
    """Files are named by their path text as the walk finds it (issue 33: no Path object per
    file): an object `put` beside another lands in a file the next polls know, under a root
    given as `.` too, never seen as one more file defining it."""
    sub = tmp_path / "clusters-c0"
    sub.mkdir()
    (sub / "cm.yaml").write_text(yaml.safe_dump(CONFIGMAP))
    if relative:
        monkeypatch.chdir(tmp_path)
    source = FileSource(Path(".") if relative else tmp_path)
    recorder = Recorder()
    await source.run(recorder, iterations=0)
    new = {**CONFIGMAP, "metadata": {"name": "made", "namespace": "ns"}}
    await source.put(new, beside=ObjectKey("ConfigMap", "ns", "cm"))
    assert (sub / "made.yaml").exists()
    for _ in range(2):
        await source.poll_once()
    assert recorder.flat() == [("ADDED", "cm"), ("ADDED", "made")]
    assert source.get(ObjectKey("ConfigMap", "ns", "made")) == new
    (sub / "made.yaml").unlink()
    await source.poll_once()
    assert recorder.flat()[-1] == ("DELETED", "made")


def test_a_polls_walk_leaves_nothing_for_the_garbage_collector(tmp_path: Path) -> None:
    """The walk was a nested function calling itself: a reference cycle holding the poll's whole
    list of files and stamps, freed only by a full collection; between two, every poll's list
    piled up (an idle owner at 110 x 12 grew 79 -> 129 MiB in two minutes, issue 33)."""
    import gc

    for sub in ("a", "b/c"):
        (tmp_path / sub).mkdir(parents=True)
        for i in range(3):
            (tmp_path / sub / f"cm-{i}.yaml").write_text(yaml.safe_dump(CONFIGMAP))
    (tmp_path / "top.yaml").write_text(yaml.safe_dump(CONFIGMAP))
    source = FileSource(tmp_path)
    gc.collect()
    gc.disable()
    try:
        found = source._walk()
        del found
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert [Path(p).relative_to(tmp_path).as_posix() for p, _stamp in source._walk()] == [
        "a/cm-0.yaml", "a/cm-1.yaml", "a/cm-2.yaml", "b/c/cm-0.yaml", "b/c/cm-1.yaml", "b/c/cm-2.yaml", "top.yaml"]
