"""What the Kubernetes source keeps of the objects it fetched, and what keeping them costs.

An object is kept with its resourceVersion (a version already seen, the echo of our own write
or a replay after a reconnect, changes nothing) and a fingerprint of its content (a re-list or
a write that changes no content is no change to hand over). Which input Secrets the kept
objects name is counted per object, so that an event costs the same with 10 or 10,000 token
Secrets. What is kept whole is bounded per namespace (`namespace_budget`): an object that would
take its namespace past it is refused, logged and told, and the namespace's other objects keep
their last good state; no tenant can run every replica out of memory.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ...model.objects import ObjectKey
from ..events import Change

log = logging.getLogger("ignition_server.sources.kube")

NAMESPACE_BUDGET = 64 << 20  # bytes of kept objects' values per namespace (a cluster's inputs are a few MiB)


def version(obj: Mapping[str, Any]) -> int:
    """The object's resourceVersion as a number (0: none, or not a number)."""
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "0")
    return int(text) if text.isdigit() else 0


def fingerprint(obj: Mapping[str, Any]) -> str:
    """The object's content, to tell a change from a new version that changes nothing.

    resourceVersion and managedFields are left out on purpose (so since the source's first
    version): an update that changes only them (an apply by another field manager with the same
    values) arrives as a newer version, and is no change to render or write for. A re-list at the
    versions already seen is skipped before this, by version. The takeover serializes
    trusted-ca-bundle-managed whole, these two fields included, as the CPO does: such an update
    reaches its machine-config-server ConfigMap at the takeover's resync, not at once (the CPO
    writes at once), and spares every NodePool of the cluster a base generation and a render for
    a change of bookkeeping (tests/sources/test_kube_kept.py)."""
    body = {k: v for k, v in obj.items() if k != "metadata"}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")}
    return hashlib.sha256(json.dumps([meta, body], sort_keys=True, default=str).encode()).hexdigest()


def size(obj: Mapping[str, Any]) -> int:
    """What keeping `obj` costs, roughly: its values' lengths (metadata aside)."""
    return sum(len(str(value)) for section in ("data", "binaryData", "stringData")
               for value in (obj.get(section) or {}).values())


@dataclass
class KeptObjects:
    # Objects a kept object names as its inputs (a token Secret's annotations): fetched too.
    references: Callable[[Mapping[str, Any]], Iterable[ObjectKey]]
    namespace_budget: int = NAMESPACE_BUDGET  # 0: unbounded
    on_over_budget: Callable[[str], None] = lambda _namespace: None  # a metric, by namespace
    # An object refused (key, reason, message): an Event on it, told later by the source.
    on_refused: Callable[[ObjectKey, str, str], None] = lambda _key, _reason, _message: None
    objects: dict[ObjectKey, dict[str, Any]] = field(default_factory=dict)
    versions: dict[ObjectKey, int] = field(default_factory=dict)
    # How many kept objects name each input Secret, and the ones named but not fetched yet.
    referenced: collections.Counter[ObjectKey] = field(default_factory=collections.Counter)
    to_fetch: set[ObjectKey] = field(default_factory=set)
    _fingerprints: dict[ObjectKey, str] = field(default_factory=dict)
    _refs: dict[ObjectKey, frozenset[ObjectKey]] = field(default_factory=dict)
    _sizes: dict[ObjectKey, int] = field(default_factory=dict)  # what each kept object costs (size)
    _namespace_bytes: collections.Counter[str] = field(default_factory=collections.Counter)
    _over_budget: set[str] = field(default_factory=set)  # namespaces said to be over budget (said once)

    def keep(self, key: ObjectKey, obj: dict[str, Any]) -> Change | None:
        """Keep `obj`; the change to hand over, None when its content is what was kept (or it was refused)."""
        if not self._within_budget(key, obj):
            return None  # its namespace keeps what it had: the last good state of each object
        self.versions[key] = version(obj)
        self._track_references(key, obj)
        content = fingerprint(obj)
        previous = self._fingerprints.get(key)
        self.objects[key] = obj
        self._fingerprints[key] = content
        if previous == content:
            return None
        return Change("MODIFIED" if previous is not None else "ADDED", key, obj)

    def forget(self, key: ObjectKey) -> Change:
        kept = self._sizes.pop(key, 0)
        if kept:
            self._namespace_bytes[key.namespace] -= kept
        self._track_references(key, None)
        self._fingerprints.pop(key, None)
        self.versions.pop(key, None)
        gone = self.objects.pop(key, None) or {"kind": key.kind, "metadata": {"name": key.name, "namespace": key.namespace}}
        return Change("DELETED", key, gone)

    def _within_budget(self, key: ObjectKey, obj: Mapping[str, Any]) -> bool:
        """Account for keeping `obj`; False (said once per namespace, and an Event on the object)
        when that would take its namespace past the budget."""
        cost, namespace = size(obj), key.namespace
        total = self._namespace_bytes[namespace] - self._sizes.get(key, 0) + cost
        if self.namespace_budget and total > self.namespace_budget:
            self.on_over_budget(namespace)
            if namespace not in self._over_budget:
                self._over_budget.add(namespace)
                log.error("namespace %s holds more than %d MiB of objects this server reads: %s (%d KiB) refused, "
                          "its last good state kept; delete what its NodePools do not need", namespace,
                          self.namespace_budget >> 20, key.ref, cost >> 10)
            self.on_refused(key, "NamespaceOverBudget",
                            f"not read: namespace {namespace} holds more than {self.namespace_budget >> 20} MiB of "
                            "objects the ignition server reads")
            return False
        if namespace in self._over_budget and total <= self.namespace_budget * 0.9:
            self._over_budget.discard(namespace)
            log.info("namespace %s is within its budget again", namespace)
        self._namespace_bytes[namespace] = total
        self._sizes[key] = cost
        return True

    def _track_references(self, key: ObjectKey, obj: Mapping[str, Any] | None) -> None:
        new = frozenset(self.references(obj)) if obj is not None else frozenset()
        old = self._refs.pop(key, frozenset())
        if new:
            self._refs[key] = new
        for gone in old - new:
            self.referenced[gone] -= 1
            if self.referenced[gone] <= 0:
                del self.referenced[gone]
        for named in new - old:
            self.referenced[named] += 1
            if named not in self.objects:
                self.to_fetch.add(named)
