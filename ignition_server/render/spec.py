"""Ignition spec versions 3.0.0 … 3.6.0: which version a config needs, canonical bytes, checks.

Pure: configs in, bytes or errors out. The bundled upstream schemas are loaded once, on first
use, through a cached loader.

The upstream draft-04 schemas are looser than the Ignition client, so `validate` adds the
client's own checks (unknown keys, URL schemes, hashes, duplicates, paths, unit names, modes).
What a version can express is keyed on (see `minimum_version`):
  - the keys each version's schema knows, and the schema itself (e.g. `kernelArguments` 3.3.0,
    `storage.luks` 3.2.0, `httpHeaders` 3.1.0, a link without `target` 3.3.0);
  - values the schemas cannot show: `sha256-` hashes 3.1.0, `gs://` sources 3.2.0,
    filesystem format `none` 3.3.0, `arn:` (S3 access point) sources 3.4.0,
    setuid/setgid/sticky mode bits 3.6.0 (older versions drop them).
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib.resources
import json
import posixpath
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes, urlsplit

if TYPE_CHECKING:
    from jsonschema import Draft4Validator

from .inputs import InvalidConfig

SUPPORTED_VERSIONS: tuple[str, ...] = ("3.0.0", "3.1.0", "3.2.0", "3.3.0", "3.4.0", "3.5.0", "3.6.0")
# Served when the client names no version (curl, `*/*`): what current RHCOS boot images read.
DEFAULT_VERSION = "3.2.0"
IGNITION_MEDIA_TYPE = "application/vnd.coreos.ignition+json"

_PREFIX = b'{"ignition":{"version":"'

_UNIT_SUFFIXES = frozenset(
    {".service", ".socket", ".device", ".mount", ".automount", ".swap", ".target", ".path",
     ".timer", ".snapshot", ".slice", ".scope"}
)
_HASH_HEX_LEN = {"sha512": 128, "sha256": 64}


class UnsatisfiableVersion(Exception):
    """No spec version fits both the payload and the client; the message says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _key(version: str) -> tuple[int, int, int]:
    major, minor, patch = version.split(".")
    return int(major), int(minor), int(patch)


def _at_least(version: str, floor: str) -> bool:
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


def _fmt(path: tuple) -> str:
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
        for k in sorted(value):
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
# walking the config


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _list(d: Any, *keys: str) -> list:
    v = _get(d, *keys)
    return v if isinstance(v, list) else []


def _resources(config: dict) -> Iterator[tuple[tuple, dict]]:
    """Every resource (something with a `source`) and its path."""
    ign = config.get("ignition")
    for i, r in enumerate(_list(ign, "config", "merge")):
        yield ("ignition", "config", "merge", i), r
    replace = _get(ign, "config", "replace")
    if isinstance(replace, dict):
        yield ("ignition", "config", "replace"), replace
    for i, r in enumerate(_list(ign, "security", "tls", "certificateAuthorities")):
        yield ("ignition", "security", "tls", "certificateAuthorities", i), r
    for i, f in enumerate(_list(config, "storage", "files")):
        if isinstance(f, dict):
            if isinstance(f.get("contents"), dict):
                yield ("storage", "files", i, "contents"), f["contents"]
            for j, r in enumerate(f.get("append") or []):
                yield ("storage", "files", i, "append", j), r
    for i, lk in enumerate(_list(config, "storage", "luks")):
        if isinstance(lk, dict) and isinstance(lk.get("keyFile"), dict):
            yield ("storage", "luks", i, "keyFile"), lk["keyFile"]


def _nodes(config: dict) -> Iterator[tuple[str, int, dict]]:
    for kind in ("files", "directories", "links"):
        for i, n in enumerate(_list(config, "storage", kind)):
            if isinstance(n, dict):
                yield kind, i, n


def _scheme(source: str) -> str:
    return source.split(":", 1)[0].lower() if ":" in source else ""


# ---------------------------------------------------------------------------------------------
# what each version can express


