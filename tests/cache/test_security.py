"""Encryption at rest, key file handling, tamper detection, format versioning, key rotation."""

from __future__ import annotations

import base64
import logging
import os
import shutil
import stat
from pathlib import Path

import pytest

from payload_cache import (
    CacheConfig,
    CacheFormatError,
    CacheKeyError,
    PayloadCache,
    RenderRecord,
    TokenRecord,
    TokenState,
    add_key,
    prune_keys,
)
from payload_cache.keys import key_id, load_key_file

PAYLOAD = b'{"ignition":{"version":"3.2.0"},"passwd":{"users":[{"name":"core","sshAuthorizedKeys":["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPLAINTEXTMARKER"]}]}}'
TOKEN = "tok-9f3a1c7e5b2d4f60a8e1c3b5d7f9a2c4"


def open_cache(cache_dir: Path, **kwargs) -> PayloadCache:
    return PayloadCache.open(CacheConfig(cache_dir, **kwargs))


def blob_path(cache_dir: Path, blob_id: str) -> Path:
    return cache_dir / "blobs" / blob_id[:2] / blob_id


def all_bytes(directory: Path) -> list[tuple[Path, bytes]]:
    return [(p, p.read_bytes()) for p in sorted(directory.rglob("*")) if p.is_file()]


def test_key_file_created_0600_outside_cache_dir(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache = open_cache(cache_dir)
    key_file = tmp_path / "cache.key"
    assert cache.key_file == key_file
    assert key_file.is_file()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert not key_file.resolve().is_relative_to(cache_dir.resolve())
    text = key_file.read_text()
    assert sum(line.startswith("index ") for line in text.splitlines()) == 1
    assert sum(line.startswith("aes ") for line in text.splitlines()) == 1
    # Re-opening keeps the same keys.
    first_ids = cache.key_ids()
    assert open_cache(cache_dir).key_ids() == first_ids


def test_explicit_key_file_inside_cache_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CacheKeyError, match="inside the cache directory"):
        open_cache(tmp_path / "cache", key_file=tmp_path / "cache" / "keys")


def test_explicit_key_file_location(tmp_path: Path) -> None:
    key_file = tmp_path / "secrets" / "cache-keys"
    key_file.parent.mkdir()
    cache = open_cache(tmp_path / "cache", key_file=key_file)
    blob_id = cache.put_blob(b"x")
    assert key_file.exists() and not (tmp_path / "cache.key").exists()
    assert open_cache(tmp_path / "cache", key_file=key_file).get_blob(blob_id) == b"x"


def test_malformed_key_file_is_refused_clearly(tmp_path: Path) -> None:
    key_file = tmp_path / "cache.key"
    key_file.write_text("index " + base64.b64encode(os.urandom(32)).decode() + "\n")
    with pytest.raises(CacheKeyError, match="at least one 'aes' key"):
        open_cache(tmp_path / "cache")
    key_file.write_text("aes notbase64!!\n")
    with pytest.raises(CacheKeyError, match="invalid base64"):
        open_cache(tmp_path / "cache")


def test_copied_cache_dir_without_key_reveals_nothing(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache = open_cache(cache_dir)
    blob_id = cache.put_blob(PAYLOAD)
    cache.put_token(TOKEN, TokenRecord("ns/np", "ns/token-secret", TokenState.CURRENT, None))
    cache.put_render(RenderRecord("ns/token-secret", "ns/np", "d", blob_id, "3.2.0", 1.0))
    cache.seal("rotation/ns/np", b"SEALED-SECRET-MARKER")
    cache.flush()

    stolen = tmp_path / "stolen"
    shutil.copytree(cache_dir, stolen)
    files = all_bytes(stolen)
    assert len(files) >= 3  # FORMAT, index, blob
    markers = [
        PAYLOAD,
        b"PLAINTEXTMARKER",
        b"sshAuthorizedKeys",
        TOKEN.encode(),
        TOKEN[4:20].encode(),
        base64.b64encode(TOKEN.encode())[:20],
        b"SEALED-SECRET-MARKER",
        b"ns/token-secret",  # even the names are inside the encrypted index
    ]
    for path, data in files:
        for marker in markers:
            assert marker not in data, f"{marker!r} found in {path}"
    # And the stolen copy cannot be opened with fresh keys: the index is quarantined, nothing served.
    thief = open_cache(stolen)
    assert thief.lookup_token(TOKEN) is None
    assert thief.renders() == []
    assert thief.get_blob(blob_id) is None


def test_tampered_blob_is_quarantined(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    blob_id = open_cache(cache_dir).put_blob(PAYLOAD)
    path = blob_path(cache_dir, blob_id)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))

    cache = open_cache(cache_dir)  # fresh memory tier
    assert cache.get_blob(blob_id) is None
    assert not path.exists()
    quarantined = list((cache_dir / "quarantine").iterdir())
    assert len(quarantined) == 1 and quarantined[0].name.startswith(blob_id)
    stats = cache.stats()
    assert (stats.quarantined, stats.misses, stats.blob_count) == (1, 1, 0)
    assert not cache.has_blob(blob_id)
    # The caller re-renders: put_blob writes a good blob again under the same id.
    assert cache.put_blob(PAYLOAD) == blob_id
    assert cache.get_blob(blob_id) == PAYLOAD


