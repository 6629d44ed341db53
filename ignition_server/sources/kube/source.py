"""The Kubernetes source: the same objects as the file source, read and written live.

Secrets and ConfigMaps are listed and watched as metadata only (`PartialObjectMetadata`): a
namespace also holds keys this server has no business keeping (a service-account signing
key), and a tenant may fill its namespace with objects of any size, so only the objects the
reconciler reads (`wanted`: token Secrets, inputs, annotated catalogs, bases and keys,
user-data; or named by a token Secret) are fetched, one GET each when their metadata says they
changed. What is kept whole is also bounded per namespace (`namespace_budget`): an object that
would take its namespace past it is refused, logged and told (an Event), and the namespace's
other objects keep their last good state; no tenant can run every replica out of memory.
Events are applied once: a version already seen (the echo of our own write, a replay after a
reconnect) changes nothing.

Write-back is a JSON merge patch of what the mutation changed, with the resourceVersion it
was made from as a precondition: a 409 (another writer came first) reads the object again
and applies the mutation to that, so two replicas never hand out two different new tokens.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ...model.objects import ObjectKey, object_key
from ..events import Change, ChangeHandler, Ingesting, Mutation
from .client import API_VERSIONS, MERGE_PATCH, KubeClient, KubeError, collection_path, item_path
from .informer import Informer
from .key_fetches import KeyFetches

log = logging.getLogger("ignition_server.sources.kube")

WRITE_ATTEMPTS = 10
FETCH_CONCURRENCY = 16
NAMESPACE_BUDGET = 64 << 20  # bytes of kept objects' values per namespace (a cluster's inputs are a few MiB)


def merge_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`."""
    patch: dict[str, Any] = {}
    for key in set(old) | set(new):
        if key not in new:
            patch[key] = None
        elif key not in old:
            patch[key] = copy.deepcopy(new[key])
        elif isinstance(old[key], dict) and isinstance(new[key], dict):
            inner = merge_diff(old[key], new[key])
            if inner:
                patch[key] = inner
        elif old[key] != new[key]:
            patch[key] = copy.deepcopy(new[key])
    return patch


def _version(obj: Mapping[str, Any]) -> int:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "0")
    return int(text) if text.isdigit() else 0


def _fingerprint(obj: Mapping[str, Any]) -> str:
    body = {k: v for k, v in obj.items() if k != "metadata"}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")}
    return hashlib.sha256(json.dumps([meta, body], sort_keys=True, default=str).encode()).hexdigest()


def _size(obj: Mapping[str, Any]) -> int:
    """What keeping `obj` costs, roughly: its values' lengths (metadata aside)."""
    return sum(len(str(value)) for section in ("data", "binaryData", "stringData")
               for value in (obj.get(section) or {}).values())


def _key(kind: str, obj: Mapping[str, Any]) -> ObjectKey | None:
    return object_key({**obj, "kind": kind})


