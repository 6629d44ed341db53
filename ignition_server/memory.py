"""Keeping the process's memory close to what it holds (the RSS target is 300 MiB at 5,280 NodePools).

glibc's allocator otherwise keeps what bursts of work used: one arena per thread that ever
rendered or decrypted, and a mmap threshold that grows after large frees so later ~300 KiB
payloads land in the heap and fragment it. Both are tuned once at start-up; `release()`
hands freed heap back after bulk work (the first listing, a burst of renders).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from functools import cache

log = logging.getLogger("ignition_server.memory")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# Payloads and source values above this are mmap'd and go back to the OS when freed.
MMAP_THRESHOLD = 128 * 1024
# Serving workers never render: what they allocate is response bodies and the TLS records
# made from them, over and over. Up to this size those come from the heap and are reused.
# (Bodies are written whole only while few connections are open, in 64 KiB pieces beyond,
# http/ready.py: written whole, each connection held its TLS records whole too, +40 MiB in a
# worker at the seeds' fleet, issue 33.)
SERVING_MMAP_THRESHOLD = 1024 * 1024
ARENA_MAX = 2


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt  # glibc only
        libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return libc


def tune(mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix the allocator's arena count, mmap threshold and trim threshold; False where this is not glibc."""
    libc = _libc()
    if libc is None:
        return False
    # A fixed mmap threshold also fixes the trim threshold at its 128 KiB default: a buffer just
    # under the mmap threshold freed at the top of the heap is then given back to the OS, and
    # the next one faults its pages in again. Per ~300 KiB response that was 42 page faults and
    # +70-90% CPU (bare aiohttp with the worker's setting, kept-alive, same run). Twice the mmap threshold is
    # what glibc's own dynamic setting would choose; `release()` trims after bulk work anyway.
    ok = (bool(libc.mallopt(_M_ARENA_MAX, ARENA_MAX)) and bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold))
          and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2 * mmap_threshold)))
    if not ok:
        log.debug("mallopt refused; memory is not tuned")
    return ok


def release() -> None:
    """Give freed heap memory back to the OS (blocking: call from a thread)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
