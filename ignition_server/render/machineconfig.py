"""MachineConfig objects → one Ignition config, merged as the Machine Config Operator does.

Pure: YAML text in, dicts out.

`merge_machineconfigs` returns a `MergedConfig(config, notes)` named tuple: `config` is the
merged Ignition config (its `ignition.version` set to the lowest version that expresses it;
spec 2.2–2.4 configs are translated first, see `spec2`),
`notes` says what was left out (fields of a MachineConfig that an Ignition payload cannot
carry: `spec.extensions`, `spec.fips`, `spec.kernelType`, `spec.osImageURL`, …).

Merge rules (MCO: configs sorted by `metadata.name`, folded with Ignition's config merge):
  - keyed lists merge entry by entry, a later entry's fields winning over an earlier one's:
    files, directories and links by path (one namespace: a later file replaces an earlier
    link or directory at the same path), units by name (dropins by name; `enabled`/`mask`
    of the later one win), users and groups by name, disks/filesystems by device, raid/luks
    by name, merged configs/CAs by source, HTTP headers by name, a file's `append` by source;
  - lists of strings are unioned, order kept, duplicates dropped (`sshAuthorizedKeys`,
    a user's `groups`, `kernelArguments.*`, `proxy.noProxy`);
  - any other list or value: the later one replaces the earlier; a null never overrides;
  - `spec.kernelArguments` of every MachineConfig, in name order, become
    `kernelArguments.shouldExist` (after the configs' own), deduplicated; needs spec 3.3.0.
"""

from __future__ import annotations

import copy
import re
from typing import Any, NamedTuple

import yaml

from .. import bounded_yaml
from ..model.bootstrap_objects import is_consumed
from .checked import CheckedItems
from .inputs import InvalidConfig, refusal
from .spec import SUPPORTED_VERSIONS, minimum_version
from .spec2 import is_spec2, translate
from .validation import validate

API_VERSION = "machineconfiguration.openshift.io/v1"
KIND = "MachineConfig"

# Fields of a MachineConfig spec that the payload does not carry (the MCD applies them on the
# node, or they are not applicable at first boot); reported in notes when set.
_IGNORED_SPEC_FIELDS = ("extensions", "fips", "kernelType", "osImageURL", "baseOSExtensionsContainerImage")
_KNOWN_SPEC_FIELDS = frozenset(("config", "kernelArguments") + _IGNORED_SPEC_FIELDS)

_STRING_SETS = {
    ("passwd", "users", "sshAuthorizedKeys"),
    ("passwd", "users", "groups"),
    ("kernelArguments", "shouldExist"),
    ("kernelArguments", "shouldNotExist"),
    ("ignition", "proxy", "noProxy"),
}
_KEYED = {
    ("ignition", "config", "merge"): "source",
    ("ignition", "security", "tls", "certificateAuthorities"): "source",
    ("storage", "files"): "path",
    ("storage", "directories"): "path",
    ("storage", "links"): "path",
    ("storage", "files", "append"): "source",
    ("storage", "disks"): "device",
    ("storage", "disks", "partitions"): "label|number",
    ("storage", "filesystems"): "device",
    ("storage", "raid"): "name",
    ("storage", "luks"): "name",
    ("systemd", "units"): "name",
    ("systemd", "units", "dropins"): "name",
    ("passwd", "users"): "name",
    ("passwd", "groups"): "name",
}
_NODE_KINDS = ("files", "directories", "links")


class MergedConfig(NamedTuple):
    config: dict
    notes: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# parsing


def parse_machineconfigs(yaml_text: str, checked: CheckedItems | None = None, *,
                         bootstrap_consumed: bool = False) -> list[dict]:
    """The MachineConfig objects of a multi-document YAML text (a `kind: List` is expanded).

    Empty text → []. Raises InvalidConfig for bad YAML, a document that is not a
    machineconfiguration.openshift.io/v1 MachineConfig, a missing or repeated name, a
    malformed spec, or an embedded Ignition config that is not a supported 3.x version.
    `checked`: config items already found clean are not checked again (render/checked.py).
    `bootstrap_consumed`: a token Secret's config, whose ImageDigestMirrorSets, KubeletConfigs...
    went into its generated base (model/bootstrap_objects.py): skipped, not refused.
    """
    try:
        documents = bounded_yaml.load_all(yaml_text or "")
    except yaml.YAMLError as e:
        raise refusal(e, f"MachineConfig YAML does not parse: {e}") from None
    objects: list[tuple[str, Any]] = []
    for n, doc in enumerate(documents, 1):
        if doc is None:
            continue
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            objects += [(f"document {n} item {i}", item) for i, item in enumerate(doc["items"], 1)]
        else:
            objects.append((f"document {n}", doc))
    result: list[dict] = []
    names: set[str] = set()
    for where, obj in objects:
        if bootstrap_consumed and is_consumed(obj):
            continue
        mc = _check_machineconfig(where, obj, checked)
        name = mc["metadata"]["name"]
        if name in names:
            raise InvalidConfig(f"MachineConfig {name!r} appears twice")
        names.add(name)
        result.append(mc)
    return result


