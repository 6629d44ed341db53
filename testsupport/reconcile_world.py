"""A reconciler over a real file source, a real encrypted cache and the real renderer, on a test
clock: what the reconciler's tests (tests/reconcile/, tests/sources/, tests/render/test_mco_base.py)
build their world from, here once instead of a copy in each test file."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ignition_server.auth.jwt import ServiceAccountVerifier
from ignition_server.auth.rotation_policy import RotationPolicy
from ignition_server.metrics import ServerMetrics
from ignition_server.model.token_secret import is_token_secret
from ignition_server.reconcile.outputs import PointerSettings, TokenOutputs
from ignition_server.reconcile.reconciler import Reconciler
from ignition_server.reconcile.tenancy import Tenancy
from ignition_server.reconcile.trust import TrustWatcher
from ignition_server.reconcile.wiring import Watcher, build_watcher
from ignition_server.render.payload import render_payload
from ignition_server.sources.files import FileSource
from payload_cache import CacheConfig, PayloadCache
from testsupport.clock import T0, Clock
from testsupport.harness import EXAMPLE_MACHINECONFIG
from testsupport.manifests import CA_PEM, build_token_secret
from testsupport.watcher import wait_idle

POINTER_URL = "https://ignition.example.com:9090"


def file_reconciler(tmp_path: Path, clock: Clock, *, shared: Iterable[str], ca_pem: bytes = b"",
                    verifier: ServiceAccountVerifier | None = None,
                    ) -> tuple[Reconciler, FileSource, PayloadCache, Path, TokenOutputs]:
    """A reconciler as `serve` builds it over a directory (`tmp_path/source`): token outputs
    (the edge's token map, pointer configs), tenancy with `shared` as the shared namespaces,
    and, given a verifier, the service-account keys it trusts. No debounce: a test settles it."""
    source_dir = tmp_path / "source"
    source_dir.mkdir(exist_ok=True)  # opened again over the same directories: a restart
    cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache"))
    source = FileSource(source_dir)
    outputs = TokenOutputs(source, tmp_path / "cache" / "edge" / "tokens.map", PointerSettings(POINTER_URL, ca_pem),
                           delay=0.0)
    metrics = ServerMetrics()
    trust = None if verifier is None else TrustWatcher(
        verifier.keys, on_refused=metrics.tenancy_refusals.labels(what="service-account-key").inc)
    reconciler = build_watcher(source=source, cache=cache, renderer=render_payload, policy=RotationPolicy(100.0),
                               metrics=metrics, clock=clock, outputs=outputs, debounce=0.0,
                               tenancy=Tenancy(frozenset(shared)), trust=trust).reconciler
    source._handler = reconciler.handle
    return reconciler, source, cache, source_dir, outputs


def inputs_world(tmp_path: Path) -> tuple[Reconciler, FileSource, PayloadCache, Path, Clock, TokenOutputs]:
    """(reconciler, source, cache, source_dir, clock, outputs): file_reconciler with the shared
    namespaces `ignition-server` and `shared`, pointer configs carrying CA_PEM."""
    clock = Clock()
    reconciler, source, cache, source_dir, outputs = file_reconciler(
        tmp_path, clock, shared={"ignition-server", "shared"}, ca_pem=CA_PEM.encode())
    return reconciler, source, cache, source_dir, clock, outputs


def open_watcher(source_dir: Path, clock: Clock, *, read_only: bool = False) -> tuple[Watcher, FileSource, PayloadCache]:
    """A watcher (reconciler and housekeeping), file source and cache over `source_dir` and the
    cache beside it (`cache/`), as a (re)started server opens them; no token outputs."""
    cache = PayloadCache.open(CacheConfig(cache_dir=source_dir.parent / "cache"))
    source = FileSource(source_dir, read_only=read_only, retain=lambda obj: not is_token_secret(obj))
    watcher = build_watcher(source=source, cache=cache, renderer=render_payload, policy=RotationPolicy(ttl=100.0),
                            metrics=ServerMetrics(), clock=clock)
    source._handler = watcher.reconciler.handle
    return watcher, source, cache


def reopenable_world(tmp_path: Path) -> tuple[Callable[..., tuple[Reconciler, FileSource, PayloadCache]], Clock, Path]:
    """(make, clock, source_dir): make(read_only=False) opens a new reconciler, file source and
    cache over the same directories (`tmp_path/source`, `tmp_path/cache`), as a restarted server
    opens them (`open_watcher`)."""
    clock = Clock()
    source_dir = tmp_path / "source"
    source_dir.mkdir()

    def make(read_only: bool = False) -> tuple[Reconciler, FileSource, PayloadCache]:
        watcher, source, cache = open_watcher(source_dir, clock, read_only=read_only)
        return watcher.reconciler, source, cache

    return make, clock, source_dir


def pool_secret(pool: str, token: str, **kwargs: Any) -> dict[str, Any]:
    """NodePool `pool`'s token Secret in `clusters-a`, generated at T0 (build_token_secret's keywords)."""
    return build_token_secret(
        namespace="clusters-a", nodepool=f"clusters/{pool}", token=token,
        machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=pool), generation_time=kwargs.pop("generation_time", T0),
        **kwargs,
    )


async def settle(reconciler: Reconciler, source: FileSource, outputs: TokenOutputs | None = None) -> None:
    """Until the source's changes are read, rendered and written back, and the outputs published."""
    for _ in range(3):
        await source.poll_once()
        await wait_idle(reconciler)
        if outputs is not None and outputs._task is not None:
            await outputs._task


def renders(reconciler: Reconciler) -> float:
    """How many renders the reconciler has run (the cache misses it counted)."""
    return reconciler.metrics.payload_cache_miss._value.get()
