"""Payload bodies kept ready to send, per (blob, spec version): the hot path's last step.

Serving a payload at a version other than the one it was stored at splices a new ~300 KiB
bytes object (render.spec.with_version); per request that copy was a quarter of the serving
CPU in keep-alive (py-spy, bench compare). A booting fleet asks the same few NodePools at the
same version over and over, so the spliced body is kept, bounded by bytes. Blob ids are
content hashes, so an entry can never go stale: a re-render is a new blob id.
"""

from __future__ import annotations

from typing import Callable

from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import BytesPayload
from cachetools import LRUCache

from ..render.spec import with_version

# The bound where none is given (tests, bench hotpath): ~27 bodies of ~300 KiB. A server sizes
# its ready bodies from --cache-memory (config.payload_memory).
DEFAULT_READY_BYTES = 8 * 1024 * 1024
# Below the allocator's fixed mmap threshold (memory.MMAP_THRESHOLD, 128 KiB): every buffer a
# response makes on its way out (headers joined to the first piece, the TLS records read back
# from the SSL memory BIO) stays a heap allocation. Handed over whole, a ~300 KiB body made
# each of those an mmap + munmap with fresh zeroed pages: keep-alive served ~1,000 req/s per
# core that way, ~2,300 with the same buffers from the heap (one process, same run).
WRITE_PIECE = 64 * 1024


class ReadyBodies:
    """An LRU of response bodies keyed by (blob id, version); used from the event loop only."""

    def __init__(self, max_bytes: int = DEFAULT_READY_BYTES) -> None:
        self._bodies: LRUCache[tuple[str, str], bytes] = LRUCache(maxsize=max(max_bytes, 1), getsizeof=len)

    def held(self) -> int:
        """Bytes of bodies kept now."""
        return int(self._bodies.currsize)

    def get(self, blob_id: str, version: str) -> bytes | None:
        return self._bodies.get((blob_id, version))

    def make(self, blob_id: str, version: str, body: bytes, rewrite: Callable[[bytes, str], bytes] = with_version) -> bytes:
        """`body` at `version`, kept for the next request (a body larger than the bound is not kept)."""
        ready = rewrite(body, version)
        if len(ready) <= self._bodies.maxsize:
            self._bodies[(blob_id, version)] = ready
        return ready


class PiecewiseBody(BytesPayload):
    """A bytes body that aiohttp writes in `piece`-sized slices (views, no copies)."""

    def __init__(self, value: bytes, *, piece: int = WRITE_PIECE, **kwargs: object) -> None:
        super().__init__(value, **kwargs)
        self._piece = piece

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        view = memoryview(self._value)
        if content_length is not None:
            view = view[:content_length]
        piece = self._piece
        if len(view) <= piece:
            await writer.write(view)
            return
        for start in range(0, len(view), piece):
            await writer.write(view[start:start + piece])
