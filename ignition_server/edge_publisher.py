"""What the server publishes for a front proxy (`proxy/`), kept in step with its trust.

With `--edge-dir DIR` the server writes, again whenever a service-account key rotates in or
out (a replaced key's overlap window ends), and whenever the serving pair on disk changes (a
renewal, a CA rotation: `follow`, every 5 s):

- `DIR/keys/sa-<fingerprint>.pem`: the public keys it trusts (never a private key);
- `DIR/edge.pem`: its serving certificate and key, for a proxy terminating TLS with a
  certificate the pointer configs already trust (mode 0600);
- `DIR/publication.json`: what the proxy needs to check tokens as the server does: the key
  files and their algs, the accepted issuers (legacy and every cluster's bound-token
  issuer), the path of the opaque-token map (`<cache-dir>/edge/tokens.map`: sha256 hex of
  each valid token, old and new during a rotation's overlap), the certificate and the CA that
  signed the serving certificate (to verify the server when re-encrypting), and `hosts`: the
  taken-over clusters' Route hostnames, each with its certificate in `DIR/hosts/` (issued from
  `sni-hosts.json` by tls/sni_files.py, rechecked every few seconds by `follow_hosts`), so a
  terminating proxy chooses by SNI as the server does.

The server only publishes: it imports nothing from `proxy/`, which reads this directory; the
files' format is the contract both import (`edge_publication.py`, beside this module).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .auth.claims import LEGACY_ISSUER
from .auth.cluster_keys import ClusterKeys
from .edge_publication import PUBLICATION, publication_document, write_key_files
from .fsio import atomic_write, make_dir
from .tls.sni_files import HostCertificateFiles

log = logging.getLogger("ignition_server.edge_publisher")


def _ensure_exists(path: Path) -> None:
    """HAProxy refuses a config whose map file is missing; an empty one never replaces the
    map the token outputs write (O_EXCL: only when there is none yet)."""
    make_dir(path.parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


@dataclass
class EdgePublisher:
    keys: ClusterKeys
    directory: Path
    backend: str  # host:port of this server
    # The serving certificate chain + key, for a terminating proxy's TLS, read at each write, and
    # what changes when that pair does on disk (the certificate renewed, the CA rotated): read
    # once at the start, a proxy kept the first certificate after the server had moved on.
    cert_pem: Callable[[], bytes]
    cert_stamp: Callable[[], object] = lambda: None
    ca_file: Path | None = None  # to verify the backend (the self-made CA)
    token_map: Path | None = None  # sha256 hex of each valid opaque token (TokenOutputs writes it)
    hosts: HostCertificateFiles | None = None  # the taken-over hostnames' certificates (self-made CA only)
    _task: asyncio.Task[None] | None = None
    _timer: asyncio.TimerHandle | None = None
    _written: bytes | None = field(default=None)
    _cert_stamp: object = None

    def keys_changed(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._write_soon(), name="edge-publication")

    async def _write_soon(self) -> None:
        await asyncio.sleep(0.05)
        await asyncio.to_thread(self.write)
        # A replaced key leaves the publication when its window closes: come back then.
        ends = [e for e in (self.keys.next_expiry(c) for c in self.keys.clusters()) if e is not None]
        if self._timer is not None:
            self._timer.cancel()
        if ends:
            delay = max(0.0, min(ends) - time.time()) + 0.01
            self._timer = asyncio.get_running_loop().call_later(delay, self.keys_changed)

    async def follow(self, interval: float = 5.0) -> None:
        """The serving pair changes on disk, the taken-over hostnames change (the takeover rewrites
        sni-hosts.json), the CA rotates, certificates near their end: publish again."""
        while True:
            await asyncio.sleep(interval)
            try:
                cert_due = self.cert_stamp() != self._cert_stamp
            except OSError:  # the pair being replaced: next time
                cert_due = False
            if cert_due or (self.hosts is not None and self.hosts.due()):
                self.keys_changed()

    def write(self) -> None:
        make_dir(self.directory)
        clusters = self.keys.clusters()
        keys = [key for cluster in clusters for key in self.keys.trusted_keys(cluster)]
        # The same issuers the server accepts: legacy tokens' and every cluster's bound-token
        # issuer (the server then checks each token against its own cluster's).
        issuers = sorted({LEGACY_ISSUER}.union(*(self.keys.issuers(c) for c in clusters)))
        published = write_key_files(self.directory / "keys", keys)
        cert_path = self.directory / "edge.pem"
        if self.token_map is not None:
            _ensure_exists(self.token_map)
        self._cert_stamp = self.cert_stamp()
        cert_pem = self.cert_pem()
        if not cert_path.exists() or cert_path.read_bytes() != cert_pem:
            atomic_write(cert_path, cert_pem, 0o600)
        document = publication_document(
            keys=published, issuers=issuers, token_map=self.token_map, cert=cert_path.resolve(),
            ca=self.ca_file.resolve() if self.ca_file else None, backend=self.backend,
            hosts=self.hosts.update() if self.hosts is not None else None,
        )
        if document != self._written:
            atomic_write(self.directory / PUBLICATION, document, 0o644)
            self._written = document
            log.info("edge publication written to %s with %d key(s)", self.directory, len(published))
