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
import ssl
import time
from dataclasses import dataclass, field
from typing import Callable

from aiohttp import web

from payload_cache import CacheConfig, PayloadCache

from .auth.rotation import RotationPolicy
from .auth.jwt import ServiceAccountVerifier
from .auth.tokens import TokenAuthenticator
from .config import ServeSettings
from .http.fips import describe as fips_describe
from .http.guard import ConnectionGuard, GuardedSite
from .http.limits import FailedAuthLimiter
from .http.app import IgnitionHandlers, ServingState, build_app, build_metrics_app
from .http.ca_rotation import CARotation, DirectoryStore
from .http.tls import TLSFiles, ensure_self_signed, make_ca, reload_on_change, server_context
from .metrics import ServerMetrics
from .render.payload import render_payload
from .cluster import Cluster, SecretStore, WatchHealth, connect as connect_cluster, shared_tls
from .sources.events import Source
from .sources.files import FileSource
from .sources.manifests import is_token_secret
from .watch.reconciler import Reconciler, Renderer
from .watch.edge import EdgePublisher
from .watch.outputs import PointerSettings, TokenOutputs
from .watch.trust import TrustWatcher

log = logging.getLogger("ignition_server")
KEEPALIVE_TIMEOUT = 75.0  # an idle kept-alive connection is closed after this (aiohttp's default is an hour)


def open_cache(settings: ServeSettings) -> PayloadCache:
    return PayloadCache.open(
        CacheConfig(
            cache_dir=settings.cache_dir,
            key_file=settings.cache_key_file,
            memory_bytes=settings.cache_memory_bytes,
        )
    )


