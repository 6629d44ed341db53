"""Where things live in the cache directory, and its format version.

::

    <cache_dir>/FORMAT                 "ignition-server-cache 1"
    <cache_dir>/index.bin              encrypted index snapshot (tokens, renders, sealed state)
    <cache_dir>/blobs/<id[:2]>/<id>    one encrypted payload per blob id (64 hex chars)
    <cache_dir>/quarantine/<name>      files that failed authentication, kept for inspection
    <cache_dir>.key                    key file (default location; deliberately outside)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ignition_server.fsio import TEMP_PREFIX, atomic_write, make_dir

from .errors import CacheFormatError

FORMAT_FILE = "FORMAT"
FORMAT_NAME = "ignition-server-cache"
FORMAT_VERSION = 1
FORMAT_LINE = f"{FORMAT_NAME} {FORMAT_VERSION}"

_BLOB_ID = re.compile(r"[0-9a-f]{64}")
# Entries a fresh volume may already contain (ext4 PVC roots have lost+found).
_IGNORABLE = {"lost+found"}


def is_blob_id(name: str) -> bool:
    return _BLOB_ID.fullmatch(name) is not None


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def format_file(self) -> Path:
        return self.root / FORMAT_FILE

    @property
    def index_file(self) -> Path:
        return self.root / "index.bin"

    @property
    def blobs_dir(self) -> Path:
        return self.root / "blobs"

    @property
    def quarantine_dir(self) -> Path:
        return self.root / "quarantine"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def blob_path(self, blob_id: str) -> Path:
        # Validated here because ids reach the filesystem: no traversal, no odd names.
        if not is_blob_id(blob_id):
            raise ValueError(f"not a blob id: {blob_id!r}")
        # Two-hex-digit shards keep directories small at thousands of blobs.
        return self.blobs_dir / blob_id[:2] / blob_id

    def prepare(self) -> None:
        """Create a fresh cache directory, or check an existing one's format."""
        make_dir(self.root)
        try:
            found = self.format_file.read_text(encoding="utf-8", errors="replace").strip()
        except FileNotFoundError:
            found = None
        if found is None:
            others = [
                name
                for name in os.listdir(self.root)
                if name not in _IGNORABLE and not name.startswith(TEMP_PREFIX)
            ]
            if others:
                raise CacheFormatError(
                    f"{self.root} is not empty but has no {FORMAT_FILE} file (found: {', '.join(sorted(others)[:5])}); "
                    f"expected a payload cache of format {FORMAT_LINE!r}. Point the cache at an empty or "
                    f"dedicated directory, or remove its contents if nothing else uses it."
                )
            atomic_write(self.format_file, (FORMAT_LINE + "\n").encode(), 0o600)  # nothing secret, but every file of the cache is private
        elif found != FORMAT_LINE:
            raise CacheFormatError(
                f"{self.format_file} says {found[:80]!r}, but this version of ignition-server only understands "
                f"{FORMAT_LINE!r}. Run the ignition-server release that wrote this cache, or move the "
                f"directory {self.root} aside so a fresh cache is built (payloads are re-rendered from the "
                f"NodePools' sources; sealed state in the old cache is lost)."
            )
        make_dir(self.blobs_dir)
        make_dir(self.quarantine_dir)
