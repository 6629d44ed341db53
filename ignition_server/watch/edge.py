"""What the server publishes for a front proxy (`proxy/`), kept in step with its trust.

With `--edge-dir DIR` the server writes, again whenever a service-account key rotates in or
out (a replaced key's overlap window ends):

- `DIR/keys/sa-<fingerprint>.pem`: the public keys it trusts (never a private key);
- `DIR/edge.pem`: its serving certificate and key, for a proxy terminating TLS with a
  certificate the pointer configs already trust (mode 0600);
- `DIR/publication.json`: what the proxy needs to check tokens as the server does: the key
  files and their algs, the accepted issuers (legacy and every cluster's bound-token
  issuer), the path of the opaque-token map (`<cache-dir>/edge/tokens.map`: sha256 hex of
  each valid token, old and new during a rotation's overlap), the certificate and the CA that
  signed the serving certificate (to verify the server when re-encrypting).

The server only publishes: it imports nothing from `proxy/`, which reads this directory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from payload_cache.fsio import atomic_write, make_dir

from ..auth.claims import LEGACY_ISSUER
from ..auth.jwks import KeySource, TrustedKey, load_public_keys
from ..auth.jwt import ServiceAccountVerifier

log = logging.getLogger("ignition_server.watch.edge")

PUBLICATION = "publication.json"
PUBLICATION_VERSION = 1


@dataclass(frozen=True)
class PublishedKey:
    """A public key file and the one alg it verifies (RS256 or ES256)."""

    path: str
    alg: str


def _ensure_exists(path: Path) -> None:
    """HAProxy refuses a config whose map file is missing; an empty one never replaces the
    map the token outputs write (O_EXCL: only when there is none yet)."""
    make_dir(path.parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def write_key_files(
    directory: str | os.PathLike[str],
    keys: Iterable[TrustedKey | KeySource] | TrustedKey | KeySource,
    *,
    prefix: str = "sa",
    prune: bool = True,
) -> list[PublishedKey]:
    """Write each public key as `<directory>/<prefix>-<fingerprint>.pem` (atomically, mode
    0644) and return them with their algs. A private key is refused (`PrivateKeyRefused`).
    With `prune`, other `<prefix>-*.pem` files (keys past their window) are removed."""
    if not prefix.replace("_", "").replace("-", "").isalnum():
        raise ValueError("prefix must be a plain identifier")
    if isinstance(keys, TrustedKey):
        keys = [keys]
    items = list(keys) if isinstance(keys, (list, tuple)) else [keys]
    trusted: list[TrustedKey] = []
    for item in items:
        trusted.extend([item] if isinstance(item, TrustedKey) else load_public_keys(item))
    base = Path(directory)
    base.mkdir(parents=True, exist_ok=True)
    out: list[PublishedKey] = []
    wanted: set[str] = set()
    for key in trusted:
        path = base / f"{prefix}-{key.fingerprint[:32]}.pem"
        if path.name in wanted:
            continue
        wanted.add(path.name)
        data = key.pem()
        if not path.exists() or path.read_bytes() != data:
            atomic_write(path, data, 0o644)
        out.append(PublishedKey(str(path.resolve()), key.alg))
    if prune:
        for stale in base.glob(f"{prefix}-*.pem"):
            if stale.name not in wanted:
                stale.unlink()
    return out


def publication_document(
    *, keys: list[PublishedKey], issuers: list[str], token_map: Path | None, cert: Path, ca: Path | None, backend: str,
) -> bytes:
    """The manifest a proxy reads. Pure."""
    document = {
        "version": PUBLICATION_VERSION,
        "keys": [{"path": k.path, "alg": k.alg} for k in keys],
        "issuers": issuers,
        "token_map": str(token_map) if token_map else None,
        "cert": str(cert),
        "ca": str(ca) if ca else None,
        "backend": backend,
    }
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


@dataclass
class EdgePublisher:
    verifier: ServiceAccountVerifier
    directory: Path
    backend: str  # host:port of this server
    cert_pem: bytes  # serving certificate chain + key, for a terminating proxy's TLS
    ca_file: Path | None = None  # to verify the backend (the self-made CA)
    token_map: Path | None = None  # sha256 hex of each valid opaque token (TokenOutputs writes it)
    _task: asyncio.Task[None] | None = None
    _timer: asyncio.TimerHandle | None = None
    _written: bytes | None = field(default=None)

    def keys_changed(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._write_soon(), name="edge-publication")

    async def _write_soon(self) -> None:
        await asyncio.sleep(0.05)
        await asyncio.to_thread(self.write)
        # A replaced key leaves the publication when its window closes: come back then.
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
        published = write_key_files(self.directory / "keys", keys)
        cert_path = self.directory / "edge.pem"
        if self.token_map is not None:
            _ensure_exists(self.token_map)
        if not cert_path.exists() or cert_path.read_bytes() != self.cert_pem:
            atomic_write(cert_path, self.cert_pem, 0o600)
        document = publication_document(
            keys=published, issuers=issuers, token_map=self.token_map, cert=cert_path.resolve(),
            ca=self.ca_file.resolve() if self.ca_file else None, backend=self.backend,
        )
        if document != self._written:
            atomic_write(self.directory / PUBLICATION, document, 0o644)
            self._written = document
            log.info("edge publication written to %s with %d key(s)", self.directory, len(published))
