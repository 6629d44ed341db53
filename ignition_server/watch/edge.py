"""The edge HAProxy config (IBM's design: a token-checking HAProxy in front of the server),
kept in step with the hosted clusters' service-account keys.

With `--edge-dir DIR --edge-bind HOST:PORT` the server writes `DIR/keys/*.pem` (public keys
only), `DIR/edge.pem` (its serving certificate and key, for the edge's TLS) and
`DIR/haproxy.cfg`, again whenever a key rotates in or out (a replaced key's overlap window
ends). Run or reload HAProxy with that file; it refuses forged JWTs before they reach the
server, which still checks every token itself (per cluster). It trusts what the server
trusts: the same keys (with their overlap) and issuers (legacy and each cluster's bound-token
issuer), and the opaque tokens of `<cache-dir>/edge/tokens.map` (hashes, old and new during a
rotation's overlap; HAProxy reads the map at start, so reload it, or change it through the
runtime API, when the map changes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from payload_cache.fsio import atomic_write, make_dir
from proxy.edge import render_edge_config, write_key_files

from ..auth.jwt import LEGACY_ISSUER, ServiceAccountVerifier

log = logging.getLogger("ignition_server.watch.edge")


def _ensure_exists(path: Path) -> None:
    """HAProxy refuses a config whose map file is missing; an empty one never replaces the
    map the token outputs write (O_EXCL: only when there is none yet)."""
    make_dir(path.parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


@dataclass
class EdgeWriter:
    verifier: ServiceAccountVerifier
    directory: Path
    bind: str  # host:port the edge listens on
    backend: str  # host:port of this server
    cert_pem: bytes  # serving certificate chain + key, for the edge's TLS
    ca_file: Path | None = None  # to verify the backend (the self-made CA)
    token_map: Path | None = None  # sha256 hex of each valid opaque token (TokenOutputs writes it)
    _task: asyncio.Task[None] | None = None
    _timer: asyncio.TimerHandle | None = None
    _written: str | None = field(default=None)

    def keys_changed(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._write_soon(), name="edge-config")

    async def _write_soon(self) -> None:
        await asyncio.sleep(0.05)
        await asyncio.to_thread(self.write)
        # A replaced key leaves the edge when its window closes: come back then.
        ends = [e for e in (self.verifier.next_expiry(c) for c in self.verifier.clusters()) if e is not None]
        if self._timer is not None:
            self._timer.cancel()
        if ends:
            delay = max(0.0, min(ends) - time.time()) + 0.01
            self._timer = asyncio.get_running_loop().call_later(delay, self.keys_changed)

    def write(self) -> None:
        make_dir(self.directory)
        clusters = self.verifier.clusters()
        keys = [key for cluster in clusters for key in self.verifier.trusted_keys(cluster)]
        # The same issuers the server accepts: legacy tokens' and every cluster's bound-token
        # issuer (the server then checks each token against its own cluster's).
        issuers = sorted({LEGACY_ISSUER}.union(*(self.verifier.issuers(c) for c in clusters)))
        edge_keys = write_key_files(self.directory / "keys", keys)
        cert_path = self.directory / "edge.pem"
        if self.token_map is not None:
            _ensure_exists(self.token_map)
        atomic_write(cert_path, self.cert_pem, 0o600)
        server_options = f"ssl verify required ca-file {self.ca_file}" if self.ca_file else "ssl verify none"
        if not edge_keys:
            config = "# No service-account keys known yet: nothing for an edge to check.\n"
        else:
            config = render_edge_config(
                bind=self.bind, backend_servers=[self.backend], key_files=edge_keys, issuers=issuers,
                token_map=str(self.token_map) if self.token_map else None, bearer=self.token_map is not None,
                bind_options=f"ssl crt {cert_path}", server_options=server_options,
                open_paths=("/healthz", "/readyz"),
            )
        if config != self._written:
            atomic_write(self.directory / "haproxy.cfg", config.encode(), 0o644)
            self._written = config
            log.info("edge config written to %s with %d key(s)", self.directory / "haproxy.cfg", len(edge_keys))
