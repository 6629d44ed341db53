"""A release with the REAL MCO binaries, in the tests' real registry, as a release ships them.

`../shared/real/` (CI has it beside the clone; elsewhere set IGNITION_TEST_REAL_DIR to a
directory holding the same files: `machine-config-{operator,controller,server}.xz`,
`render.xz`, `mco-image-files.tar.xz`, built from source as its README says) is unpacked
once per test session (`real_mco` fixture). From it:

- the `machine-config-operator` image: `usr/bin/machine-config-{operator,controller,server}`,
  `etc/mcc/templates/**`, `manifests/**` and `usr/lib/os-release` (RHEL 9.6);
- the `cluster-config-api` image: `usr/bin/render`;
- the release: `release-manifests/image-references` naming both (and the other components
  MCO's bootstrap looks up) by the tags a release uses, its `metadata.name` the version.

The gzipped layers are made once per session and pushed to each registry that asks
(`push_real_release`). `hypershift_mcs_config` is the `machine-config-server` ConfigMap's data
as HyperShift's control-plane-operator writes it (mcs/reconcile.go). Under CI (CI=true) a
missing directory fails the test; locally it skips.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from realtools import in_ci
from registry_world import OCI_MANIFEST, Registry, sha256

REPO_ROOT = Path(__file__).resolve().parent.parent
BINARIES = ("machine-config-operator", "machine-config-controller", "machine-config-server", "render")
IMAGE_FILES = "mco-image-files.tar.xz"
OS_RELEASE = b'NAME="Red Hat Enterprise Linux"\nVERSION="9.6 (Plow)"\nID="rhel"\nVERSION_ID="9.6"\n'
# Components MCO's bootstrap looks up by tag (it stops at the first missing one), besides the two
# images the tests build; never pulled, so any digest does.
PLACEHOLDERS = ("rhel-coreos", "rhel-coreos-extensions", "haproxy-router", "keepalived-ipfailover", "coredns",
                "baremetal-runtimecfg", "pod", "kube-rbac-proxy", "oauth-proxy", "docker-registry", "cli")
ART = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:"


def real_dir() -> Path | None:
    """Where the real binaries are: $IGNITION_TEST_REAL_DIR, else ../shared/real beside the clone
    (or beside the directory of worktrees, for a git worktree one level further down)."""
    for candidate in (os.environ.get("IGNITION_TEST_REAL_DIR"), str(REPO_ROOT.parent / "shared" / "real"),
                      str(REPO_ROOT.parent.parent / "shared" / "real")):
        if candidate and all((Path(candidate) / f"{b}.xz").is_file() for b in BINARIES) \
                and (Path(candidate) / IMAGE_FILES).is_file():
            return Path(candidate)
    return None


def require_real_dir() -> Path:
    found = real_dir()
    if found is not None:
        return found
    message = ("the real MCO binaries are not there: set IGNITION_TEST_REAL_DIR to a directory with "
               f"{', '.join(b + '.xz' for b in BINARIES)} and {IMAGE_FILES} (../shared/real in CI)")
    if in_ci():
        pytest.fail(f"CI needs the real binaries: {message}", pytrace=False)
    pytest.skip(message)


@dataclass(frozen=True)
class RealMCO:
    """The unpacked real binaries and the two images' layers (gzip tar), made once per session."""

    root: Path  # usr/bin/*, etc/mcc/templates/**, manifests/**, usr/lib/os-release: the MCO image's tree
    mco_layer: Path
    render_layer: Path

    def binary(self, name: str) -> Path:
        return self.root / "usr" / "bin" / name


