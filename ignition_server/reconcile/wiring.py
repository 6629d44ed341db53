"""The reconciler's objects, built once and handed to each other: the server's (`reconciliation_for`,
from its settings) and the tests' (`build_reconciliation`, from parts).

Who calls whom, so a reader can follow it: the source calls `Reconciler.handle`, which
updates the indexes (TokenSecrets, the catalogs, bases, mirror sets, trusted keys) and queues
NodePool keys on `NodePools`' work queue, which runs `NodePools.reconcile` for each
(reconciler.py and nodepools.py tell the story); Housekeeping runs rotation and expiry on the
clock. The waits for releases and generated bases queue their NodePools again through
`nodepools.dependency_arrived`, and the registry resolver and the base generator, built before
the reconciler, call back into `release_waits.resolved` and `base_waits.generated`.
"""

from __future__ import annotations

import logging
import shutil
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, cast

from payload_cache import CacheConfig, PayloadCache

from ..auth.rotation_policy import RotationPolicy
from ..auth.tokens import NodePoolDirectory
from ..basegen.generator import BaseGenerator, GeneratorSettings
from ..basegen.run import Limits
from ..basegen.sandbox import Sandbox, SandboxUnavailable, hide_list
from ..config import ServeSettings
from ..metrics import ServerMetrics
from ..registry.allowed import parse_allowed
from ..registry.image_files import ImageFiles
from ..registry.mirrors import Mirrors, parse_overrides
from ..registry.resolver import ReleaseStore
from ..registry.setup import open_resolver
from ..sources.events import Change, Source
from .bases import BaseIndex
from .claims import Claims, ClaimsPublisher
from .faults import Faults
from .generated_bases import GeneratedBaseWaits
from .housekeeping import Housekeeping
from .index_flush import IndexFlush
from .input_graph import InputGraph
from .nodepools import NodePools, Renderer
from .object_work import ObjectWork
from .outputs import TokenOutputs
from .reconciler import Reconciler
from .release_waits import ReleaseWaits
from .releases import Releases
from .rotation import Rotation
from .takeover import Takeover, TakeoverSource
from .tenancy import Tenancy
from .token_secrets import TokenSecrets
from .trust import TrustWatcher
from .write_backs import WriteBacks

log = logging.getLogger("ignition_server.reconcile")


@dataclass(frozen=True)
class Reconciliation:
    """The reconciler and its clock, as `build_reconciliation` ties them. The server uses only
    the methods below: changes in, the clock, the JWT directory, what was served or found
    missing, the renders queued ahead of a NodePool's, drain. Tests may reach the parts."""

    reconciler: Reconciler  # source changes in (the source calls `reconciler.handle`)
    housekeeping: Housekeeping  # the clock (`housekeeping.run`)

    async def handle(self, changes: list[Change]) -> None:
        """A source's batch of changes, oldest first (the handler a source is attached to)."""
        await self.reconciler.handle(changes)

    def ingesting(self) -> AbstractContextManager[None]:
        """Held by a source while it reads a batch it will hand over: no reconcile starts meanwhile
        (those running go on), so a flood of new token Secrets is read and indexed at full speed,
        another tenant's among them, before renders take the CPU."""
        return self.reconciler.nodepools.queue.held()

    async def run_housekeeping(self) -> None:
        """Rotation and expiry on the clock, until cancelled."""
        await self.housekeeping.run()

    @property
    def directory(self) -> NodePoolDirectory:
        """For service-account JWTs, which name a cluster and a NodePool: the token Secret whose payload they open."""
        return self.reconciler.tokens

    def payload_missing(self, secret_ref: str) -> None:
        """A request found no usable payload for a Secret the index serves: render it, first."""
        self.reconciler.payload_missing(secret_ref)

    def renders_ahead(self, secret_ref: str) -> int | None:
        """Renders queued before this NodePool's (None: none queued for it): its 503's Retry-After."""
        return self.reconciler.nodepools.renders_ahead(secret_ref)

    def note_served(self, secret_ref: str) -> None:
        """A node got its payload (`ignition-reached`, written once, off the request path)."""
        self.reconciler.note_served(secret_ref)

    async def drain(self, timeout: float) -> None:
        """Let write-backs in flight finish before the process exits (a draining shutdown)."""
        await self.reconciler.drain(timeout)

    def tell_taken_over_hosts(self, tell: Callable[[frozenset[str]], None]) -> None:
        """--take-over: `tell` gets the taken-over clusters' Ignition Route hostnames whenever
        they change (the certificates chosen by SNI, tls/sni.py); without it, never called."""
        if self.reconciler.takeover is not None:
            self.reconciler.takeover.on_hosts = tell


