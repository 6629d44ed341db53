"""What a release image holds: its manifest picked for an architecture, and two files of its layers.

A layer is read from a verified file on disk as a tar stream; only
`release-manifests/image-references` and `release-manifests/release-metadata` are
extracted (each bounded in size), so a multi-gigabyte layer costs a chunk of memory.
"""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import yaml

from .. import bounded_yaml
from .client import LISTS, IntegrityError, json_object

IMAGE_REFERENCES = "release-manifests/image-references"
RELEASE_METADATA = "release-manifests/release-metadata"
WANTED = (IMAGE_REFERENCES, RELEASE_METADATA)
MAX_FILE_BYTES = 8 << 20


class NotARelease(Exception):
    """The image is fine but is not a release image (no image-references)."""


@dataclass(frozen=True)
class ReleaseContent:
    version: str
    images: Mapping[str, str]


def pick_manifest(media_type: str, body: bytes, architecture: str, what: str) -> str | None:
    """For a manifest list or index, the digest of the `architecture`/linux entry; None for a single manifest."""
    if media_type not in LISTS:
        return None
    manifests = json_object(body, what).get("manifests") or []
    for entry in manifests:
        platform = entry.get("platform") or {} if isinstance(entry, dict) else {}
        if platform.get("architecture") == architecture and platform.get("os", "linux") == "linux":
            return str(entry["digest"])
    found = sorted({str((e.get("platform") or {}).get("architecture")) for e in manifests if isinstance(e, dict)})
    raise NotARelease(f"{what} has no linux/{architecture} image (it has: {', '.join(found) or 'none'})")


def layer_digests(body: bytes, what: str) -> list[str]:
    layers = json_object(body, what).get("layers")
    if not isinstance(layers, list) or not layers:
        raise NotARelease(f"{what}: the image manifest lists no layers")
    return [str(layer.get("digest", "")) for layer in layers if isinstance(layer, dict)]


def extract(path: Path, found: dict[str, bytes]) -> None:
    """Add the wanted files of the layer tarball at `path` (gzip or plain) to `found`.

    Later layers overwrite earlier ones, as the image's filesystem would."""
    try:
        with tarfile.open(path, mode="r|*") as tar:
            for member in tar:
                name = member.name.lstrip("./").lstrip("/")
                if name not in WANTED or not member.isfile():
                    continue
                if member.size > MAX_FILE_BYTES:
                    raise NotARelease(f"{name} is larger than {MAX_FILE_BYTES} bytes")
                handle = tar.extractfile(member)
                if handle is not None:
                    found[name] = handle.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise IntegrityError(f"a layer is not a readable tar archive: {exc}") from None


def release_content(found: Mapping[str, bytes], what: str) -> ReleaseContent:
    if IMAGE_REFERENCES not in found:
        raise NotARelease(f"{what} is not a release image: no {IMAGE_REFERENCES}")
    try:
        stream = bounded_yaml.load(found[IMAGE_REFERENCES].decode())
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as exc:
        raise NotARelease(f"{what}: {IMAGE_REFERENCES} is not an ImageStream: {exc}") from None
    tags = ((stream or {}).get("spec") or {}).get("tags") if isinstance(stream, dict) else None
    if not isinstance(tags, list):
        raise NotARelease(f"{what}: {IMAGE_REFERENCES} has no spec.tags")
    images: dict[str, str] = {}
    for tag in tags:
        if isinstance(tag, dict) and isinstance(tag.get("name"), str):
            source = (tag.get("from") or {}).get("name")
            if isinstance(source, str) and source and not any(c.isspace() for c in source):
                images[tag["name"]] = source
    version = ""
    if RELEASE_METADATA in found:
        try:
            version = str(json.loads(found[RELEASE_METADATA]).get("version", ""))
        except (ValueError, AttributeError):
            pass  # the version is informative; the images are what the render needs
    if not version and isinstance(stream, dict):
        version = str((stream.get("metadata") or {}).get("name", ""))
    return ReleaseContent(version, images)


def _wanted(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p.rstrip("/") + "/") for p in prefixes)


def extract_tree(path: Path, prefixes: tuple[str, ...], dest: Path, max_bytes: int) -> int:
    """Write the regular files of the layer at `path` under any of `prefixes` into `dest`.

    Read as a stream (one member at a time, never the whole layer in memory), applied in
    layer order by the caller so a later layer's file replaces an earlier one's. Whiteouts
    (`.wh.*`) are ignored: a file an upper layer deletes stays; the MCO image does not
    delete its binaries or templates. Symlinks and devices are skipped; names escaping
    `dest` are refused. Returns the bytes written; more than `max_bytes` in all is refused."""
    written = 0
    root = dest.resolve()
    try:
        with tarfile.open(path, mode="r|*") as tar:
            for member in tar:
                name = member.name.lstrip("./").lstrip("/")
                if not member.isfile() or not _wanted(name, prefixes) or "/.wh." in "/" + name:
                    continue
                target = (root / name).resolve()
                if root not in target.parents:
                    raise IntegrityError(f"a layer names a file outside the image root: {member.name!r}")
                written += member.size
                if written > max_bytes:
                    raise IntegrityError(f"the files under {', '.join(prefixes)} exceed {max_bytes} bytes")
                handle = tar.extractfile(member)
                if handle is None:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.unlink(missing_ok=True)
                with open(target, "wb") as out:
                    while chunk := handle.read(1 << 20):
                        out.write(chunk)
                target.chmod(member.mode & 0o755)
    except (tarfile.TarError, EOFError) as exc:
        raise IntegrityError(f"a layer is not a readable tar archive: {exc}") from None
    return written
