"""What a NodePool reads from the source, gathered into its render inputs.

By namespace convention, as the reference reads them: the token Secret's namespace holds
`Secret pull-secret` (.dockerconfigjson), `Secret bootstrap-kubeconfig` (kubeconfig),
`ConfigMap user-ca-bundle` (ca-bundle.crt), and optionally `ConfigMap apiserver-proxy`,
`ConfigMap ibmcloud-vpc` (render/settings.py) and `ConfigMap cluster-proxy` (render/cluster_proxy.py);
the MCO base of the NodePool's release, when the namespace holds one (bases.py). An annotation on the token Secret,
`ignition-server.openshift.io/input-<name>: <namespace>/<object>`, points one input
elsewhere (so many NodePools can share, say, one CA bundle): only into a namespace the
tenancy allows (tenancy.py), else the NodePool is refused (`InvalidConfig`) and nothing read.

Every object looked at, present or not, is a dependency: when it changes (or appears), the
NodePool is rendered again, and no other.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..model.bootstrap_objects import NONE, BootstrapObjects, bootstrap_objects
from ..model.mco_base import BASE_KEY
from ..model.objects import ManifestError, ObjectKey, data_text
from ..model.token_secret import TokenSecret, token_secret_config
from ..render.inputs import NodePoolInputs, Settings
from .bases import RHCOS_EXTENSIONS_IMAGE, RHCOS_IMAGE, BaseIndex, release_keys
from .generated_bases import generated_key
from .inputs import JOIN_INPUTS, MCS_INPUTS, SETTINGS_INPUTS, Lookup, input_key
from .releases import HAPROXY_IMAGE, Releases, release_key
from .tenancy import Tenancy


def gather(
    secret: TokenSecret,
    notes: Mapping[str, str],
    lookup: Lookup,
    releases: Releases,
    machineconfigs_yaml: str = "",
    bases: BaseIndex | None = None,
    generated: Callable[[str], str | None] | None = None,
    tenancy: Tenancy | None = None,
    consumed: Callable[[TokenSecret], BootstrapObjects | None] | None = None,
) -> tuple[NodePoolInputs, frozenset[ObjectKey]]:
    """The NodePool's inputs and what they depend on.

    With a slim `lookup` and no YAML this is cheap and decides whether to render at all; a
    render gathers again with full objects and the token Secret's decoded config.
    `consumed`: what the MCO's bootstrap takes of the config (None: not known yet; no callable: none).
    """
    objects = consumed(secret) if consumed is not None else NONE
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
    base: ObjectKey | None = None
    on_generated = False
    if bases is not None:
        namespace = secret.key.namespace
        deps |= release_keys(namespace, secret.release, secret.release_version)
        base = bases.find(namespace, secret.release, secret.release_version)
        if base is not None:
            _refuse_consumed(objects, f"the NodePool's MCO base is the imported ConfigMap {base.namespace}/{base.name}")
            obj = lookup(base)
            base_yaml = data_text(obj).get(BASE_KEY) if obj is not None else None
            if not base_yaml:
                raise ManifestError(f"MCO base {base.namespace}/{base.name} has no {BASE_KEY}")
        elif generated is not None and secret.release:
            found = generated_key(secret, notes, lookup, releases, tenancy, objects)
            deps |= found.deps
            base_yaml = generated(found.key) if found.key is not None else None
            on_generated = found.configured
    if base is None and not on_generated:
        _refuse_consumed(objects, "the NodePool has no MCO base generated for it (serve with --generate-bases; its "
                                  "namespace needs the machine-config-server ConfigMap)")
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


def _refuse_consumed(objects: BootstrapObjects | None, why: str) -> None:
    """A mirror set (KubeletConfig...) in the config changes the base, which only a generated base can
    take: refused, naming it, rather than served without it (a node pulling past its mirrors)."""
    if objects is not None and objects.documents:
        raise ManifestError(f"the token Secret's config holds {objects.describe()}, which the MCO's bootstrap turns "
                            f"into the base (registries.conf, policy.json, kubelet and CRI-O configuration), and {why}")


def gather_for_render(
    secret: TokenSecret,
    obj: Mapping[str, Any],
    lookup: Lookup,
    releases: Releases,
    bases: BaseIndex | None = None,
    generated: Callable[[str], str | None] | None = None,
    tenancy: Tenancy | None = None,
) -> NodePoolInputs:
    """What a render reads: `gather` with whole objects (`lookup` reads them in full) and the
    token Secret's decoded config (`obj`: the Secret whole). The reconciler's renders and
    `ignition-server render` both gather through here, so the command prints what serve serves."""
    config = token_secret_config(obj)
    objects = bootstrap_objects(config)
    inputs, _deps = gather(
        secret, secret.annotations, lookup, releases, config, bases, generated, tenancy, lambda _secret: objects,
    )
    return inputs
