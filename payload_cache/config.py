"""Configuration of a payload cache."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_MEMORY_BYTES = 128 * 1024 * 1024
DEFAULT_GC_GRACE_SECONDS = 3600.0


@dataclass(frozen=True)
class CacheConfig:
    cache_dir: Path
    # None means the sibling file "<cache_dir>.key": outside the directory, so
    # copying or backing up the cache directory alone never carries the keys.
    key_file: Path | None = None
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    gc_grace_seconds: float = DEFAULT_GC_GRACE_SECONDS

    def __post_init__(self) -> None:
        # Accept str paths from CLI/env callers; the dataclass is frozen, hence setattr.
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        if self.key_file is not None:
            object.__setattr__(self, "key_file", Path(self.key_file))
        if self.memory_bytes < 0:
            raise ValueError(f"memory_bytes must be >= 0, got {self.memory_bytes}")
        if self.gc_grace_seconds < 0:
            raise ValueError(f"gc_grace_seconds must be >= 0, got {self.gc_grace_seconds}")

    @property
    def resolved_key_file(self) -> Path:
        if self.key_file is not None:
            return self.key_file
        return Path(str(self.cache_dir) + ".key")
