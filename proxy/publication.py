"""What a server publishes for the proxy (its `--edge-dir`), read back.

The server writes `publication.json` last, after the key files and the certificate it names
(ignition_server.edge_publisher), so a manifest that parses names files that exist.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ignition_server.edge_publication import PUBLICATION, TLS_SETTINGS, EdgeTLS, PublishedKey, parse_tls_settings
from ignition_server.tls.sni import is_host_name


class PublicationError(ValueError):
    """The publication is missing or unusable (the caller keeps the last good one)."""


@dataclass(frozen=True)
class Publication:
    keys: tuple[PublishedKey, ...]
    issuers: tuple[str, ...]
    token_map: Path | None
    cert: Path
    ca: Path | None
    tls: EdgeTLS = EdgeTLS.server_default()  # what the server's TLS offers: a terminating edge offers the same
    # Taken-over clusters' Route hostnames and each one's certificate file (the server's tls/sni_files.py):
    # a terminate route routes and serves them by SNI too.
    hosts: tuple[tuple[str, Path], ...] = ()


def parse_publication(text: str, tls_text: str | None = None) -> Publication:
    """Pure: the manifest's text (and `tls.json`'s, when the server wrote one) to a :class:`Publication`."""
    try:
        data = json.loads(text)
        keys = tuple(
            PublishedKey(str(k["path"]), str(k["alg"]), str(k["kid"]) if k.get("kid") else None) for k in data["keys"]
        )
        issuers = tuple(str(i) for i in data["issuers"])
        token_map = Path(data["token_map"]) if data.get("token_map") else None
        cert = Path(data["cert"])
        ca = Path(data["ca"]) if data.get("ca") else None
        tls = parse_tls_settings(tls_text) if tls_text is not None else EdgeTLS.server_default()
        hosts = tuple(sorted((str(name), Path(path)) for name, path in (data.get("hosts") or {}).items()))
        for name, _ in hosts:  # written into the config as SNI filters and ACL patterns
            if not is_host_name(name):
                raise ValueError(f"hosts: {name!r} is not a host name")
    except (ValueError, KeyError, TypeError) as error:
        raise PublicationError(f"publication not readable: {error}") from None
    return Publication(keys, issuers, token_map, cert, ca, tls, hosts)


def read_publication(directory: Path) -> Publication:
    try:
        text = (directory / PUBLICATION).read_text()
    except OSError as error:
        raise PublicationError(f"no publication in {directory}: {error}") from None
    try:
        tls_text: str | None = (directory / TLS_SETTINGS).read_text()
    except FileNotFoundError:
        tls_text = None  # a server older than tls.json: it served its defaults
    except OSError as error:
        raise PublicationError(f"{directory / TLS_SETTINGS} not readable: {error}") from None
    return parse_publication(text, tls_text)


def parse_token_map(text: str) -> dict[str, str]:
    """`<sha256 hex> <namespace>/<nodepool>` lines to a dict. Pure; odd lines are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64 and all(c in "0123456789abcdef" for c in parts[0]):
            out[parts[0]] = parts[1]
    return out
