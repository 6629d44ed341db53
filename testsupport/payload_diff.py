"""Two Ignition payloads compared item by item, with differences a person can read.

    differences = diff_payloads(reference_bytes, our_bytes)
    assert not differences, report(differences)

An item is what a node ends up with: a file (path, mode, contents decoded from its data URL
and gzip, appends, overwrite, user/group), a directory, a link, a unit (enabled, mask,
contents, drop-ins), a user or group, the kernel arguments, the `ignition` section (config
merges and replaces, TLS CAs, timeouts, proxy) and storage devices. Unset fields count as
Ignition's defaults, so two spellings of one outcome are equal (`overwrite` unset and
`false`). File contents that are JSON are compared structurally (paths into the document),
and a MachineConfig inside a file (the machine-config-server's
`/etc/mcs-machine-config-content.json`) has its Ignition config compared item by item in turn.
The spec version is not an item: the same config at 3.2.0 and 3.4.0 is the same config
(`compare_version=True` makes it one).
"""

from __future__ import annotations

import base64
import difflib
import gzip
import hashlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

Config = dict[str, Any]
Fields = dict[str, Any]


@dataclass(frozen=True)
class Difference:
    item: str  # "file /etc/kubernetes/kubeconfig", "unit kubelet.service", "kernelArguments"
    aspect: str  # "mode", "contents", "missing", "extra", "dropin 10-x.conf", ...
    reference: str
    ours: str
    detail: str = ""  # a unified diff, or the nested differences of a document

    def __str__(self) -> str:
        line = f"{self.item}: {self.aspect}: reference {self.reference} | ours {self.ours}"
        return line + ("\n" + _indent(self.detail) if self.detail else "")


def load(payload: bytes | str | Config) -> Config:
    return payload if isinstance(payload, dict) else json.loads(payload)


def decode_source(source: str | None, compression: str | None = None) -> bytes | None:
    """The bytes a `contents.source` data URL stands for (None for no source); a remote URL is
    kept as its text, since the node would fetch it."""
    if source is None:
        return None
    if not source.startswith("data:"):
        return f"<remote {source}>".encode()
    header, _, data = source[5:].partition(",")
    raw = base64.b64decode(data) if header.endswith(";base64") else unquote_to_bytes(data)
    return gzip.decompress(raw) if compression == "gzip" else raw


def _resource(resource: dict[str, Any] | None) -> bytes | None:
    if not resource:
        return None
    decoded = decode_source(resource.get("source"), resource.get("compression"))
    hash_ = (resource.get("verification") or {}).get("hash")
    if decoded is None or not hash_:
        return decoded
    return decoded + f"\n<verification {hash_}>".encode()


def _owner(owner: dict[str, Any] | None) -> str:
    owner = {k: v for k, v in (owner or {}).items() if v is not None}
    if not owner:
        return "root"
    return ",".join(f"{k}={owner[k]}" for k in sorted(owner))


def _mode(mode: int | None, default: int) -> str:
    return f"{default if mode is None else mode:04o}"


