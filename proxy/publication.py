"""What a server publishes for the proxy (its `--edge-dir`), read back.

The server writes `publication.json` last, after the key files and the certificate it names
(ignition_server.edge_publisher), so a manifest that parses names files that exist.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ignition_server.edge_publication import PUBLICATION, PublishedKey


class PublicationError(ValueError):
    """The publication is missing or unusable (the caller keeps the last good one)."""


@dataclass(frozen=True)
class Publication:
    keys: tuple[PublishedKey, ...]
    issuers: tuple[str, ...]
    token_map: Path | None
    cert: Path
    ca: Path | None


def parse_publication(text: str) -> Publication:
    """Pure: the manifest's text to a :class:`Publication`."""
    try:
        data = json.loads(text)
        keys = tuple(
            PublishedKey(str(k["path"]), str(k["alg"]), str(k["kid"]) if k.get("kid") else None) for k in data["keys"]
        )
        issuers = tuple(str(i) for i in data["issuers"])
        token_map = Path(data["token_map"]) if data.get("token_map") else None
        cert = Path(data["cert"])
        ca = Path(data["ca"]) if data.get("ca") else None
    except (ValueError, KeyError, TypeError) as error:
        raise PublicationError(f"publication not readable: {error}") from None
    return Publication(keys, issuers, token_map, cert, ca)


def read_publication(directory: Path) -> Publication:
    try:
        return parse_publication((directory / PUBLICATION).read_text())
    except OSError as error:
        raise PublicationError(f"no publication in {directory}: {error}") from None


def parse_token_map(text: str) -> dict[str, str]:
    """`<sha256 hex> <namespace>/<nodepool>` lines to a dict. Pure; odd lines are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64 and all(c in "0123456789abcdef" for c in parts[0]):
            out[parts[0]] = parts[1]
    return out
