"""The Kubernetes source: the same objects as the file source, read and written live.

Secrets and ConfigMaps are listed and watched as metadata only (`PartialObjectMetadata`): a
namespace also holds keys this server has no business keeping (a service-account signing
key), and a tenant may fill its namespace with objects of any size, so only the objects the
reconciler reads (`wanted`: token Secrets, inputs, annotated catalogs, bases and keys,
user-data; or named by a token Secret) are fetched, one GET each when their metadata says they
changed, and kept (kept.py: versions, content, references, each namespace's budget). Events
are applied once: a version already seen (the echo of our own write, a replay after a
reconnect) changes nothing. What changed is handed over in the order it was kept.

    Informer per kind and scope (informer.py) ─ listed / event ─▶ KubeSource ─ GET (a watch event's:
        key_fetches.py) ─▶ KeptObjects.keep (kept.py) ─ Change ─▶ the handler (the reconciler)
    the reconciler's writes ─▶ KubeWrites (writes.py) ─ PATCH/POST/PUT/DELETE; the answer kept, handed over
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ...model.objects import ObjectKey, object_key
from ..events import Change, ChangeHandler, Ingesting, Mutation
from .client import API_VERSIONS, KubeClient, KubeError, item_path
from .informer import Informer
from .kept import NAMESPACE_BUDGET, KeptObjects, version
from .key_fetches import KeyFetches
from .writes import KubeWrites

log = logging.getLogger("ignition_server.sources.kube")

FETCH_CONCURRENCY = 16


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
    _kept: KeptObjects = field(init=False)  # the objects fetched, their versions, references, budget
    _writes: KubeWrites = field(init=False)
    _meta: dict[ObjectKey, dict[str, Any]] = field(default_factory=dict)  # every Secret and ConfigMap, metadata only
    _informers: list[Informer] = field(default_factory=list)
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
        self._kept = KeptObjects(references=self.references, namespace_budget=self.namespace_budget,
                                 on_over_budget=self.on_over_budget, on_refused=self._tell_later)
        self._writes = KubeWrites(client=self.client, kept=self._kept, fetch=self._fetch, hand_over=self._hand_over,
                                  trim=self.trim)
        self._event_fetches = KeyFetches(run=self._observe_event, present=lambda key: key in self._meta,
                                         lane_of=lambda key: key.namespace, concurrency=FETCH_CONCURRENCY)

    @property
    def writable(self) -> bool:
        return True

    def describe(self) -> str:
        return f"Kubernetes API ({', '.join(self.namespaces) or 'every namespace'})"

    def objects(self) -> dict[ObjectKey, dict[str, Any]]:
        return dict(self._kept.objects)

    def get(self, key: ObjectKey) -> dict[str, Any] | None:
        return self._kept.objects.get(key)

    def get_full(self, key: ObjectKey) -> dict[str, Any] | None:
        return self._kept.objects.get(key)

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
                     len(self._kept.objects), len(self._meta))
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
        for key in [k for k in list(self._kept.objects) if k not in seen and in_scope(k)]:
            changes.append(self._kept.forget(key))
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
            if key in self._kept.objects:
                await self._hand_over([self._kept.forget(key)])
            return
        self._meta[key] = obj.get("metadata") or {}
        if self._writes.in_flight(key, obj):
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
        if version(obj) and version(obj) <= self._kept.versions.get(key, -1):
            return None  # seen already: our own write's echo, or a replay
        if kind in self.extra_kinds:  # listed and watched whole (HostedControlPlanes): kept as they come
            return self._kept.keep(key, {**obj, "kind": kind, "apiVersion": obj.get("apiVersion", API_VERSIONS.get(kind, "v1"))})
        if not (self.wanted({**obj, "kind": kind}) or key in self._kept.referenced):
            return self._kept.forget(key) if key in self._kept.objects else None
        full = await self._fetch(key)
        if full is None or key not in self._meta:  # gone, or deleted while it was fetched
            return self._kept.forget(key) if key in self._kept.objects else None
        return self._kept.keep(key, {**full, "kind": kind, "apiVersion": full.get("apiVersion", "v1")})

    async def _fetch(self, key: ObjectKey) -> dict[str, Any] | None:
        async with self._fetches:
            try:
                return self.trim(await self.client.request("get", "GET", item_path(key.kind, key.namespace, key.name)))
            except KubeError as exc:
                if exc.status == 404:
                    return None
                raise

    async def _fetch_referenced(self) -> list[Change]:
        new = [k for k in self._kept.to_fetch if k in self._meta and k not in self._kept.objects and k in self._kept.referenced]
        self._kept.to_fetch.difference_update(new)
        changes = []
        for key in new:
            full = await self._fetch(key)
            if full is not None:
                change = self._kept.keep(key, {**full, "kind": key.kind, "apiVersion": full.get("apiVersion", "v1")})
                if change is not None:
                    changes.append(change)
        return changes

    def _tell_later(self, about: ObjectKey, reason: str, message: str) -> None:
        async def tell() -> None:
            try:
                await self.record_event(about, reason, message)
            except Exception as exc:  # the log said it already
                log.debug("could not record an Event on %s: %s", about, exc)

        asyncio.get_running_loop().create_task(tell(), name=f"event {about.ref}")

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

    # -- writing (writes.py) -----------------------------------------------------------------

    async def write_back(self, key: ObjectKey, mutate: Mutation) -> dict[str, Any] | None:
        return await self._writes.write_back(key, mutate)

    async def put(self, obj: dict[str, Any], *, beside: ObjectKey) -> None:
        await self._writes.put(obj, beside=beside)

    async def record_event(self, about: ObjectKey, reason: str, message: str, *, warning: bool = True) -> None:
        await self._writes.record_event(about, reason, message, warning=warning)

    async def delete(self, key: ObjectKey, *, resource_version: str | None = None) -> bool:
        return await self._writes.delete(key, resource_version=resource_version)

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._writes.create(obj)

    async def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._writes.replace(obj)
