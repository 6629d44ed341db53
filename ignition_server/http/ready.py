"""Payload bodies kept ready to send, per (blob, spec version): the hot path's last step.

Serving a payload at a version other than the one it was stored at is a splice: a new version
head, then the stored body past its own (render.spec.version_splice). The body is never copied
for it: a spliced copy per request was a quarter of the serving CPU in keep-alive (py-spy,
bench compare) and, with 64 responses of 416 KB in flight, ~25 MiB more of a worker's memory
(the seeds' fleet, issue 33). A booting fleet asks the same few NodePools at the same version
over and over, so the (head, body) pair is kept from its second ask (FIRST_ASKS_REMEMBERED),
bounded by the bytes it keeps alive; a kept pair asked for again is kept joined from then on
(one copy per entry, not per request): a body written whole is then one TLS write and one
socket write, where a head and the rest were two (issue 32). Blob ids are content hashes, so an entry can never go stale: a re-render is a new
blob id.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import BytesPayload
from cachetools import LRUCache

from ..render.spec import version_splice

# The bound where none is given (tests, bench hotpath): ~27 bodies of ~300 KiB. A server sizes
# its ready bodies from --cache-memory (config.payload_memory).
DEFAULT_READY_BYTES = 8 * 1024 * 1024
# Below the allocator's fixed mmap threshold (memory.MMAP_THRESHOLD, 128 KiB): every buffer a
# response makes on its way out (headers joined to the first piece, the TLS records read back
# from the SSL memory BIO) stays a heap allocation. Handed over whole, a ~300 KiB body made
# each of those an mmap + munmap with fresh zeroed pages: keep-alive served ~1,000 req/s per
# core that way, ~2,300 with the same buffers from the heap (one process, same run).
WRITE_PIECE = 64 * 1024
# On a kept-alive connection after its first response (piece_for), bodies are written whole
# while (connections open in this process) x (body size) stays under this, in WRITE_PIECE
# pieces beyond. A TLS write is encrypted whole into the connection's outgoing memory BIO, which
# keeps that capacity for the connection's life (and a slow reader holds the records themselves):
# written whole, 64 kept-alive clients of a 294 KiB payload cost a serving worker 25 MiB over idle
# against 10 in pieces (+40 MiB at the seeds' fleet, issue 33). In pieces, a kept-alive ~300 KiB
# body took six socket writes where bare aiohttp takes one: 51-60 µs of the worker's system CPU
# per request against 38-46 whole (issue 32, one worker, 16 connections). Under the bound, whole
# writes pin at most this much more than pieces would.
WHOLE_WRITES_BYTES = 8 * 1024 * 1024
# A version head is sent joined to this much of the body: one write, a few KiB copied.
HEAD_JOIN = 4 * 1024
# Payload bytes a process may be writing at once before new payload requests are answered 503 +
# Retry-After: --max-in-flight counts requests until their handler returns, not bodies still
# being written to slow clients (1,024 of 416 KB would be 416 MiB in one worker). 64 in flight
# at the seeds' fleet (issue 33) write ~26 MiB.
DEFAULT_SENDING_BYTES = 64 * 1024 * 1024
# A (blob, version) pair is kept ready from its second ask on: the last this many first asks are
# remembered (their keys only, ~0.3 MiB). Kept at its first ask, every body of a fleet asked
# once each (a warm restart: each node fetches once) passed through the ready bodies and stayed
# there until pushed out, ~11 MiB of a serving worker's peak and the heap holes they left
# (the seeds' fleet, issue 33); a storm's hot NodePools are asked again within moments.
FIRST_ASKS_REMEMBERED = 2048


def piece_for(size: int, open_connections: int, served_before: bool, piece: int = WRITE_PIECE,
              whole_bytes: int = WHOLE_WRITES_BYTES) -> int:
    """How much of a `size`-byte body to write at once on a connection that has (`served_before`)
    or has not had a response before, `open_connections` open in this process. Pure.

    A connection's first response goes in pieces: written whole, its TLS buffer would grow to the
    body (reallocated and zeroed on the way) for a connection that most often ends after it (a
    node fetches once; every connection of a storm). Later ones go whole while the connections
    open could pin at most `whole_bytes` that way."""
    return size if served_before and open_connections * size <= whole_bytes else piece


@dataclass(frozen=True, slots=True)
class ReadyBody:
    """A response body: `head`, then `body` from offset `rest` on (the stored bytes, shared, not copied)."""

    head: bytes
    body: bytes
    rest: int = 0

    def __len__(self) -> int:
        return len(self.head) + len(self.body) - self.rest

    def held(self) -> int:
        """Bytes this keeps alive (the whole stored body, shared or not)."""
        return len(self.head) + len(self.body)

    def joined(self) -> bytes:
        """The body as one bytes object (a copy unless no splice is needed)."""
        return self.head + memoryview(self.body)[self.rest:] if self.head or self.rest else self.body


@dataclass
class Sending:
    """Bytes of payload bodies being written now; used from the event loop only."""

    bytes: int = 0


class ReadyBodies:
    """An LRU of response bodies keyed by (blob id, version); used from the event loop only."""

    def __init__(self, max_bytes: int = DEFAULT_READY_BYTES, first_asks: int = FIRST_ASKS_REMEMBERED) -> None:
        self._bodies: LRUCache[tuple[str, str], ReadyBody] = LRUCache(maxsize=max(max_bytes, 1), getsizeof=ReadyBody.held)
        self._asked_once: OrderedDict[tuple[str, str], None] = OrderedDict()  # FIRST_ASKS_REMEMBERED
        self._first_asks = first_asks

    def held(self) -> int:
        """Bytes of bodies kept now."""
        return int(self._bodies.currsize)

    def get(self, blob_id: str, version: str) -> ReadyBody | None:
        key = (blob_id, version)
        try:
            # Not .get: cachetools' get is `in`, then [] (four Python calls a request, for two).
            ready: ReadyBody | None = self._bodies[key]
        except KeyError:
            return None
        if ready is not None and (ready.head or ready.rest):
            # Asked again: joined once, so that every later response is one write (module doc).
            # A fleet asking each NodePool once (the seeds' warm restart) never pays the copy.
            ready = ReadyBody(b"", ready.joined())
            self._bodies[key] = ready
        return ready

    def make(self, blob_id: str, version: str, body: bytes,
             splice: Callable[[bytes, str], tuple[bytes, int]] = version_splice) -> ReadyBody:
        """`body` at `version`, kept for the next request if it was asked for before
        (FIRST_ASKS_REMEMBERED; a body larger than the bound is never kept)."""
        head, rest = splice(body, version)
        ready = ReadyBody(head, body, rest)
        key = (blob_id, version)
        if ready.held() > self._bodies.maxsize:
            return ready
        if key in self._asked_once:
            del self._asked_once[key]
            self._bodies[key] = ready
        else:
            self._asked_once[key] = None
            if len(self._asked_once) > self._first_asks:
                self._asked_once.popitem(last=False)
        return ready


class PiecewiseBody(BytesPayload):
    """A ready body that aiohttp writes in `piece`-sized slices: views of the stored body. A
    version head goes out joined to a small first slice (a few KiB copied, never the body)."""

    def __init__(self, ready: ReadyBody, *, piece: int = WRITE_PIECE, sending: Sending | None = None,
                 **kwargs: object) -> None:
        super().__init__(memoryview(ready.body)[ready.rest:], **kwargs)
        self._head = ready.head
        self._size = len(ready)
        self._piece = piece
        self._sending = sending or Sending()

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return (self._head + self._value).decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self._head + self._value

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        size = len(self._head) + len(self._value)
        self._sending.bytes += size
        try:
            await self._write_pieces(writer, content_length)
        finally:
            self._sending.bytes -= size
            # Written (or abandoned): let go of the body. aiohttp keeps a kept-alive connection's
            # last response (its request loop's local) until the next request arrives, and with
            # it this payload: a client that parses a body before asking again held a decrypted
            # body per connection in the worker (64 connections at the seeds' fleet, ~26 MiB).
            self._head, self._value = b"", b""

    async def _write_pieces(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        head, view = self._head, memoryview(self._value)
        if content_length is not None:
            head, view = head[:content_length], view[:max(content_length - len(head), 0)]
        start = 0
        if head:
            start = min(HEAD_JOIN, len(view))
            await writer.write(head + view[:start])
        piece = self._piece
        for offset in range(start, len(view), piece):
            await writer.write(view[offset:offset + piece])