def test_truncated_blob_is_quarantined(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    blob_id = open_cache(cache_dir).put_blob(PAYLOAD)
    path = blob_path(cache_dir, blob_id)
    path.write_bytes(path.read_bytes()[:-7])
    cache = open_cache(cache_dir)
    assert cache.get_blob(blob_id) is None
    assert cache.stats().quarantined == 1
    assert len(list((cache_dir / "quarantine").iterdir())) == 1


def test_blob_renamed_onto_another_id_fails(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache = open_cache(cache_dir)
    a = cache.put_blob(b"payload A")
    b = cache.put_blob(b"payload B")
    os.replace(blob_path(cache_dir, a), blob_path(cache_dir, b))
    cache = open_cache(cache_dir)
    assert cache.get_blob(b) is None
    assert cache.stats().quarantined == 1


def test_verify_quarantines_bad_blobs(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache = open_cache(cache_dir)
    good = cache.put_blob(b"good")
    bad = cache.put_blob(b"bad")
    path = blob_path(cache_dir, bad)
    path.write_bytes(path.read_bytes()[:30])
    report = cache.verify()
    assert (report.checked, report.ok, report.quarantined) == (2, 1, (bad,))
    assert cache.has_blob(good) and not cache.has_blob(bad)


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    open_cache(cache_dir)
    (cache_dir / "FORMAT").write_text("ignition-server-cache 7\n")
    with pytest.raises(CacheFormatError) as info:
        open_cache(cache_dir)
    message = str(info.value)
    assert "ignition-server-cache 7" in message  # what was found
    assert "ignition-server-cache 1" in message  # what is expected
    assert "move the directory" in message  # what to do


def test_non_cache_directory_is_refused(tmp_path: Path) -> None:
    cache_dir = tmp_path / "home"
    cache_dir.mkdir()
    (cache_dir / "notes.txt").write_text("not a cache")
    with pytest.raises(CacheFormatError, match="no FORMAT file"):
        open_cache(cache_dir)
    assert (cache_dir / "notes.txt").read_text() == "not a cache"


def test_fresh_volume_with_lost_and_found_is_accepted(tmp_path: Path) -> None:
    cache_dir = tmp_path / "pvc"
    (cache_dir / "lost+found").mkdir(parents=True)
    open_cache(cache_dir)
    assert (cache_dir / "FORMAT").read_text() == "ignition-server-cache 1\n"


def test_key_rotation_add_rekey_prune(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    key_file = tmp_path / "cache.key"
    cache = open_cache(cache_dir)
    old_ids = [cache.put_blob(f"old {i}".encode()) for i in range(3)]
    cache.put_token(TOKEN, TokenRecord("ns/np", "ns/s", TokenState.CURRENT, None))
    cache.flush()
    old_key = cache.key_ids()[0]

    new_key = add_key(key_file)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert load_key_file(key_file).key_ids() == [new_key, old_key]

    # After adding a key, blobs under the old key still decrypt and new ones use the new key.
    cache = open_cache(cache_dir)
    assert cache.key_ids() == [new_key, old_key]
    assert all(cache.get_blob(b) == f"old {i}".encode() for i, b in enumerate(old_ids))
    fresh = cache.put_blob(b"new payload")
    assert blob_path(cache_dir, fresh).read_bytes()[4:12].hex() == new_key
    assert cache.verify().by_key == {old_key: 3, new_key: 1}

    assert cache.rekey() == 3
    assert cache.verify().by_key == {new_key: 4}
    assert cache.rekey() == 0  # idempotent
    assert (cache_dir / "index.bin").read_bytes()[4:12].hex() == new_key

    assert prune_keys(key_file) == [old_key]
    cache = open_cache(cache_dir)
    assert cache.key_ids() == [new_key]
    assert all(cache.get_blob(b) == f"old {i}".encode() for i, b in enumerate(old_ids))
    assert cache.lookup_token(TOKEN) is not None
    assert cache.stats().quarantined == 0


def test_running_cache_picks_up_added_key(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    key_file = tmp_path / "cache.key"
    server = open_cache(cache_dir, memory_bytes=0)  # every read goes to disk
    blob_id = server.put_blob(b"payload")
    # An operator adds a key and rekeys from another process while the server runs.
    new_key = add_key(key_file)
    assert open_cache(cache_dir).rekey() == 1
    # The server re-reads the key file on an unknown key id instead of quarantining.
    assert server.get_blob(blob_id) == b"payload"
    assert server.stats().quarantined == 0
    assert server.key_ids()[0] == new_key
    # and encrypts new writes with the new key
    other = server.put_blob(b"other")
    assert blob_path(cache_dir, other).read_bytes()[4:12].hex() == new_key


def test_blob_under_removed_key_is_quarantined(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    key_file = tmp_path / "cache.key"
    blob_id = open_cache(cache_dir).put_blob(b"payload")
    add_key(key_file)
    prune_keys(key_file)  # without rekey: the old blob becomes unreadable
    cache = open_cache(cache_dir)
    assert cache.get_blob(blob_id) is None
    assert cache.stats().quarantined == 1


def test_torn_index_does_not_brick_startup(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache_dir = tmp_path / "cache"
    cache = open_cache(cache_dir)
    blob_id = cache.put_blob(b"payload")
    cache.put_token(TOKEN, TokenRecord("ns/np", "ns/s", TokenState.CURRENT, None))
    cache.flush()
    index = cache_dir / "index.bin"
    index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])

    with caplog.at_level(logging.WARNING, logger="payload_cache"):
        reopened = open_cache(cache_dir)
    assert reopened.lookup_token(TOKEN) is None
    assert reopened.renders() == []
    assert "index unreadable" in caplog.text
    assert not index.exists()
    assert [p.name.startswith("index.bin") for p in (cache_dir / "quarantine").iterdir()] == [True]
    assert reopened.stats().quarantined == 1
    # Blobs are unaffected, and the server can rebuild and persist a new index.
    assert reopened.get_blob(blob_id) == b"payload"
    reopened.put_token(TOKEN, TokenRecord("ns/np", "ns/s", TokenState.CURRENT, None))
    reopened.flush()
    assert open_cache(cache_dir).lookup_token(TOKEN) is not None


def test_missing_key_file_with_existing_cache_rebuilds(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache_dir = tmp_path / "cache"
    cache = open_cache(cache_dir)
    cache.put_token(TOKEN, TokenRecord("ns/np", "ns/s", TokenState.CURRENT, None))
    cache.flush()
    old = load_key_file(tmp_path / "cache.key")
    (tmp_path / "cache.key").unlink()
    with caplog.at_level(logging.WARNING, logger="payload_cache"):
        reopened = open_cache(cache_dir)
    assert "key file" in caplog.text and "missing" in caplog.text
    assert reopened.lookup_token(TOKEN) is None
    assert key_id(load_key_file(tmp_path / "cache.key").aes_keys[0]) != key_id(old.aes_keys[0])


def test_key_file_in_new_directory(tmp_path: Path) -> None:
    key_file = tmp_path / "keys" / "nested" / "cache.key"
    open_cache(tmp_path / "cache", key_file=key_file)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


@pytest.mark.parametrize(("mode", "own_group", "warned"), [
    (0o600, True, False),
    (0o440, True, False),   # a Secret volume reaching a non-root pod through fsGroup
    (0o440, False, True),   # group-readable by a group this process is not in
    (0o644, True, True),
])
def test_key_file_readable_by_other_users_is_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                    mode: int, own_group: bool, warned: bool) -> None:
    key_file = tmp_path / "cache.key"
    open_cache(tmp_path / "cache", key_file=key_file)
    foreign = max({os.getgid(), *os.getgroups()}) + 1
    os.chown(key_file, -1, os.getgid() if own_group else foreign)
    key_file.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="payload_cache"):
        load_key_file(key_file)
    assert ("accessible by other users" in caplog.text) is warned
