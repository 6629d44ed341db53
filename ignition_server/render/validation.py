"""The Ignition client's own checks, on top of the spec's schema: what it refuses to boot.

Pure: a config and a spec version in, InvalidConfig (naming the field) or nothing out.

The upstream draft-04 schemas are looser than the Ignition client, so `validate` runs both
what the version can express (`spec.version_problems`: the schema, unknown keys, features
newer than the version) and the client's own checks: URL schemes and data URLs, hashes,
HTTP headers, duplicates, absolute and simplified paths, paths below links, modes,
owners, unit and drop-in names, users, groups and kernel arguments.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

from .checked import CheckedItems
from .inputs import InvalidConfig
from .spec import (
    SUPPORTED_VERSIONS,
    at_least,
    dig,
    field_path,
    list_at,
    resources,
    storage_nodes,
    url_scheme,
    version_problems,
)

_UNIT_SUFFIXES = frozenset(
    {".service", ".socket", ".device", ".mount", ".automount", ".swap", ".target", ".path",
     ".timer", ".snapshot", ".slice", ".scope"}
)
_HASH_HEX_LEN = {"sha512": 128, "sha256": 64}


def validate(config: dict, version: str, checked: CheckedItems | None = None) -> None:
    """Check `config` as the Ignition client would at `version`; InvalidConfig names the field.
    `checked`: items (and sources) already found clean are not looked at again (render/checked.py)."""
    if version not in SUPPORTED_VERSIONS:
        raise InvalidConfig(f"unsupported spec version {version!r}")
    if not isinstance(config, dict):
        raise InvalidConfig("the config is not a JSON object")
    claimed = dig(config, "ignition", "version")
    if claimed != version:
        raise InvalidConfig(f"ignition.version: is {claimed!r}, expected exactly {version!r}")
    for path, why, _ in version_problems(config, version, checked):
        raise InvalidConfig(f"{field_path(path)}: {why}")
    validate_client_rules(config, version, checked)


def validate_client_rules(config: dict, version: str, checked: CheckedItems | None = None) -> None:
    """The client's own checks only: `validate` of a config whose `ignition.version` is what
    `spec.minimum_version_reason` just found for it (which ran the version's checks)."""
    for path, why in _own_problems(config, version, checked):
        raise InvalidConfig(f"{field_path(path)}: {why}")


def _problems_of_source(path: tuple, res: dict, version: str) -> Iterator[tuple[tuple, str]]:
    src = res.get("source")
    scheme = url_scheme(src) if isinstance(src, str) else None
    if isinstance(src, str) and src != "":
        allowed = {"http", "https", "tftp", "s3", "data"}
        if at_least(version, "3.2.0"):
            allowed.add("gs")
        if at_least(version, "3.4.0"):
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
    h = dig(res, "verification", "hash")
    if isinstance(h, str):
        hp = path + ("verification", "hash")
        if not src:
            yield hp, "a source is needed when verification is set"
        func, sep, digest = h.partition("-")
        functions = ("sha512", "sha256") if at_least(version, "3.1.0") else ("sha512",)
        if not sep:
            yield hp, "malformed hash (want <function>-<hex digest>)"
        elif func not in functions:
            yield hp, f"unrecognized hash function {func!r} (spec {version} allows {', '.join(functions)})"
        elif not re.fullmatch(r"[0-9a-fA-F]{%d}" % _HASH_HEX_LEN[func], digest):
            yield hp, f"{func} digest must be {_HASH_HEX_LEN[func]} hex characters"


def _problems_of_source_once(path: tuple, res: dict, version: str, checked: CheckedItems | None) -> list[tuple[tuple, str]]:
    """A source's problems are its own (`path` only names them): one found clean is not looked at again."""
    if checked is None:
        return list(_problems_of_source(path, res, version))
    known_as = checked.key("source", version, res)
    if checked.known(known_as):
        return []
    problems = list(_problems_of_source(path, res, version))
    if not problems:
        checked.learn((known_as,))
    return problems


def _data_url_problem(src: str) -> str:
    header, sep, data = src[5:].partition(",")
    if not sep:
        return "invalid data url: no comma"
    try:
        if header.lower().endswith(";base64"):
            base64.b64decode(unquote_to_bytes(data), validate=False)
        else:
            # All `unquote_to_bytes` can refuse here (it keeps a malformed escape as it is) is
            # text UTF-8 cannot write, a lone surrogate: encoding finds it without decoding
            # (decoding a render's 250 KB rendered MachineConfig file cost ~4 ms).
            data.encode()
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


def _own_problems(config: dict, version: str, checked: CheckedItems | None = None) -> Iterator[tuple[tuple, str]]:
    name_of = lambda x: x.get("name") if isinstance(x, dict) else None  # noqa: E731
    for path, res in resources(config):
        if isinstance(res, dict):
            yield from _problems_of_source_once(path, res, version, checked)
    ign = config.get("ignition") or {}
    yield from _duplicates(list_at(ign, "config", "merge"), lambda r: r.get("source"),
                           ("ignition", "config", "merge"), "merged config")
    yield from _duplicates(list_at(ign, "security", "tls", "certificateAuthorities"),
                           lambda r: r.get("source"),
                           ("ignition", "security", "tls", "certificateAuthorities"), "certificate authority")

    # files, directories, links: one namespace of paths
    seen: dict[str, str] = {}
    links = {n.get("path") for kind, _, n in storage_nodes(config) if kind == "links"}
    for kind, i, n in storage_nodes(config):
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
    for i, fs in enumerate(list_at(config, "storage", "filesystems")):
        if isinstance(fs, dict) and fs.get("path"):
            yield from _problems_of_path(("storage", "filesystems", i, "path"), fs["path"])
    for kind, key in (("disks", "device"), ("filesystems", "device"), ("raid", "name"), ("luks", "name")):
        yield from _duplicates(list_at(config, "storage", kind),
                               lambda x, key=key: x.get(key) if isinstance(x, dict) else None,
                               ("storage", kind), key)

    units = list_at(config, "systemd", "units")
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

    users = list_at(config, "passwd", "users")
    yield from _duplicates(users, name_of, ("passwd", "users"), "user")
    for i, u in enumerate(users):
        if isinstance(u, dict):
            if u.get("name") == "":
                yield ("passwd", "users", i, "name"), "empty user name"
            yield from _duplicates(u.get("sshAuthorizedKeys") or [], lambda k: k,
                                   ("passwd", "users", i, "sshAuthorizedKeys"), "SSH key")
            yield from _duplicates(u.get("groups") or [], lambda g: g,
                                   ("passwd", "users", i, "groups"), "group")
    groups = list_at(config, "passwd", "groups")
    yield from _duplicates(groups, name_of, ("passwd", "groups"), "group")
    for i, g in enumerate(groups):
        if isinstance(g, dict) and g.get("name") == "":
            yield ("passwd", "groups", i, "name"), "empty group name"

    should = list_at(config, "kernelArguments", "shouldExist")
    should_not = list_at(config, "kernelArguments", "shouldNotExist")
    yield from _duplicates(should, lambda a: a, ("kernelArguments", "shouldExist"), "kernel argument")
    yield from _duplicates(should_not, lambda a: a, ("kernelArguments", "shouldNotExist"), "kernel argument")
    for i, a in enumerate(should_not):
        if a in should:
            yield ("kernelArguments", "shouldNotExist", i), f"kernel argument {a!r} is also in shouldExist"