def build_reconciliation(
    *, source: Source, cache: PayloadCache, renderer: Renderer, policy: RotationPolicy, metrics: ServerMetrics,
    clock: Callable[[], float] = time.time, trust: TrustWatcher | None = None, outputs: TokenOutputs | None = None,
    # Whether this replica writes (rotation, expiry, status, user-data, ignition-reached):
    # with several replicas only the Lease holder does; every replica indexes and serves.
    writer: Callable[[], bool] = lambda: True,
    releases: Releases | None = None, tenancy: Tenancy | None = None, bases: BaseIndex | None = None,
    generator: BaseGenerator | None = None,  # --generate-bases
    share_namespace: str | None = None,  # several replicas: the writer publishes releases and generated bases here
    debounce: float = NodePools.debounce, render_concurrency: int = NodePools.render_concurrency,
    prune_grace: float = WriteBacks.prune_grace,
    take_over: Callable[[], bytes | None] | None = None,  # --take-over: the CA bundle to publish (None: off)
    managed_service: str = "",  # --managed-service: the CPO's MANAGED_SERVICE, for the takeover
) -> Reconciliation:
    releases = releases if releases is not None else Releases()
    tenancy = (tenancy if tenancy is not None else Tenancy()).reading(source.get)  # the shareable mark
    bases = bases if bases is not None else BaseIndex()
    faults = Faults(count=lambda step: metrics.watch_errors.labels(step=step).inc())
    work = ObjectWork(faults)
    persist_index = IndexFlush(cache)
    if outputs is not None:
        outputs.faults = faults
        outputs.writer = writer
    claims = Claims.restored(cache.unseal, cache.seal, clock)
    if share_namespace is not None:
        claims.on_changed = ClaimsPublisher(claims, source, share_namespace, writer).changed
    if trust is not None:
        trust.claims = claims  # one record of contests, for keys and tokens alike
    tokens = TokenSecrets(cache=cache, ttl=policy.ttl, clock=clock, outputs=outputs, claims=claims,
                          on_refused=metrics.tenancy_refusals.labels(what="duplicate-token").inc)
    input_graph = InputGraph()
    write_backs = WriteBacks(source=source, work=work, faults=faults, secret_of=tokens.get, writer=writer,
                             clock=clock, prune_grace=prune_grace)
    # The waits and the NodePools call each other: `nodepools` exists by the time a wait requeues.
    base_waits = GeneratedBaseWaits(
        generator=generator, releases=releases, bases=bases, source=source, tenancy=tenancy,
        share_namespace=share_namespace, writer=writer, requeue=lambda key: nodepools.dependency_arrived(key))
    release_waits = ReleaseWaits(
        releases=releases, input_graph=input_graph, source=source, tenancy=tenancy, share_namespace=share_namespace,
        writer=writer, requeue=lambda key: nodepools.dependency_arrived(key))
    nodepools = NodePools(
        source=source, cache=cache, renderer=renderer, metrics=metrics, faults=faults, releases=releases, bases=bases,
        tenancy=tenancy, input_graph=input_graph, release_waits=release_waits, base_waits=base_waits,
        secret_of=tokens.get, persist_index=persist_index, write_status=write_backs.status_later, clock=clock,
        debounce=debounce, render_concurrency=render_concurrency)
    rotation = Rotation(tokens=tokens, cache=cache, policy=policy, write_backs=write_backs, work=work,
                        faults=faults, metrics=metrics, persist_index=persist_index, clock=clock)
    takeover = None if take_over is None else Takeover(  # a source that creates and replaces: the Kubernetes one
        source=cast(TakeoverSource, source), writer=writer, ca_pem=take_over, faults=faults,
        managed_service=managed_service)
    if takeover is not None:
        base_waits.feature_gate = takeover.feature_gate
    reconciler = Reconciler(
        source=source, cache=cache, metrics=metrics, tokens=tokens, rotation=rotation, nodepools=nodepools,
        input_graph=input_graph, write_backs=write_backs, release_waits=release_waits, base_waits=base_waits,
        releases=releases, bases=bases, tenancy=tenancy, faults=faults, work=work, trust=trust, claims=claims,
        claims_namespace=share_namespace, takeover=takeover)
    housekeeping = Housekeeping(
        tokens=tokens, rotation=rotation, write_backs=write_backs, release_waits=release_waits,
        cache=cache, faults=faults, metrics=metrics, persist_index=persist_index, clock=clock)
    return Reconciliation(reconciler, housekeeping)