def _version_problems(config: dict, version: str) -> Iterator[tuple[tuple, str, str]]:
    """(path, why, feature) for what `version` cannot express. `ignition.version` is ignored."""
    probe = dict(config)
    ign = config.get("ignition", {})
    probe["ignition"] = {**ign, "version": version} if isinstance(ign, dict) else ign
    root = _schema(version)
    for path in _unknown_keys(probe, root, root, ()):
        yield path, f"unknown key in spec {version}", _fmt(path)
    errors = sorted(_validator(version).iter_errors(probe), key=lambda e: list(e.absolute_path))
    for e in errors:
        p = tuple(e.absolute_path)
        yield p, f"{e.message} (spec {version} schema)", _fmt(p)
    for path, res in _resources(probe):
        if not isinstance(res, dict):
            continue
        h = _get(res, "verification", "hash")
        if isinstance(h, str) and h.startswith("sha256-") and not _at_least(version, "3.1.0"):
            p = path + ("verification", "hash")
            yield p, f"sha256 hashes need spec 3.1.0 (checking {version})", "sha256 hash"
        src = res.get("source")
        if isinstance(src, str):
            s = _scheme(src)
            if s == "gs" and not _at_least(version, "3.2.0"):
                yield path + ("source",), f"gs:// sources need spec 3.2.0 (checking {version})", "gs:// source"
            if s == "arn" and not _at_least(version, "3.4.0"):
                yield path + ("source",), f"arn: sources need spec 3.4.0 (checking {version})", "arn: source"
    for i, fs in enumerate(_list(probe, "storage", "filesystems")):
        if isinstance(fs, dict) and fs.get("format") == "none" and not _at_least(version, "3.3.0"):
            p = ("storage", "filesystems", i, "format")
            yield p, f'format "none" needs spec 3.3.0 (checking {version})', 'filesystem format "none"'
    if not _at_least(version, "3.6.0"):
        for kind, i, n in _nodes(probe):
            mode = n.get("mode")
            if isinstance(mode, int) and not isinstance(mode, bool) and 0o777 < mode <= 0o7777:
                p = ("storage", kind, i, "mode")
                yield (p, f"setuid/setgid/sticky bits need spec 3.6.0 (older clients drop them; "
                       f"checking {version})", "setuid/setgid/sticky mode bits")


def minimum_version_reason(config: dict) -> tuple[str, str]:
    """(lowest version that can express `config`, the feature that needs it, "" for 3.0.0)."""
    reason = ""
    for version in SUPPORTED_VERSIONS:
        problem = next(_version_problems(config, version), None)
        if problem is None:
            return version, reason
        reason = problem[2]
    path, why, _ = next(_version_problems(config, SUPPORTED_VERSIONS[-1]))
    raise InvalidConfig(f"{_fmt(path)}: {why}")


def minimum_version(config: dict) -> str:
    """The lowest supported spec version that can express `config` (its `ignition.version`
    is ignored). Raises InvalidConfig when no supported version can."""
    return minimum_version_reason(config)[0]


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
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"unsupported spec version {version!r}")
    current = body_version(body)
    if current == version:
        return body
    if _key(version) < _key(current):
        raise ValueError(f"the payload needs spec {current}; cannot serve it as {version}")
    start = len(_PREFIX)
    return b"".join((_PREFIX, version.encode("ascii"), body[start + len(current):]))


# ---------------------------------------------------------------------------------------------
# negotiation


def _parse_version(text: str) -> tuple[int, int, int] | None:
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text.strip().strip('"'))
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def client_maximum(accept: str | None) -> tuple[int, int, int] | None:
    """The highest `version=` of an acceptable (q > 0) Ignition media type in Accept, if any."""
    best = None
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
        v = _parse_version(params.get("version", ""))
        if v is not None and (best is None or v > best):
            best = v
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


# ---------------------------------------------------------------------------------------------
# validation


def validate(config: dict, version: str) -> None:
    """Check `config` as the Ignition client would at `version`; InvalidConfig names the field."""
    if version not in SUPPORTED_VERSIONS:
        raise InvalidConfig(f"unsupported spec version {version!r}")
    if not isinstance(config, dict):
        raise InvalidConfig("the config is not a JSON object")
    claimed = _get(config, "ignition", "version")
    if claimed != version:
        raise InvalidConfig(f"ignition.version: is {claimed!r}, expected exactly {version!r}")
    for path, why, _ in _version_problems(config, version):
        raise InvalidConfig(f"{_fmt(path)}: {why}")
    for path, why in _own_problems(config, version):
        raise InvalidConfig(f"{_fmt(path)}: {why}")