def _check_machineconfig(where: str, obj: Any, checked: CheckedItems | None) -> dict:
    if not isinstance(obj, dict):
        raise InvalidConfig(f"{where}: not a MachineConfig object (a {type(obj).__name__})")
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        raise InvalidConfig(
            f"{where}: {obj.get('apiVersion')!r} {obj.get('kind')!r} is not a {API_VERSION} {KIND}"
        )
    name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidConfig(f"{where}: MachineConfig without metadata.name")
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        raise InvalidConfig(f"MachineConfig {name!r}: spec is not a mapping")
    config = spec.get("config") or {}
    if not isinstance(config, dict):
        raise InvalidConfig(f"MachineConfig {name!r}: spec.config is not a mapping")
    if config:
        ign = config.get("ignition")
        version = ign.get("version") if isinstance(ign, dict) else None
        if version is None:
            raise InvalidConfig(f"MachineConfig {name!r}: spec.config.ignition.version is missing")
        if is_spec2(version):
            try:
                config = translate(config)
            except InvalidConfig as e:
                raise InvalidConfig(f"MachineConfig {name!r}: spec.config.{e}") from None
            obj = {**obj, "spec": {**spec, "config": config}}
            version = config["ignition"]["version"]
        if not isinstance(version, str) or not re.fullmatch(r"3\.\d+\.\d+", version):
            raise InvalidConfig(
                f"MachineConfig {name!r}: spec.config.ignition.version {version!r} is not an "
                f"Ignition 3.x version"
            )
        if version not in SUPPORTED_VERSIONS:
            raise InvalidConfig(
                f"MachineConfig {name!r}: spec.config.ignition.version {version!r} is not supported "
                f"({SUPPORTED_VERSIONS[0]} … {SUPPORTED_VERSIONS[-1]})"
            )
        try:
            validate(config, version, checked)
        except InvalidConfig as e:
            raise InvalidConfig(f"MachineConfig {name!r}: spec.config.{e}") from None
    kargs = spec.get("kernelArguments") or []
    if not isinstance(kargs, list) or not all(isinstance(a, str) and a.strip() for a in kargs):
        raise InvalidConfig(f"MachineConfig {name!r}: spec.kernelArguments must be a list of non-empty strings")
    extensions = spec.get("extensions") or []
    if not isinstance(extensions, list) or not all(isinstance(e, str) and e.strip() for e in extensions):
        raise InvalidConfig(f"MachineConfig {name!r}: spec.extensions must be a list of non-empty strings")
    if not isinstance(spec.get("fips", False), (bool, type(None))):
        raise InvalidConfig(f"MachineConfig {name!r}: spec.fips must be true or false")
    if spec.get("kernelType") not in (None, "", "default", "realtime", "64k-pages"):
        raise InvalidConfig(f"MachineConfig {name!r}: spec.kernelType {spec.get('kernelType')!r} is not default, realtime or 64k-pages")
    for field in ("osImageURL", "baseOSExtensionsContainerImage"):
        if not isinstance(spec.get(field) or "", str):
            raise InvalidConfig(f"MachineConfig {name!r}: spec.{field} must be an image pull spec")
    return obj


# ---------------------------------------------------------------------------------------------
# merging


