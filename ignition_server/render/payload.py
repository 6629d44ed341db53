"""NodePoolInputs → RenderedPayload: the NodePool's MachineConfigs merged with what the server
adds (join files, the node-local kube-apiserver HAProxy, IBM Cloud VPC platform files),
validated as the client would read it, encoded canonically. Pure and deterministic.
"""

from __future__ import annotations

from .haproxy import ApiServerAccess, render_haproxy_fragment
from .ibmcloud import api_server_access, render_ibmcloud_fragment
from .inputs import InvalidConfig, NodePoolInputs, RenderedPayload
from .join import JoinInputs, render_join_fragment
from .machineconfig import merge_machineconfigs, parse_machineconfigs
from .join import merge_ca_bundles
from .mco import (
    CLOUD_CA_PATH, KUBELET_CA_PATH, ReleaseImages, appender_files, check_spec, migrate_kernel_arguments,
    rendered_machineconfig, set_file,
)
from .proxy import render_proxy_fragment, proxy_settings
from .settings import HAPROXY_TEMPLATE_KEY, apiserver_access, ibmcloud_settings
from .spec import encode, minimum_version_reason
from .validation import validate

# Server-made parts merge first, as MachineConfigs named so that the NodePool's own
# MachineConfigs (conventionally "50-..." and up) can still override any file.
_SERVER_PREFIX = "00-ignition-server-"
# The cluster-wide proxy merges after every other MachineConfig: MCO's base writes an empty
# /etc/mco/proxy.env (and empty drop-ins) when it was rendered without a proxy.
_PROXY_NAME = "zz-ignition-server-proxy"


def server_fragments(inputs: NodePoolInputs) -> list[tuple[str, dict]]:
    """The Ignition fragments the server adds to a NodePool's MachineConfigs."""
    fragments: list[tuple[str, dict]] = []
    join = JoinInputs(
        bootstrap_kubeconfig=inputs.bootstrap_kubeconfig.encode() if inputs.bootstrap_kubeconfig else None,
        pull_secret=inputs.pull_secret.encode() if inputs.pull_secret else None,
        ca_bundles=(inputs.ca_bundle.encode(),) if inputs.ca_bundle else (),
    )
    fragments.append(("join", render_join_fragment(join)))
    access: ApiServerAccess | None = None
    if inputs.ibmcloud_vpc is not None:
        settings = ibmcloud_settings(dict(inputs.ibmcloud_vpc))
        fragments.append(("ibmcloud-vpc", render_ibmcloud_fragment(settings)))
        access = api_server_access(settings)
    template = None
    if inputs.apiserver_proxy is not None:
        data = dict(inputs.apiserver_proxy)
        template = data.get(HAPROXY_TEMPLATE_KEY)
        access = apiserver_access(data)  # explicit settings win over IBM's defaults
    if access is not None:
        if not inputs.haproxy_image:
            raise InvalidConfig(
                f"release {inputs.release or '(none)'!r} is not in the release catalog and was not read from a "
                "registry: its haproxy-router image is needed for the node's kube-apiserver proxy (add the "
                "release to a catalog ConfigMap, or serve with --release-resolve)"
            )
        fragments.append(("apiserver-proxy", render_haproxy_fragment(access, inputs.haproxy_image, template)))
    return fragments


def _machineconfigs(inputs: NodePoolInputs) -> list[dict]:
    """Base (if any), then the NodePool's (a NodePool MachineConfig replaces a base one of its
    name), then the server's fragments, then the proxy."""
    own = parse_machineconfigs(inputs.machineconfigs_yaml)
    names = {mc["metadata"]["name"] for mc in own}
    base = []
    if inputs.mco_base_yaml is not None:
        try:
            base = parse_machineconfigs(inputs.mco_base_yaml)
        except InvalidConfig as exc:
            raise InvalidConfig(f"MCO base configuration: {exc}") from None
    machineconfigs = [mc for mc in base if mc["metadata"]["name"] not in names] + own
    for name, fragment in server_fragments(inputs):
        if fragment:
            machineconfigs.append({"metadata": {"name": _SERVER_PREFIX + name}, "spec": {"config": fragment}})
    if inputs.cluster_proxy is not None:
        proxy = render_proxy_fragment(proxy_settings(dict(inputs.cluster_proxy)))
        if proxy:
            machineconfigs.append({"metadata": {"name": _PROXY_NAME}, "spec": {"config": proxy}})
    return machineconfigs


def _with_mcs_appenders(config: dict, machineconfigs: list[dict], inputs: NodePoolInputs) -> tuple[dict, str]:
    """The merged config as the machine-config-server serves it (the rendered MachineConfig's
    kernel arguments carried by it, and the files the first boot reads appended), and the
    rendered config's name."""
    release = ReleaseImages(inputs.os_image_url, inputs.extensions_image, inputs.release_version)
    rendered = rendered_machineconfig(config, machineconfigs, release)
    problem = check_spec(rendered["spec"])
    if problem:
        raise InvalidConfig(problem)
    if not rendered["spec"]["osImageURL"]:
        raise InvalidConfig(
            f"release {inputs.release or '(none)'!r} has no rhel-coreos image in the release catalog and no "
            "MachineConfig names an osImageURL: the first boot could not rebase (add the release to a catalog ConfigMap)"
        )
    served = migrate_kernel_arguments(rendered)
    config = served["spec"]["config"]
    for path, pem, what in ((KUBELET_CA_PATH, inputs.kubelet_ca, "kubelet-ca"), (CLOUD_CA_PATH, inputs.cloud_ca, "cloud-provider-ca")):
        if pem:
            config = set_file(config, path, merge_ca_bundles((pem.encode(),), what))
    version, _ = minimum_version_reason(config)
    config["ignition"]["version"] = version
    files = appender_files(served, version)
    merged = merge_machineconfigs([
        {"metadata": {"name": "0"}, "spec": {"config": config}},
        {"metadata": {"name": "1"}, "spec": {"config": {"storage": {"files": files}}}},
    ], carried=True).config
    return merged, served["metadata"]["name"]


def render_payload(inputs: NodePoolInputs) -> RenderedPayload:
    """Render the payload of one NodePool generation; raises InvalidConfig saying why not.

    Notes: one line per input the source did not hold, then what the merge left out, then
    (when above 3.0.0) which feature sets the minimum spec version.
    """
    machineconfigs = _machineconfigs(inputs)
    with_base = inputs.mco_base_yaml is not None
    config, merge_notes = merge_machineconfigs(machineconfigs, carried=with_base)
    if with_base:
        config, name = _with_mcs_appenders(config, machineconfigs, inputs)
        merge_notes = (f"MCO base merged: {name}",) + merge_notes
    version, reason = minimum_version_reason(config)
    config["ignition"]["version"] = version
    validate(config, version)
    body = encode(config, version)
    notes = [f"{name} not in the source: left out of the payload" for name in inputs.missing]
    notes += merge_notes
    if reason:
        notes.append(f"payload needs Ignition spec {version} ({reason})")
    return RenderedPayload(body=body, min_version=version, notes=tuple(notes))


__all__ = ["InvalidConfig", "render_payload", "server_fragments"]
