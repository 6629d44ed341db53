"""The objects the parity check hands to HyperShift's real ignition server and to ours, in
HyperShift's shapes, and the NodePools it compares (tests/system/test_payload_parity.py, and
`python -m bench parity` for the timing).

Per hosted cluster (a control-plane namespace): the `pull-secret` (`.dockerconfigjson`, the
tests' registry), `bootstrap-kubeconfig` (`kubeconfig`), and the `machine-config-server`
ConfigMap as HyperShift's control-plane-operator writes it (testsupport/real_release.py's
`hypershift_mcs_config`: real CAs, the cluster's config.openshift.io objects, its TLS
profile). Per NodePool: a token Secret as HyperShift's NodePool controller writes it, whose
`config` is the core MachineConfigs HyperShift adds to every NodePool (`30-fips`,
`99-worker-ssh`, from the control-plane-operator's `ignition-config-*` ConfigMaps) followed by
the NodePool's own, and `os-stream` when the NodePool names a stream.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from ignition_server.reconcile.generated_bases import hash_simple
from ignition_server.tls.certificates import make_ca
from testsupport.manifests import build_token_secret
from testsupport.real_release import hypershift_mcs_config
from testsupport.registry_world import Registry

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq0gZ0s3Rl5m1aPq8Kc8xN4o3d2fQ7bVjW9uYt1xH2L parity@example"
# The Accept header of an Ignition client at each spec version a node may speak (the reference
# serves its 3.2.0 bytes to all; ours translates, so every version is compared).
CLIENT_VERSIONS = ("3.0.0", "3.1.0", "3.2.0", "3.3.0", "3.4.0", "3.5.0", "3.6.0")


def accept(version: str) -> dict[str, str]:
    return {"Accept": f"application/vnd.coreos.ignition+json;version={version}, */*;q=0.1"}


def machineconfig(name: str, config: dict[str, Any] | None = None, **spec: Any) -> str:
    """One MachineConfig as HyperShift serializes it (api.YamlSerializer: the worker role label,
    `creationTimestamp: null`, the Ignition config at 3.2.0)."""
    body = {"ignition": {"version": "3.2.0"}, **(config or {})}
    return yaml.safe_dump({
        "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
        "metadata": {"creationTimestamp": None, "labels": {"machineconfiguration.openshift.io/role": "worker"}, "name": name},
        "spec": {"config": body, "extensions": None, "fips": False, "kernelArguments": None, "kernelType": "",
                 "osImageURL": "", **spec},
    }, sort_keys=True)


def core_machineconfigs() -> list[str]:
    """What HyperShift puts in every NodePool's config before the NodePool's own."""
    return [machineconfig("30-fips", fips=False),
            machineconfig("99-worker-ssh", {"passwd": {"users": [{"name": "core", "sshAuthorizedKeys": [SSH_KEY]}]}})]


def data_url(text: str) -> str:
    from urllib.parse import quote
    return "data:," + quote(text)


@dataclass(frozen=True)
class Cluster:
    namespace: str
    tls_profile: str | None  # the hosted cluster's APIServer tlsSecurityProfile type (None: the default)
    trust_bundle: bool = False  # an additional trust bundle (HostedCluster.spec.additionalTrustBundle)


@dataclass(frozen=True)
class NodePool:
    cluster: Cluster
    name: str
    machineconfigs: tuple[str, ...] = ()  # the NodePool's own, after the core ones
    os_stream: str = ""
    token: str = field(default="")

    @property
    def key(self) -> str:
        return f"{self.cluster.namespace}/{self.name}"

    @property
    def token_value(self) -> str:
        return self.token or f"tok-{self.cluster.namespace}-{self.name}"


CLUSTER_A = Cluster("clusters-a", None)
CLUSTER_B = Cluster("clusters-b", "Modern")
CLUSTER_C = Cluster("clusters-c", "Old", trust_bundle=True)
CLUSTERS = (CLUSTER_A, CLUSTER_B, CLUSTER_C)

# The five NodePools of the issue: an override of a base file, of a base unit, clusters with
# different TLS profiles, an os-stream, extra user MachineConfigs; and a cluster with an
# additional trust bundle (`user-ca-bundle`, and the operator's --additional-trust-bundle-config-file).
NODEPOOLS = (
    NodePool(CLUSTER_A, "override-file", (machineconfig("50-override-file", {"storage": {"files": [
        {"path": "/etc/sysctl.d/inotify.conf", "mode": 420, "overwrite": True,
         "contents": {"source": data_url("fs.inotify.max_user_watches = 1048576\n")}}]}}),)),
    NodePool(CLUSTER_A, "override-unit", (machineconfig("50-override-unit", {"systemd": {"units": [
        {"name": "kubelet-auto-node-size.service", "enabled": False,
         "contents": "[Unit]\nDescription=Node sizing, set by the NodePool\n[Service]\nType=oneshot\nExecStart=/usr/bin/true\n"},
        {"name": "zincati.service", "mask": True}]}}),)),
    NodePool(CLUSTER_A, "stream", os_stream="rhel-10"),
    NodePool(CLUSTER_A, "extra", (
        machineconfig("60-extra-files", {"storage": {"files": [
            {"path": "/etc/extra/settings.conf", "mode": 384, "overwrite": True, "user": {"name": "core"},
             "contents": {"source": data_url("answer = 42\n")}}]},
            "systemd": {"units": [{"name": "extra.service", "enabled": True,
                                   "contents": "[Unit]\nDescription=extra\n[Service]\nType=oneshot\nExecStart=/usr/bin/true\n"
                                               "[Install]\nWantedBy=multi-user.target\n"}]}}),
        machineconfig("99-extra-kargs", kernelArguments=["nosmt", "mitigations=auto"]),
    )),
    NodePool(CLUSTER_B, "tls"),
    NodePool(CLUSTER_C, "trust-bundle"),
)


@dataclass(frozen=True)
class ClusterInputs:
    """What one hosted cluster's objects are made of (made per run: real CAs, the registry's pull secret)."""

    root_ca: str
    signer_ca: str
    pull_secret: str
    trust_bundle: str  # "" without one
    configuration_hash: str = "parity-1"


def cluster_inputs(cluster: Cluster, registry: Registry) -> ClusterInputs:
    return ClusterInputs(make_ca()[0].decode(), make_ca()[0].decode(), registry.pull_secret(),
                         make_ca()[0].decode() if cluster.trust_bundle else "")


def cluster_objects(cluster: Cluster, inputs: ClusterInputs) -> list[dict[str, Any]]:
    """The control-plane namespace's objects both servers read, as HyperShift writes them."""
    ns = cluster.namespace
    kubeconfig = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "bootstrap",
        "clusters": [{"name": "cluster", "cluster": {"server": f"https://api-int.{ns}.example.com:6443",
                                                     "certificate-authority-data": base64.b64encode(inputs.root_ca.encode()).decode()}}],
        "users": [{"name": "bootstrap", "user": {"token": f"bootstrap-token-{ns}"}}],
        "contexts": [{"name": "bootstrap", "context": {"cluster": "cluster", "user": "bootstrap"}}],
    })
    objects = [
        secret(ns, "pull-secret", {".dockerconfigjson": inputs.pull_secret}, "kubernetes.io/dockerconfigjson"),
        secret(ns, "bootstrap-kubeconfig", {"kubeconfig": kubeconfig}),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "machine-config-server", "namespace": ns},
         "data": hypershift_mcs_config(ns, root_ca=inputs.root_ca, signer_ca=inputs.signer_ca, tls_profile=cluster.tls_profile,
                                       user_ca_bundle=inputs.trust_bundle, configuration_hash=inputs.configuration_hash)},
    ]
    if inputs.trust_bundle:
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "user-ca-bundle", "namespace": ns},
                        "data": {"ca-bundle.crt": inputs.trust_bundle}})
    return objects


