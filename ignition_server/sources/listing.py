"""The file source's listing snapshot: what a restart needs to skip parsing the files that did
not change while it was down (at 5,280 NodePools, parsing every manifest again costs ~40 s of CPU).

One record per file (its stamp, digest, when it was read and its objects as kept, slim), each
compressed on its own and kept that way in memory and in the snapshot alike: a restart decodes
a file's record only when it reaches that file, and carries a restored file's record over as
it is. (Version 2 was one JSON document: decoding it whole made ~40 MiB of short-lived objects
at 5,280 NodePools, much of which the owner's heap kept as RSS after they were freed.)
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from ..model.objects import LargeValue, ObjectKey, shared

SNAPSHOT_NAME = "source-listing"
SNAPSHOT_VERSION = 3  # 2: values over 4 KiB as digests; 3: framed, compressed records
_LARGE_MARK = "$large"
_FRAME = struct.Struct(">II")  # path length, record length


class ListingStore(Protocol):
    """Somewhere safe for the listing snapshot: it holds Secret values (the payload cache
    keeps it encrypted)."""

    def load_state(self, name: str) -> bytes | None: ...

    def save_state(self, name: str, data: bytes) -> None: ...


@dataclass(frozen=True)
class Record:
    stamp: tuple[int, int, int]  # (mtime_ns, size, inode) when read
    digest: str
    read_at: int  # time_ns of the read: a stamp this close to it may hide a later same-size write
    objects: list[tuple[ObjectKey, dict[str, Any]]]


def encode_record(stamp: tuple[int, int, int], digest: str, read_at: int,
                  objects: list[tuple[ObjectKey, dict[str, Any]]]) -> bytes:
    text = json.dumps(
        {"stamp": stamp, "digest": digest, "read_at": read_at,
         "objects": [[k.kind, k.namespace, k.name, o] for k, o in objects]},
        default=_encode_value, separators=(",", ":"),
    )
    return zlib.compress(text.encode(), 1)  # level 1: a third smaller; higher levels gain nothing here


def restamped(raw: bytes, stamp: tuple[int, int, int], read_at: int) -> bytes:
    """The record with its file read again (same content) at `read_at`, stamped `stamp`."""
    record = decode_record(raw)
    return encode_record(stamp, record.digest, read_at, record.objects)


def decode_record(raw: bytes) -> Record:
    """A record as `encode_record` made it; ValueError when it is not one."""
    try:
        fields = json.loads(zlib.decompress(raw))
        return Record(tuple(fields["stamp"]), fields["digest"], fields["read_at"],
                      [(ObjectKey(shared(kind), shared(namespace), name), _revive(obj)) for kind, namespace, name, obj in fields["objects"]])
    except (zlib.error, KeyError, TypeError) as exc:
        raise ValueError(f"not a listing record: {exc}") from None


def pack(root: str, records: Mapping[str, bytes]) -> bytes:
    """The snapshot of `root`: its files' records, by path."""
    parts = [json.dumps({"version": SNAPSHOT_VERSION, "root": root}).encode(), b"\n"]
    for path, record in records.items():
        name = path.encode()
        parts += (_FRAME.pack(len(name), len(record)), name, record)
    return b"".join(parts)


def unpack(data: bytes, root: str) -> dict[str, bytes]:
    """Path -> record of a snapshot of `root`; {} for another root or version; ValueError
    when damaged (records are checked one by one, as they are used)."""
    head, newline, body = data.partition(b"\n")
    try:
        meta = json.loads(head)
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or meta.get("version") != SNAPSHOT_VERSION or meta.get("root") != root:
        return {}
    if not newline:
        raise ValueError("no records")
    found: dict[str, bytes] = {}
    view, at = memoryview(body), 0
    while at < len(view):
        if at + _FRAME.size > len(view):
            raise ValueError("truncated")
        name_len, record_len = _FRAME.unpack_from(view, at)
        at += _FRAME.size
        if at + name_len + record_len > len(view):
            raise ValueError("truncated")
        found[bytes(view[at:at + name_len]).decode()] = bytes(view[at + name_len:at + name_len + record_len])
        at += name_len + record_len
    return found


def _encode_value(value: Any) -> Any:
    if isinstance(value, LargeValue):
        return {_LARGE_MARK: [value.sha256, value.size]}
    raise TypeError(f"cannot encode {type(value).__name__}")


def _revive(value: Any) -> Any:
    if isinstance(value, dict):
        mark = value.get(_LARGE_MARK)
        if mark is not None and len(value) == 1:
            return LargeValue(mark[0], mark[1])
        return {sys.intern(k): _revive(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_revive(v) for v in value]
    if isinstance(value, str):
        return shared(value)  # as `slim` does: a restored object is kept as a parsed one is
    return value
