"""Generated MCO bases in the reconciler: which (cluster configuration, release digest) a NodePool needs, and waiting for it.

With `--generate-bases`, a NodePool whose cluster has no given base (bases.py) for its
release uses the base the release's MCO generates (basegen/) from the cluster's
configuration, the `machine-config-server` ConfigMap of its namespace (HyperShift's name;
no such ConfigMap: no generated base) and the pull secret. The pair's key is computed from
slim objects (a large value's digest stands in for it), so deciding costs no read; the
5,280 NodePools of 440 clusters name 440 keys, each generated once. What the MCO's bootstrap
consumes of a NodePool's config (an ImageDigestMirrorSet, a KubeletConfig...; model/bootstrap_objects.py)
is in the key too: it is read once per config, off the event loop, and the NodePool waits meanwhile.

Until the base is known the NodePool's render waits (the last good payload keeps serving);
a failed run is `InvalidConfig` with the run's output tail, retried with back-off. Only the
writer generates (workers never render); with several replicas it publishes each generated
base as a ConfigMap `ignition-server-base-<key>` in its own namespace, which the others keep
like one they generated.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from cachetools import LRUCache

from ..basegen.generator import BaseGenerator, BaseJob, cluster_key
from ..basegen.steps import FEATURE_GATE, platform
from ..model.bootstrap_objects import NONE, BootstrapObjects, bootstrap_objects
from ..model.mco_base import BASE_KEY
from ..model.objects import (
    LargeValue,
    ManifestError,
    ObjectKey,
    annotations_of,
    config_map,
    data_text,
    has_large_values,
    value_digest,
)
from ..model.token_secret import TokenSecret, token_secret_config
from ..render.inputs import NodePoolInputs
from .bases import BaseIndex, base_key
from .inputs import JOIN_INPUTS, InputObject, Lookup, input_key
from .releases import Releases, release_key
from .status import DependencyWaits, Status, Waiting
from .tenancy import Tenancy

log = logging.getLogger("ignition_server.reconcile")

CLUSTER_CONFIG = InputObject("ConfigMap", "machine-config-server", None)
# On Azure and OpenStack HyperShift hands the cloud provider's ConfigMap to the operator
# (--cloud-config-file), and waits (CloudConfigPending) until the token Secret's
# `cloud-config-hash` is that ConfigMap's.
CLOUD_CONFIGS = {"Azure": InputObject("ConfigMap", "azure-cloud-config", None),
                 "OpenStack": InputObject("ConfigMap", "openstack-cloud-config", None)}


def hash_simple(value: Mapping[str, Any] | bytes | str) -> str:
    """HyperShift's util.HashSimple: FNV-1a (32 bit, `%08x`: always eight hex digits) of Go's `%v` of the value: a map
    prints as `map[k1:v1 k2:v2]` (keys sorted), a []byte as `[123 34 …]`, a string as itself."""
    if isinstance(value, bytes):
        text = "[" + " ".join(str(b) for b in value) + "]"
    elif isinstance(value, str):
        text = value
    else:
        text = "map[" + " ".join(f"{k}:{value[k]}" for k in sorted(value)) + "]"
    digest = 0x811C9DC5
    for byte in text.encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return format(digest, "08x")


def precondition_failure(wanted: Mapping[str, str], pull_secret: str | None, trust_bundle: str | None,
                         configuration_hash: str) -> str | None:
    """Why the token Secret's preconditions do not hold, in HyperShift's words (None: they do).
    A None value is not known yet (past the slim size): not checked here."""
    if wanted.get("pull-secret-hash") and pull_secret is not None \
            and hash_simple(pull_secret.encode()) != wanted["pull-secret-hash"]:
        return "pull secret does not match hash"
    if wanted.get("additional-trust-bundle-hash") and trust_bundle is not None \
            and hash_simple(trust_bundle) != wanted["additional-trust-bundle-hash"]:
        return "additionalTrustBundle does not match hash"
    if wanted.get("hc-configuration-hash") and configuration_hash != wanted["hc-configuration-hash"]:
        return f"machine-config-server configmap is out of date, waiting for update {configuration_hash} != {wanted['hc-configuration-hash']}"
    return None


def cloud_config_mismatch(secret: TokenSecret, data: Mapping[str, str], name: str) -> Status | None:
    if secret.cloud_config_hash and hash_simple(data) != secret.cloud_config_hash:
        return Status("CloudConfigPending", f"ConfigMap {name} does not match the token Secret's cloud-config-hash yet")
    return None


def cloud_config_input(config: Mapping[str, Any] | None) -> InputObject | None:
    """The cloud config ConfigMap a cluster's MCO run needs (None: its platform needs none)."""
    if config is None:
        return None
    return CLOUD_CONFIGS.get(platform(data_text(config)))
