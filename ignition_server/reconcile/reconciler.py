"""The watcher: turns source changes into token index entries, renders and write-backs.

It owns every side effect between the source and the cache: the HTTP app only reads the
index and the blobs this keeps up to date. This module keeps the token index and the
housekeeping tick, and composes objects that own their state: which NodePools read which
objects (InputGraph, input_graph.py), when each renders (RenderScheduler, renders.py), the
NodePools waiting for a release (ReleaseWaits, release_waits.py) or for a generated base
(GeneratedBaseWaits, generated_bases.py). The writer's duties (writes.py) are still mixed in.

One Secret change: `handle` -> `_apply` (index its tokens) -> `renders.schedule` (which asks
`release_waits.blocked` and `base_waits.blocked`, then renders into the cache) -> the
status write-back (`write_backs.status_later`, write_backs.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import InitVar, dataclass, field
from typing import Any, Callable

from payload_cache import PayloadCache, TokenRecord, TokenState

from ..auth.tokens import Grant
from ..auth.rotation_policy import RotationPolicy
from .. import memory
from ..metrics import ServerMetrics
from ..sources.events import Change, Source
from ..model.objects import ManifestError, ObjectKey, has_large_values
from ..model.token_secret import TokenSecret, is_token_secret, parse_token_secret
from .bases import BaseIndex, is_base
from .faults import Faults, ObjectWork
from .input_graph import InputGraph
from .generated_bases import GeneratedBaseWaits, is_generated_base
from ..basegen.generator import BaseGenerator
from .outputs import TokenOutputs
from ..registry.mirrors import is_mirror_set
from .release_waits import ReleaseWaits
from .releases import ReleaseCatalog, Releases, is_catalog, release_key
from .renders import Renderer, RenderScheduler
from .status import Status
from .write_backs import WriteBacks
from .writes import WriterDuties
from .tenancy import Tenancy, generation_group, oldest_first
from .trust import TrustWatcher, is_trust_object

log = logging.getLogger("ignition_server.reconcile")

GC_INTERVAL = 600.0


def _pool_of(secret: TokenSecret) -> tuple[str, str]:
    return (secret.key.namespace, secret.nodepool.partition("/")[2])


@dataclass
class Reconciler(WriterDuties):
    source: Source
    cache: PayloadCache
    renderer: Renderer
    policy: RotationPolicy
    metrics: ServerMetrics
    render_concurrency: int = 2
    clock: Callable[[], float] = time.time
    trust: TrustWatcher | None = None
    outputs: TokenOutputs | None = None
    debounce: float = 0.05  # a burst of changes to one NodePool's inputs renders once
    # The catalog, the registry resolver and mirrors (the resolver calls release_waits.resolved).
    releases: Releases = field(default_factory=Releases)
    share_namespace: str | None = None  # several replicas: the writer publishes resolved releases here
    # Which namespaces may shape a NodePool besides its own (--shared-namespaces); by default none.
    tenancy: Tenancy = field(default_factory=Tenancy)
    bases: BaseIndex = field(default_factory=BaseIndex)  # MCO base configurations by (cluster, release)
    # --generate-bases: bases the release's MCO generates (it calls base_waits.generated); base_waits owns it
    generator: InitVar[BaseGenerator | None] = None
    # Whether this replica writes (rotation, expiry, status, user-data, ignition-reached):
    # with several replicas only the Lease holder does; every replica indexes and serves.
    writer: Callable[[], bool] = lambda: True
    prune_grace: float = 60.0  # an expired token Secret is deleted this long after its expiry (sources that can)
    secrets: dict[ObjectKey, TokenSecret] = field(default_factory=dict)
    _order: dict[ObjectKey, int] = field(default_factory=dict)  # first-seen order, for ties
    _source_tokens: dict[ObjectKey, str | None] = field(default_factory=dict)  # token as the source holds it
    _pools: dict[tuple[str, str], set[ObjectKey]] = field(default_factory=dict)  # (namespace, pool name) -> Secrets
    _by_nodepool: dict[tuple[str, str], set[ObjectKey]] = field(default_factory=dict)  # generation_group -> its Secrets
    input_graph: InputGraph = field(default_factory=InputGraph)  # what each token Secret reads, and who reads each object
    _listed: asyncio.Event = field(default_factory=asyncio.Event)
    _next_flush: asyncio.Future[None] | None = None
    _seq: int = 0
    _duplicates: set[ObjectKey] = field(default_factory=set)  # token Secrets refused for another's token
    # Secrets whose rotation lives in the cache dir although the source is writable: their
    # manifest (a symlink's target on a read-only mount) cannot be written.
    _rotated_in_cache: set[ObjectKey] = field(default_factory=set)
    faults: Faults = field(init=False)
    work: ObjectWork = field(init=False)  # write-backs, queued per object (never awaited by the handler)
    release_waits: ReleaseWaits = field(init=False)  # NodePools waiting for a release the resolver reads
    base_waits: GeneratedBaseWaits = field(init=False)  # NodePools waiting for a generated MCO base
    renders: RenderScheduler = field(init=False)  # when each NodePool renders, into the cache
    write_backs: WriteBacks = field(init=False)  # status, ignition-reached, deletions (rotation: writes.py)

    @property
    def catalog(self) -> ReleaseCatalog:
        return self.releases.catalog

    def __post_init__(self, generator: BaseGenerator | None) -> None:
        self.faults = Faults(count=lambda step: self.metrics.watch_errors.labels(step=step).inc())
        self.work = ObjectWork(self.faults)
        self.write_backs = WriteBacks(source=self.source, work=self.work, faults=self.faults,
                                      secret_of=lambda key: self.secrets.get(key), writer=self.writer,
                                      clock=self.clock, prune_grace=self.prune_grace)
        self.base_waits = GeneratedBaseWaits(
            generator=generator, releases=self.releases, bases=self.bases, source=self.source, tenancy=self.tenancy,
            share_namespace=self.share_namespace, writer=self.writer, inputs_changed=self._inputs_changed)
        self.release_waits = ReleaseWaits(
            releases=self.releases, input_graph=self.input_graph, source=self.source, tenancy=self.tenancy,
            share_namespace=self.share_namespace, writer=self.writer, inputs_changed=self._inputs_changed,
            retry_now=lambda key: self.renders.clear_backoff(key))
        self.renders = RenderScheduler(
            source=self.source, cache=self.cache, renderer=self.renderer, metrics=self.metrics, faults=self.faults,
            releases=self.releases, bases=self.bases, tenancy=self.tenancy, input_graph=self.input_graph,
            release_waits=self.release_waits, base_waits=self.base_waits, secret_of=lambda key: self.secrets.get(key),
            persist_index=self.persist_index, write_status=self.write_backs.status_later, clock=self.clock,
            debounce=self.debounce, render_concurrency=self.render_concurrency)
        if self.outputs is not None:
            self.outputs.faults = self.faults
            self.outputs.writer = self.writer

    # -- source events -------------------------------------------------------------

    async def handle(self, changes: list[Change]) -> None:
        touched_pools: set[tuple[str, str]] = set()
        for change in oldest_first(changes):
            # One object's fault stays with that object: logged once, retried with back-off,
            # while every other change of the batch (and every later one) is applied.
            self.work.discard(change.key.ref, "parse")  # a retry of an older version is moot
            try:
                nodepool = await self._handle_one(change)
            except Exception as exc:
                delay = self.faults.failed("parse", change.key.ref, exc)
                self.work.retry(change.key.ref, "parse", lambda change=change: self._handle_again(change), delay)
                continue
            self.faults.succeeded("parse", change.key.ref)
            if nodepool is not None:
                touched_pools.add(nodepool)
        if not self._listed.is_set():
            self._after_first_listing()
            self._listed.set()
            await asyncio.to_thread(memory.release)  # parsing the whole source left garbage behind
        self._supersede_outdated(touched_pools)

    async def _handle_again(self, change: Change) -> None:
        nodepool = await self._handle_one(change)
        if nodepool is not None:
            self._supersede_outdated({nodepool})

    async def _handle_one(self, change: Change) -> tuple[str, str] | None:
        """Apply one change; the generation group of a token Secret it added or changed."""
        key = change.key
        touched = None
        if change.type != "DELETED" and has_large_values(change.obj) and (is_catalog(change.obj) or is_trust_object(change.obj) or is_generated_base(change.obj)):
            full = await asyncio.to_thread(self.source.get_full, key)
            change = Change(change.type, key, full if full is not None else change.obj)
        if self.trust is not None:
            self.trust.handle(change)
        if not self._may_shape_every_tenant(change):
            change = Change("DELETED", key, change.obj)  # as if absent; it is not used for anything shared
        if key.kind == "ConfigMap" and (is_catalog(change.obj) or self.catalog.knows(key)):
            for pull_spec in self.catalog.update(key, None if change.type == "DELETED" else change.obj):
                self._inputs_changed(release_key(pull_spec))
        if key.kind == "ConfigMap" and (is_base(change.obj) or self.bases.knows(key)):
            for dependency in self.bases.update(key, None if change.type == "DELETED" else change.obj):
                self._inputs_changed(dependency)
        if key.kind == "ConfigMap" and change.type != "DELETED" and is_generated_base(change.obj):
            self.base_waits.published(change.obj)
        if is_mirror_set(change.obj) or (key.kind in ("ImageDigestMirrorSet", "ImageTagMirrorSet")):
            self.release_waits.mirror_set_changed(key, None if change.type == "DELETED" else change.obj)
        if key.kind == "Secret":
            if change.type != "DELETED" and is_token_secret(change.obj):
                secret = await self._apply(key, change.obj)
                if secret is not None:
                    touched = generation_group(secret)
            elif key in self.secrets or key in self._duplicates:
                self._duplicates.discard(key)
                if key not in self.secrets:
                    return None
                why = "its token Secret was deleted" if change.type == "DELETED" else "it is no longer a token Secret"
                self._forget_secret(key, why)
        if self.input_graph.is_read(key):
            self._inputs_changed(key)
        return touched

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

    def _inputs_changed(self, dependency: ObjectKey) -> None:
        """Re-render exactly the NodePools that read `dependency` (the digest decides if anything changed)."""
        for key in self.input_graph.readers_of(dependency):
            secret = self.secrets.get(key)
            if secret is not None:
                self.renders.schedule(secret)

    async def _apply(self, key: ObjectKey, obj: dict[str, Any]) -> TokenSecret | None:
        try:
            secret = parse_token_secret(obj)
        except ManifestError as exc:
            # Bad input loses nothing: the last good tokens and payload keep serving.
            log.error("token Secret %s is invalid, keeping its last good state: %s", key, exc)
            self.write_backs.status_later(key, obj, Status("InvalidConfig", f"cannot read the token Secret: {exc}"))
            return None
        if key not in self._order:
            self._seq += 1
            self._order[key] = self._seq
        self._source_tokens[key] = secret.token
        secret = self._with_rotation_state(secret)
        if self._token_held_elsewhere(key, secret, obj):
            return None
        self._unlist_pool(key)
        self.secrets[key] = secret
        self._pools.setdefault(_pool_of(secret), set()).add(key)
        self._by_nodepool.setdefault(generation_group(secret), set()).add(key)
        self._index_tokens(secret)
        if self.outputs is not None:
            self.outputs.tokens_changed(secret)
        self.renders.schedule(secret)
        return secret

    def _token_held_elsewhere(self, key: ObjectKey, secret: TokenSecret, obj: dict[str, Any]) -> bool:
        """A token belongs to the Secret that held it first: a newcomer holding it (a leaked
        token pasted into another Secret) is refused, never served and never replaces the first.
        The index remembers holders across restarts (retired tokens for one TTL), so the first stays first."""
        holders = set()
        for token in (secret.token, secret.old_token):
            record = self.cache.lookup_token_key(self.cache.token_key(token)) if token else None
            if record is not None and record.secret != secret.ref:
                holders.add(record.secret)
        if not holders:
            self._duplicates.discard(key)
            return False
        if key not in self._duplicates:
            self._duplicates.add(key)
            self.metrics.tenancy_refusals.labels(what="duplicate-token").inc()
            log.error("token Secret %s holds a token that %s already holds: refused (not indexed, not rendered, "
                      "not rotated); give it a token of its own", key.ref, ", ".join(sorted(holders)))
        if key in self.secrets:
            self._forget_secret(key, "it now holds another Secret's token")
        self.write_backs.status_later(key, obj, Status(
            "InvalidConfig", "refused: a token of this Secret is already held by another token Secret; "
                             "generate a new token"))
        return True

    def _index_tokens(self, secret: TokenSecret) -> None:
        now = self.clock()
        known = self.cache.tokens_of_secret(secret.ref)
        wanted: dict[bytes, TokenState] = {}
        if secret.expired(now):
            pass  # every token of an expired Secret retires: refused (403) for one more TTL
        elif secret.token:
            wanted[self.cache.token_key(secret.token)] = TokenState.CURRENT
        if secret.old_token and not secret.expired(now):
            wanted.setdefault(self.cache.token_key(secret.old_token), TokenState.PREVIOUS)
        for token_key, state in wanted.items():
            record = TokenRecord(secret.nodepool, secret.ref, state, secret.expiration)
            if known.get(token_key) != record:
                self.cache.put_token_key(token_key, record)
        for token_key, record in known.items():
            if token_key not in wanted and record.state is not TokenState.RETIRED:
                self._retire(token_key, record, now)

    def _retire(self, token_key: bytes, record: TokenRecord, now: float) -> None:
        # Remembered for one TTL, so a stale pointer config fails fast (403) instead of
        # retrying for ever (511).
        self.cache.put_token_key(
            token_key, TokenRecord(record.nodepool, record.secret, TokenState.RETIRED, now + self.policy.ttl)
        )

    def _forget_secret(self, key: ObjectKey, why: str) -> None:
        now = self.clock()
        self._unlist_pool(key)
        self.input_graph.forget(key)
        gone = self.secrets.pop(key, None)
        if gone is not None and self.outputs is not None:
            self.outputs.secret_gone(gone)
        if gone is not None and why == "its token Secret was deleted":
            self.write_backs.orphaned_user_data(gone)
        self.renders.forget(key)
        self.work.cancel(key.ref)
        self.faults.forget(key.ref)
        self._rotated_in_cache.discard(key)
        for token_key, record in self.cache.tokens_of_secret(key.ref).items():
            if record.state is not TokenState.RETIRED:
                self._retire(token_key, record, now)
        if self.cache.get_render(key.ref) is not None:
            self.cache.drop_render(key.ref)
            log.info("dropped the payload of %s: %s", key.ref, why)
        self.metrics.payloads_cached.set(self.cache.render_count())

    def _unlist_pool(self, key: ObjectKey) -> None:
        previous = self.secrets.get(key)
        if previous is not None:
            for index, name in ((self._pools, _pool_of(previous)), (self._by_nodepool, generation_group(previous))):
                keys = index.get(name)  # type: ignore[attr-defined]
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[name]  # type: ignore[attr-defined]

    def _after_first_listing(self) -> None:
        # The index was loaded before the source answered; what it holds for Secrets the
        # source no longer has was deleted while we were down.
        present = {key.ref for key in self.secrets}
        for record in self.cache.renders():
            if record.secret not in present:
                namespace, _, name = record.secret.partition("/")
                self._forget_secret(ObjectKey("Secret", namespace, name), "deleted while the server was down")

    # -- the index on disk, shutdown, what the HTTP app asks -----------------------------

    async def persist_index(self) -> None:
        """Flush the index soon; callers arriving together share one flush."""
        if self._next_flush is None:
            self._next_flush = asyncio.ensure_future(self._flush_later())
        await asyncio.shield(self._next_flush)

    async def _flush_later(self) -> None:
        await asyncio.sleep(0.05)
        self._next_flush = None  # changes from now on go into the next flush
        await asyncio.to_thread(self.cache.flush)

    async def drain(self, timeout: float) -> None:
        """Let write-backs in flight finish (a draining shutdown loses no status or rotation)."""
        await self.work.drain(timeout)

    async def wait_idle(self) -> None:
        """Until no render and no queued write-back is pending (tests and graceful shutdown).

        A write-back that failed and waits for its retry does not count."""
        while self.renders.pending() or self.work.running():
            tasks = self.renders.pending() + list(self.work.running())
            await asyncio.gather(*tasks, return_exceptions=True)

    def grant_for(self, namespace: str, pool_name: str) -> Grant | None:
        """The NodePool `pool_name` of the hosted cluster in `namespace`: its newest live generation.

        Service-account tokens name a cluster, not a NodePool, so the request's NodePool
        picks the token Secret (and so the payload) among that cluster's.
        """
        now = self.clock()
        candidates = [
            s for s in (self.secrets[k] for k in self._pools.get((namespace, pool_name), ())) if not s.expired(now)
        ]
        if not candidates:
            return None
        newest = max(candidates, key=lambda s: (s.creation_time or 0.0, self._order.get(s.key, 0)))
        return Grant(nodepool=newest.nodepool, secret=newest.ref)

    def rotation_overdue(self, now: float) -> int:
        """Live token Secrets whose current token has outlived the TTL: rotation (due at TTL/2) is not happening."""
        return sum(
            1 for secret in self.secrets.values()
            if not secret.expired(now) and now - (secret.generation_time or 0.0) > self.policy.ttl
        )

    # -- housekeeping ----------------------------------------------------------------

    async def run_periodic(self, *, tick: float = 0.5) -> None:
        """Rotation, render retries and index persistence, until cancelled."""
        last_forget = 0.0
        last_gc = self.clock()  # not at start-up: nothing is unreferenced before the first listing
        while True:
            await asyncio.sleep(tick)
            try:
                await self.rotate_due()
                await self.write_backs.prune_expired(list(self.secrets.items()))
                await self.renders.retry_failed()
                self.release_waits.nudge()
                now = self.clock()
                for secret in list(self.secrets.values()):
                    if secret.expired(now):
                        try:
                            self._index_tokens(secret)
                        except Exception as exc:  # one Secret's fault must not stop the sweep
                            self.faults.failed("expiry", secret.ref, exc)
                        else:
                            self.faults.succeeded("expiry", secret.ref)
                self.metrics.rotation_overdue.set(self.rotation_overdue(now))
                if now - last_forget > 60:
                    self.cache.forget_expired(now)
                    last_forget = now
                if now - last_gc > GC_INTERVAL:
                    last_gc = now
                    report = await asyncio.to_thread(self.cache.gc, now)
                    if report.deleted:
                        log.info("cache gc: deleted %d unreferenced payload(s), %d bytes", report.deleted, report.bytes_freed)
                if self.cache.dirty:
                    await self.persist_index()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("housekeeping failed; trying again")
