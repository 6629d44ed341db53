"""Ignition spec versions 3.0.0 … 3.6.0: which version a config needs, canonical bytes, negotiation.

Pure: configs in, bytes or errors out. The bundled upstream schemas are loaded once, on first
use, through a cached loader.

What a version can express is keyed on (see `minimum_version`):
  - the keys each version's schema knows, and the schema itself (e.g. `kernelArguments` 3.3.0,
    `storage.luks` 3.2.0, `httpHeaders` 3.1.0, a link without `target` 3.3.0);
  - values the schemas cannot show: `sha256-` hashes 3.1.0, `gs://` sources 3.2.0,
    filesystem format `none` 3.3.0, `arn:` (S3 access point) sources 3.4.0,
    setuid/setgid/sticky mode bits 3.6.0 (older versions drop them).
The schemas are looser than the Ignition client: `validation.validate` adds the client's own
checks, and walks configs with the helpers here.
"""
from __future__ import annotations

import functools
import importlib.resources
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema import Draft4Validator

from .checked import CheckedItems
from .inputs import InvalidConfig

SUPPORTED_VERSIONS: tuple[str, ...] = ("3.0.0", "3.1.0", "3.2.0", "3.3.0", "3.4.0", "3.5.0", "3.6.0")
# Served when the client names no version (curl, `*/*`): what current RHCOS boot images read.
DEFAULT_VERSION = "3.2.0"
IGNITION_MEDIA_TYPE = "application/vnd.coreos.ignition+json"

_PREFIX = b'{"ignition":{"version":"'


