"""Config items known to pass a spec version's checks: what the renders of many NodePools share.

A payload of a cluster with an MCO base is mostly the base's files and units: the same in each
of the cluster's NodePools and, but for the cluster's own certificates, kubeconfig and pull
secret, in every cluster of a release. The checks that dominate a render look at one item at a
time: what a spec version can express (`spec.version_problems`: unknown keys, the schema, hash
and URL schemes, mode bits) sees each entry of `storage.files`, `storage.directories`,
`storage.links` and `systemd.units` on its own (the bundled schemas give every item of a list
the same schema through `items`, with no `uniqueItems` or length bounds: see
tests/render/test_checked.py), and the client's checks of a source (validation) see one
resource. So an item found clean at a version is clean in any config at that version, and a
check needs to look only at the items it has not met: the whole config's problems are those
of the items left, each at its own place, in the same order.

An item is known by the SHA-256 of its JSON text (what the client reads) with the version and
the check: a changed byte is a new item (the same item with its keys in another order is one
too: only a miss). Values JSON cannot write (a date, bytes from `!!binary`, NaN) have no key and
are always checked. JSON writes a key 1 as "1": harmless, as no check reads a key that is not
one of the spec's names, and the version checks refuse every other (an unknown key).

Owned by whoever renders (render/reuse.py) and passed in: bounded (least recently used first
out), safe to share between threads.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

# The lists whose items a version check sees one at a time: (section, list).
ITEM_LISTS: tuple[tuple[str, str], ...] = (
    ("storage", "files"), ("storage", "directories"), ("storage", "links"), ("systemd", "units"),
)


# Built once: json.dumps with arguments makes an encoder each call (~3 µs, 400 keys a render).
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class Reduced:
    """A config with the items already known clean left out, and where the others were."""

    config: dict
    places: dict[tuple[str, str], list[int]]  # per list: the original index of each item kept
    keys: dict[tuple[str, str], list[bytes | None]]  # per list: each kept item's key (None: none)

    def place(self, path: tuple) -> tuple:
        """A path in the reduced config → the same field's path in the whole config."""
        if len(path) >= 3 and (path[0], path[1]) in self.places and isinstance(path[2], int):
            return (path[0], path[1], self.places[(path[0], path[1])][path[2]], *path[3:])
        return path


class CheckedItems:
    """Keys of config items (and resources) that passed a check at a spec version."""

    def __init__(self, maxsize: int = 8192) -> None:
        self._clean: LRUCache[bytes, bool] = LRUCache(maxsize)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._clean)

    @staticmethod
    def key(check: str, version: str, value: Any) -> bytes | None:
        """`value`'s key for `check` at `version`; None when JSON cannot write it as it is."""
        try:
            text = _JSON.encode(value)
        except (TypeError, ValueError):
            return None
        return hashlib.sha256(f"{check}\0{version}\0{text}".encode()).digest()

    def known(self, key: bytes | None) -> bool:
        if key is None:
            return False
        with self._lock:
            return self._clean.get(key, False)

    def learn(self, keys: Iterable[bytes | None]) -> None:
        with self._lock:
            for key in keys:
                if key is not None:
                    self._clean[key] = True

    def reduce(self, config: dict, check: str, version: str) -> Reduced:
        """`config` without the list items known clean for `check` at `version` (shallow copies:
        `config` is not changed)."""
        out = dict(config)
        places: dict[tuple[str, str], list[int]] = {}
        keys: dict[tuple[str, str], list[bytes | None]] = {}
        for section, name in ITEM_LISTS:
            parent = out.get(section)
            items = parent.get(name) if isinstance(parent, dict) else None
            if not isinstance(parent, dict) or not isinstance(items, list):
                continue
            kept: list[Any] = []
            where: list[int] = []
            item_keys: list[bytes | None] = []
            for i, item in enumerate(items):
                key = self.key(f"{check}:{section}.{name}", version, item)
                if self.known(key):
                    continue
                kept.append(item)
                where.append(i)
                item_keys.append(key)
            out[section] = {**parent, name: kept}
            places[(section, name)] = where
            keys[(section, name)] = item_keys
        return Reduced(out, places, keys)

    def learn_clean(self, reduced: Reduced, problem_paths: Iterable[tuple]) -> None:
        """Every kept item that no problem (a path in the reduced config) lies under is clean."""
        dirty = {(p[0], p[1], p[2]) for p in problem_paths if len(p) >= 3 and isinstance(p[2], int)}
        self.learn(key for (section, name), item_keys in reduced.keys.items()
                   for i, key in enumerate(item_keys) if (section, name, i) not in dirty)
