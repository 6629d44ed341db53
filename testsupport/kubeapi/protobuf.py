"""Request bodies in Kubernetes' protobuf encoding, decoded as the API server decodes them.

client-go (the reference ignition server's controller-runtime among its users) writes
built-in kinds as `application/vnd.kubernetes.protobuf`: the 4-byte magic `k8s\\0`, then a
`runtime.Unknown` envelope (type meta, the raw object, encoding), the raw object in the
fields of k8s.io/api's generated.proto. The kinds a client writes here (Secret, ConfigMap,
Event) are decoded into the JSON shape the store keeps; any other kind is 415, as a real
API server answers for a body it cannot read.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one message: varints as int, length-delimited as bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ProtobufError("truncated field")
            yield number, data[pos:pos + length]
            pos += length
        elif wire in (1, 5):  # fixed64/fixed32: no field of the kinds decoded here uses them
            pos += 8 if wire == 1 else 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")


# A schema: field number -> (JSON name, decoder, repeated).
Schema = dict[int, tuple[str, Callable[[Any], Any], bool]]


def _string(value: bytes) -> str:
    return value.decode()


def _int(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _bool(value: int) -> bool:
    return bool(value)


def _bytes_b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _time(micro: bool) -> Callable[[bytes], str | None]:
    def decode(value: bytes) -> str | None:
        parts = dict(fields(value))
        seconds, nanos = _int(int(parts.get(1, 0))), int(parts.get(2, 0))
        if not seconds and not nanos:
            return None
        when = dt.datetime.fromtimestamp(seconds, dt.timezone.utc)
        if micro:
            return when.strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos // 1000:06d}Z"
        return when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return decode


def _map(value_decoder: Callable[[bytes], Any]) -> Callable[[bytes], tuple[str, Any]]:
    def decode(entry: bytes) -> tuple[str, Any]:
        parts = dict(fields(entry))
        return _string(bytes(parts.get(1, b""))), value_decoder(bytes(parts.get(2, b"")))
    return decode


def _message(schema: Schema) -> Callable[[bytes], dict[str, Any]]:
    def decode(data: bytes) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for number, value in fields(data):
            if number not in schema:
                continue  # a field this server does not keep (managedFields, ...)
            name, decoder, repeated = schema[number]
            decoded = decoder(value)
            if isinstance(decoded, tuple):  # a map entry
                out.setdefault(name, {})[decoded[0]] = decoded[1]
            elif repeated:
                out.setdefault(name, []).append(decoded)
            elif decoded is not None:
                out[name] = decoded
        return out
    return decode


_OWNER_REFERENCE = _message({1: ("kind", _string, False), 3: ("name", _string, False), 4: ("uid", _string, False),
                             5: ("apiVersion", _string, False), 6: ("controller", _bool, False),
                             7: ("blockOwnerDeletion", _bool, False)})
_OBJECT_META = _message({
    1: ("name", _string, False), 2: ("generateName", _string, False), 3: ("namespace", _string, False),
    5: ("uid", _string, False), 6: ("resourceVersion", _string, False), 7: ("generation", _int, False),
    8: ("creationTimestamp", _time(False), False), 9: ("deletionTimestamp", _time(False), False),
    10: ("deletionGracePeriodSeconds", _int, False), 11: ("labels", _map(_string), False),
    12: ("annotations", _map(_string), False), 13: ("ownerReferences", _OWNER_REFERENCE, True),
    14: ("finalizers", _string, True)})
_OBJECT_REFERENCE = _message({1: ("kind", _string, False), 2: ("namespace", _string, False), 3: ("name", _string, False),
                              4: ("uid", _string, False), 5: ("apiVersion", _string, False),
                              6: ("resourceVersion", _string, False), 7: ("fieldPath", _string, False)})

KINDS: dict[str, Callable[[bytes], dict[str, Any]]] = {
    "Secret": _message({1: ("metadata", _OBJECT_META, False), 2: ("data", _map(_bytes_b64), False),
                        3: ("type", _string, False), 4: ("stringData", _map(_string), False),
                        5: ("immutable", _bool, False)}),
    "ConfigMap": _message({1: ("metadata", _OBJECT_META, False), 2: ("data", _map(_string), False),
                           3: ("binaryData", _map(_bytes_b64), False), 4: ("immutable", _bool, False)}),
    "Event": _message({
        1: ("metadata", _OBJECT_META, False), 2: ("involvedObject", _OBJECT_REFERENCE, False),
        3: ("reason", _string, False), 4: ("message", _string, False),
        5: ("source", _message({1: ("component", _string, False), 2: ("host", _string, False)}), False),
        6: ("firstTimestamp", _time(False), False), 7: ("lastTimestamp", _time(False), False),
        8: ("count", _int, False), 9: ("type", _string, False), 10: ("eventTime", _time(True), False),
        12: ("action", _string, False), 13: ("related", _OBJECT_REFERENCE, False),
        14: ("reportingComponent", _string, False), 15: ("reportingInstance", _string, False)}),
}


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON object it stands for (kind and apiVersion from its
    envelope). ProtobufError: not a Kubernetes protobuf body, or a kind not decoded here."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body lacks the k8s protobuf magic")
    envelope = dict(fields(body[len(MAGIC):]))
    type_meta = dict(fields(bytes(envelope.get(1, b""))))
    api_version, kind = _string(bytes(type_meta.get(1, b""))), _string(bytes(type_meta.get(2, b"")))
    if kind not in KINDS:
        raise ProtobufError(f"protobuf bodies of kind {kind or '(none)'} are not decoded by this test server")
    return {"apiVersion": api_version, "kind": kind, **KINDS[kind](bytes(envelope.get(2, b"")))}
