"""Which registries releases (and the images they name) may be read from: `--registry-allow`.

A token Secret names its release by pull spec, and a tenant writes token Secrets: without a
list, the server would connect to any host:port a tenant names (a probe of the management
cluster's network) and, with `--generate-bases`, run binaries from any registry the tenant
runs. An entry is a registry host (`registry.redhat.io`, `mirror.local:5000`) or a host and
repository prefix at a `/` boundary (`quay.io/openshift-release-dev`: anyone can push to
quay.io); `*` allows every registry. Mirrors the operator configured (`--registry-overrides`,
mirror sets from shared namespaces) are allowed as such: the origin of a mirrored image need
not be listed, it is then only read through its mirrors.
"""

from __future__ import annotations

from dataclasses import dataclass

from .reference import Reference


def parse_allowed(text: str) -> "AllowedRegistries":
    entries = tuple(e.strip().rstrip("/") for e in (text or "").split(",") if e.strip())
    for entry in entries:
        if entry != "*" and ("://" in entry or entry.startswith("/") or " " in entry):
            raise ValueError(f"--registry-allow: {entry!r} is not a registry host or host/repository prefix")
    return AllowedRegistries(entries)


@dataclass(frozen=True)
class AllowedRegistries:
    entries: tuple[str, ...]

    def allows(self, ref: Reference) -> bool:
        name = ref.name  # host/repository
        return any(e == "*" or name == e or name.startswith(e + "/") for e in self.entries)

    def describe(self) -> str:
        return ", ".join(self.entries) or "none"
