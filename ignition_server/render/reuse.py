"""What one server's renders share: parsed MCO bases and config items already checked.

A cluster's NodePools render on the same MCO base (a few hundred KB of MachineConfig YAML);
every render used to parse it and check it again. `RenderReuse` keeps, for whoever renders
(the reconciler's renderer: render/payload.py `renderer`) and passed into `render_payload`:

- the parsed base, keyed by the SHA-256 of its YAML text (parsing reads nothing else), so
  a changed base is a new key and never served from here: a handful as objects (the renders
  of one cluster come in bursts: a shared input changed, a new cluster's NodePools), and many
  more packed (JSON, zlib: ~47 KB for HyperShift's 434 KB payload, unpacked in ~0.5 ms where
  YAML and its checks take ~10 ms), since the work queue's round robin over namespaces meets
  each of 440 clusters' bases once per lap: a cache smaller than the fleet's bases would never
  be hit by a cold start (least recently used out first, cycling);
- the config items found clean at a spec version (render/checked.py), content-addressed, so
  shared by every cluster of a release whatever order renders come in.

Bounded, safe between the reconciler's render threads. The rendered bytes are the same with or
without it (tests/render/test_reuse.py).
"""

from __future__ import annotations

import hashlib
import json
import threading
import zlib

from cachetools import LRUCache

from .checked import CheckedItems
from .machineconfig import parse_machineconfigs

# Sized for the fleet of issue 33 (440 clusters x 12 NodePools) rendered cold in the work queue's
# round robin: every cache below must hold one lap over the clusters, or least recently used
# out first cycles and nothing is ever found (at 440 clusters with 32 MiB of packed bases and
# 8,192 items every render parsed its base's YAML again: 38 ms a render against 25 at 110).
# A parsed base of HyperShift's real size (434 KB payload, 170 KB of YAML) is ~0.2 MiB of Python
# objects, ~47 KB packed; the seeds fleet's (its certificates random, one per file) ~103 KB:
# 64 MiB of packed bases hold ~650 of those, ~1,400 real ones. Held until the server stops.
BASES = 8
PACKED_BYTES = 64 * 2**20
# ~190 B a key (tracemalloc: 6.0 MiB for 32,768). A lap of 440 clusters learns ~24,000: each
# cluster's own items (~45 keys: its certificates, pull secret, kubeconfig at each check) and
# each render's appended files and NodePool file (~9 keys, met once), besides the release's.
ITEMS = 32768


class RenderReuse:
    def __init__(self, *, bases: int = BASES, packed_bytes: int = PACKED_BYTES, items: int = ITEMS) -> None:
        self.checked = CheckedItems(items)
        self._bases: LRUCache[bytes, tuple[dict, ...]] = LRUCache(bases)
        self._packed: LRUCache[bytes, bytes] = LRUCache(packed_bytes, getsizeof=len)
        self._lock = threading.Lock()
        self.base_hits = 0  # held as objects
        self.base_unpacked = 0
        self.base_misses = 0  # parsed from YAML

    def base(self, yaml_text: str) -> list[dict]:
        """`parse_machineconfigs(yaml_text)`, parsed once while it stays in the cache. The
        MachineConfigs are shared: a render reads them and never changes them (it merges copies)."""
        key = hashlib.sha256(yaml_text.encode()).digest()
        with self._lock:
            found = self._bases.get(key)
            packed = self._packed.get(key) if found is None else None
            if found is not None:
                self.base_hits += 1
        if found is not None:
            return list(found)
        if packed is not None:
            found = tuple(json.loads(zlib.decompress(packed)))
            with self._lock:
                self.base_unpacked += 1
                self._bases[key] = found
            return list(found)
        found = tuple(parse_machineconfigs(yaml_text, self.checked))  # InvalidConfig: not kept
        packed = _pack(found)
        with self._lock:
            self.base_misses += 1
            self._bases[key] = found
            if packed is not None and len(packed) <= self._packed.maxsize:
                self._packed[key] = packed
        return list(found)


def _pack(mcs: tuple[dict, ...]) -> bytes | None:
    """The MachineConfigs as compressed JSON, when JSON gives back exactly these values (YAML can
    hold what JSON cannot: dates, bytes, keys that are not strings, NaN, and one object in two
    places through an alias, which a copy made from JSON would not share: those stay unpacked)."""
    if _shares_objects(mcs):
        return None
    try:
        text = json.dumps(list(mcs), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None
    if json.loads(text) != list(mcs):  # e.g. a key 1 written as "1"
        return None
    return zlib.compress(text.encode(), 1)


def _shares_objects(value: object) -> bool:
    seen: set[int] = set()
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, (dict, list, tuple)):
            if id(node) in seen:
                return True
            seen.add(id(node))
            stack.extend(node.values() if isinstance(node, dict) else node)
    return False
