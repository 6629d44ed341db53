"""Crash-safe file primitives: every write is temp file + fsync + rename + fsync(dir)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

TEMP_PREFIX = ".tmp-"


def fsync_dir(directory: Path) -> None:
    # The rename is only durable once the directory entry itself is on disk.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path_for(path: Path) -> Path:
    # Same directory as the target so os.replace never crosses filesystems;
    # the prefix lets garbage collection recognise leftovers of a crash, and the suffix
    # keeps tools that read "*.yaml" in a manifest directory away from a half-written file.
    return path.with_name(f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}-{path.name}.tmp")


def write_exclusive(path: Path, data: bytes, mode: int) -> None:
    """Create a new file (never reusing an existing one) holding data, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        # A disk that fills up mid-write must not keep the torn file (O_EXCL: it is ours).
        os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        raise
    os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace path with data so a reader sees the old or the new file, never a torn one."""
    tmp = temp_path_for(path)
    try:
        write_exclusive(tmp, data, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def make_dir(path: Path) -> None:
    """mkdir -p with 0700, making each newly created entry durable."""
    if path.is_dir():
        return
    make_dir(path.parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    fsync_dir(path.parent)
