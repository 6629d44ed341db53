"""What every object the takeover writes shares: the HostedControlPlane as its controlling owner
(HyperShift's config.OwnerRefFrom), and the inputs it reads, named."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ignition_server.model.objects import config_map, has_large_values

HCP_API_VERSION = "hypershift.openshift.io/v1beta1"
HCP_KIND = "HostedControlPlane"
DISABLE_IGNITION_SERVER = "hypershift.openshift.io/disable-ignition-server"


class MissingInput(ValueError):
    """An object the CPO needs is not there (or lacks its key): it writes nothing and says which."""


def owner_reference(hcp: dict[str, Any]) -> dict[str, Any]:
    meta = hcp["metadata"]
    return {"apiVersion": HCP_API_VERSION, "kind": HCP_KIND, "name": meta["name"], "uid": meta.get("uid", ""),
            "controller": True, "blockOwnerDeletion": True}


def owned_config_map(hcp: dict[str, Any], name: str, data: dict[str, str],
                     labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A ConfigMap in the HCP's namespace, owned by it, as the CPO creates it."""
    cm = config_map(hcp["metadata"]["namespace"], name, data)
    if labels:
        cm["metadata"]["labels"] = dict(labels)
    cm["metadata"]["ownerReferences"] = [owner_reference(hcp)]
    return cm


def taken_over(hcp: dict[str, Any]) -> bool:
    """The HCP carries the annotation (any value) under which the CPO stops writing the ignition path."""
    return DISABLE_IGNITION_SERVER in ((hcp.get("metadata") or {}).get("annotations") or {})


def ignition_hostname(hcp: dict[str, Any]) -> str:
    """The hostname of the HCP's `Ignition` service published as a Route (the only strategy under
    which HyperShift still sets `status.ignitionEndpoint` with the annotation); "" otherwise."""
    for service in (hcp.get("spec") or {}).get("services") or []:
        if not isinstance(service, dict) or service.get("service") != "Ignition":
            continue
        strategy = service.get("servicePublishingStrategy") or {}
        if strategy.get("type") == "Route":
            return str((strategy.get("route") or {}).get("hostname") or "").lower().rstrip(".")
    return ""


@dataclass(frozen=True)
class Named:
    """The objects of the HCP's namespace that the takeover reads, by the names the CPO uses (None: absent)."""

    root_ca: dict[str, Any] | None = None            # Secret root-ca
    pull_secret: dict[str, Any] | None = None        # Secret pull-secret
    kubelet_client_ca: dict[str, Any] | None = None  # ConfigMap kubelet-client-ca
    trusted_ca_bundle: dict[str, Any] | None = None  # ConfigMap trusted-ca-bundle-managed, optional
    ssh_key: dict[str, Any] | None = None            # the Secret spec.sshKey.name names, if it names one

    def __post_init__(self) -> None:
        for obj in (self.root_ca, self.pull_secret, self.kubelet_client_ca, self.trusted_ca_bundle, self.ssh_key):
            if obj is not None and has_large_values(obj):
                name = (obj.get("metadata") or {}).get("name")
                raise ValueError(f"{obj.get('kind')} {name} is a slim copy (large values as digests): read the full object")

    ROOT_CA = "root-ca"
    PULL_SECRET = "pull-secret"
    KUBELET_CLIENT_CA = "kubelet-client-ca"
    TRUSTED_CA_BUNDLE = "trusted-ca-bundle-managed"


def ssh_key_secret_name(hcp: dict[str, Any]) -> str:
    """The Secret `spec.sshKey.name` names ("" when none: the CPO then writes no key)."""
    name: str = ((hcp.get("spec") or {}).get("sshKey") or {}).get("name") or ""
    return name
