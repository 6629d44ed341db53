"""What `ignition-server cache stats` prints: the cache's counters (upkeep.py) and what it is
made of (the CLI owns argument parsing)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .cache import PayloadCache


def stats_report(cache: PayloadCache) -> dict[str, Any]:
    """A JSON-serialisable summary for ``ignition-server cache stats``."""
    report: dict[str, Any] = {
        "cache_dir": str(cache.layout.root),
        "key_file": str(cache.key_file),
        "format": cache.format,
        "key_ids": cache.key_ids(),  # newest (encrypting) first
        "index_dirty": cache.dirty,
        "quarantine_files": cache.quarantine_files(),
        "sealed_names": cache.unseal_names(),
    }
    report.update(dataclasses.asdict(cache.stats()))
    return report
