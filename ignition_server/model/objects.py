"""Kubernetes objects as the sources hand them over: identity, values, slim copies.

Pure: parsing and decoding only. A file source and a Kubernetes source both produce `dict`
objects as `oc get -o yaml` prints them; this module reads and writes their values.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import sys
from dataclasses import dataclass
from typing import Any, Mapping


class ManifestError(ValueError):
    """An object that cannot be read as what it claims to be; the message says why."""


# Values above this size are not kept in memory by a source (nor in its listing snapshot):
# 5,280 token Secrets with 30-300 KiB configs would otherwise hold hundreds of MiB to GiB.
# They are read again from the source when a render needs them. Tokens, release names,
# annotations and pointer configs are far smaller.
LARGE_VALUE_BYTES = 4 * 1024


@dataclass(frozen=True, slots=True)  # two in every user-data Secret kept, 5,280 of those: no __dict__ each
class LargeValue:
    """Stands in for a large string value of a slim object: equal iff the contents are."""

    sha256: str
    size: int

    def __str__(self) -> str:
        return f"sha256:{self.sha256}"


# Strings up to this length are shared between the objects a source keeps (sys.intern): keys,
# kinds, API versions, namespaces, "true". Each parsed document (each listing record) otherwise
# holds its own copy of every one: ~40 % of a kept user-data Secret's bytes. Longer values are
# mostly unique (tokens, names, digests) and are left alone.
SHARED_STRING_CHARS = 24


def shared(value: str) -> str:
    """`value`, or the one copy of it every kept object shares when it is short."""
    return sys.intern(value) if len(value) <= SHARED_STRING_CHARS else value


def slim(value: Any) -> Any:
    """A copy of an object with every string over LARGE_VALUE_BYTES replaced by a LargeValue
    (and short strings and keys `shared`)."""
    if isinstance(value, str):
        if len(value) > LARGE_VALUE_BYTES:
            return LargeValue(hashlib.sha256(value.encode()).hexdigest(), len(value))
        return shared(value)
    if isinstance(value, dict):
        return {sys.intern(k) if isinstance(k, str) else k: slim(v) for k, v in value.items()}
    if isinstance(value, list):
        return [slim(v) for v in value]
    return value


def has_large_values(value: Any) -> bool:
    if isinstance(value, LargeValue):
        return True
    if isinstance(value, dict):
        return any(has_large_values(v) for v in value.values())
    if isinstance(value, list):
        return any(has_large_values(v) for v in value)
    return False


@dataclass(frozen=True, order=True, slots=True)  # ~150,000 of them at 5,280 NodePools: no __dict__ each
class ObjectKey:
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def secret_key(ref: str) -> ObjectKey:
    """The token Secret a cache record's "namespace/name" (`ObjectKey.ref`) names."""
    namespace, _, name = ref.partition("/")
    return ObjectKey("Secret", namespace, name)


def object_key(obj: Mapping[str, Any]) -> ObjectKey | None:
    """The identity of a manifest document, or None for documents that are not objects."""
    if not isinstance(obj, Mapping):
        return None
    kind = obj.get("kind")
    meta = obj.get("metadata")
    if not isinstance(kind, str) or not isinstance(meta, Mapping):
        return None
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    namespace = meta.get("namespace") or "default"
    return ObjectKey(shared(kind), shared(str(namespace)), name)


def secret_value(obj: Mapping[str, Any], key: str) -> bytes | None:
    """One Secret value decoded (`stringData` wins over `data`, as the API server merges them)."""
    string_data = obj.get("stringData") or {}
    if key in string_data:
        value = string_data[key]
        return b"" if value is None else str(value).encode()
    data = obj.get("data") or {}
    if key not in data:
        return None
    value = data[key]
    if value is None:
        return b""
    if isinstance(value, LargeValue):
        raise ManifestError(f"data.{key} is held as a digest only; read the full object")
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ManifestError(f"data.{key} is not valid base64: {exc}") from None


def data_text(obj: Mapping[str, Any]) -> dict[str, str]:
    """A ConfigMap's or Secret's data as text (Secret values decoded, `stringData` merged in).

    A LargeValue of a slim object stands in as "sha256:<digest>": enough to tell a change;
    read the full object for the text itself.
    """
    data = obj.get("data") or {}
    if obj.get("kind") != "Secret":
        return {k: "" if v is None else str(v) for k, v in data.items()}
    keys = list(data) + [k for k in (obj.get("stringData") or {}) if k not in data]
    return {
        k: str(data[k]) if isinstance(data.get(k), LargeValue) else (secret_value(obj, k) or b"").decode(errors="replace")
        for k in keys
    }


def value_digest(obj: Mapping[str, Any], key: str) -> str:
    """A digest of one Secret value as the object holds it, full or slim alike."""
    for section in ("stringData", "data"):
        values = obj.get(section) or {}
        if key in values:
            value = values[key]
            if isinstance(value, LargeValue):
                return value.sha256
            return hashlib.sha256(("" if value is None else str(value)).encode()).hexdigest()
    return ""


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """An object's annotations (empty if it has none)."""
    return (obj.get("metadata") or {}).get("annotations") or {}



def digested(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with every Secret value (data, stringData) as a LargeValue, whatever its size."""
    out = dict(obj)
    for section in ("data", "stringData"):
        values = obj.get(section)
        if isinstance(values, Mapping):
            out[section] = {k: v if isinstance(v, LargeValue) or not isinstance(v, str)
                            else LargeValue(hashlib.sha256(v.encode()).hexdigest(), len(v)) for k, v in values.items()}
    return out


def set_secret_value(obj: dict[str, Any], key: str, value: bytes) -> None:
    """Write one Secret value the way the manifest already holds it (`stringData` or `data`)."""
    string_data = obj.get("stringData")
    if isinstance(string_data, dict) and key in string_data:
        string_data[key] = value.decode()
        return
    data = obj.setdefault("data", {})
    if data is None:
        data = obj["data"] = {}
    data[key] = base64.b64encode(value).decode()


def config_map(namespace: str | None, name: str | None, data: Mapping[str, str],
               notes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A ConfigMap object as the API server takes it (no `annotations` key without `notes`)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if notes is not None:
        metadata["annotations"] = dict(notes)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": dict(data)}


def set_annotation(obj: dict[str, Any], key: str, value: str) -> None:
    meta = obj.setdefault("metadata", {})
    notes = meta.get("annotations")
    if notes is None:
        notes = meta["annotations"] = {}
    notes[key] = value
