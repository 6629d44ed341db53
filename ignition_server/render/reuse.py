"""What one server's renders share: parsed MCO bases and config items already checked.

A cluster's NodePools render on the same MCO base (a few hundred KB of MachineConfig YAML);
every render used to parse it and check it again. `RenderReuse` keeps, for whoever renders
(the reconciler's renderer: render/payload.py `renderer`) and passed into `render_payload`:

- the parsed base, keyed by the SHA-256 of its YAML text (parsing reads nothing else), so
  a changed base is a new key and never served from here; a handful of them (the renders of
  one cluster come in bursts: a shared input changed, a new cluster's NodePools);
- the config items found clean at a spec version (render/checked.py), content-addressed, so
  shared by every cluster of a release whatever order renders come in.

Bounded (least recently used out first), safe between the reconciler's render threads. The
rendered bytes are the same with or without it (tests/render/test_reuse.py).
"""

from __future__ import annotations

import hashlib
import threading

from cachetools import LRUCache

from .checked import CheckedItems
from .machineconfig import parse_machineconfigs

# A parsed base of HyperShift's real size (434 KB payload, 170 KB of YAML) holds ~0.5 MiB of
# Python objects; bursts of one cluster's renders need one, the round robin of a cold start
# (one lane per namespace) meets each cluster's base once per lap, which no small cache holds.
BASES = 8
ITEMS = 8192  # ~100 B a key: the bases' items, one cluster's own, the renders in flight


class RenderReuse:
    def __init__(self, *, bases: int = BASES, items: int = ITEMS) -> None:
        self.checked = CheckedItems(items)
        self._bases: LRUCache[bytes, tuple[dict, ...]] = LRUCache(bases)
        self._lock = threading.Lock()
        self.base_hits = 0
        self.base_misses = 0

    def base(self, yaml_text: str) -> list[dict]:
        """`parse_machineconfigs(yaml_text)`, parsed once while it stays in the cache. The
        MachineConfigs are shared: a render reads them and never changes them (it merges copies)."""
        key = hashlib.sha256(yaml_text.encode()).digest()
        with self._lock:
            found = self._bases.get(key)
            if found is not None:
                self.base_hits += 1
        if found is None:
            found = tuple(parse_machineconfigs(yaml_text, self.checked))  # InvalidConfig: not kept
            with self._lock:
                self.base_misses += 1
                self._bases[key] = found
        return list(found)
