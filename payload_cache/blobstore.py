"""Encrypted blob files on disk (no memory tier, no accounting: see cache.py)."""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

from ignition_server.fsio import TEMP_PREFIX, atomic_write, fsync_dir, make_dir

from .envelope import UnknownKeyError, blob_context, envelope_key_id, open_envelope, seal
from .keys import KeyRing, KeySource
from .layout import Layout, is_blob_id

log = logging.getLogger("payload_cache")


def open_with_reload(keys: KeySource, data: bytes, context: bytes) -> tuple[bytes, bytes]:
    """Decrypt, re-reading the key file once if the data names a key we have not loaded
    (another process may have added a key and rekeyed). Returns (plaintext, key id)."""
    try:
        return open_envelope(keys.ring, data, context), envelope_key_id(data) or b""
    except UnknownKeyError:
        before = keys.ring
        if keys.refresh() is before:
            raise
        return open_envelope(keys.ring, data, context), envelope_key_id(data) or b""


def quarantine_file(path: Path, quarantine_dir: Path, reason: str) -> Path | None:
    """Move a bad file aside (never delete: an operator may want to inspect it)."""
    target = quarantine_dir / f"{path.name}.{int(time.time())}.{secrets.token_hex(3)}"
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return None  # another thread already moved it
    fsync_dir(path.parent)
    fsync_dir(quarantine_dir)
    log.warning("quarantined %s as %s: %s", path, target.name, reason)
    return target


class BlobStore:
    def __init__(self, layout: Layout, keys: KeySource) -> None:
        self.layout = layout
        self.keys = keys

    def path(self, blob_id: str) -> Path:
        return self.layout.blob_path(blob_id)

    def exists(self, blob_id: str) -> bool:
        return self.path(blob_id).is_file()

    def read(self, blob_id: str) -> bytes | None:
        try:
            with open(self.path(blob_id), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def decrypt(self, blob_id: str, data: bytes) -> tuple[bytes, bytes]:
        """Plaintext and key id; raises EnvelopeError if the file is not authentic."""
        return open_with_reload(self.keys, data, blob_context(blob_id))

    def encrypt(self, blob_id: str, plaintext: bytes, ring: KeyRing | None = None) -> bytes:
        return seal(ring or self.keys.refresh(), plaintext, blob_context(blob_id))

    def write(self, blob_id: str, ciphertext: bytes) -> None:
        path = self.path(blob_id)
        make_dir(path.parent)
        atomic_write(path, ciphertext, 0o600)

    def touch(self, blob_id: str) -> bool:
        """Refresh the mtime so gc's grace period restarts for a blob that is wanted again."""
        try:
            os.utime(self.path(blob_id))
            return True
        except FileNotFoundError:
            return False

    def mtime_and_size(self, blob_id: str) -> tuple[float, int] | None:
        try:
            st = os.stat(self.path(blob_id))
        except FileNotFoundError:
            return None
        return st.st_mtime, st.st_size

    def delete(self, blob_id: str) -> None:
        path = self.path(blob_id)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        fsync_dir(path.parent)

    def quarantine(self, blob_id: str, reason: str) -> bool:
        return quarantine_file(self.path(blob_id), self.layout.quarantine_dir, reason) is not None

    def _shards(self) -> Iterator[os.DirEntry[str]]:
        try:
            with os.scandir(self.layout.blobs_dir) as shards:
                for shard in shards:
                    if shard.is_dir(follow_symlinks=False) and len(shard.name) == 2:
                        yield shard
        except FileNotFoundError:
            return

    def scan(self) -> dict[str, int]:
        """blob id -> file size for every blob file (a listing plus stat; nothing is read)."""
        found: dict[str, int] = {}
        for shard in self._shards():
            with os.scandir(shard.path) as entries:
                for entry in entries:
                    if is_blob_id(entry.name) and entry.name.startswith(shard.name):
                        try:
                            found[entry.name] = entry.stat(follow_symlinks=False).st_size
                        except FileNotFoundError:
                            pass
        return found

    def remove_stale_temp(self, older_than: float) -> int:
        """Delete temp files left by interrupted writes (only old ones: a live writer may own new ones)."""
        removed = 0
        dirs = [self.layout.root, *(Path(shard.path) for shard in self._shards())]
        for directory in dirs:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if not entry.name.startswith(TEMP_PREFIX):
                        continue
                    try:
                        if entry.stat(follow_symlinks=False).st_mtime < older_than:
                            os.unlink(entry.path)
                            removed += 1
                    except FileNotFoundError:
                        pass
        return removed

    def quarantined_count(self) -> int:
        try:
            return sum(1 for _ in os.scandir(self.layout.quarantine_dir))
        except FileNotFoundError:
            return 0