def unpack(source: Path, dest: Path) -> RealMCO:
    root = dest / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    for name in BINARIES:
        target = root / "usr" / "bin" / name
        with lzma.open(source / f"{name}.xz") as packed, open(target, "wb") as out:
            shutil.copyfileobj(packed, out, 1 << 20)
        target.chmod(0o755)
    with tarfile.open(source / IMAGE_FILES, "r:xz") as tar:
        tar.extractall(dest / "files", filter="data")
    (root / "etc" / "mcc").mkdir(parents=True)
    shutil.copytree(dest / "files" / "templates", root / "etc" / "mcc" / "templates")
    shutil.copytree(dest / "files" / "install", root / "manifests")
    (root / "usr" / "lib").mkdir()
    (root / "usr" / "lib" / "os-release").write_bytes(OS_RELEASE)
    mco_paths = [p for p in sorted(root.rglob("*")) if p.is_file() and p.name != "render"]
    return RealMCO(root, _layer(dest / "mco-layer.tar.gz", root, mco_paths),
                   _layer(dest / "render-layer.tar.gz", root, [root / "usr" / "bin" / "render"]))


def _layer(path: Path, root: Path, files: list[Path]) -> Path:
    # compresslevel 1: the binaries are ~250 MB; this runs once per session.
    with gzip.open(path, "wb", compresslevel=1) as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for file in files:
            info = tar.gettarinfo(str(file), arcname=str(file.relative_to(root)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            with open(file, "rb") as handle:
                tar.addfile(info, handle)
    return path


@pytest.fixture(scope="session")
def real_mco(tmp_path_factory: pytest.TempPathFactory) -> RealMCO:
    """The real MCO binaries, unpacked once per session (skips locally, fails in CI, when absent)."""
    return unpack(require_real_dir(), tmp_path_factory.mktemp("real-mco"))


def push_image(registry: Registry, repo: str, layer: Path) -> str:
    """One-layer linux/amd64 image; its pull spec by digest."""
    data = layer.read_bytes()
    with gzip.open(layer) as raw:
        diff_id = sha256(raw.read())
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": registry.push_blob(repo, config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": registry.push_blob(repo, data),
                    "size": len(data)}],
    }).encode()
    return f"{registry.host}/{repo}@{registry.push_manifest(repo, sha256(manifest), manifest, OCI_MANIFEST)}"


@dataclass(frozen=True)
class RealRelease:
    pullspec: str  # by digest
    version: str
    images: dict[str, str]  # tag -> pull spec, as image-references names them


def push_real_release(registry: Registry, real: RealMCO, version: str = "4.21.0", repo: str = "ocp/release",
                      images: dict[str, str] | None = None) -> RealRelease:
    """The real images and a release naming them (a single-architecture image, as `oc adm release new` makes for amd64)."""
    components = {name: ART + hashed(name) for name in PLACEHOLDERS}
    components["machine-config-operator"] = push_image(registry, "ocp/machine-config-operator", real.mco_layer)
    components["cluster-config-api"] = push_image(registry, "ocp/cluster-config-api", real.render_layer)
    components.update(images or {})
    digests = registry.push_release(repo, {"amd64": components}, version)
    return RealRelease(f"{registry.host}/{repo}@{digests['index']}", version, components)


