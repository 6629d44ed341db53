"""Some files of an image, extracted to a directory: its layers pulled, verified and streamed.

The generic "extract these paths from an image" (the MCO base generator takes the
machine-config-operator image's binaries and templates with it). The manifest is picked
for the architecture as for releases; each layer is downloaded to a temp file while its
digest is checked (client.blob_to_file), then read as a tar stream bottom layer first, so
an upper layer's file replaces a lower one's. Mirrors are tried in order, then the origin.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .auth import AuthError, credentials_for
from .client import Refused, RegistryClient, RegistryError, Unreachable
from .layers import NotARelease, extract_tree, layer_digests, pick_manifest
from .mirrors import Mirrors
from .reference import Reference, parse

log = logging.getLogger("ignition_server.registry")


@dataclass(frozen=True)
class ImageFiles:
    client: RegistryClient
    mirrors: Mirrors
    architecture: str = "amd64"
    work_dir: Path | None = None  # where layers are downloaded (temp files, removed after use)
    max_layer_bytes: int = 4 << 30
    max_extracted_bytes: int = 2 << 30

    async def extract(self, image: str, prefixes: tuple[str, ...], dest: Path, pull_secret: str | None,
                      tls: ssl.SSLContext | None = None) -> int:
        """Files of `image` under `prefixes` into `dest`; the bytes written. Raises RegistryError."""
        ref = parse(image)
        errors: list[str] = []
        last: Exception | None = None
        candidates = self.mirrors.candidates(ref)
        if not candidates:
            raise Refused(self.mirrors.refusal(ref))
        for candidate in candidates:
            try:
                written = await self._extract_from(candidate, prefixes, dest, pull_secret, tls)
            except (RegistryError, AuthError, NotARelease) as exc:
                if isinstance(exc, Unreachable):
                    self.mirrors.failed(candidate.api_host)
                errors.append(f"{candidate.host}: {exc}")
                last = exc
                log.warning("image %s from %s: %s", image, candidate.host, exc)
                continue
            self.mirrors.worked(candidate.api_host)
            return written
        if isinstance(last, RegistryError):
            raise type(last)("; ".join(errors))
        raise RegistryError("; ".join(errors) or f"no registry to read {image} from")

    async def _extract_from(self, ref: Reference, prefixes: tuple[str, ...], dest: Path, pull_secret: str | None,
                            tls: ssl.SSLContext | None) -> int:
        creds = credentials_for(pull_secret, ref)
        what = str(ref)
        media_type, body, _digest = await self.client.manifest(ref, creds, tls)
        sub = pick_manifest(media_type, body, self.architecture, what)
        if sub is not None:
            _media, body, _d = await self.client.manifest(ref.at(sub), creds, tls)
        written = 0
        for layer in layer_digests(body, what):  # bottom first: upper layers replace lower ones
            with tempfile.TemporaryDirectory(dir=self.work_dir, prefix="layer-") as tmp:
                path = Path(tmp) / "layer"
                await self.client.blob_to_file(ref, layer, creds, path, self.max_layer_bytes, tls)
                written += await asyncio.to_thread(
                    extract_tree, path, prefixes, dest, self.max_extracted_bytes - written)
        return written
