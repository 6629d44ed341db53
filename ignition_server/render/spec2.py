"""Ignition spec 2.2–2.4 configs → spec 3, as coreos/ign-converter translates them.

IBM's prototype and many existing clusters carry MachineConfigs in spec 2.x; the
machine-config-operator translates them before merging, and so do we. Pure: dict in, dict out.

What changes between the two specs (and why each rule is here):
  - 2.x names a filesystem per file, directory and link; spec 3 has only paths. `root`
    is `/`, so its paths carry over; any other filesystem would need its mount point, which
    only the node knows: refused.
  - 2.x `append: true` appended the file's contents; spec 3 lists the appended resources
    in `append` and has no contents then.
  - 2.x replaced existing files and gave files mode 0644 and directories 0755 when none was
    set; spec 3 does not overwrite by default. The 2.x behaviour is written out explicitly
    so the node ends up with the same files.
  - `ignition.config.append` became `ignition.config.merge`; a unit's `enable` became
    `enabled`; `networkd` units and users' `create` options have no spec 3 form: refused.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from .inputs import InvalidConfig

TRANSLATABLE = re.compile(r"2\.[2-4]\.\d+")
TRANSLATED_VERSION = "3.2.0"

_FILE_MODE_2X = 0o644
_DIRECTORY_MODE_2X = 0o755


def is_spec2(version: Any) -> bool:
    return isinstance(version, str) and version.startswith("2.")


def translate(config: dict) -> dict:
    """The spec 3 form of a spec 2.2–2.4 config. Raises InvalidConfig naming the field."""
    version = (config.get("ignition") or {}).get("version")
    if not isinstance(version, str) or not TRANSLATABLE.fullmatch(version):
        raise InvalidConfig(f"ignition.version: {version!r} cannot be translated to spec 3 (only 2.2–2.4 can)")
    out: dict[str, Any] = {"ignition": _ignition(config.get("ignition") or {})}
    if config.get("networkd"):
        raise InvalidConfig("networkd: networkd units have no spec 3 form (write them as files under /etc/systemd/network)")
    storage = _storage(config.get("storage") or {})
    if storage:
        out["storage"] = storage
    systemd = _systemd(config.get("systemd") or {})
    if systemd:
        out["systemd"] = systemd
    passwd = _passwd(config.get("passwd") or {})
    if passwd:
        out["passwd"] = passwd
    unknown = sorted(set(config) - {"ignition", "storage", "systemd", "passwd", "networkd"})
    if unknown:
        raise InvalidConfig(f"{unknown[0]}: not a field of Ignition spec {version}")
    return out


def _ignition(ign: dict) -> dict:
    out = copy.deepcopy({k: v for k, v in ign.items() if k != "config"})
    out["version"] = TRANSLATED_VERSION
    config = ign.get("config") or {}
    if config:
        translated: dict[str, Any] = {}
        if config.get("append"):
            translated["merge"] = copy.deepcopy(config["append"])
        if config.get("replace"):
            translated["replace"] = copy.deepcopy(config["replace"])
        out["config"] = translated
    return out


def _on_root(kind: str, i: int, node: dict) -> dict:
    filesystem = node.get("filesystem")
    if filesystem != "root":
        raise InvalidConfig(
            f"storage.{kind}[{i}].filesystem: {filesystem!r} cannot be translated to spec 3 "
            f"(only 'root' can: spec 3 names paths, not filesystems)"
        )
    return {k: copy.deepcopy(v) for k, v in node.items() if k != "filesystem"}


def _storage(storage: dict) -> dict:
    out: dict[str, Any] = {}
    for field in ("disks", "raid", "filesystems"):
        if storage.get(field):
            raise InvalidConfig(
                f"storage.{field}: spec 2.x {field} are not translated (their spec 3 form depends on the "
                f"node's devices); write them as a spec 3 MachineConfig"
            )
    files: dict[str, dict] = {}
    for i, f in enumerate(storage.get("files") or []):
        file = _on_root("files", i, f)
        contents = file.pop("contents", None)
        if file.pop("append", False):
            # 2.x applied entries in order: an append after a write of the same path adds to
            # that file, which spec 3 says with one entry (a path may appear only once).
            file = files.get(file["path"], {**file, "overwrite": file.get("overwrite", False)})
            if contents:
                file["append"] = file.get("append", []) + [contents]
        else:
            if contents:
                file["contents"] = contents
            file.setdefault("overwrite", True)
        file.setdefault("mode", _FILE_MODE_2X)
        files[file["path"]] = file
    if files:
        out["files"] = list(files.values())
    directories = []
    for i, d in enumerate(storage.get("directories") or []):
        directory = _on_root("directories", i, d)
        directory.setdefault("mode", _DIRECTORY_MODE_2X)
        directories.append(directory)
    if directories:
        out["directories"] = directories
    links = [_on_root("links", i, link) for i, link in enumerate(storage.get("links") or [])]
    if links:
        out["links"] = links
    return out


def _systemd(systemd: dict) -> dict:
    units = []
    for unit in systemd.get("units") or []:
        translated = copy.deepcopy(unit)
        if "enable" in translated:
            enable = translated.pop("enable")
            translated.setdefault("enabled", enable)
        units.append(translated)
    return {"units": units} if units else {}


def _passwd(passwd: dict) -> dict:
    out: dict[str, Any] = {}
    users = []
    for i, user in enumerate(passwd.get("users") or []):
        if user.get("create"):
            raise InvalidConfig(
                f"passwd.users[{i}].create: has no spec 3 form (move its fields onto the user itself)"
            )
        users.append({k: copy.deepcopy(v) for k, v in user.items() if k != "create"})
    if users:
        out["users"] = users
    if passwd.get("groups"):
        out["groups"] = copy.deepcopy(passwd["groups"])
    return out