ANNOTATION_GENERATED_BASE = "ignition-server.openshift.io/generated-base"  # its value: the pair's key
CONSUMED_KEPT = 16384  # configs whose consumed objects are known (the fleet's 5,280 NodePools, and their changes)


def is_generated_base(obj: Mapping[str, Any] | None) -> bool:
    return obj is not None and obj.get("kind") == "ConfigMap" and bool(annotations_of(obj).get(ANNOTATION_GENERATED_BASE))


def fingerprint(obj: Mapping[str, Any] | None) -> str:
    """A digest of an object's data, the same for its slim and its full form."""
    if obj is None:
        return "absent"
    parts = []
    for section in ("data", "stringData", "binaryData"):
        for name, value in sorted((obj.get(section) or {}).items()):
            digest = value.sha256 if isinstance(value, LargeValue) else hashlib.sha256(str(value).encode()).hexdigest()
            parts.append([section, name, digest])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def generated_base(secret: TokenSecret) -> ObjectKey:
    """The NodePool's generated base as a dependency: the NodePools waiting for it are queued by it."""
    return base_key(secret.key.namespace, "generated:" + secret.release)


@dataclass(frozen=True, slots=True)
class GeneratedKey:
    key: str | None  # the (cluster configuration, release digest) key; None: not known (yet)
    deps: frozenset[ObjectKey]  # what deciding it read
    # The cluster has a configuration (its `machine-config-server` ConfigMap): the NodePool's base, when
    # no base is given, is the generated one, known or not (its key waits for the release or the config).
    configured: bool


def generated_key(secret: TokenSecret, notes: Mapping[str, str], lookup: Lookup,
                  releases: Releases, tenancy: Tenancy | None = None,
                  consumed: BootstrapObjects | None = NONE) -> GeneratedKey:
    """The NodePool's generated base: its (cluster configuration, release digest) key, what it reads,
    and whether the NodePool is on one.

    `consumed`: what the MCO's bootstrap takes of the NodePool's config (None: not read yet, no key)."""
    config_key = input_key(secret, CLUSTER_CONFIG, notes, tenancy)
    secret_key = input_key(secret, JOIN_INPUTS[0], notes, tenancy)
    deps = {config_key, secret_key}
    config = lookup(config_key)
    if config is None:
        return GeneratedKey(None, frozenset(deps), configured=False)  # no generated base, and no need of the release
    deps |= {release_key(secret.release), generated_base(secret)}
    if consumed is None:
        return GeneratedKey(None, frozenset(deps), configured=True)
    cloud = cloud_config_input(config)
    cloud_fingerprint = ""
    if cloud is not None:
        cloud_key = input_key(secret, cloud, notes, tenancy)
        deps.add(cloud_key)
        cloud_fingerprint = fingerprint(lookup(cloud_key))
    digest = releases.digest(secret.release) if secret.release else None
    if not digest:
        return GeneratedKey(None, frozenset(deps), configured=True)
    # The OS stream is the NodePool's, so two NodePools of a cluster on two streams are two runs; so are
    # two with different mirror sets (KubeletConfigs...), and NodePools with the same share a run. Without
    # any, the key is what it was before they were taken: a server upgraded generates nothing again.
    parts = [fingerprint(config), fingerprint(lookup(secret_key)), cloud_fingerprint, secret.os_stream]
    if consumed.digest:
        parts.append(consumed.digest)
    cluster = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return GeneratedKey(cluster_key(cluster, digest), frozenset(deps), configured=True)


