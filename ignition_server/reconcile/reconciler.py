"""The dispatcher: each source change updates the indexes it touches and queues the NodePools it concerns.

It does nothing else: what happens to a NodePool is `NodePools.reconcile` (nodepools.py),
run by the fair work queue (work_queue.py). One token Secret change, from the source to the cache:

1. the source (sources/) hands a batch of changes to `Reconciler.handle`, oldest first; the
   queue is held while the batch is applied, so a listing is applied whole (catalogs, bases,
   mirror sets, every token Secret) before any NodePool is reconciled; a fault stays with its
   object (`faults`, retried with back-off through `work`);
2. `_index_token_secret` parses it; `rotation.restore` (rotation.py) applies a rotation kept in
   the cache dir; `tokens.holds_anothers_token` refuses a Secret holding another's token;
   `tokens.put` (token_secrets.py) writes its tokens into the cache's token index, which is what
   a node's request is checked against (auth/tokens.py): from here its token is known (never 511);
3. `nodepools.schedule` queues its key (a first payload ahead of re-renders); a change to any
   other object queues the NodePools that read it (`nodepools.inputs_changed`, the input graph);
4. after the batch, `rotation.expire_outdated` gives the NodePool's older Secrets an expiry.

What happens on the clock instead (rotation when due, expiry) is Housekeeping
(housekeeping.py); wiring.py builds these objects and hands them in.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

from payload_cache import PayloadCache

from .. import memory
from ..metrics import ServerMetrics
from ..model.objects import ManifestError, ObjectKey, has_large_values, secret_key
from ..model.token_secret import TokenSecret, is_token_secret, parse_token_secret
from ..registry.mirrors import is_mirror_set
from ..sources.events import Change, Source
from .bases import BaseIndex, is_base
from .claims import Claims, is_claims_object
from .faults import Faults
from .generated_bases import GeneratedBaseWaits, is_generated_base
from .input_graph import InputGraph
from .nodepools import NodePools
from .object_work import ObjectWork
from .release_waits import ReleaseWaits
from .releases import Releases, is_catalog, release_key
from .rotation import Rotation
from .status import Status
from .takeover import Takeover
from .tenancy import Tenancy, generation_group, oldest_first
from .token_secrets import TokenSecrets
from .trust import TrustWatcher, is_trust_object
from .write_backs import WriteBacks

log = logging.getLogger("ignition_server.reconcile")


@dataclass
class Reconciler:
    source: Source
    cache: PayloadCache  # a gone Secret's payload is dropped from it
    metrics: ServerMetrics
    tokens: TokenSecrets  # the token Secrets served, and what their tokens open
    rotation: Rotation  # a rotation kept in the cache dir; outdated Secrets' expiry
    nodepools: NodePools  # what happens to each NodePool, run by the fair work queue
    input_graph: InputGraph  # what each token Secret reads, and who reads each object
    write_backs: WriteBacks  # status, user-data of gone Secrets
    release_waits: ReleaseWaits  # NodePools waiting for a release; mirror sets
    base_waits: GeneratedBaseWaits  # NodePools waiting for a generated MCO base
    releases: Releases  # the release catalog (and the registry resolver, mirrors)
    bases: BaseIndex  # MCO base configurations by (cluster, release)
    tenancy: Tenancy  # which namespaces may shape a NodePool besides its own
    faults: Faults
    work: ObjectWork  # write-backs and retries, queued per object (never awaited by the handler)
    trust: TrustWatcher | None = None  # service-account signing keys
    claims: Claims | None = None  # who held a contested key or token first
    claims_namespace: str | None = None  # where the writer publishes them (Kubernetes mode): read from there only
    takeover: Takeover | None = None  # --take-over: told of every change, queues the HCPs it concerns
    _listed: bool = False

    # -- source events -------------------------------------------------------------

    async def handle(self, changes: list[Change]) -> None:
        with self.nodepools.queue.held():  # the batch whole, then the NodePools it queued
            await self._apply_batch(changes)

    async def _apply_batch(self, changes: list[Change]) -> None:
        touched_pools: set[tuple[str, str]] = set()
        # The recorded contests first: a listing judges every claim by them, not by creation time.
        for change in sorted(oldest_first(changes), key=lambda c: not self._is_published_claims(c)):
            # One object's fault stays with that object: logged once, retried with back-off,
            # while every other change of the batch (and every later one) is applied.
            self.work.discard(change.key.ref, "parse")  # a retry of an older version is moot
            if self.takeover is not None:
                self.takeover.changed(change)
            try:
                nodepool = await self._handle_one(change)
            except Exception as exc:
                delay = self.faults.failed("parse", change.key.ref, exc)
                self.work.retry(change.key.ref, "parse", partial(self._handle_again, change), delay)
                continue
            self.faults.succeeded("parse", change.key.ref)
            if nodepool is not None:
                touched_pools.add(nodepool)
        if not self._listed:
            self._after_first_listing()
            self._listed = True
            await asyncio.to_thread(memory.release)  # parsing the whole source left garbage behind
        self.rotation.expire_outdated(touched_pools)

    async def _handle_again(self, change: Change) -> None:
        nodepool = await self._handle_one(change)
        if nodepool is not None:
            self.rotation.expire_outdated({nodepool})

    async def _handle_one(self, change: Change) -> tuple[str, str] | None:
        """Apply one change; the generation group of a token Secret it added or changed."""
        key = change.key
        touched = None
        if change.type != "DELETED" and has_large_values(change.obj) and (is_catalog(change.obj) or is_trust_object(change.obj) or is_generated_base(change.obj)):
            full = await asyncio.to_thread(self.source.get_full, key)
            change = Change(change.type, key, full if full is not None else change.obj)
        if self._is_published_claims(change) and self.claims is not None and change.type != "DELETED":
            self.claims.published(change.obj)
            return None
        if self.trust is not None:
            self.trust.handle(change)
        if not self._may_shape_every_tenant(change):
            change = Change("DELETED", key, change.obj)  # as if absent; it is not used for anything shared
        if key.kind == "ConfigMap" and (is_catalog(change.obj) or self.releases.catalog.knows(key)):
            for pull_spec in self.releases.catalog.update(key, None if change.type == "DELETED" else change.obj):
                self.nodepools.inputs_changed(release_key(pull_spec))
        if key.kind == "ConfigMap" and (is_base(change.obj) or self.bases.knows(key)):
            for dependency in self.bases.update(key, None if change.type == "DELETED" else change.obj):
                self.nodepools.inputs_changed(dependency)
        if key.kind == "ConfigMap" and change.type != "DELETED" and is_generated_base(change.obj):
            self.base_waits.published(change.obj)
        if is_mirror_set(change.obj) or (key.kind in ("ImageDigestMirrorSet", "ImageTagMirrorSet")):
            self.release_waits.mirror_set_changed(key, None if change.type == "DELETED" else change.obj)
        if key.kind == "Secret":
            if change.type != "DELETED" and is_token_secret(change.obj):
                secret = self._index_token_secret(key, change.obj)
                if secret is not None:
                    touched = generation_group(secret)
            else:
                refused = self.tokens.forget_refusal(key)
                if self.tokens.get(key) is not None:
                    deleted = change.type == "DELETED"
                    self._forget_secret(key, "its token Secret was deleted" if deleted else "it is no longer a token Secret",
                                        deleted=deleted)
                elif refused:
                    return None
        if self.input_graph.is_read(key):
            self.nodepools.inputs_changed(key)
        return touched

    def _is_published_claims(self, change: Change) -> bool:
        """The writer's record of contests, from the server's own namespace (no tenant writes there)."""
        return change.key.kind == "Secret" and change.key.namespace == self.claims_namespace \
            and is_claims_object(change.obj)

    def _may_shape_every_tenant(self, change: Change) -> bool:
        """Release catalogs, published generated bases and mirror sets shape the payloads of
        every NodePool that uses them, whatever its namespace: they count only from a shared
        namespace (mirror sets also cluster-scoped, as OpenShift's are)."""
        if change.type == "DELETED":
            return True
        obj, namespace = change.obj, change.key.namespace
        shaping = is_catalog(obj) or is_generated_base(obj) or is_mirror_set(obj) or \
            change.key.kind in ("ImageDigestMirrorSet", "ImageTagMirrorSet")
        if not shaping or self.tenancy.is_shared(namespace):
            return True
        if is_mirror_set(obj) and not (obj.get("metadata") or {}).get("namespace"):
            return True  # cluster-scoped, as OpenShift's are: only a cluster admin writes those
        log.warning("%s %s is ignored: a release catalog, generated base or mirror set shapes other namespaces' "
                    "NodePools, and %s is not a shared namespace (%s)", change.key.kind, change.key.ref, namespace,
                    self.tenancy.describe())
        self.metrics.tenancy_refusals.labels(what="shared-object").inc()
        return False

    def _index_token_secret(self, key: ObjectKey, obj: dict[str, Any]) -> TokenSecret | None:
        try:
            secret = parse_token_secret(obj)
        except ManifestError as exc:
            # Bad input loses nothing: the last good tokens and payload keep serving.
            log.error("token Secret %s is invalid, keeping its last good state: %s", key, exc)
            self.write_backs.status_later(key, obj, Status("InvalidConfig", f"cannot read the token Secret: {exc}"))
            return None
        self.tokens.seen(secret)
        secret = self.rotation.restore(secret)
        if self.tokens.holds_anothers_token(secret):
            if self.tokens.get(key) is not None:
                self._forget_secret(key, "it now holds another Secret's token")
            self.write_backs.status_later(key, obj, Status(
                "InvalidConfig", "refused: a token of this Secret is already held by another token Secret; "
                                 "generate a new token"))
            return None
        self.tokens.put(secret)
        self.nodepools.schedule(secret)
        return secret

    def _forget_secret(self, key: ObjectKey, why: str, *, deleted: bool = False) -> None:
        self.input_graph.forget(key)
        gone = self.tokens.remove(key)
        if gone is not None and deleted:
            self.write_backs.orphaned_user_data(gone)
            if self.claims is not None:
                self.claims.release(key.ref)
        self.nodepools.forget(key)
        self.work.cancel(key.ref)
        self.faults.forget(key.ref)
        self.rotation.forget(key)
        if self.cache.get_render(key.ref) is not None:
            self.cache.drop_render(key.ref)
            log.info("dropped the payload of %s: %s", key.ref, why)
        self.metrics.payloads_cached.set(self.cache.render_count())

    def _after_first_listing(self) -> None:
        # The index was loaded before the source answered; what it holds for Secrets the
        # source no longer has was deleted while we were down.
        present = {key.ref for key in self.tokens.secrets}
        for record in self.cache.renders():
            if record.secret not in present:
                self._forget_secret(secret_key(record.secret), "deleted while the server was down")

    # -- what the server asks (through wiring.Reconciliation) --------------------------

    def payload_missing(self, secret_ref: str) -> None:
        """A request found no usable payload for a Secret the index serves: render it, first."""
        self.nodepools.payload_missing(secret_ref)

    def note_served(self, secret_ref: str) -> None:
        """A node got its payload (`ignition-reached`, written once, off the request path)."""
        self.write_backs.note_served(secret_ref)

    async def drain(self, timeout: float) -> None:
        """Let write-backs in flight finish (a draining shutdown loses no status or rotation);
        reconciles not begun are left to the next start (the cache says what is current)."""
        self.nodepools.queue.cancel()
        if self.takeover is not None:
            self.takeover.cancel()
        await self.work.drain(timeout)
