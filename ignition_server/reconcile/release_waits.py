"""What the reconciler does about releases it does not know yet: ask the resolver, wait, say why.

A NodePool whose payload runs a release component (the node's kube-apiserver HAProxy)
renders once its release is known (catalog or registry). Until then its render waits
(no status churn: the last good payload keeps serving); a failed resolution becomes the
Secret's `reason`/`message` (`InvalidConfig` for refused credentials or a tampered image,
`ReleaseUnavailable` for an unreachable registry) and is retried with back-off.

With several replicas (`share_namespace` set: Kubernetes mode) only the writer reads
registries; it publishes what the payloads need of each release (its component images, a
few hundred bytes) as a release catalog ConfigMap in its own namespace, and the other
replicas read that like any catalog.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Mapping

import yaml

from ..model.objects import ObjectKey, config_map, data_text
from ..model.token_secret import TokenSecret
from ..render.inputs import NodePoolInputs
from .input_graph import InputGraph
from .inputs import JOIN_INPUTS, input_key
from .releases import ANNOTATION_RELEASE_CATALOG, CATALOG_KEY, HAPROXY_IMAGE, Releases, release_key
from .status import DependencyWaits, Status, Waiting

log = logging.getLogger("ignition_server.reconcile")

# What payloads name of a release: the node HAProxy's image, and with an MCO base the OS
# image and its extensions (the MCO image is for the writer's base generation; shared so
# the writer, which reads its own catalog first, still finds it).
SHARED_IMAGES = frozenset((HAPROXY_IMAGE, "rhel-coreos", "rhel-coreos-extensions", "machine-config-operator"))


@dataclass(kw_only=True)
class ReleaseWaits(DependencyWaits):
    """Which NodePools wait for a release: asks the resolver, waits, says why.

    The renders ask `blocked` before rendering; when the resolver is done with a pull spec,
    every NodePool that reads the release is requeued and renders again."""

    releases: Releases
    input_graph: InputGraph

    def resolved(self, pull_spec: str) -> None:
        """The resolver finished with `pull_spec` (known now, or failed): its NodePools look again."""
        self.requeue(release_key(pull_spec))
        resolver = self.releases.resolver
        content = resolver.known(pull_spec) if resolver is not None else None
        if content is not None and self.share_namespace and self.writer():
            asyncio.create_task(self._share(pull_spec, dict(content.images), content.version), name=f"share {pull_spec}")

    async def _share(self, pull_spec: str, images: dict[str, str], version: str) -> None:
        """Publish a release for the other replicas: only the components a payload names."""
        wanted = {name: image for name, image in images.items() if name in SHARED_IMAGES}
        name = "ignition-server-release-" + hashlib.sha256(pull_spec.encode()).hexdigest()[:16]
        entry = [{"pullSpec": pull_spec, "version": version, "images": wanted}]
        await self.publish(config_map(self.share_namespace, name, {CATALOG_KEY: yaml.safe_dump(entry, sort_keys=True)},
                                      {ANNOTATION_RELEASE_CATALOG: "true"}), f"release {pull_spec}")

    def nudge(self) -> None:
        """A replica that became the writer takes over the releases the others wait for."""
        if not self.share_namespace or self.releases.resolver is None or not self.writer():
            return
        resolver = self.releases.resolver
        for dependency in self.input_graph.releases_read():
            spec = dependency.name
            if self.releases.get(spec) is None and not resolver.pending(spec) and spec not in self._asking \
                    and resolver.failure(spec) is None:
                self.requeue(dependency)

    def mirror_set_changed(self, key: ObjectKey, obj: Mapping[str, Any] | None) -> None:
        mirrors = self.releases.mirrors
        if mirrors is None:
            return
        try:
            changed = mirrors.update(key, obj)
        except ValueError as exc:
            log.error("mirror set %s is invalid, keeping its last good rules: %s", key, exc)
            return
        if changed:
            for dependency in self.input_graph.releases_read():
                self.requeue(dependency)

    def blocked(self, secret: TokenSecret, inputs: NodePoolInputs) -> Status | Waiting | None:
        """None: render. Waiting: the release is being read. A Status: why it cannot be read."""
        resolver = self.releases.resolver
        spec = secret.release
        if resolver is None or inputs.haproxy_image or not spec:
            return None
        if not self.input_graph.reads(secret.key, release_key(spec)) or self.releases.get(spec) is not None:
            return None  # not needed, or known (and the render says what is wrong with it)
        if self.share_namespace and not self.writer():
            return Waiting(f"release {spec}, read by the writer")  # and published as a catalog ConfigMap
        failure = resolver.failure(spec)
        if resolver.due(spec):
            self._ask(spec, secret)
        if failure is None:
            return Waiting(f"release {spec}")
        reason = "InvalidConfig" if failure.permanent else "ReleaseUnavailable"
        return Status(reason, f"cannot read release {spec}: {failure.message}")

    def _ask(self, spec: str, secret: TokenSecret) -> None:
        resolver = self.releases.resolver
        if resolver is None or spec in self._asking or resolver.pending(spec):
            return
        self._asking.add(spec)
        asyncio.create_task(self._ask_with_inputs(spec, secret), name=f"release {spec}")

    async def _ask_with_inputs(self, spec: str, secret: TokenSecret) -> None:
        try:
            # In full (a pull secret is often past the slim size): read off the event loop.
            values = []
            for wanted in (JOIN_INPUTS[0], JOIN_INPUTS[2]):  # pull-secret, user-ca-bundle
                obj = await asyncio.to_thread(self.source.get_full, input_key(secret, wanted, secret.annotations, self.tenancy))
                values.append(data_text(obj).get(wanted.key or "") if obj is not None else None)
            assert self.releases.resolver is not None
            self.releases.resolver.request(spec, values[0] or None, values[1] or None)
        except Exception:
            log.exception("asking for release %s failed", spec)
        finally:
            self._asking.discard(spec)
