"""The token Secret contract (DESIGN §3): its annotations, its gzip+base64 `config`, parsing and building.

Pure: parsing and decoding only.
"""

from __future__ import annotations

import base64
import binascii
import sys
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping

from ..bounded_yaml import OverBounds
from .objects import ManifestError, ObjectKey, annotations_of, object_key, secret_value, shared, value_digest

ANNOTATION_IGNITION_CONFIG = "hypershift.openshift.io/ignition-config"
ANNOTATION_NODEPOOL = "hypershift.openshift.io/nodePool"
ANNOTATION_TOKEN_GENERATION = "hypershift.openshift.io/last-token-generation-time"
ANNOTATION_TOKEN_EXPIRATION = "hypershift.openshift.io/ignition-token-expiration-timestamp"
ANNOTATION_IGNITION_REACHED = "hypershift.openshift.io/ignition-reached"

# Preconditions the reference checks before rendering: key in the token Secret -> the
# input in the source it is the hash of (DESIGN §3).
PRECONDITION_KEYS = ("pull-secret-hash", "hc-configuration-hash", "additional-trust-bundle-hash")


def is_token_secret(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") == "Secret" and str(annotations_of(obj).get(ANNOTATION_IGNITION_CONFIG, "")).lower() == "true"


def is_user_data_secret(obj: Mapping[str, Any]) -> bool:
    """A `user-data-<nodepool>-<hash>` Secret as the reconciler writes it (render/userdata.py)."""
    meta = obj.get("metadata") or {}
    data = obj.get("data")
    return (obj.get("kind") == "Secret" and str(meta.get("name", "")).startswith("user-data-")
            and ANNOTATION_NODEPOOL in annotations_of(obj) and isinstance(data, Mapping) and "value" in data)


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


# What a token Secret's `config` may decompress to (MachineConfig YAML; typically well under 1 MiB):
# at most CONFIG_RATIO times its gzip size (YAML compresses 5-10x) or CONFIG_FREE_BYTES, whichever
# is more, and never over MAX_CONFIG_BYTES. The ratio is what bounds a small Secret's cost: 5 KiB
# of gzip once decompressed to 8 MB of YAML that took the owner process to ~950 MiB to compose.
MAX_CONFIG_BYTES = 32 * 1024 * 1024
CONFIG_FREE_BYTES = 1024 * 1024
CONFIG_RATIO = 32


class ConfigTooLarge(ManifestError, OverBounds):
    """`config` decompresses past its bound: the same bytes always will."""


def config_limit(gzip_size: int) -> int:
    return min(MAX_CONFIG_BYTES, max(CONFIG_FREE_BYTES, CONFIG_RATIO * gzip_size))


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
    text = _gunzip_bounded(raw, config_limit(len(raw)))
    try:
        return text.decode()
    except UnicodeDecodeError:
        raise ManifestError("config does not decode to UTF-8 YAML") from None


def _gunzip_bounded(raw: bytes, limit: int) -> bytes:
    """gzip data (one or more members) decompressed, stopping at `limit` bytes: a 1 MiB
    "gzip bomb" of zeros must cost 32 MiB at most, never the 1 GiB it expands to."""
    too_large = (f"config decompresses to more than {limit:,} bytes (its {len(raw):,} bytes of gzip "
                 f"may expand {CONFIG_RATIO}x, and {CONFIG_FREE_BYTES // 1024 ** 2} MiB in any case): refused")
    out = bytearray()
    data = raw
    try:
        while data:
            stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out += stream.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise ConfigTooLarge(too_large)
            if not stream.eof:
                if stream.unconsumed_tail:
                    raise ConfigTooLarge(too_large)
                raise ManifestError("config is not valid gzip data: truncated")
            data = stream.unused_data
    except zlib.error as exc:
        raise ManifestError(f"config is not valid gzip data: {exc}") from None
    return bytes(out)


@dataclass(frozen=True, slots=True)  # 5,280 and more held at once: no __dict__ each
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


def newest_live(secrets: Iterable[TokenSecret], now: float,
                seen_order: Callable[[TokenSecret], int] = lambda secret: 0) -> TokenSecret | None:
    """A NodePool's generation to serve: the newest by creation time that has not expired; among
    equals, the one seen last (`seen_order`). None: every one expired."""
    live = [s for s in secrets if not s.expired(now)]
    return max(live, key=lambda s: (s.creation_time or 0.0, seen_order(s))) if live else None


def parse_token_secret(obj: Mapping[str, Any]) -> TokenSecret:
    key = object_key(obj)
    if key is None:
        raise ManifestError("a Secret without metadata.name")
    meta = obj.get("metadata") or {}
    notes = annotations_of(obj)
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
        # Release, version, status: the same text in most of a fleet's Secrets, one copy for all.
        release=sys.intern(text("release")),
        release_version=sys.intern(text("release-version")),
        config_digest=value_digest(obj, "config"),
        generation_time=parse_time(notes.get(ANNOTATION_TOKEN_GENERATION)),
        expiration=parse_time(notes.get(ANNOTATION_TOKEN_EXPIRATION)),
        creation_time=parse_time(meta.get("creationTimestamp")),
        reason=sys.intern(text("reason")),
        message=sys.intern(text("message")),
        preconditions={k: text(k) for k in PRECONDITION_KEYS if secret_value(obj, k) is not None},
        ignition_reached=str(notes.get(ANNOTATION_IGNITION_REACHED, "")).lower() == "true",
        annotations={sys.intern(str(k)): shared(str(v)) for k, v in notes.items()},
        os_stream=text("os-stream"),
        cloud_config_hash=text("cloud-config-hash"),
    )


def token_secret_config(obj: Mapping[str, Any]) -> str:
    """The MachineConfig YAML of a full (not slim) token Secret object."""
    return decode_config(secret_value(obj, "config") or b"")
