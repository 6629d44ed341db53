"""Functions behind the project's cache CLI commands (the CLI owns argument parsing)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .cache import PayloadCache
from .reports import GcReport, VerifyReport


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


def verify(cache: PayloadCache, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    return cache.verify(progress)


def gc(cache: PayloadCache, now: float | None = None) -> GcReport:
    return cache.gc(now)


def rekey(cache: PayloadCache) -> int:
    return cache.rekey()
