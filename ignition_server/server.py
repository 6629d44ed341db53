"""The server's lifecycle: start-up, serving, draining shutdown.

Start-up loads the persisted index and answers Ready at once (no render); the source's
first listing is applied right after, so a restart during a boot storm costs nodes
seconds, not minutes. One place owns signals (the CLI); this only waits for `stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from aiohttp import web

from payload_cache import CacheConfig, PayloadCache

from .auth.cluster_keys import ClusterKeys
from .auth.jwt import ServiceAccountVerifier
from .auth.tokens import TokenAuthenticator
from .config import ServeSettings
from .edge_publication import EdgeTLS, write_tls_settings
from .edge_publisher import EdgePublisher
from .http.access_log import AccessLog
from .http.app import Handler, IgnitionHandlers, ServingState, build_dispatch, build_metrics_app
from .http.connection_table import ConnectionTable
from .http.guard import ConnectionGuard
from .http.limits import FailedAuthLimiter
from .http.listen import reserve_port, start_site
from .metrics import ServerMetrics
from .model.token_secret import is_token_secret, is_user_data_secret
from .reconcile.nodepools import Renderer
from .reconcile.outputs import PointerSettings, TokenOutputs
from .reconcile.trust import TrustWatcher
from .reconcile.wiring import Reconciliation, reconciliation_for
from .render.payload import renderer as reusing_renderer
from .sockets import unix_listening_socket
from .sources.events import Source
from .sources.files import FileSource
from .tls.ca_rotation import CARotation, CAStore, DirectoryStore
from .tls.certificates import (
    PASSWORD_PURPOSE,
    TLSFiles,
    ensure_self_signed,
    make_ca,
    pair_stamp,
    reload_on_change,
    serving_context,
)
from .tls.fips import describe as fips_describe
from .tls.sni import HostCertificates, refresh_periodically, write_hosts
from .tls.sni_files import HostCertificateFiles
from .workers.pool import WorkerPool
from .workers.render_wait import RenderWait

if TYPE_CHECKING:
    # Imported in Kubernetes mode only: kubernetes_asyncio's generated client is ~35 MiB of
    # RSS (930 modules) that a server with a file source would carry for nothing.
    from .cluster import Cluster, WatchHealth

log = logging.getLogger("ignition_server")


def _secret_store(cluster: Cluster, namespace: str) -> CAStore:
    from .cluster import SecretStore  # Kubernetes mode only (above)

    return SecretStore(cluster.client, namespace)


def open_cache(settings: ServeSettings) -> PayloadCache:
    return PayloadCache.open(
        CacheConfig(
            cache_dir=settings.cache_dir,
            key_file=settings.cache_key_file,
            # With workers, they serve and hold the memory tier; the owner only renders.
            memory_bytes=0 if settings.workers else settings.serving_memory.tier,
        )
    )


@dataclass
class _Running:
    """What start-up made and shutdown closes, in the order it closes them."""

    cache: PayloadCache
    source: Source
    cluster: Cluster | None
    reconciliation: Reconciliation
    writer: Callable[[], bool]  # whether this replica writes (with several replicas: the Lease holder)
    outputs: TokenOutputs
    ssl_context: ssl.SSLContext
    tls_loaded: tuple[int, int]  # pair_stamp of what ssl_context loaded
    registry_session: Any
    pool: WorkerPool | None = None
    reserved: socket.socket | None = None  # the serving port, held for the workers
    edge_listener: socket.socket | None = None  # --edge-socket: the pod's TLS edge hands requests over here
    runners: list[web.BaseRunner] = field(default_factory=list)
    guards: list[ConnectionGuard] = field(default_factory=list)
    handlers: IgnitionHandlers | None = None  # the owner's, when it serves itself
    hosts: HostCertificates | None = None  # the owner's SNI certificates (tls/sni.py), when it holds the CA
    connections: ConnectionTable | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@dataclass
class IgnitionServer:
    settings: ServeSettings
    # One RenderReuse for the server's renders (a cluster's base parsed once, items checked once).
    renderer: Renderer = field(default_factory=reusing_renderer)
    clock: Callable[[], float] = time.time
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    state: ServingState = field(default_factory=ServingState)
    cache: PayloadCache | None = None
    tls_files: TLSFiles | None = None
    ports: dict[str, int] = field(default_factory=dict)
    cluster: Cluster | None = None
    watch_health: WatchHealth | None = None
    render_wait: RenderWait = field(default_factory=RenderWait)
    edge_publisher: EdgePublisher | None = None  # --edge-dir: what a front proxy reads

    async def run(self, stop: asyncio.Event) -> None:
        """Start up, serve until `stop` is set, shut down."""
        started = time.perf_counter()
        running = await self._start_up()
        self._say_ready(running, time.perf_counter() - started)
        running.tasks = self._background_tasks(running)
        try:
            await stop.wait()
        finally:
            await self._shut_down(running)

    # Start-up: the cache, the source, the reconciler, then the sockets (metrics first).

    async def _start_up(self) -> _Running:
        settings = self.settings
        self.cache = cache = await asyncio.to_thread(open_cache, settings)
        self.metrics.watch_cache(cache.stats)
        self.metrics.payloads_cached.set(len(cache.renders()))
        source, cluster = await self._open_source(cache)
        verifier = ServiceAccountVerifier(clock=self.clock, overlap_seconds=settings.service_account_overlap)
        ssl_context, tls_loaded = self._tls_context()
        hosts = HostCertificates.for_files(self.tls_files, settings.tls.profile) if self.tls_files is not None else None
        if hosts is not None:  # taken-over clusters' Route hostnames, chosen by SNI
            hosts.install(ssl_context)
        if "FIPS" in settings.tls.profile.name:
            log.info(fips_describe())
        outputs = TokenOutputs(source, settings.edge_token_map, self._pointer_settings())
        trust = TrustWatcher(verifier.keys, self._edge_writer(verifier.keys, ssl_context),
                             on_refused=self.metrics.tenancy_refusals.labels(what="service-account-key").inc)
        writer = cluster.is_writer if cluster is not None else (lambda: True)
        reconciliation, registry_session = reconciliation_for(
            settings, source=source, cache=cache, renderer=self.renderer, metrics=self.metrics, clock=self.clock,
            writer=writer, trust=trust, outputs=outputs)
        running = _Running(cache=cache, source=source, cluster=cluster, reconciliation=reconciliation, writer=writer,
                           outputs=outputs, ssl_context=ssl_context, tls_loaded=tls_loaded,
                           registry_session=registry_session)
        running.hosts = hosts
        if self.tls_files is not None and self.tls_files.ca is not None:
            tls_dir = self.tls_files.ca.parent
            reconciliation.tell_taken_over_hosts(lambda names: write_hosts(tls_dir, names))
        authenticator = TokenAuthenticator(cache, self.clock, verifier=verifier, directory=reconciliation.directory)
        await self._start_serving(running, authenticator)
        return running

    async def _open_source(self, cache: PayloadCache) -> tuple[Source, Cluster | None]:
        """Kubernetes (and its shared TLS files), or the directory of manifests."""
        settings = self.settings
        if settings.kubernetes:
            from .cluster import WatchHealth, connect as connect_cluster, shared_tls

            self.watch_health = health = WatchHealth(self.metrics)
            self.state.behind = lambda: [f"{kind} watch reconnecting" for kind in sorted(health.behind)]
            self.cluster = cluster = await connect_cluster(settings, self.metrics, self.watch_health)
            if settings.tls.cert_file is None:
                self.tls_files = await shared_tls(cluster.client, settings.pod_namespace, settings.cache_dir / "tls",
                                                  settings.public_url, self._ca_validity(), password=self._tls_password())
            return cluster.source, cluster
        return FileSource(
            settings.source_dir, poll_interval=settings.poll_interval, read_only=settings.source_read_only,
            # The reconciler keeps what it needs of token Secrets; the source need not keep them too.
            retain=lambda obj: not is_token_secret(obj),
            digest_values=is_user_data_secret,  # only ever compared with what would be written
            state=cache,
        ), None

    async def _start_serving(self, running: _Running, authenticator: TokenAuthenticator) -> None:
        """The worker processes on a reserved port, or the owner's own serving site."""
        settings, reconciliation = self.settings, running.reconciliation
        if settings.edge_socket is not None:
            # Made once, here: every serving process accepts on it (workers inherit it), and it
            # stays while a worker restarts, so the edge's connections wait in its backlog.
            running.edge_listener = unix_listening_socket(settings.edge_socket, 1024)
            log.info("serving plain HTTP behind the pod's TLS edge on unix:%s", settings.edge_socket)
        if settings.workers:
            assert self.tls_files is not None
            running.reserved = reserve_port(settings.listen)
            self.ports["serving"] = running.reserved.getsockname()[1]
            running.pool = WorkerPool(settings=settings, count=settings.workers, port=self.ports["serving"],
                                      tls_files=self.tls_files, cache=running.cache, authenticator=authenticator,
                                      metrics=self.metrics, on_served=reconciliation.note_served,
                                      on_missing=reconciliation.payload_missing, behind=self.state.behind,
                                      edge_listener=running.edge_listener,
                                      render_wait=self.render_wait.seconds,
                                      render_wait_for=self._render_wait_for(reconciliation))
        pool = running.pool
        # Metrics first: once a worker answers /readyz, everything of this server answers.
        if settings.metrics_listen is not None:
            running.runners.append(await self._start(build_metrics_app(
                self.metrics, pool.gather_reports if pool is not None else None), settings.metrics_listen, None, "metrics"))
        if pool is not None:
            await pool.start()
            return
        # One process: the owner serves too.
        running.handlers = handlers = self._handlers(authenticator, running.cache, reconciliation)
        self.metrics.ready_held = handlers.ready_held
        running.connections = connections = ConnectionTable.create(1, shared=False)
        self.metrics.watch_connections(connections.counts, ["main"])
        guard = ConnectionGuard(settings.header_timeout, settings.connections_per_source, settings.connections_total,
                                connections.row(0), handshake_timeout=settings.handshake_timeout)
        running.runners.append(await self._start(build_dispatch(handlers), settings.listen, running.ssl_context,
                                                 "serving", guard, running.edge_listener))
        running.guards.append(guard)

    def _say_ready(self, running: _Running, seconds: float) -> None:
        settings = self.settings
        self.state.ready = True
        log.info(
            "ready in %.3fs with %d payloads from the cache; serving on %s:%d%s",
            seconds, len(running.cache.renders()), settings.listen[0], self.ports["serving"],
            f" with {settings.workers} worker processes" if running.pool is not None else "",
        )
        if not running.source.writable:
            log.warning(
                "source %s is read-only: token rotation state is kept (encrypted) in the cache dir %s, "
                "and status is not written back", running.source.describe(), settings.cache_dir,
            )

    # Serving: what runs beside the sockets until the stop.

    def _background_tasks(self, running: _Running) -> list[asyncio.Task[None]]:
        settings, reconciliation, cluster, pool = self.settings, running.reconciliation, running.cluster, running.pool
        if pool is None:  # the owner serves itself
            wait_for = self._render_wait_for(reconciliation)

            async def render_wait(secret: str) -> int:
                return wait_for(secret)

            self.state.render_wait = render_wait
        tasks = [
            asyncio.create_task(self._follow_render_queue(), name="render-wait"),
            asyncio.create_task(self._run_source(running.source, reconciliation), name="source"),
            asyncio.create_task(reconciliation.run_housekeeping(), name="housekeeping"),
        ]
        if pool is None and self.tls_files is not None:  # workers reload their own
            tasks.append(asyncio.create_task(reload_on_change(running.ssl_context, self.tls_files,
                                                              loaded=running.tls_loaded), name="tls-reload"))
        if pool is None and running.hosts is not None:
            tasks.append(asyncio.create_task(refresh_periodically(running.hosts), name="sni-hosts"))
        if self.edge_publisher is not None:
            tasks.append(asyncio.create_task(self.edge_publisher.follow(), name="edge-publication"))
        if cluster is not None:
            tasks.append(asyncio.create_task(cluster.elector.run(), name="lease"))
        if pool is not None:
            tasks.append(asyncio.create_task(pool.run(), name="workers"))
        if settings.tls.cert_file is None and self.tls_files is not None:
            rotation = CARotation(
                store=_secret_store(cluster, settings.pod_namespace) if cluster is not None
                else DirectoryStore(self.tls_files.cert.parent, self._tls_password()),
                directory=self.tls_files.cert.parent, public_url=settings.public_url, overlap=settings.token_ttl,
                password=self._tls_password(),
                make_ca=lambda: make_ca(self._ca_validity()), is_writer=running.writer,
                on_bundle=running.outputs.trust_changed, interval=settings.ca_check_interval,
            )
            tasks.append(asyncio.create_task(rotation.run(), name="ca-rotation"))
        return tasks

    def _render_wait_for(self, reconciliation: Reconciliation) -> Callable[[str], int]:
        """A 503's Retry-After for one NodePool still rendering: its place in the render queue."""
        return lambda secret: self.render_wait.seconds_for(reconciliation.renders_ahead(secret))

    async def _follow_render_queue(self, interval: float = 0.5) -> None:
        """Feed the Retry-After estimate (workers/render_wait.py) the render queue's progress."""
        loop = asyncio.get_running_loop()
        while True:
            self.render_wait.observe(*self.metrics.render_progress(), loop.time())
            await asyncio.sleep(interval)

    # Shutdown: the workers drain, then the owner's sockets and tasks, the reconciler, the cache.

    async def _shut_down(self, running: _Running) -> None:
        if running.pool is not None:
            log.info("draining: the workers stop accepting and finish their in-flight responses")
            self.state.draining = True
            await running.pool.stop(self.settings.shutdown_timeout + 5.0)
            assert running.reserved is not None
            running.reserved.close()
        await self._stop_serving(running.runners, running.guards, running.tasks, running.cache)
        if running.edge_listener is not None:
            running.edge_listener.close()
            with contextlib.suppress(OSError):
                os.unlink(str(self.settings.edge_socket))
        if running.cluster is not None:
            await running.cluster.close()
        await running.reconciliation.drain(self.settings.shutdown_timeout)
        await asyncio.to_thread(running.cache.flush)
        await running.source.flush()
        if running.handlers is not None:
            running.handlers.close()
        if running.connections is not None:
            running.connections.close()
        if running.registry_session is not None:
            await running.registry_session.close()

    def _handlers(self, authenticator: TokenAuthenticator, cache: PayloadCache,
                  reconciliation: Reconciliation) -> IgnitionHandlers:
        settings = self.settings
        return IgnitionHandlers(
            cache=cache,
            authenticator=authenticator,
            metrics=self.metrics,
            state=self.state,
            on_served=reconciliation.note_served,
            on_missing=reconciliation.payload_missing,
            max_in_flight=settings.max_in_flight,
            limiter=FailedAuthLimiter(settings.auth_failure_burst, settings.auth_failure_window),
            access=AccessLog(settings.log_format),
            ready_bytes=settings.serving_memory.ready,
        )

    def _edge_writer(self, keys: ClusterKeys, ssl_context: ssl.SSLContext) -> Callable[[], None]:
        settings = self.settings
        if settings.edge_dir is None or self.tls_files is None:
            return lambda: None
        # Before the publication that names the certificate: a proxy terminating TLS with it
        # offers what this server's context does (its profile, FIPS mode), never its own defaults.
        write_tls_settings(settings.edge_dir, EdgeTLS.of(ssl_context))
        host = "127.0.0.1" if settings.listen[0] in ("0.0.0.0", "::", "") else settings.listen[0]
        files = self.tls_files
        writer = EdgePublisher(
            keys=keys, directory=settings.edge_dir,
            backend=f"[{host}]:{settings.listen[1]}" if ":" in host else f"{host}:{settings.listen[1]}",
            cert_pem=lambda: files.cert.read_bytes() + files.key_pem(),  # HAProxy reads it plaintext
            cert_stamp=lambda: pair_stamp(files),
            ca_file=self.tls_files.ca, token_map=settings.edge_token_map,
            # The taken-over clusters' hostnames, each with its certificate: a terminating proxy's SNI choice.
            hosts=HostCertificateFiles.for_dir(self.tls_files.ca.parent, self.tls_files.password, settings.edge_dir / "hosts")
            if self.tls_files.ca is not None else None,
        )
        self.edge_publisher = writer
        writer.keys_changed()  # published at start too: opaque-token clusters have no keys to announce it
        return writer.keys_changed

    def _pointer_settings(self) -> PointerSettings | None:
        s = self.settings
        ca = self.tls_files.ca if self.tls_files is not None else None
        if s.public_url is None or ca is None:
            log.info("user-data Secrets are not written: they need --public-url and the self-made CA")
            return None
        proxy = {"httpProxy": s.node_http_proxy, "httpsProxy": s.node_https_proxy, "noProxy": list(s.node_no_proxy)}
        items = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in proxy.items() if v)
        return PointerSettings(s.public_url, ca.read_bytes(), proxy=items)

    def _tls_password(self) -> bytes:
        """What the self-made pair's private keys are encrypted under in the cache dir: derived
        from the cache key, which is kept outside it (README, "What a copy reveals")."""
        assert self.cache is not None
        return self.cache.derived_secret(PASSWORD_PURPOSE)

    def _ca_validity(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.settings.ca_lifetime)

    def _tls_context(self) -> tuple[ssl.SSLContext, tuple[int, int]]:
        """The serving context, and the pair_stamp of the files it loaded (taken before loading)."""
        tls = self.settings.tls
        if self.tls_files is None:  # else the replicas' shared CA (Kubernetes mode)
            if tls.cert_file is not None and tls.key_file is not None:
                self.tls_files = TLSFiles(tls.cert_file, tls.key_file, None)
            else:
                self.tls_files = ensure_self_signed(self.settings.cache_dir / "tls", self.settings.public_url,
                                                   self._ca_validity(), password=self._tls_password())
                log.info("TLS: self-made CA at %s (put it in pointer configs' certificateAuthorities)", self.tls_files.ca)
        return serving_context(self.tls_files, tls.profile)

    async def _start(self, app: web.Application | Handler, listen: tuple[str, int], ssl_context: ssl.SSLContext | None, name: str,
                     guard: ConnectionGuard | None = None, edge_listener: socket.socket | None = None) -> web.BaseRunner:
        runner, self.ports[name] = await start_site(app, listen, ssl_context, guard=guard,
                                                    shutdown_timeout=self.settings.shutdown_timeout,
                                                    proxy_from=self.settings.proxy_protocol_from,
                                                    edge_listener=edge_listener)
        return runner

    async def _run_source(self, source: Source, reconciliation: Reconciliation) -> None:
        delay = 1.0
        while True:
            try:
                await source.run(reconciliation.handle, ingesting=reconciliation.ingesting)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The source is down (unreadable, unmounted), or its listing failed: keep
                # serving what the index knows and try again with back-off.
                log.error("source %s unavailable, serving from the cache: %s (retry in %.0fs)", source.describe(), exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _stop_serving(self, runners: list[web.BaseRunner], guards: list[ConnectionGuard],
                            tasks: list[asyncio.Task[None]], cache: PayloadCache) -> None:
        log.info("draining: no new connections, finishing in-flight responses")
        self.state.draining = True
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for runner in runners:
            await runner.cleanup()
        for guard in guards:  # the last responses' bytes out of the transports before we exit
            await guard.wait_closed(self.settings.shutdown_timeout)
        await asyncio.to_thread(cache.flush)
        log.info("stopped")
