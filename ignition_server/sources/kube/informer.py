"""List, then watch from the list's resourceVersion, for one kind in one scope (cluster-wide
or one namespace), as client-go's informers and kopf's watcher do.

A stream that ends is resumed from the last version seen (bookmarks keep it fresh); 410 Gone
(the version was compacted) lists again; any other fault backs off with jitter, honouring
Retry-After. All of that lives in `run`; what the events mean is the caller's (`Sink`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from .client import METADATA, METADATA_LIST, KubeClient, KubeError, collection_path

log = logging.getLogger("ignition_server.sources.kube")

BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0


class Sink(Protocol):
    async def listed(self, informer: "Informer", items: list[dict[str, Any]]) -> None: ...

    async def event(self, informer: "Informer", type_: str, obj: dict[str, Any]) -> None: ...

    def health(self, informer: "Informer", up: bool, restart_reason: str | None = None) -> None: ...


class Gone(Exception):
    """The resourceVersion to watch from was compacted: list again."""


def backoff_delays(base: float = BACKOFF_MIN, cap: float = BACKOFF_MAX, rng: random.Random | None = None):
    """Doubling delays with full jitter (a fleet of replicas does not reconnect in step)."""
    rng = rng or random.Random()
    attempt = 0
    while True:
        yield rng.uniform(base, min(cap, base * 2 ** attempt))
        attempt += 1


@dataclass
class Informer:
    client: KubeClient
    kind: str
    namespace: str | None  # None: every namespace
    sink: Sink
    metadata_only: bool = False
    watch_timeout: float = 300.0
    page_size: int = 500
    resource_version: str | None = None
    failing: str | None = field(default=None, repr=False)

    @property
    def scope(self) -> str:
        return f"{self.kind} in {self.namespace or 'every namespace'}"

    async def run(self, *, iterations: int | None = None) -> None:
        delays = backoff_delays()
        count = 0
        while iterations is None or count < iterations:
            count += 1
            try:
                if self.resource_version is None:
                    await self._list()
                await self._watch()
                self.sink.health(self, False, "ended")  # a stream that ends is normal: resume
                delays = backoff_delays()
            except asyncio.CancelledError:
                raise
            except (Gone, KubeError) as exc:
                if isinstance(exc, KubeError) and exc.status != 410:
                    await self._failed(exc, delays)
                    continue
                log.info("%s: resourceVersion %s expired, listing again", self.scope, self.resource_version)
                self.resource_version = None
                self.sink.health(self, False, "gone")
            except Exception as exc:
                await self._failed(exc, delays)

    async def _failed(self, exc: Exception, delays: Any) -> None:
        self.sink.health(self, False, "error")
        said = f"{type(exc).__name__}: {exc}"
        if said != self.failing:  # said once, not on every retry
            log.warning("%s: watch failed, retrying with back-off: %s", self.scope, said)
        self.failing = said
        retry_after = getattr(exc, "retry_after", None)
        await asyncio.sleep(max(next(delays), retry_after or 0.0))

    async def _list(self) -> None:
        items: list[dict[str, Any]] = []
        query: dict[str, Any] = {"limit": self.page_size}
        accept = METADATA_LIST if self.metadata_only else "application/json"
        while True:
            page = await self.client.request("list", "GET", collection_path(self.kind, self.namespace), query=query, accept=accept)
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
            query = {"limit": self.page_size, "continue": token}
        version = (page.get("metadata") or {}).get("resourceVersion")
        await self.sink.listed(self, items)
        self.resource_version = version
        self.failing = None

    async def _watch(self) -> None:
        query = {"resourceVersion": self.resource_version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": int(self.watch_timeout)}
        accept = METADATA if self.metadata_only else "application/json"
        stream = self.client.stream(collection_path(self.kind, self.namespace), query, accept, self.watch_timeout + 30)
        self.sink.health(self, True)
        async for event in stream:
            type_, obj = event.get("type"), event.get("object") or {}
            if type_ == "ERROR":
                if obj.get("code") == 410:
                    raise Gone()
                raise KubeError(int(obj.get("code") or 0), str(obj.get("message") or obj))
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if type_ != "BOOKMARK":
                await self.sink.event(self, str(type_), obj)
            if version:
                self.resource_version = version
            self.failing = None
