"""Building the resolver from settings: one HTTP session (proxy-aware), one TLS trust, the store."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path
from typing import Callable

import aiohttp

from ..config import RegistrySettings
from ..metrics import ServerMetrics
from .client import RegistryClient
from .mirrors import Mirrors
from .resolver import ReleaseResolver, ReleaseStore, ResolverSettings


def base_context(ca_file: Path | None) -> Callable[[], ssl.SSLContext]:
    def make() -> ssl.SSLContext:
        context = ssl.create_default_context()
        if ca_file is not None:
            context.load_verify_locations(cafile=str(ca_file))
        return context

    return make


def open_resolver(
    settings: RegistrySettings, mirrors: Mirrors, store: ReleaseStore, metrics: ServerMetrics,
    on_resolved: Callable[[str], None], work_dir: Path,
) -> tuple[ReleaseResolver, aiohttp.ClientSession]:
    """The resolver and the session to close at shutdown. Call inside the running loop."""
    make_context = base_context(settings.ca_file)
    # trust_env: HTTPS_PROXY / NO_PROXY, the cluster-wide proxy as OpenShift injects it.
    session = aiohttp.ClientSession(trust_env=True, connector=aiohttp.TCPConnector(limit=16))
    client = RegistryClient(
        session=session, ssl_context=make_context(), timeout=settings.timeout,
        count=lambda host, result: metrics.registry_requests.labels(registry=host, result=result).inc(),
        count_bytes=metrics.registry_bytes.inc,
    )
    work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for leftover in work_dir.glob("layer-*"):  # a layer download a crash interrupted
        shutil.rmtree(leftover, ignore_errors=True)
    resolver = ReleaseResolver(
        client=client, mirrors=mirrors, store=store,
        settings=ResolverSettings(architecture=settings.architecture, tag_ttl=settings.tag_ttl),
        on_resolved=on_resolved, observe=metrics.release_resolution.observe, fetched=metrics.release_fetches.inc,
        work_dir=work_dir, make_context=make_context,
    )
    return resolver, session
