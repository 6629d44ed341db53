"""Open connections counted for the whole server, however many processes serve it.

`--connections-per-source` and `--connections-total` are the server's limits, not each
worker's: SO_REUSEPORT spreads one address's connections over the workers by a hash of
the 4-tuple, so a per-worker share of a limit would refuse an address on one worker while
another had room. So the count lives in one table in shared memory (a memfd the owner
creates and each worker maps; private memory when one process serves alone), with one row
per serving process. A row is written only by its own process, so no locks or atomics are
needed; a check sums one column over the rows (a handful of reads: under a microsecond
beside a TLS handshake's milliseconds).

A row holds its process's open connections in all, and per source address hashed into
`buckets` buckets (IPv4 and IPv6 addresses alike, as text), plus the connections it refused
and the ones it closed for slow headers. Addresses that share a bucket share a count:
a collision only ever over-counts (refuses early), never lets an address past its limit.
The hash is keyed with a random key made with the table (each start of the server), kept in
the table's header so every process agrees: unkeyed (a CRC), anyone could work out an address
that shares a victim's bucket and hold its connections to lock the victim out.

A process counts a connection in its own row first and sums afterwards, so two processes
admitting at the same moment each see the other's connection and the race refuses (the
client retries) rather than over-admits. Strictly, with no memory fence between the write
and the reads, a CPU may let both reads miss the other's write if they fall within a few
nanoseconds of each other; then one connection per other process can slip past.

A process that dies (SIGKILL) leaves its row as it was: its connections are gone, so the
owner clears the row (`clear`) before it starts the replacement.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections.abc import Sequence

from ..tallies import ConnectionCounts

BUCKETS = 16_384  # per row: 64 KiB of int32, touched only where addresses hash
_MAGIC = b"IGNCONN1"
_HEADER = struct.Struct("=8sII16s")  # magic, rows, buckets, the bucket hash's key
KEY_BYTES = 16
_HEADER_BYTES = 64
_SLOTS = 8  # int64 per row: open, refused, timed out, the rest spare
_OPEN, _REFUSED, _TIMED_OUT = 0, 1, 2
_SLOT_BYTES = _SLOTS * 8


class ConnectionTable:
    """The shared table; `create` in the owner, `attach` in a worker (to the fd it was passed)."""

    def __init__(self, fd: int, memory: mmap.mmap) -> None:
        magic, rows, buckets, key = _HEADER.unpack_from(memory, 0)
        if magic != _MAGIC or rows < 1 or buckets < 1 or buckets & (buckets - 1):
            raise ValueError("not a connection table")
        self.fd, self.rows, self.buckets, self.key = fd, rows, buckets, key
        self._memory = memory
        self._stride = _SLOT_BYTES + 4 * buckets
        view = memoryview(memory)
        self._int64 = view.cast("q")
        self._int32 = view.cast("i")
        # Rows whose processes died: their counters live on here (the owner's copy only).
        self._retired_refused = 0
        self._retired_timed_out = 0

    @classmethod
    def create(cls, rows: int, buckets: int = BUCKETS, *, shared: bool = True) -> ConnectionTable:
        """A zeroed table; `shared`: in a memfd (`fd`) other processes can map, else private memory."""
        if rows < 1 or buckets < 1 or buckets & (buckets - 1):
            raise ValueError("a connection table needs at least one row and a power-of-two bucket count")
        size = _HEADER_BYTES + rows * (_SLOT_BYTES + 4 * buckets)
        if not shared:
            memory = mmap.mmap(-1, size)
            _HEADER.pack_into(memory, 0, _MAGIC, rows, buckets, os.urandom(KEY_BYTES))
            return cls(-1, memory)
        fd = os.memfd_create("ignition-server-connections")  # close-on-exec: pass_fds hands it on
        try:
            os.ftruncate(fd, size)
            memory = mmap.mmap(fd, size)
        except OSError:
            os.close(fd)
            raise
        _HEADER.pack_into(memory, 0, _MAGIC, rows, buckets, os.urandom(KEY_BYTES))
        return cls(fd, memory)

    @classmethod
    def attach(cls, fd: int) -> ConnectionTable:
        memory = mmap.mmap(fd, os.fstat(fd).st_size)
        return cls(fd, memory)

    def _slot(self, row: int, slot: int) -> int:
        return (_HEADER_BYTES + row * self._stride) // 8 + slot

    def _bucket(self, row: int) -> int:
        """Index (in int32 units) of the row's first bucket."""
        return (_HEADER_BYTES + row * self._stride + _SLOT_BYTES) // 4

    def row(self, index: int) -> ConnectionRow:
        if not 0 <= index < self.rows:
            raise IndexError(f"row {index} of a {self.rows}-row connection table")
        return ConnectionRow(self, index)

    def counts(self) -> ConnectionCounts:
        if self._int64 is None:  # closed (the server is stopping)
            return ConnectionCounts((0,) * self.rows, self._retired_refused, self._retired_timed_out)
        slots = self._int64
        return ConnectionCounts(
            tuple(slots[self._slot(row, _OPEN)] for row in range(self.rows)),
            self._retired_refused + sum(slots[self._slot(row, _REFUSED)] for row in range(self.rows)),
            self._retired_timed_out + sum(slots[self._slot(row, _TIMED_OUT)] for row in range(self.rows)),
        )

    def clear(self, index: int) -> None:
        """Zero a dead process's row (only once it is dead: the row is its to write)."""
        slots = self._int64
        self._retired_refused += slots[self._slot(index, _REFUSED)]
        self._retired_timed_out += slots[self._slot(index, _TIMED_OUT)]
        start = _HEADER_BYTES + index * self._stride
        self._memory[start:start + self._stride] = bytes(self._stride)

    def close(self) -> None:
        if self._int64 is None:
            return
        self._int64.release()
        self._int32.release()
        self._int64 = self._int32 = None  # type: ignore[assignment]
        self._memory.close()
        if self.fd >= 0:
            os.close(self.fd)