def items_of(config: Config) -> dict[str, Fields]:
    """Every item of a config, keyed by what names it on a node, with its effective fields.
    A later entry of the same path or name wins, as Ignition applies them."""
    items: dict[str, Fields] = {}
    storage = config.get("storage") or {}
    for entry in storage.get("files") or []:
        items[f"file {entry['path']}"] = {
            "mode": _mode(entry.get("mode"), 0o644),
            "overwrite": bool(entry.get("overwrite")),
            "user": _owner(entry.get("user")), "group": _owner(entry.get("group")),
            "contents": _resource(entry.get("contents")),
            "append": [_resource(a) for a in entry.get("append") or []],
        }
    for entry in storage.get("directories") or []:
        items[f"directory {entry['path']}"] = {
            "mode": _mode(entry.get("mode"), 0o755), "overwrite": bool(entry.get("overwrite")),
            "user": _owner(entry.get("user")), "group": _owner(entry.get("group"))}
    for entry in storage.get("links") or []:
        items[f"link {entry['path']}"] = {
            "target": entry.get("target"), "hard": bool(entry.get("hard")), "overwrite": bool(entry.get("overwrite")),
            "user": _owner(entry.get("user")), "group": _owner(entry.get("group"))}
    for section, kind, key in (("disks", "disk", "device"), ("raid", "raid", "name"),
                               ("filesystems", "filesystem", "device"), ("luks", "luks", "name")):
        for entry in storage.get(section) or []:
            items[f"{kind} {entry.get(key)}"] = {"spec": _canonical(entry)}
    for unit in (config.get("systemd") or {}).get("units") or []:
        fields: Fields = {
            "enabled": "unset (preset)" if unit.get("enabled") is None else str(unit["enabled"]).lower(),
            "mask": bool(unit.get("mask")),
            "contents": None if unit.get("contents") is None else unit["contents"].encode(),
        }
        for dropin in unit.get("dropins") or []:
            fields[f"dropin {dropin['name']}"] = None if dropin.get("contents") is None else dropin["contents"].encode()
        items[f"unit {unit['name']}"] = fields
    passwd = config.get("passwd") or {}
    for kind in ("users", "groups"):
        for entry in passwd.get(kind) or []:
            fields = {k: _canonical(v) for k, v in entry.items() if k != "name" and v not in (None, [], "", False)}
            if "sshAuthorizedKeys" in entry:
                fields["sshAuthorizedKeys"] = _canonical(sorted(entry["sshAuthorizedKeys"] or []))
            items[f"{kind[:-1]} {entry['name']}"] = fields
    arguments = config.get("kernelArguments") or {}
    if arguments.get("shouldExist") or arguments.get("shouldNotExist"):
        items["kernelArguments"] = {"shouldExist": _canonical(arguments.get("shouldExist") or []),
                                    "shouldNotExist": _canonical(arguments.get("shouldNotExist") or [])}
    ignition = config.get("ignition") or {}
    ignition_items = {
        "config.merge": [_resource(r) for r in (ignition.get("config") or {}).get("merge") or []],
        "config.replace": _resource((ignition.get("config") or {}).get("replace")),
        "security.tls.certificateAuthorities": [
            _resource(r) for r in ((ignition.get("security") or {}).get("tls") or {}).get("certificateAuthorities") or []],
        "timeouts": _canonical({k: v for k, v in (ignition.get("timeouts") or {}).items() if v is not None}),
        "proxy": _canonical({k: v for k, v in (ignition.get("proxy") or {}).items() if v not in (None, [])}),
    }
    items["ignition"] = ignition_items
    return items


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def diff_payloads(reference: bytes | str | Config, ours: bytes | str | Config, *,
                  compare_version: bool = False) -> list[Difference]:
    """What differs between two payloads, item by item (empty when a node would get the same)."""
    ref_config, our_config = load(reference), load(ours)
    differences: list[Difference] = []
    if compare_version:
        ref_version = (ref_config.get("ignition") or {}).get("version")
        our_version = (our_config.get("ignition") or {}).get("version")
        if ref_version != our_version:
            differences.append(Difference("ignition", "version", str(ref_version), str(our_version)))
    ref_items, our_items = items_of(ref_config), items_of(our_config)
    for item in sorted(ref_items.keys() | our_items.keys()):
        if item not in our_items:
            differences.append(Difference(item, "missing", _summary(ref_items[item]), "-"))
        elif item not in ref_items:
            differences.append(Difference(item, "extra", "-", _summary(our_items[item])))
        else:
            differences.extend(_diff_fields(item, ref_items[item], our_items[item]))
    return differences


def item_counts(reference: bytes | str | Config, ours: bytes | str | Config) -> tuple[int, int]:
    """(items equal, items in either payload): the issue's "361 of 390 items"."""
    ref_items, our_items = items_of(load(reference)), items_of(load(ours))
    names = ref_items.keys() | our_items.keys()
    return sum(1 for n in names if ref_items.get(n) == our_items.get(n)), len(names)


def _diff_fields(item: str, ref: Fields, ours: Fields) -> list[Difference]:
    differences = []
    for aspect in sorted(ref.keys() | ours.keys(), key=lambda k: (k.startswith("dropin"), k)):
        a, b = ref.get(aspect), ours.get(aspect)
        if a == b:
            continue
        if isinstance(a, (bytes, type(None))) and isinstance(b, (bytes, type(None))):
            differences.append(_diff_contents(item, aspect, a, b))
        elif aspect == "append":
            differences.append(Difference(item, aspect, f"{len(a or [])} appended", f"{len(b or [])} appended",
                                          _text_diff(b"\n".join(x or b"" for x in a or []), b"\n".join(x or b"" for x in b or []))))
        elif aspect.startswith("config.") or aspect.startswith("security."):
            differences.append(Difference(item, aspect, _brief_list(a), _brief_list(b)))
        else:
            differences.append(Difference(item, aspect, _shorten(str(a)), _shorten(str(b))))
    return differences


