"""The contract between the server and a front proxy (`proxy/`): the edge directory's files.

The server writes them (`edge_publisher.py`'s EdgePublisher, beside this module), the proxy reads them
(`proxy/publication.py`, `proxy/jwt_frontend.py`); both import this module and nothing of each other.
`<dir>/publication.json` (PUBLICATION) names the public key files with their algs and key ids
(the edge answers an unknown kid 511, a known kid's bad signature 403), the accepted
issuers, the opaque-token map, the serving certificate and its CA; `<dir>/keys/<prefix>-<fp>.pem`
are the public keys (never a private key).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from payload_cache.fsio import atomic_write

from .auth.jwks import KeySource, TrustedKey, load_public_keys

PUBLICATION = "publication.json"
PUBLICATION_VERSION = 1


@dataclass(frozen=True)
class PublishedKey:
    """A public key file, the one alg it verifies (RS256 or ES256), and the key id tokens
    signed by it carry (None: unknown, e.g. a key file given by path only)."""

    path: str
    alg: str
    kid: str | None = None


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
        out.append(PublishedKey(str(path.resolve()), key.alg, key.kid))
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
        "keys": [{"path": k.path, "alg": k.alg, "kid": k.kid} for k in keys],
        "issuers": issuers,
        "token_map": str(token_map) if token_map else None,
        "cert": str(cert),
        "ca": str(ca) if ca else None,
        "backend": backend,
    }
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
