"""Taking over from HyperShift's ignition server (issue 29): for each HostedControlPlane annotated
`hypershift.openshift.io/disable-ignition-server`, keep in its namespace what the CPO stops writing.

    reconcile(hcp key)                      (on its own WorkQueue: one lane per namespace)
      not the writer? queued again once this replica is (asked every `standby` seconds)
      HCP gone, deleting or not annotated? let our CA Secret go (finalizer off, deleted); nothing else
      takeover.plan(hcp, inputs, ConfigMaps) ─ writes: create/replace with the resourceVersion read;
                                               deletes: with the resourceVersion read
      ca_cert.keep(CA Secret)                ─ present, ours, with our finalizer and our CA
      failed? logged once, an Event on the HCP, again after back-off (`add_later`)
      done: looked at again after `resync` (a CA rotation, a lost event)

The dispatcher (reconciler.py) only calls `changed` for each source change, which queues the
HCPs it concerns: the HCP itself, an input it reads (root-ca, pull-secret, kubelet-client-ca,
trusted-ca-bundle-managed, its SSH key Secret), a ConfigMap it keeps, the CA Secret. Everything
is read from the source as it keeps it: the HCP as watched, the Secrets and ConfigMaps it reads
fetched whole for annotated HCPs only (`ca_cert.references`), the Secrets trimmed of private keys
(`ca_cert.trim_secret`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..basegen.steps import FEATURE_GATE
from ..model.objects import ObjectKey, object_key
from ..sources.events import Change
from ..takeover import ca_cert, feature_gate
from ..takeover.mcs_config import NAME as MCS_NAME, configuration_hash
from ..takeover.owned import HCP_KIND, Named, ignition_hostname, ssh_key_secret_name, taken_over
from ..takeover.plan import MANAGED, plan
from .faults import Faults
from .work_queue import WorkQueue

log = logging.getLogger("ignition_server.reconcile.takeover")

STEP = "takeover"
RACED = 1.0  # someone wrote first (409): decide again this soon, from what the watch brings
MAX_RACES = 5  # ... this many times in a row; then it is a fault like any other
_INPUTS = {("Secret", Named.ROOT_CA), ("Secret", Named.PULL_SECRET), ("ConfigMap", Named.KUBELET_CLIENT_CA),
           ("ConfigMap", Named.TRUSTED_CA_BUNDLE), ("Secret", ca_cert.NAME),
           *(("ConfigMap", name) for name in MANAGED)}


class TakeoverSource(Protocol):
    """What the takeover needs of the source (the Kubernetes source has it all)."""

    def get(self, key: ObjectKey) -> dict[str, Any] | None: ...

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    async def replace(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    async def delete(self, key: ObjectKey, *, resource_version: str | None = None) -> bool: ...

    async def record_event(self, about: ObjectKey, reason: str, message: str, *, warning: bool = True) -> None: ...


@dataclass
class Takeover:
    source: TakeoverSource
    writer: Callable[[], bool]  # only the Lease holder writes
    ca_pem: Callable[[], bytes | None]  # the CA bundle this server's pointer configs trust (None: none known)
    faults: Faults
    standby: float = 1.0  # a replica that does not write asks this often whether it has become the writer
    resync: float = 600.0  # every taken-over HCP is looked at again this often (a CA rotation)
    concurrency: int = 2
    managed_service: str = ""  # the CPO's MANAGED_SERVICE (--managed-service): ARO-HCP's private-endpoint fallback
    queue: WorkQueue[ObjectKey] = field(init=False)
    _hcps: dict[str, set[ObjectKey]] = field(default_factory=dict)  # namespace -> HCPs seen there
    _said: dict[ObjectKey, str] = field(default_factory=dict)  # the failure last reported (log and Event), by HCP
    _races: dict[ObjectKey, int] = field(default_factory=dict)  # conflicts in a row, by HCP
    _standing_by: set[ObjectKey] = field(default_factory=set)  # not the writer: queued again once it is
    _standby_timer: asyncio.TimerHandle | None = None
    # Every replica serves: told the taken-over HCPs' Route hostnames whenever they change (tls/sni.py).
    on_hosts: Callable[[frozenset[str]], None] | None = None
    _routes: dict[ObjectKey, str] = field(default_factory=dict)  # taken-over HCP -> its Ignition Route's hostname
    _hosts_told: bool = False  # a call of on_hosts is scheduled

    def __post_init__(self) -> None:
        self.queue = WorkQueue(self.reconcile, lane_of=lambda key: key.namespace, concurrency=self.concurrency)

    # -- what the dispatcher calls ---------------------------------------------------------

    def changed(self, change: Change) -> None:
        """Queue the HCPs a source change concerns (nothing else happens here)."""
        key = change.key
        if key.kind == HCP_KIND:
            self._hcps.setdefault(key.namespace, set()).add(key)  # kept until its CA Secret is let go
            self._route_changed(key)
            self.queue.add(key)
            return
        if key.kind not in ("Secret", "ConfigMap"):
            return
        for hcp_key in self._hcps.get(key.namespace, ()):
            if (key.kind, key.name) in _INPUTS or (key.kind == "Secret" and key.name == self._ssh_key_name(hcp_key)):
                self.queue.add(hcp_key)

    def _route_changed(self, key: ObjectKey) -> None:
        hcp = self.source.get(key)
        host = ignition_hostname(hcp) if hcp is not None and taken_over(hcp) else ""
        if self._routes.get(key, "") == host:
            return
        if host:
            self._routes[key] = host
        else:
            self._routes.pop(key, None)
        if self.on_hosts is None or self._hosts_told:
            return
        # Told once per batch of changes (a first listing of 440 HCPs is one file write, not 440).
        self._hosts_told = True
        try:
            asyncio.get_running_loop().call_soon(self._tell_hosts)
        except RuntimeError:  # no loop (a synchronous caller): now
            self._tell_hosts()

    def _tell_hosts(self) -> None:
        self._hosts_told = False
        if self.on_hosts is not None:
            self.on_hosts(frozenset(self._routes.values()))

    def feature_gate(self, namespace: str, config_hash: str) -> str | None:
        """The FeatureGate of the namespace's taken-over HCP, as its ignition-server Deployment would
        carry it, when machine-config-server (`config_hash`) was written for the HCP as it is now
        (None: not yet, its rewrite comes); HyperShift's default where no HCP is taken over."""
        for key in self._hcps.get(namespace, ()):
            hcp = self.source.get(key)
            if hcp is None or not taken_over(hcp):
                continue
            return feature_gate.manifest(hcp) if configuration_hash(hcp) == config_hash else None
        return FEATURE_GATE

    def _ssh_key_name(self, hcp_key: ObjectKey) -> str:
        hcp = self.source.get(hcp_key)
        return ssh_key_secret_name(hcp) if hcp is not None else ""

    def cancel(self) -> None:
        self.queue.cancel()
        if self._standby_timer is not None:
            self._standby_timer.cancel()
            self._standby_timer = None

    def standing_by(self, key: ObjectKey) -> bool:
        return key in self._standing_by

    def _stand_by(self, key: ObjectKey) -> None:
        """Not the writer: one timer for every such HCP asks whether this replica has become it."""
        self._standing_by.add(key)
        if self._standby_timer is None:
            self._standby_timer = asyncio.get_running_loop().call_later(self.standby, self._look_again)

    def _look_again(self) -> None:
        self._standby_timer = None
        if not self.writer():
            if self._standing_by:
                self._standby_timer = asyncio.get_running_loop().call_later(self.standby, self._look_again)
            return
        keys, self._standing_by = self._standing_by, set()
        for key in keys:
            self.queue.add(key)

    # -- one HCP ---------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey) -> None:
        hcp = self.source.get(key)
        if not self.writer():
            # It may become the writer: look again, for the HCPs it would write for.
            if (hcp is not None and taken_over(hcp)) or self.source.get(ObjectKey("Secret", key.namespace, ca_cert.NAME)):
                self._stand_by(key)
            return
        try:
            if hcp is None or not taken_over(hcp) or ca_cert.deleting(hcp):
                await self._let_go(key, hcp)
                return
            problems = await self._keep(key, hcp)
        except Exception as exc:  # an API error: read again and decide again, later
            if getattr(exc, "status", None) == 409 and self._races.get(key, 0) < MAX_RACES:
                self._races[key] = self._races.get(key, 0) + 1  # a write raced ours: not a fault (yet)
                log.info("%s: %s; deciding again", key, exc)
                self.queue.add_later(key, RACED)
                return
            problems = [f"{type(exc).__name__}: {exc}"]
        else:
            self._races.pop(key, None)
        if problems:
            await self._failed(key, "; ".join(problems))
            return
        if key in self._said:
            del self._said[key]
            self.faults.succeeded(STEP, key.ref)
            await self._event(key, "IgnitionTakeoverSucceeded", "the ignition ConfigMaps and CA Secret are current",
                              warning=False)
        self.queue.add_later(key, self.resync)

    async def _keep(self, key: ObjectKey, hcp: dict[str, Any]) -> list[str]:
        """Write what the plan says and keep the CA Secret; the problems that remain."""
        namespace = key.namespace

        def get(kind: str, name: str) -> dict[str, Any] | None:
            return self.source.get(ObjectKey(kind, namespace, name)) if name else None

        named = Named(root_ca=get("Secret", Named.ROOT_CA), pull_secret=get("Secret", Named.PULL_SECRET),
                      kubelet_client_ca=get("ConfigMap", Named.KUBELET_CLIENT_CA),
                      trusted_ca_bundle=get("ConfigMap", Named.TRUSTED_CA_BUNDLE),
                      ssh_key=get("Secret", ssh_key_secret_name(hcp)))
        existing = {name: obj for name in MANAGED if (obj := get("ConfigMap", name)) is not None}
        problems = []
        try:
            planned = plan(hcp, named, existing, self.managed_service)
        except ValueError as exc:  # MissingInput for a core ConfigMap (the SSH key), NotSerializable
            problems.append(str(exc))
        else:
            # machine-config-server first: the NodePool controller makes token Secrets once it counts
            # the core ConfigMaps, and a token Secret's render reads machine-config-server.
            for obj in sorted(planned.writes, key=lambda cm: cm["metadata"]["name"] != MCS_NAME):
                await self._write(obj)
            for obj in planned.deletes:
                await self._delete(obj)
            if planned.error is not None:
                problems.append(f"machine-config-server is not written: {planned.error}")
        ca_pem = self.ca_pem()
        if ca_pem is None:
            problems.append(f"Secret {ca_cert.NAME} is not written: this server has no CA of its own to publish "
                            "(run with the self-made CA and --public-url)")
        else:
            step = ca_cert.keep(get("Secret", ca_cert.NAME), ca_cert.wanted(hcp, ca_pem))
            if step is not None and step.action == "wait":
                problems.append(step.why)
            elif step is not None:
                await self._run(step)
        return problems

    async def _let_go(self, key: ObjectKey, hcp: dict[str, Any] | None) -> None:
        """The HCP is gone, being deleted, or no longer annotated: our CA Secret goes (the CPO's
        ConfigMaps are the CPO's again; we leave them as they are)."""
        written: dict[str, Any] | None = None
        for step in ca_cert.release(self.source.get(ObjectKey("Secret", key.namespace, ca_cert.NAME))):
            if step.action == "delete" and written is not None:
                step = ca_cert.Step("delete", written)  # at the version the finalizer's removal left
            written = await self._run(step)
        if hcp is None:
            self._hcps.get(key.namespace, set()).discard(key)
        self._said.pop(key, None)
        self._races.pop(key, None)
        self.faults.forget(key.ref)

    # -- writing ---------------------------------------------------------------------------

    async def _run(self, step: ca_cert.Step) -> dict[str, Any] | None:
        if step.action == "create" or step.action == "replace":
            return await self._write(step.obj)
        if step.action == "delete":
            await self._delete(step.obj)
        return None

    async def _write(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create (no resourceVersion) or replace (at the resourceVersion read: a 409 if someone wrote since)."""
        if (obj.get("metadata") or {}).get("resourceVersion"):
            written = await self.source.replace(obj)
            log.info("updated %s", object_key(obj))
        else:
            written = await self.source.create(obj)
            log.info("created %s", object_key(obj))
        return written

    async def _delete(self, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        assert key is not None
        await self.source.delete(key, resource_version=(obj.get("metadata") or {}).get("resourceVersion"))
        log.info("deleted %s", key)

    # -- failing ---------------------------------------------------------------------------

    async def _failed(self, key: ObjectKey, why: str) -> None:
        delay = self.faults.failed(STEP, key.ref, why)  # logged once while it stays the same
        if self._said.get(key) != why:
            self._said[key] = why
            await self._event(key, "IgnitionTakeoverFailed", why)
        self.queue.add_later(key, delay)

    async def _event(self, key: ObjectKey, reason: str, message: str, *, warning: bool = True) -> None:
        try:
            await self.source.record_event(key, reason, message, warning=warning)
        except Exception as exc:  # the Event is a courtesy; the log has it
            log.info("no Event on %s: %s", key, exc)
