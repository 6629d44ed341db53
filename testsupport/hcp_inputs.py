"""HostedControlPlanes and the objects they name, and HyperShift's own code run on them:
`hcp-inputs` (../shared/real/README.md, "What the control plane writes for the ignition path"),
the control-plane-operator's functions built from HyperShift's source, printing the ConfigMaps
the CPO writes for one HCP.

    world = hcp_world(platform={"type": "AWS", "aws": {"region": "us-east-2"}}, fips=True)
    cpo = hcp_inputs.run(world.objects(), tmp_path)      # name -> ConfigMap, and cpo.hash
    ours = mcs_config_map(world.hcp, world.named())

The binary is unpacked once per session (`hcp_inputs` fixture); CI=true fails without it.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ignition_server.takeover.owned import DISABLE_IGNITION_SERVER, Named
from testsupport.manifests import CA_PEM, kube_object
from testsupport.real_release import require_packed, unpack_binary

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBfYzYx6e4yX0n6o5zv2r0yB0fJ2a9Yp2X4wS0a1b2c3 core@example\n"
KUBELET_CA = CA_PEM.replace("MIIBdz", "MIIBkub")
TRUSTED_BUNDLE = CA_PEM + CA_PEM.replace("MIIBdz", "MIIBusr")
PULL_SECRET = '{"auths":{"quay.io":{"auth":"dXNlcjpwYXNz"}}}'


def as_documents(objects: list[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML file, each document JSON: every string quoted, so
    go-yaml reads exactly what PyYAML holds (PyYAML writes `0o17` plain, which go-yaml reads as 15),
    and no literal block ends at a '---' that the reader's split could trim."""
    return "".join(f"---\n{_UNREADABLE.sub(_escape, json.dumps(obj, ensure_ascii=False))}\n" for obj in objects)


# What go-yaml's reader refuses raw (DEL, C1 controls, U+FFFE/FFFF) or reads as a line break (NEL,
# U+2028/2029), and the BOM, go escaped; the rest raw (an escaped astral character would be a
# surrogate pair, which go-yaml refuses).
_UNREADABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


@dataclass
class CPOOutput:
    """What hcp-inputs wrote: the ConfigMaps by name, and the configuration hash it printed."""

    config_maps: dict[str, dict[str, Any]]
    printed_hash: str