@dataclass(kw_only=True)
class GeneratedBaseWaits(DependencyWaits):
    """Which NodePools wait for which generated base: asks the generator, waits, says why.

    The renders ask `blocked` before rendering; when the generator is done with a key (or
    the writer's published copy arrives), the NodePools waiting for it (the readers of their
    base's dependency key) are requeued and render again."""

    generator: BaseGenerator | None
    releases: Releases
    bases: BaseIndex
    # The FeatureGate `render` reads for (namespace, machine-config-server's configuration-hash): a
    # taken-over HCP's (reconcile/takeover.py), else HyperShift's default; None: not known yet.
    feature_gate: Callable[[str, str], str | None] = lambda namespace, configuration_hash: FEATURE_GATE
    _waiters: dict[str, set[ObjectKey]] = field(default_factory=dict)  # generated base key -> its dependency keys
    # Config digest -> what the MCO's bootstrap consumes of it (part of the key): read once per config,
    # off the event loop; a few bytes each (most configs have none: the shared NONE).
    _consumed: LRUCache[str, BootstrapObjects] = field(default_factory=lambda: LRUCache(CONSUMED_KEPT))
    # One copy of each set: a cluster's NodePools (a dozen configs) hold the same mirror set.
    _sets: weakref.WeakValueDictionary[str, BootstrapObjects] = field(default_factory=weakref.WeakValueDictionary)
    _held: dict[ObjectKey, tuple[str, Status]] = field(default_factory=dict)  # token Secret -> (its inputs, why it waits)

    def consumed(self, secret: TokenSecret) -> BootstrapObjects | None:
        """What the MCO's bootstrap consumes of the NodePool's config; None: not read yet."""
        return self._consumed.get(secret.config_digest)

    def lookup(self) -> Callable[[str], str | None] | None:
        """`known`, for gather; None without a generator (without `--generate-bases` no NodePool is on one)."""
        return self.known if self.generator is not None else None

    def known(self, key: str) -> str | None:
        """The generated base of `key` (None: not generated, or no generator)."""
        return self.generator.known(key) if self.generator is not None else None

    def generated(self, key: str) -> None:
        """The generator finished `key` (generated, or failed): its NodePools look again."""
        generator = self.generator
        if generator is not None and self.share_namespace and self.writer():
            text = generator.known(key)
            if text is not None:
                name = "ignition-server-base-" + key[:16]
                obj = config_map(self.share_namespace, name, {BASE_KEY: text}, {ANNOTATION_GENERATED_BASE: key})
                asyncio.create_task(self.publish(obj, f"the generated MCO base {key[:16]}"),
                                    name=f"share mco base {key[:16]}")
        for dependency in self._waiters.pop(key, set()):
            self.requeue(dependency)

    def published(self, obj: Mapping[str, Any]) -> None:
        """A base the writer generated and published: kept like one generated here."""
        generator = self.generator
        key = str(annotations_of(obj).get(ANNOTATION_GENERATED_BASE, ""))
        text = data_text(obj).get(BASE_KEY)
        if generator is None or not key or not text or generator.known(key) is not None:
            return
        try:
            generator.adopt(key, text)
        except ValueError as exc:
            log.error("the published MCO base %s is not usable: %s", key[:16], exc)
            return
        self.generated(key)

    def blocked(self, secret: TokenSecret, inputs: NodePoolInputs) -> Status | Waiting | None:
        """None: render. Waiting: the base is being generated. A Status: why it cannot be."""
        generator = self.generator
        if generator is None or not secret.release:
            return None
        if self.bases.find(secret.key.namespace, secret.release, secret.release_version) is not None:
            return None  # a given base: nothing to generate, no preconditions of its own
        if inputs.mco_base_yaml is not None:
            # The generated base is known; the token Secret's preconditions still hold it back, as
            # HyperShift's GetPayload checks them for every payload (a Secret made for another
            # cluster configuration must not be served the current one's).
            return self._configuration_pending(secret) or self._cloud_config_pending(secret)
        consumed = self.consumed(secret)
        if consumed is None:
            if self.source.get(input_key(secret, CLUSTER_CONFIG, secret.annotations, self.tenancy)) is None:
                return None  # no cluster configuration: no generated base
            self._read_consumed(secret)
            return Waiting(f"the config of {secret.ref} read")  # its mirror sets... are in the base's key
        key = generated_key(secret, secret.annotations, self.source.get, self.releases, self.tenancy, consumed).key
        release = self.releases.get(secret.release)
        if key is None or release is None:
            return None  # no cluster configuration (no base), or the release waits (release_waits.py)
        pending = self._configuration_pending(secret) or self._cloud_config_pending(secret)
        if pending is not None:
            return pending
        self._waiters.setdefault(key, set()).add(generated_base(secret))
        if self.share_namespace and not self.writer():
            return Waiting(f"MCO base {key[:16]}, generated by the writer")  # and published (published)
        failure = generator.failure(key)
        if generator.due(key) and not generator.pending(key) and key not in self._asking:
            self._asking.add(key)
            asyncio.create_task(self._ask_base(key, secret), name=f"mco base {secret.ref}")
        if failure is None:
            return Waiting(f"MCO base {key[:16]}")
        return Status("InvalidConfig", failure)

    def _configuration_pending(self, secret: TokenSecret) -> Status | None:
        """The token Secret was made for inputs the source does not hold yet (its `*-hash`
        preconditions): wait, as HyperShift's GetPayload does, in its words. Values past the
        slim size are checked on their full text when the run is asked for (_ask_base)."""
        held = self._held.get(secret.key)
        if held is not None:
            if held[0] == self._precondition_inputs(secret):
                return held[1]
            del self._held[secret.key]  # an input changed: look again
        notes = secret.annotations
        values = []
        for wanted in (JOIN_INPUTS[0], JOIN_INPUTS[2]):  # pull-secret, user-ca-bundle
            obj = self.source.get(input_key(secret, wanted, notes))
            values.append(None if obj is not None and has_large_values(obj) else
                          (data_text(obj).get(wanted.key or "", "") if obj is not None else ""))
        config = self.source.get(input_key(secret, CLUSTER_CONFIG, notes))
        why = precondition_failure(secret.preconditions, values[0], values[1],
                                   data_text(config).get("configuration-hash", "") if config is not None else "")
        return Status("InvalidConfig", why) if why else None

    def _precondition_inputs(self, secret: TokenSecret) -> str:
        notes = secret.annotations
        wanted = [JOIN_INPUTS[0], JOIN_INPUTS[2]]
        cloud = cloud_config_input(self.source.get(input_key(secret, CLUSTER_CONFIG, notes)))
        if cloud is not None:
            wanted.append(cloud)
        return json.dumps([sorted(secret.preconditions.items()), secret.cloud_config_hash] + [
            fingerprint(self.source.get(input_key(secret, w, notes))) for w in wanted])

    def _cloud_config_pending(self, secret: TokenSecret) -> Status | None:
        """CloudConfigPending while an Azure/OpenStack cluster's cloud config is not the one asked for."""
        notes = secret.annotations
        cloud = cloud_config_input(self.source.get(input_key(secret, CLUSTER_CONFIG, notes)))
        if cloud is None:
            return None
        obj = self.source.get(input_key(secret, cloud, notes))  # slim: a cloud.conf is far under its limit
        if obj is None:
            return Status("CloudConfigPending", f"waiting for ConfigMap {secret.key.namespace}/{cloud.name} (the cloud provider's configuration)")
        if not has_large_values(obj):  # else checked on its full text when the run is asked for
            return cloud_config_mismatch(secret, data_text(obj), cloud.name)
        return None

    def _read_consumed(self, secret: TokenSecret) -> None:
        asking = "config:" + secret.config_digest
        if asking not in self._asking:
            self._asking.add(asking)
            asyncio.create_task(self._read_config(secret, asking), name=f"config of {secret.ref}")

    async def _read_config(self, secret: TokenSecret, asking: str) -> None:
        try:
            digest, found = await asyncio.to_thread(self._config_objects, secret)
            self._consumed[digest] = self._sets.setdefault(found.digest, found) if found.documents else found
        except Exception:
            log.exception("reading the config of %s failed", secret.ref)
        finally:
            self._asking.discard(asking)
        self.requeue(generated_base(secret))

    def _config_objects(self, secret: TokenSecret) -> tuple[str, BootstrapObjects]:
        """The config's digest as read, and what the bootstrap consumes of it. A config that cannot be
        read consumes nothing here: its render says why (the same bytes fail the same way there)."""
        obj = self.source.get_full(secret.key)
        if obj is None:
            return secret.config_digest, NONE
        try:
            return value_digest(obj, "config"), bootstrap_objects(token_secret_config(obj))
        except ManifestError:
            return value_digest(obj, "config"), NONE

    async def _ask_base(self, key: str, secret: TokenSecret) -> None:
        try:
            # In full: the cluster configuration and the pull secret are often past the slim size.
            full = await asyncio.to_thread(self._full_inputs, secret)
            release = self.releases.get(secret.release)
            digest = self.releases.digest(secret.release)
            if release is None or digest is None:
                return
            config, pull_secret, ca_bundle, cloud_config = full
            why = precondition_failure(secret.preconditions, pull_secret or "", ca_bundle or "", config.get("configuration-hash", ""))
            held = Status("InvalidConfig", why) if why else (
                cloud_config_mismatch(secret, cloud_config["data"], cloud_config["metadata"]["name"]) if cloud_config else None)
            if held is not None:  # seen only on the full text of a large value
                self._held[secret.key] = (self._precondition_inputs(secret), held)
                for dependency in self._waiters.get(key, set()):
                    self.requeue(dependency)
                return
            gate = self.feature_gate(secret.key.namespace, config.get("configuration-hash", ""))
            consumed = self.consumed(secret)
            if gate is None or consumed is None:  # machine-config-server is older than its HCP: its rewrite asks again
                return                            # (a config forgotten since: the next reconcile reads it again)
            assert self.generator is not None
            self.generator.request(BaseJob(
                key=key, namespace=secret.key.namespace, release=secret.release, release_digest=digest,
                version=release.version or secret.release_version, images=dict(release.images),
                cluster_files=config, pull_secret=pull_secret, ca_bundle=ca_bundle,
                os_stream=secret.os_stream, cloud_config=cloud_config, feature_gate=gate,
                bootstrap_objects=consumed.text,
            ))
        except Exception:
            log.exception("asking for the MCO base of %s failed", secret.ref)
        finally:
            self._asking.discard(key)

    def _full_inputs(self, secret: TokenSecret) -> tuple[dict[str, str], str | None, str | None, dict[str, Any] | None]:
        notes = secret.annotations
        config = self.source.get_full(input_key(secret, CLUSTER_CONFIG, notes, self.tenancy))
        values = []
        for wanted in (JOIN_INPUTS[0], JOIN_INPUTS[2]):  # pull-secret, user-ca-bundle
            obj = self.source.get_full(input_key(secret, wanted, notes, self.tenancy))
            values.append((data_text(obj).get(wanted.key or "") or None) if obj is not None else None)
        cloud = cloud_config_input(config)
        cloud_config = None
        if cloud is not None:
            obj = self.source.get_full(input_key(secret, cloud, notes, self.tenancy))
            if obj is not None:  # as HyperShift writes it: the ConfigMap, YAML
                meta = obj.get("metadata") or {}
                cloud_config = config_map(meta.get("namespace"), meta.get("name"), data_text(obj))
        return (data_text(config) if config is not None else {}), values[0], values[1], cloud_config