def reconciliation_for(
    settings: ServeSettings, *, source: Source, cache: PayloadCache, renderer: Renderer, metrics: ServerMetrics,
    clock: Callable[[], float], writer: Callable[[], bool], trust: TrustWatcher, outputs: TokenOutputs,
) -> tuple[Reconciliation, Any]:
    """The server's reconciliation, and the registry session to close at shutdown (None without --release-resolve)."""
    reconciliation: Reconciliation | None = None  # the resolver and the generator call back into it once it exists

    def resolved(pull_spec: str) -> None:
        if reconciliation is not None:
            reconciliation.reconciler.release_waits.resolved(pull_spec)

    def generated(key: str) -> None:
        if reconciliation is not None:
            reconciliation.reconciler.base_waits.generated(key)

    releases, session = _releases(settings, cache, metrics, resolved)
    reconciliation = build_reconciliation(
        source=source, cache=cache, renderer=renderer, policy=RotationPolicy(settings.token_ttl), metrics=metrics,
        clock=clock, trust=trust, outputs=outputs, writer=writer, releases=releases,
        tenancy=Tenancy(frozenset(settings.shared_namespaces)),
        generator=_generator(settings, releases, cache, metrics, generated),
        share_namespace=settings.pod_namespace if settings.kubernetes else None,
        render_concurrency=settings.render_concurrency, prune_grace=settings.prune_grace,
        # What pointer configs trust is what the NodePool controller must put in its own.
        take_over=(lambda: outputs.pointer.ca_pem if outputs.pointer is not None else None)
        if settings.kubernetes and settings.take_over else None,
        managed_service=settings.managed_service,
    )
    return reconciliation, session


def _releases(settings: ServeSettings, cache: PayloadCache, metrics: ServerMetrics,
              resolved: Callable[[str], None]) -> tuple[Releases, Any]:
    """The catalog, plus the registry resolver when --release-resolve is on; mirrors either way."""
    registry = settings.registry
    mirrors = Mirrors(parse_overrides(registry.overrides), allowed=parse_allowed(registry.allow))
    if not registry.resolve:
        return Releases(mirrors=mirrors), None
    store = ReleaseStore(load=cache.load_state, save=cache.save_state)
    resolver, session = open_resolver(registry, mirrors, store, metrics, resolved, settings.cache_dir / "tmp-layers")
    return Releases(resolver=resolver, mirrors=mirrors), session


def _generator(settings: ServeSettings, releases: Releases, cache: PayloadCache, metrics: ServerMetrics,
               generated: Callable[[str], None]) -> BaseGenerator | None:
    """--generate-bases: the MCO base generator, pulling with the resolver's client and mirrors."""
    registry = settings.registry
    resolver = releases.resolver
    if not registry.generate_bases or resolver is None or releases.mirrors is None:
        return None
    work_dir = settings.cache_dir / "tmp-mco"
    work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for leftover in work_dir.iterdir():  # runs a crash interrupted, images extracted by the last process
        shutil.rmtree(leftover, ignore_errors=True)
    files = ImageFiles(resolver.client, releases.mirrors, registry.architecture, settings.cache_dir / "tmp-layers")
    return BaseGenerator(
        files=files, load=cache.load_state, save=cache.save_state, work_dir=work_dir,
        settings=GeneratorSettings(Limits(registry.base_timeout, registry.base_memory_bytes,
                                          _base_sandbox(settings, work_dir))),
        on_done=generated, counted=lambda result: metrics.base_generations.labels(result=result).inc(),
        tls=resolver.tls,
    )


def _base_sandbox(settings: ServeSettings, work_dir: Path) -> Sandbox | None:
    """The namespaces a release's binaries run in, hiding every credential of this server; checked now,
    so a host that cannot make them fails at start-up rather than at the first base."""
    if settings.registry.base_sandbox == "none":
        log.warning("--base-sandbox none: a release's MCO binaries run as this server's user, with its files")
        return None
    key_file = CacheConfig(cache_dir=settings.cache_dir, key_file=settings.cache_key_file).resolved_key_file
    hidden = [settings.cache_dir, key_file, Path("/var/run/secrets"), Path("/run/secrets")]
    hidden += [p for p in (settings.kubeconfig, settings.tls.cert_file, settings.tls.key_file) if p is not None]
    if not settings.kubernetes:
        hidden.append(settings.source_dir)
    sandbox = Sandbox(hide=hide_list(hidden, directories=[settings.edge_dir]), uid=settings.registry.base_uid)
    try:
        sandbox.check(work_dir / "sandbox-check")
    except SandboxUnavailable as exc:
        raise SystemExit(f"--generate-bases: {exc}; allow user namespaces to this server, or accept the risk "
                         "with --base-sandbox none (README, Trust model)") from None
    return sandbox