@dataclass(frozen=True)
class HcpInputs:
    binary: Path

    def run(self, objects: list[dict[str, Any]], workdir: Path, env: dict[str, str] | None = None) -> CPOOutput:
        """`env`: the CPO's own environment (MANAGED_SERVICE=ARO-HCP), besides PATH; none by default."""
        workdir.mkdir(parents=True, exist_ok=True)
        given, written = workdir / "objects.yaml", workdir / "cpo.yaml"
        given.write_text(as_documents(objects))
        done = subprocess.run([str(self.binary), "-in", str(given), "-out", str(written)],
                              capture_output=True, text=True, timeout=60, env={"PATH": os.environ.get("PATH", ""), **(env or {})})
        if done.returncode != 0:
            raise AssertionError(f"hcp-inputs failed ({done.returncode}): {done.stderr or done.stdout}")
        config_maps = {cm["metadata"]["name"]: cm for cm in yaml.safe_load_all(written.read_text()) if cm}
        printed = re.search(r"configuration-hash (\w+)", done.stdout + done.stderr)  # it reports on stderr
        return CPOOutput(config_maps, printed.group(1) if printed else "")

    def fails(self, objects: list[dict[str, Any]], workdir: Path) -> str:
        """hcp-inputs' error for objects it refuses (it must refuse them)."""
        workdir.mkdir(parents=True, exist_ok=True)
        given = workdir / "objects.yaml"
        given.write_text(as_documents(objects))
        done = subprocess.run([str(self.binary), "-in", str(given), "-out", str(workdir / "cpo.yaml")],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, f"hcp-inputs accepted them: {done.stdout}"
        return done.stderr + done.stdout


@pytest.fixture(scope="session")
def hcp_inputs(tmp_path_factory: pytest.TempPathFactory) -> HcpInputs:
    """HyperShift's hcp-inputs, unpacked once per session (skips locally, fails in CI, when absent)."""
    return HcpInputs(unpack_binary(require_packed("hcp-inputs"), tmp_path_factory.mktemp("hcp-inputs")))


@dataclass
class HcpWorld:
    """One annotated HostedControlPlane and the objects of its namespace it names."""

    hcp: dict[str, Any]
    trusted_bundle: dict[str, Any] | None = None
    ssh_secret: dict[str, Any] | None = None
    extra: list[dict[str, Any]] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        ns: str = self.hcp["metadata"]["namespace"]
        return ns

    def root_ca(self) -> dict[str, Any]:
        return kube_object("Secret", self.namespace, Named.ROOT_CA, {"ca.crt": CA_PEM, "ca.key": "not read"})

    def pull_secret(self) -> dict[str, Any]:
        secret = kube_object("Secret", self.namespace, Named.PULL_SECRET, {".dockerconfigjson": PULL_SECRET})
        secret["type"] = "kubernetes.io/dockerconfigjson"
        return secret

    def kubelet_client_ca(self) -> dict[str, Any]:
        return kube_object("ConfigMap", self.namespace, Named.KUBELET_CLIENT_CA, {"ca.crt": KUBELET_CA})

    def named(self) -> Named:
        return Named(root_ca=self.root_ca(), pull_secret=self.pull_secret(), kubelet_client_ca=self.kubelet_client_ca(),
                     trusted_ca_bundle=copy.deepcopy(self.trusted_bundle), ssh_key=copy.deepcopy(self.ssh_secret))

    def objects(self) -> list[dict[str, Any]]:
        named = self.named()
        found = [self.hcp, named.root_ca, named.pull_secret, named.kubelet_client_ca, named.trusted_ca_bundle,
                 named.ssh_key, *self.extra]
        return [copy.deepcopy(o) for o in found if o is not None]


def trusted_bundle(namespace: str, bundle: str = TRUSTED_BUNDLE) -> dict[str, Any]:
    """`trusted-ca-bundle-managed` as the API returns it, with the metadata the CPO serializes."""
    cm = kube_object("ConfigMap", namespace, Named.TRUSTED_CA_BUNDLE, {"ca-bundle.crt": bundle})
    cm["metadata"].update({
        "uid": "5d1e0a4c-7f5b-4b7e-9a34-0c3f1b2d4e6f", "resourceVersion": "48213",
        "creationTimestamp": "2026-11-02T08:15:00Z",
        "labels": {"hypershift.openshift.io/managed": "true"},
        "ownerReferences": [{"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedControlPlane",
                             "name": namespace.removeprefix("clusters-"), "uid": "hcp-uid", "controller": True,
                             "blockOwnerDeletion": True}],
        "managedFields": [{"manager": "control-plane-operator", "operation": "Update", "apiVersion": "v1",
                           "time": "2026-11-02T08:15:00Z", "fieldsType": "FieldsV1",
                           "fieldsV1": {"f:data": {".": {}, "f:ca-bundle.crt": {}}}}],
    })
    return cm


def hcp_world(name: str = "hc1", *, platform: dict[str, Any] | None = None, networking: dict[str, Any] | None = None,
              configuration: dict[str, Any] | None = None, fips: bool = False, ssh_key: str | None = SSH_KEY,
              mirrors: list[dict[str, Any]] | None = None, trusted: bool = False, dns: dict[str, Any] | None = None,
              endpoint: tuple[str, int] = ("api.hc1.example.com", 6443), **spec: Any) -> HcpWorld:
    """An annotated HCP in `clusters-<name>` as HyperShift's operator writes it, and what it names."""
    namespace = f"clusters-{name}"
    hcp_spec: dict[str, Any] = {
        "releaseImage": "quay.io/openshift-release-dev/ocp-release:4.21.0-x86_64",
        "pullSecret": {"name": Named.PULL_SECRET}, "sshKey": {"name": "ssh-key" if ssh_key is not None else ""},
        "issuerURL": "https://kubernetes.default.svc", "infraID": f"{name}-x7k2p", "fips": fips,
        "dns": dns or {"baseDomain": "example.com"},
        "networking": networking or {"networkType": "OVNKubernetes", "clusterNetwork": [{"cidr": "10.132.0.0/14"}],
                                     "serviceNetwork": [{"cidr": "172.31.0.0/16"}], "machineNetwork": [{"cidr": "10.0.0.0/16"}]},
        "platform": platform or {"type": "None"},
        "services": [], "etcd": {"managementType": "Managed"},
        "controllerAvailabilityPolicy": "SingleReplica", "infrastructureAvailabilityPolicy": "HighlyAvailable",
        **spec,
    }
    if mirrors:
        hcp_spec["imageContentSources"] = mirrors
    if configuration is not None:
        hcp_spec["configuration"] = configuration
    hcp = {"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedControlPlane",
           "metadata": {"name": name, "namespace": namespace, "uid": f"{name}-0b6f7d1e-1111-2222-3333-444455556666",
                        "annotations": {DISABLE_IGNITION_SERVER: "true"}},
           "spec": hcp_spec,
           "status": {"controlPlaneEndpoint": {"host": endpoint[0], "port": endpoint[1]}}}
    ssh = kube_object("Secret", namespace, "ssh-key", {"id_rsa.pub": ssh_key}) if ssh_key is not None else None
    return HcpWorld(hcp, trusted_bundle(namespace) if trusted else None, ssh)
