"""A hosted cluster's MCO base of the real size: HyperShift's real payload, made by the real MCO
binaries, imported as `ignition-server base import` imports it.

`real_cluster` runs HyperShift's steps 3-7 (real_release.mcs_reference_payload, ~1-2 s) for one
cluster with its own CA, kubeconfig and pull secret, on a release that is never pulled (the
binaries run directly from `unpack_tree`'s tree, so no registry is needed), and imports the
answer (434 KB, 51 files, 27 units for a None-platform worker) as the base's MachineConfig
YAML. `nodepool_inputs` is what the reconciler hands the renderer for one NodePool of it:
a small MachineConfig of its own, the cluster's join inputs, the release catalog's images.
For the render tests (tests/render/test_reuse.py) and benchmarks (bench/render_cost.py).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path

from ignition_server.base_import import base_configmap, from_mcs_config
from ignition_server.model.mco_base import BASE_KEY
from ignition_server.render.inputs import NodePoolInputs
from ignition_server.tls.certificates import make_ca
from testsupport.harness import EXAMPLE_MACHINECONFIG
from testsupport.real_release import (
    ART,
    PLACEHOLDERS,
    RealMCO,
    RealRelease,
    hashed,
    hypershift_mcs_config,
    mcs_reference_payload,
)

VERSION = "4.21.0"
RELEASE = RealRelease("quay.io/openshift-release-dev/ocp-release@sha256:" + hashed("release-" + VERSION), VERSION,
                      {n: ART + hashed(n) for n in (*PLACEHOLDERS, "machine-config-operator", "cluster-config-api")})
OS_IMAGE = RELEASE.images["rhel-coreos"]
EXTENSIONS_IMAGE = RELEASE.images["rhel-coreos-extensions"]


@dataclass(frozen=True)
class RealCluster:
    name: str
    payload: bytes  # what HyperShift's ignition server serves for the cluster's first NodePool
    base_yaml: str  # that payload as an MCO base (the ConfigMap's `machineconfigs.yaml`)
    ca: str
    kubeconfig: str
    pull_secret: str


def real_mco_tree(root: Path) -> RealMCO:
    """The binaries of `real_release.unpack_tree(..., dest)` (`root` = dest/root): no layers."""
    return RealMCO(root, Path("/nonexistent"), Path("/nonexistent"))


def real_cluster(real: RealMCO, work: Path, name: str) -> RealCluster:
    ca = make_ca()[0].decode()
    kubeconfig = (f"apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n"
                  f"    server: https://api-int.{name}.example.com:6443\n"
                  f"    certificate-authority-data: {base64.b64encode(ca.encode()).decode()}\n"
                  f"users:\n- name: kubelet-bootstrap\n  user:\n    token: {hashed(name)[:32]}\n"
                  f"contexts:\n- name: kubelet-bootstrap\n  context:\n    cluster: {name}\n    user: kubelet-bootstrap\n"
                  "current-context: kubelet-bootstrap\n")
    auth = base64.b64encode(f"{name}:{hashed(name + '-pull')[:40]}".encode()).decode()
    pull_secret = '{"auths":{"quay.io":{"auth":"%s"},"registry.redhat.io":{"auth":"%s"}}}' % (auth, auth)
    payload = mcs_reference_payload(real, work, cluster_files=hypershift_mcs_config(name, root_ca=ca, signer_ca=ca),
                                    custom_yaml=EXAMPLE_MACHINECONFIG.format(name=f"{name}-p0"),
                                    bootstrap_kubeconfig=kubeconfig, pull_secret=pull_secret, release=RELEASE)
    configmap = base_configmap(from_mcs_config(payload.decode()), name=f"mco-base-{name}", namespace=f"clusters-{name}",
                               release=RELEASE.pullspec, version=VERSION)
    return RealCluster(name, payload, configmap["data"][BASE_KEY], ca, kubeconfig, pull_secret)


def nodepool_inputs(cluster: RealCluster, pool: int, machineconfigs_yaml: str | None = None,
                    base_yaml: str | None = None) -> NodePoolInputs:
    """One NodePool of `cluster`: its own MachineConfig (the harness's example, named after it)
    unless `machineconfigs_yaml` says otherwise, on the cluster's base (or `base_yaml`)."""
    name = f"{cluster.name}-p{pool}"
    own = EXAMPLE_MACHINECONFIG.format(name=name) if machineconfigs_yaml is None else machineconfigs_yaml
    return NodePoolInputs(
        nodepool=f"clusters/{name}", secret=f"clusters-{cluster.name}/token-{name}", machineconfigs_yaml=own,
        config_digest=hashlib.sha256(own.encode()).hexdigest(), release=RELEASE.pullspec, release_version=VERSION,
        pull_secret=cluster.pull_secret, bootstrap_kubeconfig=cluster.kubeconfig, ca_bundle=cluster.ca,
        mco_base_yaml=cluster.base_yaml if base_yaml is None else base_yaml,
        os_image_url=OS_IMAGE, extensions_image=EXTENSIONS_IMAGE, kubelet_ca=cluster.ca)