def source_bucket(source: str, mask: int, key: bytes) -> int:
    """The bucket of an address (text, IPv4 or IPv6) in a table of `mask + 1` buckets."""
    # Keyed BLAKE2b (~1 µs), not hash(): str hashes are salted per process, and every process
    # must agree; not a CRC: its buckets can be computed by anyone (the module's note).
    digest = hashlib.blake2b(source.encode(), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "little") & mask


class ConnectionRow:
    """One process's row: it counts its own connections here and checks the sums over all rows."""

    def __init__(self, table: ConnectionTable, index: int) -> None:
        self.index = index
        self._int64, self._int32 = table._int64, table._int32
        self._mask = table.buckets - 1
        self._key = table.key
        self._open = table._slot(index, _OPEN)
        self._refused = table._slot(index, _REFUSED)
        self._timed_out = table._slot(index, _TIMED_OUT)
        self._first_bucket = table._bucket(index)
        self._opens: Sequence[int] = tuple(table._slot(row, _OPEN) for row in range(table.rows))
        self._first_buckets: Sequence[int] = tuple(table._bucket(row) for row in range(table.rows))

    def admit(self, source: str, per_source: int, total: int) -> int:
        """Count a connection from `source`: its bucket, or -1 (not counted) when a limit is reached."""
        bucket = source_bucket(source, self._mask, self._key)
        slots, buckets = self._int64, self._int32
        mine = self._first_bucket + bucket
        slots[self._open] += 1  # counted first, summed after: see the module's note on races
        buckets[mine] += 1
        open_total = 0
        for index in self._opens:
            open_total += slots[index]
        from_source = 0
        for first in self._first_buckets:
            from_source += buckets[first + bucket]
        if open_total > total or from_source > per_source:
            slots[self._open] -= 1
            buckets[mine] -= 1
            slots[self._refused] += 1
            return -1
        return bucket

    def release(self, bucket: int) -> None:
        self._int64[self._open] -= 1
        self._int32[self._first_bucket + bucket] -= 1

    def open_here(self) -> int:
        """This process's open connections."""
        return self._int64[self._open]

    def timed_out(self) -> None:
        self._int64[self._timed_out] += 1
