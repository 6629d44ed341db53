"""Results of maintenance operations."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GcReport:
    deleted: int  # unreferenced blobs removed
    bytes_freed: int
    kept: int  # blobs still on disk (referenced, or unreferenced but within the grace period)
    temp_removed: int = 0  # leftovers of interrupted writes


@dataclass(frozen=True)
class VerifyReport:
    checked: int
    ok: int
    quarantined: tuple[str, ...] = ()  # blob ids that failed decryption or their id check
    missing: tuple[str, ...] = ()  # blob ids a render record names but no file holds
    by_key: dict[str, int] = field(default_factory=dict)  # key id hex -> readable blobs under it