def hashed(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _dump(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=True)


def hypershift_mcs_config(name: str, *, infra_id: str | None = None, platform: str = "None", root_ca: str,
                          signer_ca: str, tls_profile: str | None = None, user_ca_bundle: str = "",
                          configuration_hash: str = "h1") -> dict[str, str]:
    """The `machine-config-server` ConfigMap's data as HyperShift writes it (control-plane-operator
    mcs/reconcile.go and globalconfig): the cluster's config.openshift.io objects, the
    install-config, the two pools (`master` selects the worker role), the CAs.

    `tls_profile` (Old, Intermediate, Modern) goes into cluster-apiserver-config.yaml, from
    where MCO writes it into the kubelet's and CRI-O's configuration."""
    meta = {"creationTimestamp": None, "name": "cluster"}
    infra = {"apiVersion": "config.openshift.io/v1", "kind": "Infrastructure", "metadata": meta,
             "spec": {"cloudConfig": {"name": ""}, "platformSpec": {"type": platform}},
             "status": {"apiServerInternalURI": f"https://api-int.{name}.example.com:6443",
                        "apiServerURL": f"https://api.{name}.example.com:6443", "controlPlaneTopology": "External",
                        "cpuPartitioning": "None", "etcdDiscoveryDomain": "", "infrastructureName": infra_id or f"{name}-abcde",
                        "infrastructureTopology": "HighlyAvailable", "platform": platform, "platformStatus": {"type": platform}}}
    networks = {"clusterNetwork": [{"cidr": "10.132.0.0/14", "hostPrefix": 23}], "networkType": "OVNKubernetes",
                "serviceNetwork": ["172.31.0.0/16"]}
    network = {"apiVersion": "config.openshift.io/v1", "kind": "Network", "metadata": meta,
               "spec": {**networks, "externalIP": {"policy": {}}}, "status": networks}
    proxy = {"apiVersion": "config.openshift.io/v1", "kind": "Proxy", "metadata": meta, "spec": {"trustedCA": {"name": ""}}, "status": {}}
    dns = {"apiVersion": "config.openshift.io/v1", "kind": "DNS", "metadata": meta,
           "spec": {"baseDomain": f"{name}.example.com", "platform": {"type": ""}}, "status": {}}
    install = {"apiVersion": "v1", "baseDomain": f"{name}.example.com", "compute": [{"name": "worker", "replicas": 0}],
               "controlPlane": {"name": "master", "replicas": 0}, "metadata": {"name": name},
               "networking": {**{k: v for k, v in networks.items()}, "machineNetwork": [{"cidr": "10.0.0.0/16"}]},
               "platform": {"none": {}} if platform == "None" else {platform.lower(): {}}, "pullSecret": "",
               "sshKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBfYzYx6e4yX0n6o5zv2r0yB0fJ2a9Yp2X4wS0a1b2c3 core@example", "fips": False}
    apiserver_spec: dict[str, Any] = {"audit": {"profile": "Default"}}
    if tls_profile:
        apiserver_spec["tlsSecurityProfile"] = {"type": tls_profile, tls_profile.lower(): {}}
    apiserver = {"apiVersion": "config.openshift.io/v1", "kind": "APIServer", "metadata": meta, "spec": apiserver_spec, "status": {}}
    image = {"apiVersion": "config.openshift.io/v1", "kind": "Image", "metadata": meta, "spec": {}, "status": {}}

    def pool(pool_name: str) -> dict[str, Any]:
        return {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
                "metadata": {"creationTimestamp": None, "labels": {"machineconfiguration.openshift.io/mco-built-in": ""},
                             "name": pool_name},
                "spec": {"configuration": {}, "machineConfigSelector": {"matchLabels": {"machineconfiguration.openshift.io/role": "worker"}},
                         "nodeSelector": {"matchLabels": {"node-role.kubernetes.io/worker": ""}}, "paused": False},
                "status": {"configuration": {}, "degradedMachineCount": 0, "machineCount": 0, "readyMachineCount": 0,
                           "unavailableMachineCount": 0, "updatedMachineCount": 0}}

    data = {
        "root-ca.crt": root_ca, "signer-ca.crt": signer_ca,
        "cluster-infrastructure-02-config.yaml": _dump(infra), "cluster-network-02-config.yaml": _dump(network),
        "cluster-proxy-01-config.yaml": _dump(proxy), "cluster-dns-02-config.yaml": _dump(dns),
        "install-config.yaml": _dump(install), "cluster-apiserver-config.yaml": _dump(apiserver),
        "image-config.yaml": _dump(image),
        "master.machineconfigpool.yaml": _dump(pool("master")), "worker.machineconfigpool.yaml": _dump(pool("worker")),
        "configuration-hash": configuration_hash,
    }
    if user_ca_bundle:
        data["user-ca-bundle-config.yaml"] = _dump({"apiVersion": "v1", "kind": "ConfigMap",
                                                    "metadata": {"name": "user-ca-bundle", "namespace": "openshift-config"},
                                                    "data": {"ca-bundle.crt": user_ca_bundle}})
    return data