def _problems_of_source(path: tuple, res: dict, version: str) -> Iterator[tuple[tuple, str]]:
    src = res.get("source")
    scheme = _scheme(src) if isinstance(src, str) else None
    if isinstance(src, str) and src != "":
        allowed = {"http", "https", "tftp", "s3", "data"}
        if _at_least(version, "3.2.0"):
            allowed.add("gs")
        if _at_least(version, "3.4.0"):
            allowed.add("arn")
        if scheme not in allowed:
            yield path + ("source",), f"invalid url scheme {scheme!r} (allowed in spec {version}: {', '.join(sorted(allowed))})"
        elif scheme == "data":
            why = _data_url_problem(src)
            if why:
                yield path + ("source",), why
        elif scheme == "arn":
            parts = src.split(":", 5)
            if len(parts) < 6 or parts[2] != "s3" or "/" not in parts[5]:
                yield path + ("source",), "invalid S3 ARN (want arn:<partition>:s3:...:<resource>/<key>)"
        else:
            try:
                u = urlsplit(src)
            except ValueError as e:
                yield path + ("source",), f"invalid url: {e}"
            else:
                if scheme in ("http", "https", "tftp", "s3", "gs") and not u.netloc:
                    yield path + ("source",), f"invalid url: {scheme} source without a host"
    comp = res.get("compression")
    if comp not in (None, "", "gzip"):
        yield path + ("compression",), f"invalid compression method {comp!r} (only gzip)"
    headers = res.get("httpHeaders")
    if isinstance(headers, list) and headers:
        if scheme not in ("http", "https"):
            yield path + ("httpHeaders",), "HTTP headers need an http or https source"
        seen = set()
        for i, h in enumerate(headers):
            name = h.get("name") if isinstance(h, dict) else None
            if not name:
                yield path + ("httpHeaders", i, "name"), "empty HTTP header name"
            elif name in seen:
                yield path + ("httpHeaders", i), f"duplicate HTTP header {name!r}"
            seen.add(name)
    h = _get(res, "verification", "hash")
    if isinstance(h, str):
        hp = path + ("verification", "hash")
        if not src:
            yield hp, "a source is needed when verification is set"
        func, sep, digest = h.partition("-")
        allowed = ("sha512", "sha256") if _at_least(version, "3.1.0") else ("sha512",)
        if not sep:
            yield hp, "malformed hash (want <function>-<hex digest>)"
        elif func not in allowed:
            yield hp, f"unrecognized hash function {func!r} (spec {version} allows {', '.join(allowed)})"
        elif not re.fullmatch(r"[0-9a-fA-F]{%d}" % _HASH_HEX_LEN[func], digest):
            yield hp, f"{func} digest must be {_HASH_HEX_LEN[func]} hex characters"


def _data_url_problem(src: str) -> str:
    header, sep, data = src[5:].partition(",")
    if not sep:
        return "invalid data url: no comma"
    try:
        raw = unquote_to_bytes(data)
        if header.lower().endswith(";base64"):
            base64.b64decode(raw, validate=False)
    except (binascii.Error, ValueError) as e:
        return f"invalid data url: {e}"
    return ""


def _problems_of_path(path: tuple, value: Any) -> Iterator[tuple[tuple, str]]:
    if not isinstance(value, str):
        return
    if not value.startswith("/"):
        yield path, f"path {value!r} is not absolute"
    elif posixpath.normpath(value) != value or value.startswith("//"):
        yield path, f"path {value!r} is not fully simplified"


def _duplicates(items: list, key, base: tuple, what: str) -> Iterator[tuple[tuple, str]]:
    seen: set = set()
    for i, item in enumerate(items):
        k = key(item)
        if k is None:
            continue
        if k in seen:
            yield base + (i,), f"duplicate {what} {k!r}"
        seen.add(k)


