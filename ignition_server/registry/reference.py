"""Image pull specs: `[host[:port]/]repository[:tag][@sha256:...]`, as container tools read them."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_REPO = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")


class ReferenceError(ValueError):
    """Not an image pull spec."""


@dataclass(frozen=True)
class Reference:
    host: str  # as written (docker.io for Docker Hub); `api_host` is where requests go
    repository: str
    tag: str = ""
    digest: str = ""

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.host == DOCKER_HUB else self.host

    @property
    def name(self) -> str:
        return f"{self.host}/{self.repository}"

    @property
    def version(self) -> str:
        """What the manifest is fetched by: the digest when there is one, else the tag."""
        return self.digest or self.tag or "latest"

    def at(self, digest: str) -> Reference:
        return replace(self, tag="", digest=digest)

    def __str__(self) -> str:
        text = self.name
        if self.tag:
            text += ":" + self.tag
        if self.digest:
            text += "@" + self.digest
        return text


def parse(spec: str) -> Reference:
    text = spec.strip()
    if not text or any(c.isspace() for c in text) or "://" in text:
        raise ReferenceError(f"not an image pull spec: {spec!r}")
    name, _, digest = text.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        raise ReferenceError(f"{spec!r}: only sha256 digests (sha256:<64 hex>) are supported")
    tag = ""
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise ReferenceError(f"{spec!r}: invalid tag {tag!r}")
    first, sep, rest = name.partition("/")
    # The first component is a host when it looks like one (a dot, a port, or localhost).
    if sep and ("." in first or ":" in first or first == "localhost"):
        host, repository = first, rest
    else:
        host, repository = DOCKER_HUB, name
    if host in ("index.docker.io", "registry-1.docker.io"):
        host = DOCKER_HUB
    if host == DOCKER_HUB and "/" not in repository:
        repository = "library/" + repository
    if not _REPO.fullmatch(repository):
        raise ReferenceError(f"{spec!r}: invalid repository {repository!r}")
    if not tag and not digest:
        tag = "latest"
    return Reference(host, repository, tag, digest)