class UnsatisfiableVersion(Exception):
    """No spec version fits both the payload and the client; the message says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _key(version: str) -> tuple[int, int, int]:
    major, minor, patch = version.split(".")
    return int(major), int(minor), int(patch)


def at_least(version: str, floor: str) -> bool:
    return _key(version) >= _key(floor)


# ---------------------------------------------------------------------------------------------
# schemas


@functools.cache
def _schema(version: str) -> dict:
    name = "ignition-v{}_{}.json".format(*version.split(".")[:2])
    text = importlib.resources.files("ignition_server.render").joinpath("schemas", name).read_text()
    return json.loads(text)


@functools.cache
def _validator(version: str) -> Draft4Validator:
    # Imported when first validating: serving workers negotiate and rewrite versions with this
    # module but never validate, and jsonschema is ~3 MiB of RSS in each of them.
    from jsonschema import Draft4Validator

    return Draft4Validator(_schema(version))


def field_path(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _resolve(node: dict, root: dict) -> dict:
    while "$ref" in node:
        target: Any = root
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def _properties(node: dict, root: dict) -> dict[str, dict]:
    node = _resolve(node, root)
    props = dict(node.get("properties", {}))
    for sub in node.get("allOf", ()):
        props.update(_properties(sub, root))
    return props


def _items(node: dict, root: dict) -> dict | None:
    node = _resolve(node, root)
    if "items" in node:
        return node["items"]
    for sub in node.get("allOf", ()):
        found = _items(sub, root)
        if found is not None:
            return found
    return None


def _unknown_keys(value: Any, node: dict, root: dict, path: tuple) -> Iterator[tuple]:
    """Paths of keys the schema does not name (the client warns "Unused key" and drops them)."""
    if isinstance(value, dict):
        props = _properties(node, root)
        # YAML allows keys of any type (`1: x`): ordered by their text, so a mixed mapping is
        # reported as an unknown key instead of failing the sort.
        for k in sorted(value, key=lambda key: (not isinstance(key, str), str(key))):
            if k not in props:
                yield path + (k,)
            else:
                yield from _unknown_keys(value[k], props[k], root, path + (k,))
    elif isinstance(value, list):
        items = _items(node, root)
        if items is not None:
            for i, v in enumerate(value):
                yield from _unknown_keys(v, items, root, path + (i,))


# ---------------------------------------------------------------------------------------------
# walking the config (validation uses these too)


def dig(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def list_at(d: Any, *keys: str) -> list:
    v = dig(d, *keys)
    return v if isinstance(v, list) else []


def resources(config: dict) -> Iterator[tuple[tuple, dict]]:
    """Every resource (something with a `source`) and its path."""
    ign = config.get("ignition")
    for i, r in enumerate(list_at(ign, "config", "merge")):
        yield ("ignition", "config", "merge", i), r
    replace = dig(ign, "config", "replace")
    if isinstance(replace, dict):
        yield ("ignition", "config", "replace"), replace
    for i, r in enumerate(list_at(ign, "security", "tls", "certificateAuthorities")):
        yield ("ignition", "security", "tls", "certificateAuthorities", i), r
    for i, f in enumerate(list_at(config, "storage", "files")):
        if isinstance(f, dict):
            if isinstance(f.get("contents"), dict):
                yield ("storage", "files", i, "contents"), f["contents"]
            for j, r in enumerate(f.get("append") or []):
                yield ("storage", "files", i, "append", j), r
    for i, lk in enumerate(list_at(config, "storage", "luks")):
        if isinstance(lk, dict) and isinstance(lk.get("keyFile"), dict):
            yield ("storage", "luks", i, "keyFile"), lk["keyFile"]


def storage_nodes(config: dict) -> Iterator[tuple[str, int, dict]]:
    for kind in ("files", "directories", "links"):
        for i, n in enumerate(list_at(config, "storage", kind)):
            if isinstance(n, dict):
                yield kind, i, n


def url_scheme(source: str) -> str:
    return source.split(":", 1)[0].lower() if ":" in source else ""


# ---------------------------------------------------------------------------------------------
# what each version can express


def version_problems(config: dict, version: str, checked: CheckedItems | None = None) -> Iterator[tuple[tuple, str, str]]:
    """(path, why, feature) for what `version` cannot express. `ignition.version` is ignored.

    With `checked`, the items it knows clean at `version` are not looked at again (each item's
    problems are its own: render/checked.py), and those found clean join it; the problems
    are the same, in the same order."""
    if checked is None:
        return ((path, why, feature or field_path(path)) for path, why, feature in _version_problems(config, version))
    reduced = checked.reduce(config, "spec", version)
    found = list(_version_problems(reduced.config, version))
    checked.learn_clean(reduced, (path for path, _, _ in found))
    placed = [(reduced.place(path), why, feature) for path, why, feature in found]
    return iter([(path, why, feature or field_path(path)) for path, why, feature in placed])


def _version_problems(config: dict, version: str) -> Iterator[tuple[tuple, str, str | None]]:
    """(path, why, feature or None for the field's path)."""
    probe = dict(config)
    ign = config.get("ignition", {})
    probe["ignition"] = {**ign, "version": version} if isinstance(ign, dict) else ign
    root = _schema(version)
    for path in _unknown_keys(probe, root, root, ()):
        yield path, f"unknown key in spec {version}", None
    errors = sorted(_validator(version).iter_errors(probe), key=lambda e: list(e.absolute_path))
    for e in errors:
        yield tuple(e.absolute_path), f"{e.message} (spec {version} schema)", None
    for path, res in resources(probe):
        if not isinstance(res, dict):
            continue
        h = dig(res, "verification", "hash")
        if isinstance(h, str) and h.startswith("sha256-") and not at_least(version, "3.1.0"):
            p = path + ("verification", "hash")
            yield p, f"sha256 hashes need spec 3.1.0 (checking {version})", "sha256 hash"
        src = res.get("source")
        if isinstance(src, str):
            s = url_scheme(src)
            if s == "gs" and not at_least(version, "3.2.0"):
                yield path + ("source",), f"gs:// sources need spec 3.2.0 (checking {version})", "gs:// source"
            if s == "arn" and not at_least(version, "3.4.0"):
                yield path + ("source",), f"arn: sources need spec 3.4.0 (checking {version})", "arn: source"
    for i, fs in enumerate(list_at(probe, "storage", "filesystems")):
        if isinstance(fs, dict) and fs.get("format") == "none" and not at_least(version, "3.3.0"):
            p = ("storage", "filesystems", i, "format")
            yield p, f'format "none" needs spec 3.3.0 (checking {version})', 'filesystem format "none"'
    if not at_least(version, "3.6.0"):
        for kind, i, n in storage_nodes(probe):
            mode = n.get("mode")
            if isinstance(mode, int) and not isinstance(mode, bool) and 0o777 < mode <= 0o7777:
                p = ("storage", kind, i, "mode")
                yield (p, f"setuid/setgid/sticky bits need spec 3.6.0 (older clients drop them; "
                       f"checking {version})", "setuid/setgid/sticky mode bits")


def minimum_version_reason(config: dict, checked: CheckedItems | None = None) -> tuple[str, str]:
    """(lowest version that can express `config`, the feature that needs it, "" for 3.0.0).
    `checked`: as for `version_problems`."""
    reason = ""
    for version in SUPPORTED_VERSIONS:
        problem = next(version_problems(config, version, checked), None)
        if problem is None:
            return version, reason
        reason = problem[2]
    path, why, _ = next(version_problems(config, SUPPORTED_VERSIONS[-1], checked))
    raise InvalidConfig(f"{field_path(path)}: {why}")


def minimum_version(config: dict, checked: CheckedItems | None = None) -> str:
    """The lowest supported spec version that can express `config` (its `ignition.version`
    is ignored). Raises InvalidConfig when no supported version can."""
    return minimum_version_reason(config, checked)[0]


# ---------------------------------------------------------------------------------------------
# bytes


def encode(config: dict, version: str | None = None) -> bytes:
    """Canonical JSON: compact, keys sorted, except `ignition` first and `version` first in it.

    The body starts with exactly `{"ignition":{"version":"3.N.0"`, N from `minimum_version`
    unless `version` is given. Same config, same bytes.
    """
    if version is None:
        version = minimum_version(config)
    if version not in SUPPORTED_VERSIONS:
        raise InvalidConfig(f"unsupported spec version {version!r}")

    def dump(value: Any) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    ign = {k: v for k, v in (config.get("ignition") or {}).items() if k != "version"}
    rest = {k: v for k, v in config.items() if k != "ignition"}
    out = '{"ignition":{"version":' + dump(version)
    if ign:
        out += "," + dump(ign)[1:-1]
    out += "}"
    if rest:
        out += "," + dump(rest)[1:-1]
    return (out + "}").encode("ascii")


def body_version(body: bytes) -> str:
    """The version of a body made by `encode` (read from its first bytes)."""
    if not body.startswith(_PREFIX):
        raise ValueError("not a canonical Ignition body")
    end = body.find(b'"', len(_PREFIX))
    if end < 0:
        raise ValueError("not a canonical Ignition body")
    return body[len(_PREFIX):end].decode("ascii")


def with_version(body: bytes, version: str) -> bytes:
    """`body` (from `encode`) with only its version rewritten: a byte splice, no JSON parse.

    Valid for any supported version ≥ the body's own (Ignition 3.x minors only add fields);
    anything else raises ValueError.
    """
    head, rest = version_splice(body, version)
    return head + memoryview(body)[rest:] if head else body


def version_splice(body: bytes, version: str) -> tuple[bytes, int]:
    """`body` at `version` as `head` followed by `body[rest:]`, without copying the body.

    (b"", 0) when the body already is at `version`. A server sends the head and a view of the
    rest: a spliced copy per response in flight was ~400 KiB more of each worker's memory.
    Raises ValueError as `with_version` does.
    """
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"unsupported spec version {version!r}")
    current = body_version(body)
    if current == version:
        return b"", 0
    if _key(version) < _key(current):
        raise ValueError(f"the payload needs spec {current}; cannot serve it as {version}")
    return _PREFIX + version.encode("ascii"), len(_PREFIX) + len(current)


