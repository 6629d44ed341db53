"""MCO base configurations: which ConfigMap holds the worker base of a cluster's release.

A ConfigMap in the hosted cluster's namespace (the token Secrets' namespace), annotated
`ignition-server.openshift.io/mco-base: "true"`, as `ignition-server base import` writes it:

    data:
      release: quay.io/openshift-release-dev/ocp-release@sha256:...   # pull spec, and/or
      releaseVersion: 4.17.3                                           # the version
      machineconfigs.yaml: |                                           # MachineConfigs, multi-document
        ...

A NodePool uses the base whose `release` is its release pull spec, else the one whose
`releaseVersion` is its release version. Two bases claiming the same release: the one whose
name sorts first wins (and the other is logged). The index keeps only names and keys
(the MachineConfigs stay in the source; a render reads them).

A NodePool depends on `base_key(namespace, "spec:" + pull spec)` and
`base_key(namespace, "version:" + version)`; a base's change names the keys of its release
before and after, so exactly that cluster's NodePools on that release render again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..model.mco_base import ANNOTATION_MCO_BASE, RELEASE_KEY, VERSION_KEY
from ..model.objects import ObjectKey, annotations_of, data_text

log = logging.getLogger("ignition_server.reconcile.bases")

# The release catalog's component images a base's payload needs (releases.py's `images`):
# the OS image nodes rebase to on first boot (osImageURL), and its extensions image.
RHCOS_IMAGE = "rhel-coreos"
RHCOS_EXTENSIONS_IMAGE = "rhel-coreos-extensions"


def is_base(obj: Mapping[str, Any] | None) -> bool:
    return obj is not None and obj.get("kind") == "ConfigMap" and \
        str(annotations_of(obj).get(ANNOTATION_MCO_BASE, "")).lower() == "true"


def base_key(namespace: str, release: str) -> ObjectKey:
    """A (cluster, release) pair as a dependency, beside the objects NodePools read."""
    return ObjectKey("MCOBase", namespace, release)


def release_keys(namespace: str, pull_spec: str, version: str) -> set[ObjectKey]:
    keys = set()
    if pull_spec:
        keys.add(base_key(namespace, "spec:" + pull_spec))
    if version:
        keys.add(base_key(namespace, "version:" + version))
    return keys


@dataclass(frozen=True)
class _Claim:
    namespace: str
    release: str
    version: str


@dataclass
class BaseIndex:
    _claims: dict[ObjectKey, _Claim] = field(default_factory=dict)
    _by_release: dict[ObjectKey, list[ObjectKey]] = field(default_factory=dict)  # base_key -> ConfigMaps, sorted

    def knows(self, key: ObjectKey) -> bool:
        return key in self._claims

    def update(self, key: ObjectKey, obj: Mapping[str, Any] | None) -> set[ObjectKey]:
        """Apply a ConfigMap's change (None: deleted); the dependency keys whose NodePools render again.

        A base's content changing (same release) names its release too: the NodePools' inputs
        digest decides whether anything is rendered."""
        before = self._claims.pop(key, None)
        touched = release_keys(before.namespace, before.release, before.version) if before else set()
        if before is not None:
            for dep in release_keys(before.namespace, before.release, before.version):
                self._by_release[dep].remove(key)
                if not self._by_release[dep]:
                    del self._by_release[dep]
        if obj is not None and is_base(obj):
            data = data_text(obj)
            claim = _Claim(key.namespace, str(data.get(RELEASE_KEY, "")).strip(), str(data.get(VERSION_KEY, "")).strip())
            if not claim.release and not claim.version:
                log.error("MCO base %s names no release (data.%s or data.%s): not used", key, RELEASE_KEY, VERSION_KEY)
            else:
                self._claims[key] = claim
                for dep in release_keys(claim.namespace, claim.release, claim.version):
                    holders = self._by_release.setdefault(dep, [])
                    holders.append(key)
                    holders.sort(key=lambda k: k.name)
                    if len(holders) > 1:
                        log.error("MCO bases %s all claim %s: %s is used", ", ".join(map(str, holders)), dep.name, holders[0])
                touched |= release_keys(claim.namespace, claim.release, claim.version)
        return touched

    def find(self, namespace: str, pull_spec: str, version: str) -> ObjectKey | None:
        """The ConfigMap holding the base for a NodePool of that cluster and release; None: no base."""
        for dep in (base_key(namespace, "spec:" + pull_spec), base_key(namespace, "version:" + version)):
            holders = self._by_release.get(dep)
            if holders and dep.name not in ("spec:", "version:"):
                return holders[0]
        return None