def _diff_contents(item: str, aspect: str, a: bytes | None, b: bytes | None) -> Difference:
    if a is None or b is None:
        return Difference(item, aspect, _brief(a), _brief(b))
    ref_doc, our_doc = _json(a), _json(b)
    if isinstance(ref_doc, dict) and isinstance(our_doc, dict):
        nested = diff_documents(ref_doc, our_doc)
        return Difference(item, aspect, _brief(a), _brief(b), "\n".join(nested))
    return Difference(item, aspect, _brief(a), _brief(b), _text_diff(a, b))


def diff_documents(ref: dict[str, Any], ours: dict[str, Any], limit: int = 40) -> list[str]:
    """A JSON document's differences as lines `path: reference → ours`; an Ignition config
    inside a MachineConfig (spec.config) is compared item by item instead."""
    lines: list[str] = []
    ref_spec, our_spec = (ref.get("spec") or {}), (ours.get("spec") or {})
    if _is_machineconfig(ref) and _is_machineconfig(ours):
        nested = diff_payloads(ref_spec.get("config") or {}, our_spec.get("config") or {}, compare_version=True)
        lines += [f"spec.config → {d}" for d in nested]
        ref = {**ref, "spec": {k: v for k, v in ref_spec.items() if k != "config"}}
        ours = {**ours, "spec": {k: v for k, v in our_spec.items() if k != "config"}}
    for path, a, b in _walk(ref, ours, ""):
        lines.append(f"{path}: {_shorten(_canonical(a)) if a is not _ABSENT else '(absent)'} → "
                     f"{_shorten(_canonical(b)) if b is not _ABSENT else '(absent)'}")
    if len(lines) > limit:
        lines = lines[:limit] + [f"… {len(lines) - limit} more"]
    return lines


def _is_machineconfig(doc: dict[str, Any]) -> bool:
    return doc.get("kind") == "MachineConfig" and isinstance((doc.get("spec") or {}).get("config"), dict)


_ABSENT = object()


def _walk(a: Any, b: Any, path: str):
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            yield from _walk(a.get(key, _ABSENT), b.get(key, _ABSENT), f"{path}.{key}" if path else key)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b)):
            yield from _walk(x, y, f"{path}[{index}]")
    elif a != b or type(a) is not type(b):
        yield path or "(document)", a, b


def report(differences: list[Difference], limit: int = 60) -> str:
    """The differences, one block each, for an assertion message or a findings file."""
    shown = [str(d) for d in differences[:limit]]
    if len(differences) > limit:
        shown.append(f"… and {len(differences) - limit} more differences")
    return "\n".join(shown)


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _summary(fields: Fields) -> str:
    parts = []
    for key, value in fields.items():
        if isinstance(value, bytes):
            parts.append(f"{key} {_brief(value)}")
        elif value not in (None, [], False, "[]", "{}", "root"):
            parts.append(f"{key} {_shorten(str(value), 60)}")
    return ", ".join(parts) or "(empty)"


def _brief(data: bytes | None) -> str:
    if data is None:
        return "(none)"
    return f"{len(data)} bytes sha256:{hashlib.sha256(data).hexdigest()[:12]}"


def _brief_list(values: list[bytes | None] | bytes | None) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_brief(v) for v in values) + "]"
    return _brief(values)


def _text_diff(a: bytes, b: bytes, limit: int = 24) -> str:
    try:
        left, right = a.decode().splitlines(), b.decode().splitlines()
    except UnicodeDecodeError:
        return "(binary contents)"
    lines = list(difflib.unified_diff(left, right, "reference", "ours", n=1, lineterm=""))
    if len(lines) > limit:
        lines = lines[:limit] + [f"… {len(lines) - limit} more diff lines"]
    return "\n".join(_shorten(line, 200) for line in lines)


def _shorten(text: str, width: int = 120) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