# ---------------------------------------------------------------------------------------------
# negotiation


def _parse_version(text: str) -> tuple[int, int, int] | None:
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text.strip().strip('"'))
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def client_maximum(accept: str | None) -> tuple[int, int, int] | None:
    """The highest `version=` of an acceptable (q > 0) Ignition media type in Accept, if any."""
    best: tuple[int, int, int] | None = None
    for media_range in (accept or "").split(","):
        parts = [p.strip() for p in media_range.split(";")]
        if parts[0].lower() != IGNITION_MEDIA_TYPE:
            continue
        params = {}
        for p in parts[1:]:
            k, sep, v = p.partition("=")
            if sep:
                params[k.strip().lower()] = v.strip()
        try:
            if float(params.get("q", "1")) <= 0:
                continue
        except ValueError:
            continue
        offered = _parse_version(params.get("version", ""))
        if offered is not None and (best is None or offered > best):
            best = offered
    return best


def negotiate(accept: str | None, min_version: str, reason: str = "") -> str:
    """The spec version to serve a payload needing `min_version` to a client sending `accept`.

    A versioned Ignition media type names the client's maximum (`*/*` does not raise it):
    serve the highest supported version ≤ that maximum (and ≥ min_version). Without one
    (curl, `*/*`, no header): max(DEFAULT_VERSION, min_version). `reason` names what needs
    min_version, for the error. Raises UnsatisfiableVersion when nothing fits.
    """
    if min_version not in SUPPORTED_VERSIONS:
        raise ValueError(f"unsupported spec version {min_version!r}")
    maximum = client_maximum(accept)
    if maximum is None:
        return max(DEFAULT_VERSION, min_version, key=_key)
    fitting = [v for v in SUPPORTED_VERSIONS if _key(min_version) <= _key(v) <= maximum]
    if not fitting:
        why = f" ({reason})" if reason else ""
        raise UnsatisfiableVersion(
            f"payload needs spec {min_version}{why} but the client accepts at most "
            f"{'.'.join(map(str, maximum))}"
        )
    return fitting[-1]


def unsatisfiable_reason(accept: str | None, body: bytes) -> str:
    """Why a canonical payload `body` cannot be served to a client sending `accept`, naming
    the feature that needs the newer spec: the one message for the server's 406 and for
    `render --spec-version`. Parses the payload, so only for the rare refusal."""
    min_version, feature = minimum_version_reason(json.loads(body))
    try:
        negotiate(accept, min_version, feature)
    except UnsatisfiableVersion as exc:
        return str(exc)
    raise ValueError("the payload can be served to this client")


def accept_for(version: str) -> str:
    """The Accept header of a client whose maximum is `version`."""
    return f"{IGNITION_MEDIA_TYPE};version={version}"