@dataclass
class IgnitionServer:
    settings: ServeSettings
    renderer: Renderer = render_payload
    clock: Callable[[], float] = time.time
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    state: ServingState = field(default_factory=ServingState)
    cache: PayloadCache | None = None
    reconciler: Reconciler | None = None
    tls_files: TLSFiles | None = None
    ports: dict[str, int] = field(default_factory=dict)
    cluster: Cluster | None = None
    watch_health: WatchHealth | None = None

    async def run(self, stop: asyncio.Event) -> None:
        settings = self.settings
        started = time.perf_counter()
        self.cache = cache = await asyncio.to_thread(open_cache, settings)
        self.metrics.watch_cache(cache.stats)
        self.metrics.payloads_cached.set(len(cache.renders()))
        cluster: Cluster | None = None
        source: Source
        if settings.kubernetes:
            self.watch_health = health = WatchHealth(self.metrics)
            self.state.behind = lambda: [f"{kind} watch reconnecting" for kind in sorted(health.behind)]
            self.cluster = cluster = await connect_cluster(settings, self.metrics, self.watch_health)
            source = cluster.source
            if settings.tls.cert_file is None:
                self.tls_files = await shared_tls(cluster.client, settings.pod_namespace, settings.cache_dir / "tls",
                                                  settings.public_url, self._ca_validity())
        else:
            source = FileSource(
                settings.source_dir, poll_interval=settings.poll_interval, read_only=settings.source_read_only,
                # The watcher keeps what it needs of token Secrets; the source need not keep them too.
                retain=lambda obj: not is_token_secret(obj),
                state=cache,
            )
        verifier = ServiceAccountVerifier(clock=self.clock, overlap_seconds=settings.service_account_overlap)
        ssl_context = self._tls_context()
        if "FIPS" in settings.tls.profile.name:
            log.info(fips_describe())
        outputs = TokenOutputs(source, settings.edge_token_map, self._pointer_settings())
        self.reconciler = reconciler = Reconciler(
            source=source,
            cache=cache,
            renderer=self.renderer,
            policy=RotationPolicy(settings.token_ttl),
            metrics=self.metrics,
            render_concurrency=settings.render_concurrency,
            clock=self.clock,
            trust=TrustWatcher(verifier, self._edge_writer(verifier)),
            outputs=outputs,
            writer=cluster.is_writer if cluster is not None else (lambda: True),
            prune_grace=settings.prune_grace,
        )
        handlers = IgnitionHandlers(
            cache=cache,
            authenticator=TokenAuthenticator(cache, self.clock, verifier=verifier, directory=reconciler),
            metrics=self.metrics,
            state=self.state,
            on_served=reconciler.note_served,
            on_missing=reconciler.payload_missing,
            max_in_flight=settings.max_in_flight,
            limiter=FailedAuthLimiter(settings.auth_failure_burst, settings.auth_failure_window),
        )
        guard = ConnectionGuard(settings.header_timeout, settings.connections_per_source, settings.connections_total)
        runners = [await self._start(build_app(handlers), settings.listen, ssl_context, "serving", guard)]
        if settings.metrics_listen is not None:
            runners.append(await self._start(build_metrics_app(self.metrics), settings.metrics_listen, None, "metrics"))
        self.state.ready = True
        log.info(
            "ready in %.3fs with %d payloads from the cache; serving on %s:%d",
            time.perf_counter() - started, len(cache.renders()), settings.listen[0], self.ports["serving"],
        )
        if not source.writable:
            log.warning(
                "source %s is read-only: token rotation state is kept (encrypted) in the cache dir %s, "
                "and status is not written back", source.describe(), settings.cache_dir,
            )
        tasks = [
            asyncio.create_task(self._run_source(source, reconciler), name="source"),
            asyncio.create_task(reconciler.run_periodic(), name="housekeeping"),
        ]
        if ssl_context is not None and self.tls_files is not None:
            tasks.append(asyncio.create_task(reload_on_change(ssl_context, self.tls_files), name="tls-reload"))
        if cluster is not None:
            tasks.append(asyncio.create_task(cluster.elector.run(), name="lease"))
        if settings.tls.cert_file is None and self.tls_files is not None:
            rotation = CARotation(
                store=SecretStore(cluster.client, settings.pod_namespace) if cluster is not None
                else DirectoryStore(self.tls_files.cert.parent),
                directory=self.tls_files.cert.parent, public_url=settings.public_url, overlap=settings.token_ttl,
                make_ca=lambda: make_ca(self._ca_validity()), is_writer=reconciler.writer,
                on_bundle=outputs.trust_changed, interval=settings.ca_check_interval,
            )
            tasks.append(asyncio.create_task(rotation.run(), name="ca-rotation"))
        try:
            await stop.wait()
        finally:
            await self._shutdown(runners, tasks, cache)
            if cluster is not None:
                await cluster.close()
            await reconciler.drain(self.settings.shutdown_timeout)
            await asyncio.to_thread(cache.flush)
            await source.flush()
            handlers.close()

    def _edge_writer(self, verifier: ServiceAccountVerifier) -> Callable[[], None]:
        settings = self.settings
        if settings.edge_dir is None or self.tls_files is None:
            return lambda: None
        host = "127.0.0.1" if settings.listen[0] in ("0.0.0.0", "::", "") else settings.listen[0]
        writer = EdgePublisher(
            verifier=verifier, directory=settings.edge_dir,
            backend=f"[{host}]:{settings.listen[1]}" if ":" in host else f"{host}:{settings.listen[1]}",
            cert_pem=self.tls_files.cert.read_bytes() + self.tls_files.key.read_bytes(),
            ca_file=self.tls_files.ca, token_map=settings.edge_token_map,
        )
        writer.keys_changed()  # published at start too: opaque-token clusters have no keys to announce it
        return writer.keys_changed

    def _pointer_settings(self) -> PointerSettings | None:
        ca = self.tls_files.ca if self.tls_files is not None else None
        if self.settings.public_url is None or ca is None:
            log.info("user-data Secrets are not written: they need --public-url and the self-made CA")
            return None
        return PointerSettings(self.settings.public_url, ca.read_bytes())

    def _ca_validity(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.settings.ca_lifetime)

    def _tls_context(self) -> ssl.SSLContext:
        tls = self.settings.tls
        if self.tls_files is not None:  # the replicas' shared CA (Kubernetes mode)
            return server_context(self.tls_files, tls.profile)
        if tls.cert_file is not None and tls.key_file is not None:
            self.tls_files = TLSFiles(tls.cert_file, tls.key_file, None)
        else:
            self.tls_files = ensure_self_signed(self.settings.cache_dir / "tls", self.settings.public_url, self._ca_validity())
            log.info("TLS: self-made CA at %s (put it in pointer configs' certificateAuthorities)", self.tls_files.ca)
        return server_context(self.tls_files, tls.profile)

    async def _start(self, app: web.Application, listen: tuple[str, int], ssl_context: ssl.SSLContext | None, name: str,
                     guard: ConnectionGuard | None = None) -> web.AppRunner:
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=self.settings.shutdown_timeout,
                               keepalive_timeout=KEEPALIVE_TIMEOUT)
        await runner.setup()
        site = (GuardedSite(runner, listen[0], listen[1], guard=guard, ssl_context=ssl_context, reuse_address=True,
                            proxy_from=self.settings.proxy_protocol_from)
                if guard is not None else web.TCPSite(runner, listen[0], listen[1], ssl_context=ssl_context, reuse_address=True))
        await site.start()
        server = site._server  # aiohttp exposes the bound port only here; needed for port 0
        if server is not None and server.sockets:  # type: ignore[union-attr]
            self.ports[name] = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner

    async def _run_source(self, source: Source, reconciler: Reconciler) -> None:
        delay = 1.0
        while True:
            try:
                await source.run(reconciler.handle)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The source is down (unreadable, unmounted), or its listing failed: keep
                # serving what the index knows and try again with back-off.
                log.error("source %s unavailable, serving from the cache: %s (retry in %.0fs)", source.describe(), exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _shutdown(self, runners: list[web.AppRunner], tasks: list[asyncio.Task[None]], cache: PayloadCache) -> None:
        log.info("draining: no new connections, finishing in-flight responses")
        self.state.draining = True
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for runner in runners:
            await runner.cleanup()
        await asyncio.to_thread(cache.flush)
        log.info("stopped")
