"""What a NodePool reads from the source, gathered into its render inputs.

By namespace convention, as the reference reads them: the token Secret's namespace holds
`Secret pull-secret` (.dockerconfigjson), `Secret bootstrap-kubeconfig` (kubeconfig),
`ConfigMap user-ca-bundle` (ca-bundle.crt), and optionally `ConfigMap apiserver-proxy`,
`ConfigMap ibmcloud-vpc` (render/settings.py) and `ConfigMap cluster-proxy` (render/proxy.py);
the MCO base of the NodePool's release, when the namespace holds one (bases.py). An annotation on the token Secret,
`ignition-server.openshift.io/input-<name>: <namespace>/<object>`, points one input
elsewhere (so many NodePools can share, say, one CA bundle): only into a namespace the
tenancy allows (tenancy.py), else the NodePool is refused (`InvalidConfig`) and nothing read.

Every object looked at, present or not, is a dependency: when it changes (or appears), the
NodePool is rendered again, and no other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..render.inputs import NodePoolInputs, Settings
from ..sources.manifests import ManifestError, ObjectKey, TokenSecret, data_text
from .bases import BASE_KEY, RHCOS_EXTENSIONS_IMAGE, RHCOS_IMAGE, BaseIndex, release_keys
from .releases import HAPROXY_IMAGE, Releases, release_key
from .tenancy import Tenancy

ANNOTATION_INPUT_PREFIX = "ignition-server.openshift.io/input-"


@dataclass(frozen=True)
class InputObject:
    kind: str
    name: str  # the conventional object name, also the input's name in messages
    key: str | None  # the data key read; None: the whole data (settings)


JOIN_INPUTS = (
    InputObject("Secret", "pull-secret", ".dockerconfigjson"),
    InputObject("Secret", "bootstrap-kubeconfig", "kubeconfig"),
    InputObject("ConfigMap", "user-ca-bundle", "ca-bundle.crt"),
)
SETTINGS_INPUTS = (
    InputObject("ConfigMap", "apiserver-proxy", None),
    InputObject("ConfigMap", "ibmcloud-vpc", None),
    InputObject("ConfigMap", "cluster-proxy", None),
)

# Only a payload with an MCO base reads these (the machine-config-server's CA files); absent
# is normal, so they are not named as missing.
MCS_INPUTS = (
    InputObject("ConfigMap", "kubelet-ca", "ca.crt"),
    InputObject("ConfigMap", "cloud-provider-ca", "ca-bundle.pem"),
)

Lookup = Callable[[ObjectKey], Mapping[str, Any] | None]


def input_key(secret: TokenSecret, wanted: InputObject, notes: Mapping[str, str],
              tenancy: Tenancy | None = None) -> ObjectKey:
    """Where the input is read. With a `tenancy`, a reference it does not allow raises
    OutsideTenancy (a ManifestError) before anyone could fetch it; None: no wall (the CLI's
    `render`, whose directory only the operator writes)."""
    ref = str(notes.get(ANNOTATION_INPUT_PREFIX + wanted.name, "")).strip()
    if ref:
        namespace, _, name = ref.partition("/")
        if not name:
            raise ManifestError(f"annotation {ANNOTATION_INPUT_PREFIX}{wanted.name} must be <namespace>/<name>, got {ref!r}")
        if tenancy is not None:
            tenancy.check(secret.key.namespace, namespace, name, f"annotation {ANNOTATION_INPUT_PREFIX}{wanted.name}")
        return ObjectKey(wanted.kind, namespace, name)
    return ObjectKey(wanted.kind, secret.key.namespace, wanted.name)


def gather(
    secret: TokenSecret,
    notes: Mapping[str, str],
    lookup: Lookup,
    releases: Releases,
    machineconfigs_yaml: str = "",
    bases: BaseIndex | None = None,
    generated: Callable[[str], str | None] | None = None,
    tenancy: Tenancy | None = None,
) -> tuple[NodePoolInputs, frozenset[ObjectKey]]:
    """The NodePool's inputs and what they depend on.

    With a slim `lookup` and no YAML this is cheap and decides whether to render at all; a
    render gathers again with full objects and the token Secret's decoded config.
    """
    deps: set[ObjectKey] = set()
    values: dict[str, str | None] = {}
    missing: list[str] = []
    for wanted in JOIN_INPUTS:
        key = input_key(secret, wanted, notes, tenancy)
        deps.add(key)
        obj = lookup(key)
        value = data_text(obj).get(wanted.key or "") if obj is not None else None
        values[wanted.name] = value if value else None
        if not value:
            missing.append(wanted.name)
    settings: dict[str, Settings | None] = {}
    for wanted in SETTINGS_INPUTS:
        key = input_key(secret, wanted, notes, tenancy)
        deps.add(key)
        obj = lookup(key)
        settings[wanted.name] = tuple(sorted(data_text(obj).items())) if obj is not None else None
    base_yaml = None
    if bases is not None:
        namespace = secret.key.namespace
        deps |= release_keys(namespace, secret.release, secret.release_version)
        base = bases.find(namespace, secret.release, secret.release_version)
        if base is not None:
            obj = lookup(base)
            base_yaml = data_text(obj).get(BASE_KEY) if obj is not None else None
            if not base_yaml:
                raise ManifestError(f"MCO base {base.namespace}/{base.name} has no {BASE_KEY}")
        elif generated is not None and secret.release:
            from .generated_bases import generated_key  # (it builds on this module)

            key, more = generated_key(secret, notes, lookup, releases, tenancy)
            deps |= more
            base_yaml = generated(key) if key is not None else None
    for wanted in MCS_INPUTS if base_yaml is not None else ():
        key = input_key(secret, wanted, notes, tenancy)
        deps.add(key)
        obj = lookup(key)
        values[wanted.name] = (data_text(obj).get(wanted.key or "") or None) if obj is not None else None
    haproxy_image = None
    images: dict[str, str] = {}
    if base_yaml is not None or settings["apiserver-proxy"] is not None or settings["ibmcloud-vpc"] is not None:
        # Only a payload that runs a release component (or rebases to its OS) needs its release known.
        deps.add(release_key(secret.release))
        haproxy_image = releases.image(secret.release, HAPROXY_IMAGE)
        if base_yaml is not None:
            images = {name: releases.image(secret.release, name) or "" for name in (RHCOS_IMAGE, RHCOS_EXTENSIONS_IMAGE)}
    inputs = NodePoolInputs(
        nodepool=secret.nodepool,
        secret=secret.ref,
        machineconfigs_yaml=machineconfigs_yaml,
        config_digest=secret.config_digest,
        release=secret.release,
        release_version=secret.release_version,
        missing=tuple(missing),
        pull_secret=values["pull-secret"],
        bootstrap_kubeconfig=values["bootstrap-kubeconfig"],
        ca_bundle=values["user-ca-bundle"],
        apiserver_proxy=settings["apiserver-proxy"],
        ibmcloud_vpc=settings["ibmcloud-vpc"],
        haproxy_image=haproxy_image,
        mco_base_yaml=base_yaml,
        os_image_url=images.get(RHCOS_IMAGE, "") if base_yaml is not None else "",
        extensions_image=images.get(RHCOS_EXTENSIONS_IMAGE, "") if base_yaml is not None else "",
        cluster_proxy=settings["cluster-proxy"],
        kubelet_ca=values.get("kubelet-ca"),
        cloud_ca=values.get("cloud-provider-ca"),
    )
    return inputs, frozenset(deps)