def _own_problems(config: dict, version: str) -> Iterator[tuple[tuple, str]]:
    name_of = lambda x: x.get("name") if isinstance(x, dict) else None  # noqa: E731
    for path, res in _resources(config):
        if isinstance(res, dict):
            yield from _problems_of_source(path, res, version)
    ign = config.get("ignition") or {}
    yield from _duplicates(_list(ign, "config", "merge"), lambda r: r.get("source"),
                           ("ignition", "config", "merge"), "merged config")
    yield from _duplicates(_list(ign, "security", "tls", "certificateAuthorities"),
                           lambda r: r.get("source"),
                           ("ignition", "security", "tls", "certificateAuthorities"), "certificate authority")

    # files, directories, links: one namespace of paths
    seen: dict[str, str] = {}
    links = {n.get("path") for kind, _, n in _nodes(config) if kind == "links"}
    for kind, i, n in _nodes(config):
        base = ("storage", kind, i)
        p = n.get("path")
        yield from _problems_of_path(base + ("path",), p)
        if isinstance(p, str):
            if p in seen:
                other = seen[p]
                yield base + ("path",), (f"duplicate entry {p!r}" if other == kind else
                                         f"{p!r} is both in storage.{other} and storage.{kind}")
            seen.setdefault(p, kind)
            parent = posixpath.dirname(p)
            while parent not in ("/", ""):
                if parent in links:
                    yield base + ("path",), f"{p!r} is below {parent!r}, which is a link in this config"
                    break
                parent = posixpath.dirname(parent)
        mode = n.get("mode")
        if isinstance(mode, int) and not isinstance(mode, bool) and not 0 <= mode <= 0o7777:
            yield base + ("mode",), f"illegal mode {mode} (must be within 0..0o7777)"
        for owner in ("user", "group"):
            o = n.get(owner)
            if isinstance(o, dict) and o.get("id") is not None and o.get("name") not in (None, ""):
                yield base + (owner,), "cannot set both id and name"
        if kind == "links" and n.get("hard") and isinstance(n.get("target"), str):
            yield from _problems_of_path(base + ("target",), n["target"])
    for i, fs in enumerate(_list(config, "storage", "filesystems")):
        if isinstance(fs, dict) and fs.get("path"):
            yield from _problems_of_path(("storage", "filesystems", i, "path"), fs["path"])
    for kind, key in (("disks", "device"), ("filesystems", "device"), ("raid", "name"), ("luks", "name")):
        yield from _duplicates(_list(config, "storage", kind),
                               lambda x, key=key: x.get(key) if isinstance(x, dict) else None,
                               ("storage", kind), key)

    units = _list(config, "systemd", "units")
    yield from _duplicates(units, name_of, ("systemd", "units"), "unit")
    for i, u in enumerate(units):
        if not isinstance(u, dict) or not isinstance(u.get("name"), str):
            continue
        base = ("systemd", "units", i)
        name = u["name"]
        if posixpath.splitext(name)[1] not in _UNIT_SUFFIXES or "/" in name:
            yield base + ("name",), (f"invalid unit name {name!r}: must end in one of "
                                     f"{', '.join(sorted(_UNIT_SUFFIXES))}")
        dropins = u.get("dropins") or []
        yield from _duplicates(dropins, name_of, base + ("dropins",), "dropin")
        for j, d in enumerate(dropins):
            dn = name_of(d)
            if isinstance(dn, str) and (not dn.endswith(".conf") or "/" in dn):
                yield base + ("dropins", j, "name"), f"invalid dropin name {dn!r}: must end in .conf"

    users = _list(config, "passwd", "users")
    yield from _duplicates(users, name_of, ("passwd", "users"), "user")
    for i, u in enumerate(users):
        if isinstance(u, dict):
            if u.get("name") == "":
                yield ("passwd", "users", i, "name"), "empty user name"
            yield from _duplicates(u.get("sshAuthorizedKeys") or [], lambda k: k,
                                   ("passwd", "users", i, "sshAuthorizedKeys"), "SSH key")
            yield from _duplicates(u.get("groups") or [], lambda g: g,
                                   ("passwd", "users", i, "groups"), "group")
    groups = _list(config, "passwd", "groups")
    yield from _duplicates(groups, name_of, ("passwd", "groups"), "group")
    for i, g in enumerate(groups):
        if isinstance(g, dict) and g.get("name") == "":
            yield ("passwd", "groups", i, "name"), "empty group name"

    should = _list(config, "kernelArguments", "shouldExist")
    should_not = _list(config, "kernelArguments", "shouldNotExist")
    yield from _duplicates(should, lambda a: a, ("kernelArguments", "shouldExist"), "kernel argument")
    yield from _duplicates(should_not, lambda a: a, ("kernelArguments", "shouldNotExist"), "kernel argument")
    for i, a in enumerate(should_not):
        if a in should:
            yield ("kernelArguments", "shouldNotExist", i), f"kernel argument {a!r} is also in shouldExist"
