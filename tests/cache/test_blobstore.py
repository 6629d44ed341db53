"""Blob store behaviour: round trip, sharing, restart, memory tier, gc, stats."""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from pathlib import Path

import pytest

from payload_cache import CacheConfig, CacheStats, PayloadCache, RenderRecord, stats_report
from payload_cache.keys import load_key_file


def open_cache(tmp_path: Path, **kwargs) -> PayloadCache:
    return PayloadCache.open(CacheConfig(tmp_path / "cache", **kwargs))


def blob_files(cache_dir: Path) -> list[Path]:
    return sorted(p for p in (cache_dir / "blobs").rglob("*") if p.is_file())


def render(secret: str, blob_id: str) -> RenderRecord:
    return RenderRecord(secret, "ns/np", "digest-" + secret, blob_id, "3.2.0", 1000.0)


def test_round_trip(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    payload = b'{"ignition": {"version": "3.2.0"}}'
    blob_id = cache.put_blob(payload)
    assert cache.get_blob(blob_id) == payload
    assert cache.has_blob(blob_id)
    assert len(blob_files(tmp_path / "cache")) == 1


def test_blob_id_is_keyed_hmac_not_plain_hash(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    payload = b"some ignition config"
    blob_id = cache.put_blob(payload)
    index_key = load_key_file(tmp_path / "cache.key").index_key
    assert blob_id == hmac.new(index_key, payload, hashlib.sha256).hexdigest()
    assert blob_id != hashlib.sha256(payload).hexdigest()


def test_identical_payloads_share_one_blob(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    first = cache.put_blob(b"same payload")
    second = cache.put_blob(bytearray(b"same payload"))
    other = cache.put_blob(b"other payload")
    assert first == second != other
    assert len(blob_files(tmp_path / "cache")) == 2
    assert cache.stats().blobs_written == 2


def test_unknown_and_malformed_blob_ids(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    assert cache.get_blob("0" * 64) is None
    assert cache.stats().misses == 1
    assert not cache.has_blob("0" * 64)
    with pytest.raises(ValueError):
        cache.get_blob("../../etc/passwd")


def test_restart_serves_blobs_and_index(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    blob_id = cache.put_blob(b"payload-1")
    cache.put_render(render("ns/tok-a", blob_id))
    cache.flush()

    reopened = open_cache(tmp_path)
    assert reopened.get_render("ns/tok-a") == render("ns/tok-a", blob_id)
    assert reopened.get_blob(blob_id) == b"payload-1"
    stats = reopened.stats()
    assert (stats.disk_hits, stats.memory_hits, stats.blob_count) == (1, 0, 1)
    assert reopened.get_blob(blob_id) == b"payload-1"
    assert reopened.stats().memory_hits == 1


def test_open_reads_no_blob(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    blob_id = cache.put_blob(b"payload")
    cache.put_render(render("ns/s", blob_id))
    cache.flush()
    # A garbage blob would be quarantined if start-up decrypted blobs.
    path = tmp_path / "cache" / "blobs" / blob_id[:2] / blob_id
    path.write_bytes(b"garbage")
    reopened = open_cache(tmp_path)
    assert reopened.stats().quarantined == 0
    assert path.exists()


def test_memory_tier_bounded_in_bytes(tmp_path: Path) -> None:
    budget = 10_000
    cache = open_cache(tmp_path, memory_bytes=budget)
    ids = [cache.put_blob(os.urandom(1000)) for _ in range(30)]
    stats = cache.stats()
    assert 0 < stats.memory_bytes <= budget
    assert stats.memory_items <= 10
    # Newest payloads are in memory, the oldest were evicted to disk only.
    assert cache.get_blob(ids[-1]) is not None
    assert cache.stats().memory_hits == 1
    assert cache.get_blob(ids[0]) is not None
    assert cache.stats().disk_hits == 1
    assert cache.stats().memory_bytes <= budget


def test_payload_larger_than_memory_budget_stays_on_disk(tmp_path: Path) -> None:
    cache = open_cache(tmp_path, memory_bytes=1000)
    big = os.urandom(5000)
    blob_id = cache.put_blob(big)
    assert cache.stats().memory_bytes == 0
    assert cache.get_blob(blob_id) == big
    assert cache.get_blob(blob_id) == big
    stats = cache.stats()
    assert (stats.disk_hits, stats.memory_hits, stats.memory_bytes) == (2, 0, 0)


def test_gc_deletes_only_unreferenced_blobs_past_grace(tmp_path: Path) -> None:
    cache = open_cache(tmp_path, gc_grace_seconds=3600)
    kept_ref = cache.put_blob(b"referenced")
    old_unref = cache.put_blob(b"old unreferenced")
    young_unref = cache.put_blob(b"young unreferenced")
    cache.put_render(render("ns/s", kept_ref))
    now = time.time()
    for blob_id in (kept_ref, old_unref):
        path = tmp_path / "cache" / "blobs" / blob_id[:2] / blob_id
        os.utime(path, (now - 7200, now - 7200))

    report = cache.gc(now)
    assert report.deleted == 1
    assert report.kept == 2
    assert report.bytes_freed > len(b"old unreferenced")
    assert not cache.has_blob(old_unref)
    assert cache.get_blob(old_unref) is None  # also gone from the memory tier
    assert cache.get_blob(kept_ref) == b"referenced"
    assert cache.has_blob(young_unref)
    stats = cache.stats()
    assert (stats.gc_runs, stats.gc_deleted, stats.blob_count) == (1, 1, 2)

    # Once past the grace period the young one goes too; the referenced one never does.
    report = cache.gc(now + 7200)
    assert report.deleted == 1 and not cache.has_blob(young_unref) and cache.has_blob(kept_ref)


def test_put_of_existing_blob_restarts_gc_grace(tmp_path: Path) -> None:
    cache = open_cache(tmp_path, gc_grace_seconds=3600)
    blob_id = cache.put_blob(b"payload")
    path = tmp_path / "cache" / "blobs" / blob_id[:2] / blob_id
    now = time.time()
    os.utime(path, (now - 7200, now - 7200))
    assert cache.put_blob(b"payload") == blob_id  # wanted again, e.g. by a new render
    assert cache.gc(now).deleted == 0
    assert cache.has_blob(blob_id)


def test_gc_removes_stale_temp_files(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    blob_id = cache.put_blob(b"x")
    stale = tmp_path / "cache" / "blobs" / blob_id[:2] / ".tmp-1-abc-leftover"
    stale.write_bytes(b"partial")
    old = time.time() - 86400
    os.utime(stale, (old, old))
    assert cache.gc().temp_removed == 1
    assert not stale.exists()


def test_stats_snapshot_and_report(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    blob_id = cache.put_blob(b"abc")
    cache.get_blob(blob_id)
    snapshot = cache.stats()
    assert isinstance(snapshot, CacheStats)
    cache.get_blob(blob_id)
    assert snapshot.memory_hits == 1  # a snapshot does not move
    assert cache.stats().memory_hits == 2
    report = stats_report(cache)
    assert report["blob_count"] == 1
    assert report["disk_bytes"] == snapshot.disk_bytes > 3
    assert report["format"] == "ignition-server-cache 1"
    assert len(report["key_ids"]) == 1 and len(report["key_ids"][0]) == 16


def test_verify_checks_every_blob(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    ids = [cache.put_blob(f"payload {i}".encode()) for i in range(5)]
    cache.put_render(render("ns/gone", "f" * 64))
    seen: list[tuple[int, int]] = []
    report = cache.verify(lambda done, total: seen.append((done, total)))
    assert (report.checked, report.ok, report.quarantined) == (5, 5, ())
    assert report.missing == ("f" * 64,)
    assert report.by_key == {cache.key_ids()[0]: 5}
    assert seen[-1] == (5, 5) and len(seen) == 5
    assert report.quarantined or report.missing  # not healthy
    assert all(cache.has_blob(i) for i in ids)


def test_concurrent_puts_and_gets(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    cache = open_cache(tmp_path, memory_bytes=20_000)
    payloads = [os.urandom(500) for _ in range(40)]

    def work(i: int) -> bool:
        payload = payloads[i % len(payloads)]
        return cache.get_blob(cache.put_blob(payload)) == payload

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(400)))
    stats = cache.stats()
    assert stats.blob_count == 40
    assert stats.memory_bytes <= 20_000
    assert len(blob_files(tmp_path / "cache")) == 40


def test_gc_resyncs_disk_accounting_with_other_processes(tmp_path: Path) -> None:
    server = open_cache(tmp_path)
    kept = server.put_blob(b"kept")
    gone = server.put_blob(b"gone")
    server.put_render(render("ns/kept", kept))
    other_process = open_cache(tmp_path)
    extra = other_process.put_blob(b"written elsewhere")
    (tmp_path / "cache" / "blobs" / gone[:2] / gone).unlink()
    assert server.stats().blob_count == 2  # not yet aware
    server.gc(time.time())  # extra is young, so it survives
    stats = server.stats()
    assert stats.blob_count == 2
    assert server.has_blob(extra) and server.has_blob(kept)
    assert stats.disk_bytes == sum(p.stat().st_size for p in blob_files(tmp_path / "cache"))
