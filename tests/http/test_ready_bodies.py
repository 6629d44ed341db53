"""Ready bodies: a payload served at another spec version is spliced without copying the body."""

from __future__ import annotations

import json
import sys
import tracemalloc

import pytest

from ignition_server.http.app import _payload_response, payload_headers
from ignition_server.http.ready import WHOLE_WRITES_BYTES, WRITE_PIECE, PiecewiseBody, ReadyBodies, piece_for
from ignition_server.memory import SERVING_MMAP_THRESHOLD
from ignition_server.render.spec import encode, with_version

# A payload of the seeds' size (~416 KB, issue 33), stored at 3.2.0.
BODY = encode({"ignition": {"version": "3.2.0"}, "storage": {"files": [
    {"path": f"/etc/f{i}", "contents": {"source": "data:," + "x" * 8000}} for i in range(52)]}}, "3.2.0")


class _Collect:
    """A stream writer that keeps only the count of bytes written, and the first bytes."""

    def __init__(self) -> None:
        self.size = 0
        self.start = b""
        self.pieces: list[int] = []

    async def write(self, chunk: bytes | memoryview) -> None:
        self.size += len(chunk)
        self.pieces.append(len(chunk))
        if not self.start:
            self.start = bytes(chunk[:64])


# 64 KiB pieces (the default) and the serving worker's whole-body write.
PIECES = [64 * 1024, SERVING_MMAP_THRESHOLD]


@pytest.mark.parametrize("piece", PIECES)
async def test_a_spliced_body_is_the_stored_bytes_written_as_views(piece: int) -> None:
    ready = ReadyBodies().make("blob", "3.4.0", BODY)
    assert ready.body is BODY  # shared with whoever holds the stored body (the memory tier)
    assert ready.joined() == with_version(BODY, "3.4.0")
    assert json.loads(ready.joined())["ignition"]["version"] == "3.4.0"
    payload = PiecewiseBody(ready, piece=piece)
    assert payload.size == len(ready.joined())
    writer = _Collect()
    await payload.write_with_length(writer, payload.size)  # type: ignore[arg-type]
    assert writer.size == payload.size and writer.start.startswith(b'{"ignition":{"version":"3.4.0"')
    assert max(writer.pieces) <= piece
    # The stored version needs no head: the body itself.
    assert ReadyBodies().make("blob", "3.2.0", BODY).joined() is BODY


@pytest.mark.parametrize("piece", PIECES)
async def test_serving_a_spliced_version_allocates_no_copy_of_the_body(piece: int) -> None:
    # 64 responses in flight each held a spliced ~416 KB copy before (worker RSS +25 MiB at the seeds' scale).
    ready_bodies = ReadyBodies(max_bytes=1)  # nothing kept: every request splices again
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        responses = [_payload_response(ready_bodies.make(f"blob{i}", "3.4.0", BODY), payload_headers("3.4.0"), piece) for i in range(8)]
        payloads = [response.body for response in responses]
        assert all(isinstance(payload, PiecewiseBody) for payload in payloads)
        held, _ = tracemalloc.get_traced_memory()
        writer = _Collect()
        for payload in payloads:
            await payload.write_with_length(writer, payload.size)  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert writer.size == 8 * len(with_version(BODY, "3.4.0"))
    assert held - base < len(BODY) // 4, held - base  # 8 bodies in flight, none copied
    assert peak - base < len(BODY), peak - base  # at most a piece or two copied at a time


def test_a_body_is_written_whole_only_on_a_reused_connection_while_few_are_open() -> None:
    # Written whole, each connection's TLS layer keeps a body's worth of records (issue 32/33):
    # whole while that stays under the bound, 64 KiB pieces beyond (64 kept-alive clients); and
    # never a connection's first response (a storm's connections, a node's one fetch).
    size = len(BODY)
    assert piece_for(size, 1, True) == size
    assert piece_for(size, WHOLE_WRITES_BYTES // size, True) == size
    assert piece_for(size, WHOLE_WRITES_BYTES // size + 1, True) == WRITE_PIECE
    assert piece_for(size, 64, True) == WRITE_PIECE
    assert piece_for(size, 1, False) == WRITE_PIECE


async def test_a_body_asked_again_is_kept_joined_and_written_in_one_write() -> None:
    bodies = ReadyBodies()
    first = bodies.make("blob", "3.4.0", BODY)
    assert first.head and first.body is BODY  # made: a head and views of the stored body
    assert bodies.get("blob", "3.4.0") is None and bodies.held() == 0  # asked once: not kept
    bodies.make("blob", "3.4.0", BODY)  # asked again: kept from now on
    again = bodies.get("blob", "3.4.0")
    assert again is not None and again.head == b"" and again.rest == 0
    assert again.body == with_version(BODY, "3.4.0")
    assert bodies.get("blob", "3.4.0") is again  # joined once, not per request
    assert bodies.held() == len(again.body)
    # Whole (few connections): the joined bytes as aiohttp's own body, one write with the headers.
    response = _payload_response(again, payload_headers("3.4.0"), piece_for(len(again), 1, True))
    assert response.body is not None and not isinstance(response.body, PiecewiseBody)
    # Many connections: still pieces of at most WRITE_PIECE.
    payload = _payload_response(again, payload_headers("3.4.0"), piece_for(len(again), 1000, True)).body
    assert isinstance(payload, PiecewiseBody)
    writer = _Collect()
    await payload.write_with_length(writer, payload.size)  # type: ignore[arg-type]
    assert writer.size == len(again) and max(writer.pieces) <= WRITE_PIECE


@pytest.mark.parametrize("piece", PIECES)
async def test_a_written_body_is_let_go(piece: int) -> None:
    # aiohttp keeps a kept-alive connection's last response until its next request: a payload
    # that held on to its body kept a decrypted ~416 KB body per connection alive in a serving
    # worker while its client parsed it (64 connections at the seeds' fleet, issue 33).
    body = bytes(bytearray(BODY))  # a body of its own, referenced here only
    ready = ReadyBodies(max_bytes=1).make("blob", "3.4.0", body)  # not kept
    payload = PiecewiseBody(ready, piece=piece)
    del ready
    held = sys.getrefcount(body)
    writer = _Collect()
    await payload.write_with_length(writer, payload.size)  # type: ignore[arg-type]
    assert writer.size == payload.size == len(with_version(body, "3.4.0"))
    assert sys.getrefcount(body) == held - 1  # the payload's view of it is gone


def test_a_body_is_kept_ready_from_its_second_ask() -> None:
    # A fleet asking each NodePool once (a warm restart) keeps no bodies: kept at their first
    # ask, they stayed until pushed out, ~11 MiB of a serving worker's peak (issue 33).
    bodies = ReadyBodies(first_asks=4)
    for i in range(100):
        bodies.make(f"blob{i}", "3.4.0", BODY)
    assert bodies.held() == 0
    # A storm's hot NodePool is asked again: kept from then on, at each version asked twice.
    bodies.make("blob99", "3.4.0", BODY)
    bodies.make("blob99", "3.2.0", BODY)
    kept = bodies.get("blob99", "3.4.0")
    assert kept is not None and kept.joined() == with_version(BODY, "3.4.0")
    assert bodies.get("blob99", "3.2.0") is None
    # Only the last `first_asks` first asks are remembered.
    bodies.make("blob0", "3.4.0", BODY)
    assert bodies.get("blob0", "3.4.0") is None
