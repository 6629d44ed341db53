"""Kubernetes objects as the sources hand them over, and the token Secret contract (DESIGN §3).

Pure: parsing and decoding only. A file source and a Kubernetes source both produce
`dict` objects as `oc get -o yaml` prints them; this module turns the ones that matter
into typed values.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import zlib
import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

ANNOTATION_IGNITION_CONFIG = "hypershift.openshift.io/ignition-config"
ANNOTATION_NODEPOOL = "hypershift.openshift.io/nodePool"
ANNOTATION_TOKEN_GENERATION = "hypershift.openshift.io/last-token-generation-time"
ANNOTATION_TOKEN_EXPIRATION = "hypershift.openshift.io/ignition-token-expiration-timestamp"
ANNOTATION_IGNITION_REACHED = "hypershift.openshift.io/ignition-reached"

# Preconditions the reference checks before rendering: key in the token Secret -> the
# input in the source it is the hash of (DESIGN §3).
PRECONDITION_KEYS = ("pull-secret-hash", "hc-configuration-hash", "additional-trust-bundle-hash")


class ManifestError(ValueError):
    """An object that cannot be read as what it claims to be; the message says why."""


# Values above this size are not kept in memory by a source (nor in its listing snapshot):
# 5,280 token Secrets with 30-300 KiB configs would otherwise hold hundreds of MiB to GiB.
# They are read again from the source when a render needs them. Tokens, release names,
# annotations and pointer configs are far smaller.
LARGE_VALUE_BYTES = 4 * 1024


@dataclass(frozen=True)
class LargeValue:
    """Stands in for a large string value of a slim object: equal iff the contents are."""

    sha256: str
    size: int

    def __str__(self) -> str:
        return f"sha256:{self.sha256}"


def slim(value: Any) -> Any:
    """A copy of an object with every string over LARGE_VALUE_BYTES replaced by a LargeValue."""
    if isinstance(value, str):
        if len(value) > LARGE_VALUE_BYTES:
            return LargeValue(hashlib.sha256(value.encode()).hexdigest(), len(value))
        return value
    if isinstance(value, dict):
        return {k: slim(v) for k, v in value.items()}
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
    return ObjectKey(kind, str(namespace), name)


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


def secret_values(obj: Mapping[str, Any]) -> dict[str, bytes]:
    """A Secret's values decoded: `data` is base64, `stringData` is text and wins (as the API server merges it)."""
    keys = list((obj.get("data") or {})) + [k for k in (obj.get("stringData") or {}) if k not in (obj.get("data") or {})]
    return {key: secret_value(obj, key) or b"" for key in keys}


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


def annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def is_token_secret(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") == "Secret" and str(annotations(obj).get(ANNOTATION_IGNITION_CONFIG, "")).lower() == "true"


def is_user_data_secret(obj: Mapping[str, Any]) -> bool:
    """A `user-data-<nodepool>-<hash>` Secret as the watcher writes it (render/userdata.py)."""
    meta = obj.get("metadata") or {}
    data = obj.get("data")
    return (obj.get("kind") == "Secret" and str(meta.get("name", "")).startswith("user-data-")
            and ANNOTATION_NODEPOOL in annotations(obj) and isinstance(data, Mapping) and "value" in data)


def digested(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with every Secret value (data, stringData) as a LargeValue, whatever its size."""
    out = dict(obj)
    for section in ("data", "stringData"):
        values = obj.get(section)
        if isinstance(values, Mapping):
            out[section] = {k: v if isinstance(v, LargeValue) or not isinstance(v, str)
                            else LargeValue(hashlib.sha256(v.encode()).hexdigest(), len(v)) for k, v in values.items()}
    return out


def parse_time(value: str | None) -> float | None:
    """RFC 3339 (with nanoseconds, as Go writes them) to unix seconds."""
    if not value:
        return None
    text = str(value).strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    # Python parses at most microseconds: cut nanoseconds to 6 digits.
    if "." in text:
        head, _, rest = text.partition(".")
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits):]
        text = f"{head}.{digits[:6].ljust(6, '0')}{zone}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ManifestError(f"not an RFC 3339 time: {value!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def format_time(unix: float) -> str:
    """Unix seconds to RFC 3339 with nanoseconds in UTC, the reference's annotation format."""
    whole = int(unix)
    nanos = int(round((unix - whole) * 1e9))
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    stamp = datetime.fromtimestamp(whole, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{nanos:09d}Z"


# What a token Secret's `config` may decompress to (MachineConfig YAML; typically well under 1 MiB).
MAX_CONFIG_BYTES = 32 * 1024 * 1024


def decode_config(value: bytes) -> str:
    """The Secret value of `config` (base64 text of gzip bytes) to MachineConfig YAML text."""
    if not value.strip():
        return ""
    raw = value
    if not raw.startswith(b"\x1f\x8b"):
        try:
            raw = base64.b64decode(b"".join(value.split()), validate=True)
        except (binascii.Error, ValueError):
            raise ManifestError("config is neither base64 of gzip data nor gzip data") from None
    text = _gunzip_bounded(raw, MAX_CONFIG_BYTES)
    try:
        return text.decode()
    except UnicodeDecodeError:
        raise ManifestError("config does not decode to UTF-8 YAML") from None


def _gunzip_bounded(raw: bytes, limit: int) -> bytes:
    """gzip data (one or more members) decompressed, stopping at `limit` bytes: a 1 MiB
    "gzip bomb" of zeros must cost 32 MiB at most, never the 1 GiB it expands to."""
    out = bytearray()
    data = raw
    try:
        while data:
            stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out += stream.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise ManifestError(f"config decompresses to more than {limit // (1024 * 1024)} MiB: refused")
            if not stream.eof:
                if stream.unconsumed_tail:
                    raise ManifestError(f"config decompresses to more than {limit // (1024 * 1024)} MiB: refused")
                raise ManifestError("config is not valid gzip data: truncated")
            data = stream.unused_data
    except zlib.error as exc:
        raise ManifestError(f"config is not valid gzip data: {exc}") from None
    return bytes(out)


def encode_config(yaml_text: str) -> bytes:
    """Inverse of decode_config: the Secret value the reference writes (mtime 0 keeps it deterministic)."""
    return base64.b64encode(gzip.compress(yaml_text.encode(), mtime=0))


@dataclass(frozen=True)
class TokenSecret:
    """One NodePool generation: the token Secret of DESIGN §3, decoded."""

    key: ObjectKey
    nodepool: str  # "<namespace>/<name>" of the NodePool object
    token: str | None
    old_token: str | None
    release: str
    release_version: str
    config_digest: str  # of the `config` value: its text is read again only to render
    generation_time: float | None
    expiration: float | None
    creation_time: float | None
    reason: str
    message: str
    preconditions: Mapping[str, str]
    ignition_reached: bool
    annotations: Mapping[str, str]
    os_stream: str = ""  # `os-stream`: the NodePool's OS image stream (generated bases render with it)
    cloud_config_hash: str = ""  # `cloud-config-hash`: Azure/OpenStack cloud config the payload was asked for

    @property
    def ref(self) -> str:
        return self.key.ref

    def tokens(self) -> tuple[str, ...]:
        return tuple(t for t in (self.token, self.old_token) if t)

    def expired(self, now: float) -> bool:
        return self.expiration is not None and now >= self.expiration


def parse_token_secret(obj: Mapping[str, Any]) -> TokenSecret:
    key = object_key(obj)
    if key is None:
        raise ManifestError("a Secret without metadata.name")
    meta = obj.get("metadata") or {}
    notes = annotations(obj)
    def text(name: str) -> str:
        try:
            return (secret_value(obj, name) or b"").decode().strip()
        except UnicodeDecodeError:
            raise ManifestError(f"{name} is not UTF-8 text") from None

    nodepool = str(notes.get(ANNOTATION_NODEPOOL) or "").strip()
    if not nodepool:
        # A Secret made by hand may lack the annotation; its name still says the pool.
        name = key.name.removeprefix("token-")
        nodepool = f"{key.namespace}/{name.rsplit('-', 1)[0] if '-' in name else name}"
    if nodepool.count("/") != 1:
        raise ManifestError(f"annotation {ANNOTATION_NODEPOOL} must be <namespace>/<name>, got {nodepool!r}")
    return TokenSecret(
        key=key,
        nodepool=nodepool,
        token=text("token") or None,
        old_token=text("old_token") or None,
        release=text("release"),
        release_version=text("release-version"),
        config_digest=value_digest(obj, "config"),
        generation_time=parse_time(notes.get(ANNOTATION_TOKEN_GENERATION)),
        expiration=parse_time(notes.get(ANNOTATION_TOKEN_EXPIRATION)),
        creation_time=parse_time(meta.get("creationTimestamp")),
        reason=text("reason"),
        message=text("message"),
        preconditions={k: text(k) for k in PRECONDITION_KEYS if secret_value(obj, k) is not None},
        ignition_reached=str(notes.get(ANNOTATION_IGNITION_REACHED, "")).lower() == "true",
        annotations={str(k): str(v) for k, v in notes.items()},
        os_stream=text("os-stream"),
        cloud_config_hash=text("cloud-config-hash"),
    )


def token_secret_config(obj: Mapping[str, Any]) -> str:
    """The MachineConfig YAML of a full (not slim) token Secret object."""
    return decode_config(secret_value(obj, "config") or b"")


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


def set_annotation(obj: dict[str, Any], key: str, value: str) -> None:
    meta = obj.setdefault("metadata", {})
    notes = meta.get("annotations")
    if notes is None:
        notes = meta["annotations"] = {}
    notes[key] = value


def build_token_secret(
    *,
    namespace: str,
    nodepool: str,
    token: str,
    machineconfigs_yaml: str = "",
    old_token: str | None = None,
    release: str = "quay.io/openshift-release-dev/ocp-release@sha256:" + "0" * 64,
    release_version: str = "4.17.3",
    generation_time: float | None = None,
    suffix: str = "00000000",
) -> dict[str, Any]:
    """A token Secret as the reference writes it (for examples, tests and fleet generation)."""
    pool_name = nodepool.partition("/")[2]
    data = {
        "token": base64.b64encode(token.encode()).decode(),
        "release": base64.b64encode(release.encode()).decode(),
        "release-version": base64.b64encode(release_version.encode()).decode(),
        "config": base64.b64encode(encode_config(machineconfigs_yaml) if machineconfigs_yaml else b"").decode(),
    }
    if old_token:
        data["old_token"] = base64.b64encode(old_token.encode()).decode()
    notes = {ANNOTATION_IGNITION_CONFIG: "true", ANNOTATION_NODEPOOL: nodepool}
    if generation_time is not None:
        notes[ANNOTATION_TOKEN_GENERATION] = format_time(generation_time)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"token-{pool_name}-{suffix}", "namespace": namespace, "annotations": notes},
        "type": "Opaque",
        "data": data,
    }
