"""Plain counters; the server's metrics module turns them into Prometheus series."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CacheStats:
    """A point-in-time snapshot. Counters (``*_hits``, ``misses``, ``quarantined``,
    ``gc_runs``, ``gc_deleted``, ``blobs_written``) count since the cache was opened;
    the rest are current levels."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    memory_bytes: int = 0
    memory_items: int = 0
    disk_bytes: int = 0
    blob_count: int = 0
    quarantined: int = 0
    gc_runs: int = 0
    gc_deleted: int = 0
    blobs_written: int = 0
    tokens: int = 0
    renders: int = 0


@dataclass
class Counters:
    """Mutable counters owned by one PayloadCache; callers hold its lock while updating."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    quarantined: int = 0
    gc_runs: int = 0
    gc_deleted: int = 0
    blobs_written: int = 0
    # blob id -> ciphertext size of every blob file we know of, for disk levels
    # without a directory scan on every metrics scrape.
    on_disk: dict[str, int] = field(default_factory=dict)
    disk_bytes: int = 0

    def disk_added(self, blob_id: str, size: int) -> None:
        self.disk_bytes += size - self.on_disk.get(blob_id, 0)
        self.on_disk[blob_id] = size

    def disk_removed(self, blob_id: str) -> None:
        self.disk_bytes -= self.on_disk.pop(blob_id, 0)
