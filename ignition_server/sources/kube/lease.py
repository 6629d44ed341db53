"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Every replica serves; only the Lease holder writes (rotation, expiry, status, user-data).
A holder renews every `renew_interval`; a Lease not renewed for `lease_duration` may be
taken by another replica. Every change of the Lease is an update with its resourceVersion
as a precondition, so two replicas racing for it cannot both win. A holder that cannot
renew in time stops writing before its Lease can pass to another (`is_leader` turns false
once `lease_duration` has gone by since its last successful renewal).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .client import KubeClient, KubeError, collection_path, item_path

log = logging.getLogger("ignition_server.sources.kube.lease")


def _now_text(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def may_take(spec: dict[str, Any], identity: str, now: float) -> bool:
    """Whether `identity` may hold a Lease with this spec now (pure)."""
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:
        return True
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime")) or 0.0
    return now > renewed + float(spec.get("leaseDurationSeconds") or 0)


@dataclass
class LeaderElector:
    client: KubeClient
    namespace: str
    identity: str
    name: str = "ignition-server"
    lease_duration: float = 15.0
    renew_interval: float = 5.0
    clock: Callable[[], float] = time.time
    on_change: Callable[[bool], None] = lambda _leader: None
    _renewed_at: float | None = field(default=None, repr=False)  # monotonic time of our last successful renewal
    _leader: bool = False

    @property
    def is_leader(self) -> bool:
        if not self._leader or self._renewed_at is None:
            return False
        # Stop writing before another replica may take the Lease over.
        return time.monotonic() - self._renewed_at < self.lease_duration * 0.8

    async def run(self) -> None:
        while True:
            try:
                await self.try_acquire_or_renew()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("Lease %s/%s: %s", self.namespace, self.name, exc)
            self._set(self.is_leader)
            await asyncio.sleep(self.renew_interval if self._leader else self.renew_interval / 2)

    async def release(self) -> None:
        """Give the Lease up (a draining shutdown): another replica takes over at once."""
        if not self._leader:
            return
        self._set(False)
        try:
            lease = await self.client.request("get", "GET", item_path("Lease", self.namespace, self.name))
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                await self.client.request("update", "PUT", item_path("Lease", self.namespace, self.name), body=lease)
        except Exception as exc:  # it expires on its own
            log.info("Lease %s/%s not released: %s", self.namespace, self.name, exc)

    async def try_acquire_or_renew(self) -> bool:
        now = self.clock()
        started = time.monotonic()
        path = item_path("Lease", self.namespace, self.name)
        try:
            lease = await self.client.request("get", "GET", path)
        except KubeError as exc:
            if exc.status != 404:
                raise
            lease = None
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec({}, now, acquired=True)}
            try:
                await self.client.request("create", "POST", collection_path("Lease", self.namespace), body=body)
            except KubeError as exc:
                if exc.status == 409:
                    return self._lost()
                raise
            return self._won(started)
        spec = lease.get("spec") or {}
        if not may_take(spec, self.identity, now):
            return self._lost()
        lease["spec"] = self._spec(spec, now, acquired=spec.get("holderIdentity") != self.identity)
        try:
            await self.client.request("update", "PUT", path, body=lease)  # carries its resourceVersion
        except KubeError as exc:
            if exc.status == 409:
                return self._lost()
            raise
        return self._won(started)

    def _spec(self, spec: dict[str, Any], now: float, *, acquired: bool) -> dict[str, Any]:
        out = dict(spec)
        out.update({"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration),
                    "renewTime": _now_text(now)})
        if acquired:
            out["acquireTime"] = _now_text(now)
            out["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if spec.get("holderIdentity") else 0)
        return out

    def _won(self, started: float) -> bool:
        self._renewed_at = started
        if not self._leader:
            log.info("Lease %s/%s acquired by %s: this replica writes", self.namespace, self.name, self.identity)
        self._leader = True
        self._set(self.is_leader)
        return True

    def _lost(self) -> bool:
        if self._leader:
            log.warning("Lease %s/%s lost: this replica stops writing", self.namespace, self.name)
        self._leader = False
        self._set(False)
        return False

    def _set(self, leader: bool) -> None:
        self.on_change(leader)