@dataclass
class KubeSource:
    client: KubeClient
    # Which Secrets and ConfigMaps to fetch (their data): judged on metadata alone.
    wanted: Callable[[Mapping[str, Any]], bool]
    # Objects a fetched token Secret names as its inputs (fetched too, whatever their name).
    references: Callable[[Mapping[str, Any]], Iterable[ObjectKey]] = lambda _obj: ()
    namespaces: tuple[str, ...] = ()  # empty: every namespace the RBAC allows
    # Kinds listed and watched whole besides ConfigMaps and Secrets (HostedControlPlane: the takeover).
    extra_kinds: tuple[str, ...] = ()
    # What of a fetched Secret is kept (a private key the server never uses is dropped before
    # the object is kept anywhere: takeover.trim_secret).
    trim: Callable[[dict[str, Any]], dict[str, Any]] = lambda obj: obj
    watch_timeout: float = 300.0
    on_health: Callable[[str, bool, str | None], None] = lambda _kind, _up, _reason: None  # metrics, readiness
    namespace_budget: int = NAMESPACE_BUDGET  # 0: unbounded
    on_over_budget: Callable[[str], None] = lambda _namespace: None  # a metric, by namespace
    _objects: dict[ObjectKey, dict[str, Any]] = field(default_factory=dict)
    _fingerprints: dict[ObjectKey, str] = field(default_factory=dict)
    _versions: dict[ObjectKey, int] = field(default_factory=dict)
    _meta: dict[ObjectKey, dict[str, Any]] = field(default_factory=dict)  # every Secret and ConfigMap, metadata only
    _sizes: dict[ObjectKey, int] = field(default_factory=dict)  # what each kept object costs (_size)
    _namespace_bytes: collections.Counter[str] = field(default_factory=collections.Counter)
    _over_budget: set[str] = field(default_factory=set)  # namespaces said to be over budget (said once)
    # How many kept objects name each input Secret, and the ones named but not fetched yet:
    # kept up to date per object, so an event costs the same with 10 or 10,000 token Secrets.
    _referenced: collections.Counter[ObjectKey] = field(default_factory=collections.Counter)
    _refs: dict[ObjectKey, frozenset[ObjectKey]] = field(default_factory=dict)
    _to_fetch: set[ObjectKey] = field(default_factory=set)
    _informers: list[Informer] = field(default_factory=list)
    # Our own write in flight: its watch event can overtake its response; a GET for it would
    # only fetch what the response is about to say. Newer versions seen meanwhile, by key.
    _writing: dict[ObjectKey, int] = field(default_factory=dict)
    _first: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    _listed: asyncio.Event = field(default_factory=asyncio.Event)
    _handler: ChangeHandler | None = None
    _fetches: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(FETCH_CONCURRENCY))
    _event_fetches: KeyFetches[ObjectKey] = field(init=False)  # watch events' GETs, concurrently (key_fetches.py)
    # Changes to hand over, in the order their objects were kept, each with who waits for it:
    # one hand-over at a time (what a fetch finds, a write's answer), batched as they come.
    _ready: list[tuple[list[Change], asyncio.Future[None]]] = field(default_factory=list)
    _handing: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._event_fetches = KeyFetches(run=self._observe_event, present=lambda key: key in self._meta,
                                         lane_of=lambda key: key.namespace, concurrency=FETCH_CONCURRENCY)

    @property
    def writable(self) -> bool:
        return True

    def describe(self) -> str:
        return f"Kubernetes API ({', '.join(self.namespaces) or 'every namespace'})"

    def objects(self) -> dict[ObjectKey, dict[str, Any]]:
        return dict(self._objects)

    def get(self, key: ObjectKey) -> dict[str, Any] | None:
        return self._objects.get(key)

    def get_full(self, key: ObjectKey) -> dict[str, Any] | None:
        return self._objects.get(key)

    async def flush(self) -> None:
        return None

    # -- watching ----------------------------------------------------------------------------

    def attach(self, handler: ChangeHandler) -> None:
        """Hand every later batch of changes (the informers' events) to `handler`."""
        self._handler = handler

    async def run(self, handler: ChangeHandler, *, ingesting: Ingesting | None = None,
                  iterations: int | None = None) -> None:
        """List every kind, hand the whole listing over at once (it tells the reconciler what is
        gone), then follow the watches until cancelled. `ingesting` is not held: what a listing
        costs here is waiting on the API server's answers, not CPU that renders would take."""
        self.attach(handler)
        scopes: list[str | None] = list(self.namespaces) or [None]
        self._informers = [
            Informer(self.client, kind, namespace, self, metadata_only=kind not in self.extra_kinds,
                     watch_timeout=self.watch_timeout)
            for kind in ("ConfigMap", "Secret", *self.extra_kinds) for namespace in scopes
        ]
        tasks = [asyncio.create_task(i.run(iterations=iterations), name=f"watch {i.scope}") for i in self._informers]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            self._event_fetches.cancel()

    async def listed(self, informer: Informer, items: list[dict[str, Any]]) -> None:
        if not self._listed.is_set():
            self._first[id(informer)] = items
            if len(self._first) < len(self._informers):
                return
            everything = [(i, it) for i in self._informers for it in self._first.pop(id(i))]
            changes = await self._relist(everything, scopes=None)
            self._listed.set()
            log.info("listed %s: %d objects kept (%d Secrets and ConfigMaps seen, metadata only)", self.describe(),
                     len(self._objects), len(self._meta))
            await self._hand_over(changes, first=True)
            return
        await self._hand_over(await self._relist([(informer, it) for it in items], scopes=[informer]))

    async def _relist(self, items: list[tuple[Informer, dict[str, Any]]], scopes: list[Informer] | None) -> list[Change]:
        """Changes that bring what is kept in line with a listing (of `scopes`, or of everything)."""
        seen: set[ObjectKey] = set()
        changes: list[Change] = []
        for informer, obj in items:
            key = _key(informer.kind, obj)
            if key is None:
                continue
            seen.add(key)
            self._meta[key] = obj.get("metadata") or {}
        fetched = await asyncio.gather(*(self._observe(i.kind, obj) for i, obj in items))
        changes += [c for c in fetched if c is not None]
        changes += await self._fetch_referenced()
        in_scope = (lambda k: True) if scopes is None else (
            lambda k: any(k.kind == i.kind and (i.namespace is None or i.namespace == k.namespace) for i in scopes))
        for key in [k for k in list(self._objects) if k not in seen and in_scope(k)]:
            changes.append(self._forget(key))
        for key in [k for k in list(self._meta) if k not in seen and in_scope(k)]:
            del self._meta[key]
        return changes

    async def event(self, informer: Informer, type_: str, obj: dict[str, Any]) -> None:
        key = _key(informer.kind, obj)
        if key is None:
            return
        if type_ == "DELETED":
            self._meta.pop(key, None)
            self._event_fetches.forget(key)
            if key in self._objects:
                await self._hand_over([self._forget(key)])
            return
        self._meta[key] = obj.get("metadata") or {}
        if key in self._writing:
            self._writing[key] = max(self._writing[key], _version(obj))
            return
        self._event_fetches.add(key, informer.kind, obj)  # the stream reads on meanwhile

    async def _observe_event(self, kind: str, obj: dict[str, Any]) -> None:
        change = await self._observe(kind, obj)
        changes = [change] if change is not None else []
        changes += await self._fetch_referenced()
        await self._hand_over(changes)

    def health(self, informer: Informer, up: bool, restart_reason: str | None = None) -> None:
        self.on_health(informer.kind, up, restart_reason)

    async def _observe(self, kind: str, obj: dict[str, Any]) -> Change | None:
        """Keep (fetching its data first, if wanted) an object seen in a list or watch as metadata."""
        key = _key(kind, obj)
        assert key is not None
        if _version(obj) and _version(obj) <= self._versions.get(key, -1):
            return None  # seen already: our own write's echo, or a replay
        if kind in self.extra_kinds:  # listed and watched whole (HostedControlPlanes): kept as they come
            return self._keep(key, {**obj, "kind": kind, "apiVersion": obj.get("apiVersion", API_VERSIONS.get(kind, "v1"))})
        if not (self.wanted({**obj, "kind": kind}) or key in self._referenced):
            return self._forget(key) if key in self._objects else None
        full = await self._fetch(key)
        if full is None or key not in self._meta:  # gone, or deleted while it was fetched
            return self._forget(key) if key in self._objects else None
        return self._keep(key, {**full, "kind": kind, "apiVersion": full.get("apiVersion", "v1")})

    async def _fetch(self, key: ObjectKey) -> dict[str, Any] | None:
        async with self._fetches:
            try:
                return self.trim(await self.client.request("get", "GET", item_path(key.kind, key.namespace, key.name)))
            except KubeError as exc:
                if exc.status == 404:
                    return None
                raise

    def _track_references(self, key: ObjectKey, obj: Mapping[str, Any] | None) -> None:
        new = frozenset(self.references(obj)) if obj is not None else frozenset()
        old = self._refs.pop(key, frozenset())
        if new:
            self._refs[key] = new
        for gone in old - new:
            self._referenced[gone] -= 1
            if self._referenced[gone] <= 0:
                del self._referenced[gone]
        for named in new - old:
            self._referenced[named] += 1
            if named not in self._objects:
                self._to_fetch.add(named)

    async def _fetch_referenced(self) -> list[Change]:
        new = [k for k in self._to_fetch if k in self._meta and k not in self._objects and k in self._referenced]
        self._to_fetch.difference_update(new)
        changes = []
        for key in new:
            full = await self._fetch(key)
            if full is not None:
                change = self._keep(key, {**full, "kind": key.kind, "apiVersion": full.get("apiVersion", "v1")})
                if change is not None:
                    changes.append(change)
        return changes

    def _keep(self, key: ObjectKey, obj: dict[str, Any]) -> Change | None:
        if not self._within_budget(key, obj):
            return None  # its namespace keeps what it had: the last good state of each object
        self._versions[key] = _version(obj)
        self._track_references(key, obj)
        fingerprint = _fingerprint(obj)
        previous = self._fingerprints.get(key)
        self._objects[key] = obj
        self._fingerprints[key] = fingerprint
        if previous == fingerprint:
            return None
        return Change("MODIFIED" if previous is not None else "ADDED", key, obj)

    def _within_budget(self, key: ObjectKey, obj: Mapping[str, Any]) -> bool:
        """Account for keeping `obj`; False (said once per namespace, and an Event on the object)
        when that would take its namespace past the budget."""
        size, namespace = _size(obj), key.namespace
        total = self._namespace_bytes[namespace] - self._sizes.get(key, 0) + size
        if self.namespace_budget and total > self.namespace_budget:
            self.on_over_budget(namespace)
            if namespace not in self._over_budget:
                self._over_budget.add(namespace)
                log.error("namespace %s holds more than %d MiB of objects this server reads: %s (%d KiB) refused, "
                          "its last good state kept; delete what its NodePools do not need", namespace,
                          self.namespace_budget >> 20, key.ref, size >> 10)
            self._tell_later(key, "NamespaceOverBudget",
                             f"not read: namespace {namespace} holds more than {self.namespace_budget >> 20} MiB of "
                             "objects the ignition server reads")
            return False
        if namespace in self._over_budget and total <= self.namespace_budget * 0.9:
            self._over_budget.discard(namespace)
            log.info("namespace %s is within its budget again", namespace)
        self._namespace_bytes[namespace] = total
        self._sizes[key] = size
        return True

    def _tell_later(self, about: ObjectKey, reason: str, message: str) -> None:
        async def tell() -> None:
            try:
                await self.record_event(about, reason, message)
            except Exception as exc:  # the log said it already
                log.debug("could not record an Event on %s: %s", about, exc)

        asyncio.get_running_loop().create_task(tell(), name=f"event {about.ref}")

    def _forget(self, key: ObjectKey) -> Change:
        size = self._sizes.pop(key, 0)
        if size:
            self._namespace_bytes[key.namespace] -= size
        self._track_references(key, None)
        self._fingerprints.pop(key, None)
        self._versions.pop(key, None)
        gone = self._objects.pop(key, None) or {"kind": key.kind, "metadata": {"name": key.name, "namespace": key.namespace}}
        return Change("DELETED", key, gone)

    async def _hand_over(self, changes: list[Change], *, first: bool = False) -> None:
        """Hand `changes` over after those kept before them; returns once the handler has them."""
        if not (changes or first) or self._handler is None:
            return
        handed = asyncio.get_running_loop().create_future()
        self._ready.append((changes, handed))
        if self._handing is None or self._handing.done():
            self._handing = asyncio.get_running_loop().create_task(self._hand_over_ready(), name="hand over")
        await handed

    async def _hand_over_ready(self) -> None:
        assert self._handler is not None
        while self._ready:
            entries, self._ready = self._ready, []
            try:
                await self._handler([change for changes, _ in entries for change in changes])
            except Exception as exc:  # each waiter hears of it, as when it called the handler itself
                for _, handed in entries:
                    if not handed.done():
                        handed.set_exception(exc)
            else:
                for _, handed in entries:
                    if not handed.done():
                        handed.set_result(None)

    # -- writing -----------------------------------------------------------------------------

    async def write_back(self, key: ObjectKey, mutate: Mutation) -> dict[str, Any] | None:
        """Apply `mutate` to the object and patch what it changed, with the version it was
        made from as a precondition; on a conflict, read it again and start over."""
        self._writing[key] = 0
        try:
            return await self._write_back(key, mutate)
        finally:
            # Someone else's write seen while ours was in flight (not our own echo): catch up.
            seen = self._writing.pop(key, 0)
            if seen > self._versions.get(key, 0):
                newer = await self._fetch(key)
                change = self._keep(key, {**newer, "kind": key.kind}) if newer is not None else None
                if change is not None:
                    await self._hand_over([change])

    async def _write_back(self, key: ObjectKey, mutate: Mutation) -> dict[str, Any] | None:
        current = self._objects.get(key)
        for _ in range(WRITE_ATTEMPTS):
            fetched = current is None
            if current is None:
                current = await self._fetch(key)
                if current is None:
                    raise KeyError(f"{key} is not in the API server")
                current = {**current, "kind": key.kind}
            changed = copy.deepcopy(current)
            if not mutate(changed):
                if fetched:
                    await self._learn(key, current)
                return None
            patch = merge_diff(current, changed)
            patch.setdefault("metadata", {})["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
            try:
                written = await self.client.request(
                    "patch", "PATCH", item_path(key.kind, key.namespace, key.name), body=patch, content_type=MERGE_PATCH)
            except KubeError as exc:
                if exc.status == 409:
                    current = None  # someone else wrote first: read theirs, decide again
                    continue
                if exc.status == 404:
                    raise KeyError(f"{key} is gone from the API server") from None
                raise
            change = self._keep(key, {**written, "kind": key.kind})
            if change is not None:
                await self._hand_over([change])
            return written
        raise RuntimeError(f"{key} kept changing while writing it back")

    async def _learn(self, key: ObjectKey, obj: dict[str, Any]) -> None:
        """A version read while writing (after a conflict) is the newest this replica knows:
        hand it over now rather than decide again from the older one until the watch brings it."""
        if _version(obj) > self._versions.get(key, 0):
            change = self._keep(key, obj)
            if change is not None:
                await self._hand_over([change])

    async def put(self, obj: dict[str, Any], *, beside: ObjectKey) -> None:
        """Create an object, or bring an existing one in line with it."""
        key = object_key(obj)
        if key is None:
            raise ValueError("an object needs kind and metadata.name")

        def replace(current: dict[str, Any]) -> bool:
            wanted = {k: v for k, v in obj.items() if k != "metadata"}
            if all(current.get(k) == v for k, v in wanted.items()):
                return False
            current.update(copy.deepcopy(wanted))
            return True

        if key in self._objects:  # kept already (user-data is): one patch, no create that fails first
            await self.write_back(key, replace)
            return
        try:
            created = await self.client.request("create", "POST", collection_path(key.kind, key.namespace), body=obj)
        except KubeError as exc:
            if exc.status != 409:
                raise
        else:
            self._keep(key, {**created, "kind": key.kind})
            return
        await self.write_back(key, replace)

    async def record_event(self, about: ObjectKey, reason: str, message: str, *, warning: bool = True) -> None:
        """A core/v1 Event on the object (what `kubectl describe` shows)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        involved = self._objects.get(about, {}).get("metadata") or {}
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{about.name}.", "namespace": about.namespace},
            "involvedObject": {"apiVersion": self._objects.get(about, {}).get("apiVersion", "v1"), "kind": about.kind, "namespace": about.namespace, "name": about.name,
                               "uid": involved.get("uid"), "resourceVersion": involved.get("resourceVersion")},
            "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
            "source": {"component": "ignition-server"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        await self.client.request("create", "POST", collection_path("Event", about.namespace), body=body)

    async def delete(self, key: ObjectKey, *, resource_version: str | None = None) -> bool:
        """Delete an object (only at `resource_version`, when given). False when already gone."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if resource_version:
            body["preconditions"] = {"resourceVersion": resource_version}
        try:
            await self.client.request("delete", "DELETE", item_path(key.kind, key.namespace, key.name), body=body)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object as it is (a KubeError 409 when one of its name exists); kept and
        handed over as the API server answered."""
        key = object_key(obj)
        if key is None:
            raise ValueError("an object needs kind and metadata.name")
        created = await self.client.request("create", "POST", collection_path(key.kind, key.namespace), body=obj)
        await self._wrote(key, created)
        return created

    async def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace an object whole (PUT) at the resourceVersion it carries: a KubeError 409 when
        someone wrote since, 404 when it is gone. Kept and handed over as the API server answered."""
        key = object_key(obj)
        if key is None:
            raise ValueError("an object needs kind and metadata.name")
        written = await self.client.request("update", "PUT", item_path(key.kind, key.namespace, key.name), body=obj)
        await self._wrote(key, written)
        return written

    async def _wrote(self, key: ObjectKey, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            change: Change | None = self._forget(key) if key in self._objects else None  # its last finalizer went: gone
        else:
            change = self._keep(key, {**self.trim(obj), "kind": key.kind})
        if change is not None:
            await self._hand_over([change])