def merge_machineconfigs(mcs: list[dict], *, carried: bool = False, checked: CheckedItems | None = None,
                         find_version: bool = True) -> MergedConfig:
    """Merge MachineConfigs (as from `parse_machineconfigs`) into one Ignition config.

    `carried`: the spec fields beside `config` travel in the rendered MachineConfig that the
    payload encapsulates (render/mco.py), so they are neither noted as dropped nor turned
    into Ignition kernel arguments. `checked`: as for `parse_machineconfigs`.
    `find_version=False`: `ignition.version` is left at the newest version, for a caller that
    finds the version of what it serves itself (render_payload).
    """
    ordered = sorted(mcs, key=lambda mc: mc["metadata"]["name"])
    merged: dict = {}
    kargs: list[str] = []
    notes: list[str] = []
    for mc in ordered:
        name = mc["metadata"]["name"]
        spec = mc.get("spec") or {}
        config = copy.deepcopy(spec.get("config") or {})  # the one copy: the fold (_merge) makes none
        if isinstance(config.get("ignition"), dict):
            config["ignition"].pop("version", None)
            if not config["ignition"]:
                del config["ignition"]
        merged = _merge_config(merged, config)
        for field in () if carried else _IGNORED_SPEC_FIELDS:
            value = spec.get(field)
            if value in (None, "", [], False) or (field == "kernelType" and value == "default"):
                continue
            notes.append(f"MachineConfig {name!r}: spec.{field} is not applied by the Ignition payload (ignored)")
        if not carried:
            kargs += spec.get("kernelArguments") or []
        for field in sorted(set(spec) - _KNOWN_SPEC_FIELDS):
            notes.append(f"MachineConfig {name!r}: unknown field spec.{field} ignored")
    if kargs:
        ka = merged.setdefault("kernelArguments", {})
        ka["shouldExist"] = _union(ka.get("shouldExist") or [], kargs)
    ign = merged.pop("ignition", {}) or {}
    result = {"ignition": {"version": SUPPORTED_VERSIONS[-1], **ign}, **merged}
    if find_version:
        try:
            result["ignition"]["version"] = minimum_version(result, checked)
        except InvalidConfig:
            pass  # no version can express it: validation says why
    return MergedConfig(result, tuple(notes))


def _union(first: list, second: list) -> list:
    out = []
    seen = set()
    for item in list(first) + list(second):
        marker = repr(item)
        if marker not in seen:
            seen.add(marker)
            out.append(item)
    return out


def _merge_config(parent: dict, child: dict) -> dict:
    # Files, directories and links share one namespace: a child's entry at a path drops the
    # parent's entry of another kind at that path.
    child_storage = child.get("storage") if isinstance(child.get("storage"), dict) else {}
    parent_storage = parent.get("storage") if isinstance(parent.get("storage"), dict) else None
    if child_storage and parent_storage:
        parent = dict(parent)
        parent_storage = dict(parent_storage)
        for kind in _NODE_KINDS:
            paths = {n.get("path") for n in child_storage.get(kind) or [] if isinstance(n, dict)}
            for other in _NODE_KINDS:
                if other != kind and parent_storage.get(other):
                    parent_storage[other] = [n for n in parent_storage[other] if n.get("path") not in paths]
        parent["storage"] = parent_storage
    return _merge(parent, child, ())


# The fold never changes what it is given and builds new dicts and lists where it merges; the
# rest of its result is parent's and child's own objects. merge_machineconfigs gives it the
# configs' deep copies and its own accumulated result, so what it returns shares nothing with
# the MachineConfigs (a reused base's, render/reuse.py) and copying once is enough.


def _merge(parent: Any, child: Any, path: tuple) -> Any:
    if child is None:
        return parent
    if isinstance(parent, dict) and isinstance(child, dict):
        out = dict(parent)
        for k, v in child.items():
            if v is None:
                continue
            out[k] = _merge(parent[k], v, path + (k,)) if k in parent else v
        return out
    if isinstance(parent, list) and isinstance(child, list):
        if path in _STRING_SETS:
            return _union(parent, child)
        key = _KEYED.get(path) or ("name" if path and path[-1] == "httpHeaders" else None)
        if key is not None:
            return _merge_keyed(parent, child, path, key)
    return child


def _item_key(item: Any, key: str) -> Any:
    if not isinstance(item, dict):
        return None
    if key == "label|number":
        return ("label", item["label"]) if item.get("label") else ("number", item.get("number"))
    return item.get(key)


def _merge_keyed(parent: list, child: list, path: tuple, key: str) -> list:
    out = list(parent)
    index = {_item_key(p, key): i for i, p in enumerate(out) if _item_key(p, key) is not None}
    removed: set[int] = set()
    for c in child:
        k = _item_key(c, key)
        if k is not None and k in index:
            i = index[k]
            if path[-1] == "httpHeaders" and isinstance(c, dict) and c.get("value") is None:
                removed.add(i)  # a header named without a value removes the parent's header
            else:
                out[i] = _merge(out[i], c, path)
        else:
            if k is not None:
                index[k] = len(out)
            out.append(c)
    return [item for i, item in enumerate(out) if i not in removed]
