"""The contract between the server and a front proxy (`proxy/`): the edge directory's files.

The server writes them (`edge_publisher.py`'s EdgePublisher, beside this module), the proxy reads them
(`proxy/publication.py`, `proxy/jwt_frontend.py`); both import this module and nothing of each other.
`<dir>/publication.json` (PUBLICATION) names the public key files with their algs and key ids
(the edge answers an unknown kid 511, a known kid's bad signature 403), the accepted
issuers, the opaque-token map, the serving certificate and its CA, and `hosts`: each taken-over
cluster's Route hostname with its own certificate file (`<dir>/hosts/<host>.pem`, tls/sni_files.py),
which a terminating proxy serves for that SNI name; `<dir>/keys/<prefix>-<fp>.pem` are the
public keys (never a private key). `<dir>/tls.json` (TLS_SETTINGS) is the TLS the
server's own context offers (its `--tls-profile` and `--fips`), which a terminating proxy
offers in its place.
"""

from __future__ import annotations

import json
import os
import re
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .auth.jwks import KeySource, TrustedKey, load_public_keys
from .fsio import atomic_write, make_dir
from .tls.profiles import NEVER_OFFERED, TLSProfile

PUBLICATION = "publication.json"
PUBLICATION_VERSION = 1
TLS_SETTINGS = "tls.json"
_CIPHER_NAMES = re.compile(r"[A-Za-z0-9_+!:@=.-]*")
_VERSION_NAMES = {ssl.TLSVersion.TLSv1: "VersionTLS10", ssl.TLSVersion.TLSv1_1: "VersionTLS11",
                  ssl.TLSVersion.TLSv1_2: "VersionTLS12", ssl.TLSVersion.TLSv1_3: "VersionTLS13"}


@dataclass(frozen=True)
class EdgeTLS:
    """What a server's TLS offers, for a proxy that terminates TLS in its place: the lowest
    version (OpenShift's names), the ciphers below TLS 1.3 and the TLS 1.3 suites (OpenSSL's
    names; "" for OpenSSL's own), and whether it issues session tickets."""

    min_version: str
    ciphers: str
    tls13_suites: str
    session_tickets: bool

    @classmethod
    def server_default(cls) -> "EdgeTLS":
        """The server's without flags: for a publication written before `tls.json` existed."""
        default = TLSProfile()
        return cls(default.min_version, default.ciphers + NEVER_OFFERED, "", False)

    @classmethod
    def of(cls, context: ssl.SSLContext) -> "EdgeTLS":
        """Read off the server's own serving context, so the edge follows whatever set it (a
        profile, FIPS mode's OpenSSL configuration), not a second copy of those rules."""
        enabled = context.get_ciphers()
        return cls(
            min_version=_VERSION_NAMES.get(context.minimum_version, "VersionTLS12"),
            ciphers=":".join(c["name"] for c in enabled if c["protocol"] != "TLSv1.3"),
            tls13_suites=":".join(c["name"] for c in enabled if c["protocol"] == "TLSv1.3"),
            session_tickets=not (context.options & ssl.OP_NO_TICKET) or context.num_tickets > 0,
        )


def write_tls_settings(directory: str | os.PathLike[str], tls: EdgeTLS) -> None:
    """`<directory>/tls.json`, atomically (mode 0644: nothing secret)."""
    document = {"min_version": tls.min_version, "ciphers": tls.ciphers, "tls13_suites": tls.tls13_suites,
                "session_tickets": tls.session_tickets}
    make_dir(Path(directory))
    atomic_write(Path(directory) / TLS_SETTINGS, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode(), 0o644)


def parse_tls_settings(text: str) -> EdgeTLS:
    """Pure: `tls.json`'s text to an EdgeTLS (ValueError, KeyError or TypeError when it is not one)."""
    data = json.loads(text)
    tls = EdgeTLS(str(data["min_version"]), str(data["ciphers"]), str(data["tls13_suites"]),
                  data["session_tickets"] is True)
    if tls.min_version not in _VERSION_NAMES.values():
        raise ValueError(f"unknown TLS version {tls.min_version!r}")
    for names in (tls.ciphers, tls.tls13_suites):  # a proxy writes them into its configuration as they are
        if not _CIPHER_NAMES.fullmatch(names):
            raise ValueError(f"not a list of OpenSSL cipher names: {names!r}")
    return tls


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
    hosts: Mapping[str, Path] | None = None,
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
        "hosts": {name: str(path) for name, path in sorted((hosts or {}).items())},
    }
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
