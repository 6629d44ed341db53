"""The `machine-config-server` ConfigMap, key for key as HyperShift's control-plane-operator
writes it (mcs.NewMCSParams + mcs.ReconcileMachineConfigServerConfig), and its
`configuration-hash` (backwardcompat.GetBackwardCompatibleConfigHash, the value HyperShift's
NodePool controller writes into token Secrets as `hc-configuration-hash`).
"""

from __future__ import annotations

import re
from typing import Any

from ignition_server.model.objects import secret_value
from ignition_server.takeover import cluster_config, go_json, go_yaml
from ignition_server.takeover.owned import MissingInput, Named, owned_config_map

NAME = "machine-config-server"
CA_KEY = "ca.crt"
USER_CA_KEY = "user-ca-bundle-config.yaml"
HASH_KEY = "configuration-hash"
_MCFG_V1 = "machineconfiguration.openshift.io/v1"
# openshift/api#1928 added imageStreamImportMode without omitempty; HyperShift drops it when empty
# so that the hash stays what older CPOs computed (support/util.RemoveEmptyJSONField).
_EMPTY_IMPORT_MODE = re.compile(r',?\s*"imageStreamImportMode":\s*""')


def fnv1a32(data: bytes) -> str:
    """FNV-1a, 32 bits, as eight hex digits (HyperShift's util.HashBytes)."""
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{value:08x}"


def configuration_hash(hcp: dict[str, Any]) -> str:
    """`configuration-hash`: FNV-1a of `spec.configuration` as Go's json.Marshal prints the typed
    struct (`null` when absent), an empty `imageStreamImportMode` removed."""
    configuration = (hcp.get("spec") or {}).get("configuration")
    if configuration is None:
        text = "null"
    else:
        text = go_json.dumps(go_json.struct(configuration, "ClusterConfiguration"))
    text = _EMPTY_IMPORT_MODE.sub("", text)
    text = re.sub(r"\s*,\s*}", "}", text)
    text = re.sub(r"{\s*,\s*", "{", text)
    return fnv1a32(text.encode())


def serialize(obj: dict[str, Any], kind: str) -> str:
    """An object as the CPO's serializer prints it: through its Go type, as YAML."""
    return go_yaml.dump(go_json.struct(obj, kind))


def _pool(name: str) -> str:
    worker = {"matchLabels": {"machineconfiguration.openshift.io/role": "worker"}}
    pool = {"apiVersion": _MCFG_V1, "kind": "MachineConfigPool",
            "metadata": {"name": name, "labels": {"machineconfiguration.openshift.io/mco-built-in": ""}},
            "spec": {"machineConfigSelector": worker,
                     "nodeSelector": {"matchLabels": {"node-role.kubernetes.io/worker": ""}}}}
    return serialize(pool, "MachineConfigPool")


def _required(obj: dict[str, Any] | None, what: str) -> dict[str, Any]:
    if obj is None:
        raise MissingInput(f"{what} is missing")
    return obj


def mcs_data(hcp: dict[str, Any], named: Named, managed_service: str = "") -> dict[str, str]:
    """The ConfigMap's data. Raises MissingInput for a missing `root-ca`, `pull-secret` or
    `kubelet-client-ca` (the CPO reads all three, though the pull secret is not written here).
    `managed_service`: the CPO's MANAGED_SERVICE (cluster_config.is_private)."""
    root_ca = _required(named.root_ca, f"Secret {Named.ROOT_CA}")
    _required(named.pull_secret, f"Secret {Named.PULL_SECRET}")
    kubelet_ca = _required(named.kubelet_client_ca, f"ConfigMap {Named.KUBELET_CLIENT_CA}")
    data: dict[str, str] = {}
    trusted = named.trusted_ca_bundle
    if trusted is not None and trusted.get("data"):
        # The whole ConfigMap as the CPO read it, metadata (resourceVersion, managedFields) included.
        data[USER_CA_KEY] = serialize({**trusted, "apiVersion": "v1", "kind": "ConfigMap"}, "ConfigMap")
    data["root-ca.crt"] = (secret_value(root_ca, CA_KEY) or b"").decode(errors="replace")
    data["signer-ca.crt"] = str((kubelet_ca.get("data") or {}).get(CA_KEY) or "")
    data["cluster-dns-02-config.yaml"] = serialize(cluster_config.dns(hcp), "DNS")
    data["cluster-infrastructure-02-config.yaml"] = serialize(cluster_config.infrastructure(hcp, managed_service), "Infrastructure")
    data["cluster-network-02-config.yaml"] = serialize(cluster_config.network(hcp), "Network")
    data["cluster-proxy-01-config.yaml"] = serialize(cluster_config.proxy(hcp), "Proxy")
    data["image-config.yaml"] = serialize(cluster_config.image(hcp), "Image")
    data["cluster-apiserver-config.yaml"] = serialize(cluster_config.apiserver(hcp), "APIServer")
    data["install-config.yaml"] = cluster_config.install_config(hcp)
    data["master.machineconfigpool.yaml"] = _pool("master")
    data["worker.machineconfigpool.yaml"] = _pool("worker")
    data[HASH_KEY] = configuration_hash(hcp)
    return data


def mcs_config_map(hcp: dict[str, Any], named: Named, managed_service: str = "") -> dict[str, Any]:
    """The `machine-config-server` ConfigMap the CPO writes for `hcp`, owned by it."""
    return owned_config_map(hcp, NAME, mcs_data(hcp, named, managed_service))
