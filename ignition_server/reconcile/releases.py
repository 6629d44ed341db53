"""Releases: release pull spec → version and component images.

From the catalog first (an override, and the way for air-gapped sites), else from the
registry (`registry/resolver.py`), with images named through the configured mirrors. A
ConfigMap annotated `ignition-server.openshift.io/release-catalog: "true"` lists them under
the key `releases.yaml`:

    - pullSpec: quay.io/openshift-release-dev/ocp-release@sha256:...
      version: 4.17.3
      images:
        haproxy-router: quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:...

Several catalog ConfigMaps merge; a bad one keeps its last good entries.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from .. import bounded_yaml
from ..model.objects import ObjectKey, annotations_of
from ..registry.mirrors import Mirrors
from ..registry.resolver import ReleaseResolver

log = logging.getLogger("ignition_server.reconcile.releases")

ANNOTATION_RELEASE_CATALOG = "ignition-server.openshift.io/release-catalog"
CATALOG_KEY = "releases.yaml"
HAPROXY_IMAGE = "haproxy-router"


def release_key(pull_spec: str) -> ObjectKey:
    """A release as a dependency, beside the objects NodePools read."""
    return ObjectKey("Release", "", pull_spec)


def is_catalog(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") == "ConfigMap" and str(annotations_of(obj).get(ANNOTATION_RELEASE_CATALOG, "")).lower() == "true"


@dataclass(frozen=True)
class Release:
    pull_spec: str
    version: str
    images: Mapping[str, str]


def parse_catalog(obj: Mapping[str, Any]) -> dict[str, Release]:
    text = (obj.get("data") or {}).get(CATALOG_KEY)
    if not text:
        raise ValueError(f"no {CATALOG_KEY} key")
    entries = bounded_yaml.load(text) or []
    if not isinstance(entries, list):
        raise ValueError(f"{CATALOG_KEY} must be a list of releases")
    releases: dict[str, Release] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("pullSpec"), str) or not entry["pullSpec"].strip():
            raise ValueError(f"{CATALOG_KEY}[{index}] needs a pullSpec")
        images = entry.get("images") or {}
        if not isinstance(images, dict) or not all(isinstance(v, str) and v for v in images.values()):
            raise ValueError(f"{CATALOG_KEY}[{index}].images must map component names to image pull specs")
        spec = entry["pullSpec"].strip()
        releases[spec] = Release(spec, str(entry.get("version", "")), dict(images))
    return releases


@dataclass
class ReleaseCatalog:
    _by_object: dict[ObjectKey, dict[str, Release]] = field(default_factory=dict)
    _merged: dict[str, Release] = field(default_factory=dict)

    def get(self, pull_spec: str) -> Release | None:
        return self._merged.get(pull_spec)

    def update(self, key: ObjectKey, obj: Mapping[str, Any] | None) -> set[str]:
        """Apply a catalog object's change (None: deleted); returns the pull specs that changed."""
        if obj is None or not is_catalog(obj):
            self._by_object.pop(key, None)
        else:
            try:
                self._by_object[key] = parse_catalog(obj)
            except (ValueError, yaml.YAMLError) as exc:
                log.error("release catalog %s is invalid, keeping its last good entries: %s", key, exc)
                return set()
        merged: dict[str, Release] = {}
        for releases in self._by_object.values():
            merged.update(releases)
        changed = {spec for spec in set(merged) | set(self._merged) if merged.get(spec) != self._merged.get(spec)}
        self._merged = merged
        return changed

    def knows(self, key: ObjectKey) -> bool:
        return key in self._by_object


@dataclass
class Releases:
    """Where the reconciler looks releases up: the catalog, then what the resolver has read."""

    catalog: ReleaseCatalog = field(default_factory=ReleaseCatalog)
    resolver: ReleaseResolver | None = None
    mirrors: Mirrors | None = None

    def get(self, pull_spec: str) -> Release | None:
        release = self.catalog.get(pull_spec)
        if release is None and self.resolver is not None:
            content = self.resolver.known(pull_spec)
            if content is not None:
                release = Release(pull_spec, content.version, content.images)
        return release

    def digest(self, pull_spec: str) -> str | None:
        """The release's digest: named by the pull spec, or what the resolver read for its tag."""
        if "@sha256:" in pull_spec:
            return pull_spec.rpartition("@")[2]
        return self.resolver.digest_of(pull_spec) if self.resolver is not None else None

    def image(self, pull_spec: str, component: str) -> str | None:
        """A component image of the release, as the payload names it (its first mirror, if any)."""
        release = self.get(pull_spec)
        image = release.images.get(component) if release else None
        if image and self.mirrors is not None:
            return self.mirrors.rewrite(image)
        return image