def secret(namespace: str, name: str, data: dict[str, str], type_: str = "Opaque") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace}, "type": type_,
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def token_secret(pool: NodePool, release: str, version: str, inputs: ClusterInputs | None = None) -> dict[str, Any]:
    """The NodePool's token Secret, generated now (so neither server rotates it during a test),
    with the precondition hashes HyperShift's NodePool controller writes (util.HashSimple, as
    the reference checks them) when the cluster's inputs are given."""
    config = "\n---\n".join([*core_machineconfigs(), *pool.machineconfigs])
    obj = build_token_secret(namespace=pool.cluster.namespace, nodepool=f"clusters/{pool.name}", token=pool.token_value,
                             release=release, release_version=version, machineconfigs_yaml=config,
                             generation_time=time.time())
    if inputs is not None:
        hashes = {"pull-secret-hash": hash_simple(inputs.pull_secret.encode()),
                  "hc-configuration-hash": inputs.configuration_hash}
        if inputs.trust_bundle:
            hashes["additional-trust-bundle-hash"] = hash_simple(inputs.trust_bundle)
        obj["data"].update({k: base64.b64encode(v.encode()).decode() for k, v in hashes.items()})
    if pool.os_stream:
        obj["data"]["os-stream"] = base64.b64encode(pool.os_stream.encode()).decode()
    return obj


def token_secret_name(pool: NodePool) -> str:
    return token_secret(pool, "", "")["metadata"]["name"]


def pointer_headers(pool: NodePool) -> dict[str, str]:
    """The headers HyperShift's pointer config (user-data) makes a node send with its token:
    the reference names the token Secret from them (`token-<name>-<hash>`) to annotate it
    `hypershift.openshift.io/ignition-reached` once served."""
    return {"NodePool": f"clusters/{pool.name}", "TargetConfigVersionHash": token_secret_name(pool).rsplit("-", 1)[1]}
