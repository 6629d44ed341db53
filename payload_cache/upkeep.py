"""The payload store's upkeep: gc, verify and rekey.

None of it is on the serving path: the reconciler runs gc now and then, `ignition-server
cache` runs all three. It works on the store's own parts, handed over by `PayloadCache`
(cache.py), which keeps the methods callers know (`cache.gc()`, ...) and forwards them here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .blobstore import BlobStore
from .config import CacheConfig
from .envelope import EnvelopeError, envelope_key_id
from .index import TokenIndex
from .keys import KeySource
from .reports import GcReport, VerifyReport
from .stats import Counters

log = logging.getLogger("payload_cache")

# Temp files younger than this may belong to a live writer in another process.
TEMP_FILE_MIN_AGE = 600.0


@dataclass
class CacheUpkeep:
    """Upkeep of one cache; it holds no state of its own, only the cache's parts and locks."""

    config: CacheConfig
    blobs: BlobStore
    keys: KeySource
    index: TokenIndex
    counters: Counters
    lock: threading.Lock  # the cache's: guards the memory tier and the counters
    disk_lock: threading.Lock  # the cache's: "is this blob on disk / keep it" against gc deleting it
    quarantine: Callable[[str, str], None]  # (blob id, reason): moved aside, forgotten, counted
    forget: Callable[[str], None]  # a blob deleted: out of the memory tier and the disk counts
    rewrite_index: Callable[[], None]  # write the index snapshot now, under the newest key

    def gc(self, now: float | None = None) -> GcReport:
        """Delete blobs no render record references whose file is older than the grace period."""
        now = time.time() if now is None else now
        cutoff = now - self.config.gc_grace_seconds
        referenced = self.index.referenced_blobs()
        on_disk = self.blobs.scan()
        deleted = freed = 0
        for blob_id, size in list(on_disk.items()):
            if blob_id in referenced:
                continue
            with self.disk_lock:
                stat = self.blobs.mtime_and_size(blob_id)
                if stat is None or stat[0] >= cutoff:
                    continue
                self.blobs.delete(blob_id)
            del on_disk[blob_id]
            self.forget(blob_id)
            deleted += 1
            freed += stat[1]
        temp_removed = self.blobs.remove_stale_temp(min(cutoff, now - TEMP_FILE_MIN_AGE))
        # Resync the disk levels with the scan (another process may have written or
        # deleted blobs); a blob known but not scanned may be a write that raced the scan.
        vanished = [b for b in list(self.counters.on_disk) if b not in on_disk and not self.blobs.exists(b)]
        with self.lock:
            for blob_id, size in on_disk.items():
                self.counters.disk_added(blob_id, size)
            for blob_id in vanished:
                self.counters.disk_removed(blob_id)
            self.counters.gc_runs += 1
            self.counters.gc_deleted += deleted
        if deleted:
            log.info("gc deleted %d unreferenced blobs (%d bytes)", deleted, freed)
        return GcReport(deleted=deleted, bytes_freed=freed, kept=len(on_disk), temp_removed=temp_removed)

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """Decrypt every blob and check it is named by the HMAC of its content; quarantine bad ones."""
        ids = sorted(self.blobs.scan())
        total = len(ids)
        bad: list[str] = []
        by_key: dict[str, int] = {}
        checked = 0
        for done, blob_id in enumerate(ids, 1):
            raw = self.blobs.read(blob_id)
            if raw is not None:
                checked += 1
                try:
                    payload, kid = self.blobs.decrypt(blob_id, raw)
                except EnvelopeError as exc:
                    self.quarantine(blob_id, str(exc))
                    bad.append(blob_id)
                else:
                    if self.keys.ring.hmac(payload).hex() != blob_id:
                        self.quarantine(blob_id, "content does not match its blob id")
                        bad.append(blob_id)
                    else:
                        by_key[kid.hex()] = by_key.get(kid.hex(), 0) + 1
            if progress is not None:
                progress(done, total)
        missing = sorted(b for b in self.index.referenced_blobs() if not self.blobs.exists(b))
        return VerifyReport(
            checked=checked, ok=checked - len(bad), quarantined=tuple(bad), missing=tuple(missing), by_key=by_key
        )

    def rekey(self) -> int:
        """Re-encrypt every blob and the index under the newest key; returns blobs re-encrypted.

        Re-reads the key file first, so ``add_key`` then ``rekey`` works without a restart.
        Idempotent and safe to interrupt: blobs already under the newest key are skipped.
        """
        ring = self.keys.refresh()
        count = 0
        for blob_id in sorted(self.blobs.scan()):
            raw = self.blobs.read(blob_id)
            if raw is None or envelope_key_id(raw) == ring.newest_id:
                continue
            try:
                payload, _ = self.blobs.decrypt(blob_id, raw)
            except EnvelopeError as exc:
                self.quarantine(blob_id, str(exc))
                continue
            ciphertext = self.blobs.encrypt(blob_id, payload, ring)
            self.blobs.write(blob_id, ciphertext)
            with self.lock:
                self.counters.disk_added(blob_id, len(ciphertext))
            count += 1
        self.rewrite_index()
        log.info("rekey re-encrypted %d blobs and the index under key %s", count, ring.newest_id.hex())
        return count

