"""The core ignition ConfigMaps, as HyperShift's control-plane-operator writes them
(reconcileCoreIgnitionConfig: ignition.ReconcileFIPSIgnitionConfig, ReconcileWorkerSSHIgnitionConfig,
globalconfig.ReconcileImageDigestMirrors + ReconcileImageSourceMirrorsIgnitionConfigFromIDMS).

HyperShift's NodePool controller lists the ConfigMaps labelled `core-ignition-config` in the
control-plane namespace and counts them exactly: `expected(hcp)` of them, or no token Secret.
"""

from __future__ import annotations

from typing import Any

from ignition_server.model.objects import secret_value
from ignition_server.takeover.mcs_config import serialize
from ignition_server.takeover.owned import MissingInput, Named, owned_config_map, ssh_key_secret_name

CORE_LABEL = "hypershift.openshift.io/core-ignition-config"
LABELS = {CORE_LABEL: "true"}
FIPS = "ignition-config-fips"
WORKER_SSH = "ignition-config-worker-ssh"
IMAGE_CONTENT_SOURCE = "ignition-config-40-image-content-source"
CORE_NAMES = (FIPS, WORKER_SSH, IMAGE_CONTENT_SOURCE)  # every core ConfigMap the CPO keeps or deletes
CONFIG_KEY = "config"
SSH_KEY = "id_rsa.pub"
_WORKER = {"machineconfiguration.openshift.io/role": "worker"}


def names(hcp: dict[str, Any]) -> tuple[str, ...]:
    """The core ConfigMaps the CPO keeps for `hcp`: two, three while it has image content sources."""
    if (hcp.get("spec") or {}).get("imageContentSources"):
        return FIPS, WORKER_SSH, IMAGE_CONTENT_SOURCE
    return FIPS, WORKER_SSH


def ssh_key(hcp: dict[str, Any], named: Named) -> str:
    """`id_rsa.pub` of the Secret `spec.sshKey` names, as it is ("" when the HCP names none)."""
    name = ssh_key_secret_name(hcp)
    if not name:
        return ""
    if named.ssh_key is None:
        raise MissingInput(f"SSH key secret {name} is missing")
    value = secret_value(named.ssh_key, SSH_KEY)
    if value is None:
        raise MissingInput(f"SSH key secret {name} is missing the {SSH_KEY} key")
    return value.decode(errors="replace")


def _machine_config(name: str, spec: dict[str, Any]) -> str:
    mc = {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
          "metadata": {"name": name, "labels": dict(_WORKER)}, "spec": spec}
    return serialize(mc, "MachineConfig")


def fips_config(hcp: dict[str, Any]) -> str:
    """MachineConfig `30-fips` with `spec.fips` from the HCP."""
    return _machine_config("30-fips", {"fips": bool((hcp.get("spec") or {}).get("fips"))})


def worker_ssh_config(key: str) -> str:
    """MachineConfig `99-worker-ssh`: Ignition 3.2.0 with user `core` and the key, if any."""
    user: dict[str, Any] = {"name": "core"}
    if key:
        user["sshAuthorizedKeys"] = [key]
    ignition = {"ignition": {"version": "3.2.0"}, "passwd": {"users": [user]}}
    return _machine_config("99-worker-ssh", {"config": ignition})


def image_content_source_config(hcp: dict[str, Any]) -> str:
    """ImageDigestMirrorSet `cluster`: one entry per `spec.imageContentSources` item, mirrors in order."""
    mirrors = [{"source": source.get("source", ""), "mirrors": list(source.get("mirrors") or []) or None}
               for source in (hcp.get("spec") or {}).get("imageContentSources") or []]
    idms = {"apiVersion": "config.openshift.io/v1", "kind": "ImageDigestMirrorSet",
            "metadata": {"name": "cluster", "labels": dict(_WORKER)}, "spec": {"imageDigestMirrors": mirrors}}
    return serialize(idms, "ImageDigestMirrorSet")


def core_config_maps(hcp: dict[str, Any], named: Named) -> dict[str, dict[str, Any]]:
    """name -> the ConfigMap the CPO writes, for every name in `names(hcp)`; any other core
    ConfigMap it finds (the mirrors' once the HCP has none) it deletes."""
    contents = {FIPS: fips_config(hcp), WORKER_SSH: worker_ssh_config(ssh_key(hcp, named))}
    if IMAGE_CONTENT_SOURCE in names(hcp):
        contents[IMAGE_CONTENT_SOURCE] = image_content_source_config(hcp)
    return {name: owned_config_map(hcp, name, {CONFIG_KEY: text}, LABELS) for name, text in contents.items()}
