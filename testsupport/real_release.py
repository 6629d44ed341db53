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

from testsupport import REPO
from testsupport.realtools import in_ci
from testsupport.registry_world import OCI_MANIFEST, Registry, sha256

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
    for candidate in (os.environ.get("IGNITION_TEST_REAL_DIR"), str(REPO.parent / "shared" / "real"),
                      str(REPO.parent.parent / "shared" / "real")):
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


def require_packed(name: str) -> Path:
    """`NAME.xz` in the real directory (../shared/real/README.md lists them): fails in CI, skips
    elsewhere, when it is not there."""
    packed = require_real_dir() / f"{name}.xz"
    if not packed.is_file():
        message = f"{packed.name} is not in {packed.parent} (../shared/real/README.md)"
        if in_ci():
            pytest.fail(f"CI needs the real binaries: {message}", pytrace=False)
        pytest.skip(message)
    return packed


def unpack_binary(packed: Path, into: Path) -> Path:
    """A real binary (`NAME.xz`) decompressed into `into` as NAME, executable."""
    target = into / packed.name.removesuffix(".xz")
    with lzma.open(packed) as source, open(target, "wb") as out:
        shutil.copyfileobj(source, out, 1 << 20)
    target.chmod(0o755)
    return target


@dataclass(frozen=True)
class RealMCO:
    """The unpacked real binaries and the two images' layers (gzip tar), made once per session."""

    root: Path  # usr/bin/*, etc/mcc/templates/**, manifests/**, usr/lib/os-release: the MCO image's tree
    mco_layer: Path
    render_layer: Path

    def binary(self, name: str) -> Path:
        return self.root / "usr" / "bin" / name


def unpack(source: Path, dest: Path) -> RealMCO:
    root = unpack_tree(source, dest)
    mco_paths = [p for p in sorted(root.rglob("*")) if p.is_file() and p.name != "render"]
    return RealMCO(root, _layer(dest / "mco-layer.tar.gz", root, mco_paths),
                   _layer(dest / "render-layer.tar.gz", root, [root / "usr" / "bin" / "render"]))


def unpack_tree(source: Path, dest: Path) -> Path:
    """The MCO image's tree (binaries, templates, manifests, os-release) under `dest/root`,
    without the layers a registry needs (enough to run the binaries directly)."""
    root = dest / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    for name in BINARIES:
        unpack_binary(source / f"{name}.xz", root / "usr" / "bin")
    with tarfile.open(source / IMAGE_FILES, "r:xz") as tar:
        tar.extractall(dest / "files", filter="data")
    (root / "etc" / "mcc").mkdir(parents=True)
    shutil.copytree(dest / "files" / "templates", root / "etc" / "mcc" / "templates")
    shutil.copytree(dest / "files" / "install", root / "manifests")
    (root / "usr" / "lib").mkdir()
    (root / "usr" / "lib" / "os-release").write_bytes(OS_RELEASE)
    return root


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


DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
# The release's CoreOS boot images, as the installer's manifest carries them (HyperShift's release
# lookup reads it: "couldn't read image lookup data as serialized ConfigMap: EOF" without it).
BOOTIMAGES: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "coreos-bootimages", "namespace": "openshift-machine-config-operator"},
              "data": {"releaseVersion": "", "stream": json.dumps({
                  "stream": "rhcos-9.6", "metadata": {"last-modified": "2026-08-20T00:00:00Z", "generator": "tests"},
                  "architectures": {"x86_64": {"artifacts": {}, "images": {}, "rhel-coreos-extensions": {}}}})}}


def release_tar_gz(images: dict[str, str], version: str) -> bytes:
    """The release image's one layer: image-references, release-metadata and the boot images."""
    import io

    stream = {"kind": "ImageStream", "apiVersion": "image.openshift.io/v1", "metadata": {"name": version},
              "spec": {"tags": [{"name": n, "from": {"kind": "DockerImage", "name": i}} for n, i in images.items()]}}
    bootimages = dict(BOOTIMAGES, data={**BOOTIMAGES["data"], "releaseVersion": version})
    files = {
        "release-manifests/image-references": json.dumps(stream).encode(),
        "release-manifests/release-metadata": json.dumps({"kind": "cincinnati-metadata-v0", "version": version}).encode(),
        "release-manifests/0000_50_installer_coreos-bootimages.yaml": yaml.safe_dump(bootimages).encode(),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=1)


def push_real_release(registry: Registry, real: RealMCO, version: str = "4.21.0", repo: str = "ocp/release",
                      images: dict[str, str] | None = None) -> RealRelease:
    """The real images and a release naming them, pushed as `oc adm release new` pushes a
    single-architecture release: a Docker schema 2 manifest (HyperShift's client refuses an OCI
    index at a release's root)."""
    components = {name: ART + hashed(name) for name in PLACEHOLDERS}
    components["machine-config-operator"] = push_image(registry, "ocp/machine-config-operator", real.mco_layer)
    components["cluster-config-api"] = push_image(registry, "ocp/cluster-config-api", real.render_layer)
    components.update(images or {})
    layer = release_tar_gz(components, version)
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [sha256(gzip.decompress(layer))]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": registry.push_blob(repo, config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "digest": registry.push_blob(repo, layer), "size": len(layer)}],
    }).encode()
    digest = registry.push_manifest(repo, sha256(manifest), manifest, DOCKER_MANIFEST)
    return RealRelease(f"{registry.host}/{repo}@{digest}", version, components)


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
    infra: dict[str, Any] = {"apiVersion": "config.openshift.io/v1", "kind": "Infrastructure", "metadata": meta,
             "spec": {"cloudConfig": {"name": ""}, "platformSpec": {"type": platform}},
             "status": {"apiServerInternalURI": f"https://api-int.{name}.example.com:6443",
                        "apiServerURL": f"https://api.{name}.example.com:6443", "controlPlaneTopology": "External",
                        "cpuPartitioning": "None", "etcdDiscoveryDomain": "", "infrastructureName": infra_id or f"{name}-abcde",
                        "infrastructureTopology": "HighlyAvailable", "platform": platform, "platformStatus": {"type": platform}}}
    if platform == "Azure":  # as globalconfig.ReconcileInfrastructure writes it for Azure
        infra["spec"]["cloudConfig"] = {"key": "cloud.conf", "name": "azure-cloud-config"}
        infra["spec"]["platformSpec"]["azure"] = {}
        infra["status"]["platformStatus"]["azure"] = {"cloudName": "AzurePublicCloud", "resourceGroupName": f"{name}-rg",
                                                      "networkResourceGroupName": f"{name}-rg"}
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



def azure_cloud_config(namespace: str, location: str = "eastus") -> dict[str, Any]:
    """The `azure-cloud-config` ConfigMap of a control-plane namespace (its `cloud.conf`)."""
    conf = {"cloud": "AzurePublicCloud", "tenantId": "00000000-0000-0000-0000-000000000000",
            "subscriptionId": "00000000-0000-0000-0000-000000000000", "resourceGroup": "example-rg", "location": location,
            "vmType": "standard", "useManagedIdentityExtension": True}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "azure-cloud-config", "namespace": namespace},
            "data": {"cloud.conf": json.dumps(conf, indent=2)}}


def mcs_reference_payload(real: RealMCO, work: Path, *, cluster_files: dict[str, str], custom_yaml: str,
                          bootstrap_kubeconfig: str, pull_secret: str, release: RealRelease, os_stream: str = "",
                          cloud_config: dict[str, Any] | None = None) -> bytes:
    """What HyperShift's ignition server serves for these inputs, made by running its steps 3-7
    (../shared/real/README.md) with the real binaries directly: render, the operator, the
    controller with the NodePool's MachineConfigs (`mcc/custom.yaml`), then the bootstrap MCS's
    answer to `/config/master` at 3.2.0. About 2 s; `work` must not exist yet."""
    import base64
    import subprocess
    import urllib.request

    from ignition_server.tls.certificates import ensure_self_signed
    from testsupport.harness import free_port, wait_for

    config, mco, mcc, mcs, gates = (work / n for n in ("config", "mco", "mcc", "mcs", "cca"))
    for directory in (config, mco, mcc, mcs, gates / "input", gates / "output", gates / "manifests"):
        directory.mkdir(parents=True)
    for name, text in cluster_files.items():
        if name != "configuration-hash":
            (config / name).write_text(text)
    (config / "pull-secret.yaml").write_text(_dump({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "pull-secret", "namespace": "openshift-config"},
        "data": {".dockerconfigjson": base64.b64encode(pull_secret.encode()).decode()}}))
    (config / "release-manifests").mkdir()
    (config / "release-manifests" / "image-references").write_text(json.dumps(
        {"kind": "ImageStream", "apiVersion": "image.openshift.io/v1", "metadata": {"name": release.version},
         "spec": {"tags": [{"name": n, "from": {"kind": "DockerImage", "name": i}} for n, i in release.images.items()]}}))
    (mcc / "custom.yaml").write_text(custom_yaml)
    (mcs / "kubeconfig").write_text(bootstrap_kubeconfig)

    def run(argv: list[str], cwd: Path) -> None:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{argv[0]} failed:\n{done.stdout[-4000:]}{done.stderr[-4000:]}"

    (gates / "manifests" / "99_feature-gate.yaml").write_text(
        "apiVersion: config.openshift.io/v1\nkind: FeatureGate\nmetadata:\n  name: cluster\nspec: {}\n")
    run([str(real.binary("render")), "--asset-output-dir", str(gates / "output"), "--image-manifests=input",
         f"--rendered-manifest-dir={gates / 'manifests'}", "--cluster-profile=ibm-cloud-managed",
         f"--payload-version={release.version}"], gates)
    shutil.copyfile(gates / "manifests" / "99_feature-gate.yaml", mcc / "99_feature-gate.yaml")
    args = [f"--root-ca={config}/root-ca.crt", f"--infra-config-file={config}/cluster-infrastructure-02-config.yaml",
            f"--network-config-file={config}/cluster-network-02-config.yaml",
            f"--proxy-config-file={config}/cluster-proxy-01-config.yaml", f"--config-file={config}/install-config.yaml",
            f"--dns-config-file={config}/cluster-dns-02-config.yaml", f"--pull-secret={config}/pull-secret.yaml",
            f"--dest-dir={mco}", f"--release-image={release.pullspec}", f"--payload-version={release.version}",
            f"--image-references={config}/release-manifests/image-references", f"--kube-ca={config}/signer-ca.crt"]
    if cluster_files.get("user-ca-bundle-config.yaml"):
        args.append(f"--additional-trust-bundle-config-file={config}/user-ca-bundle-config.yaml")
    if cloud_config is not None:  # Azure, OpenStack
        (mco / "cloud.conf.configmap.yaml").write_text(_dump(cloud_config))
        args.append(f"--cloud-config-file={mco}/cloud.conf.configmap.yaml")
    run([str(real.binary("machine-config-operator")), "bootstrap", *args], work)
    for source in (mco / "bootstrap" / "manifests").iterdir():
        shutil.copyfile(source, mcc / source.name)
    for source in [*config.glob("*.machineconfigpool.yaml"), config / "image-config.yaml", config / "cluster-apiserver-config.yaml"]:
        shutil.copyfile(source, mcc / source.name)
    if os_stream:
        (mcc / "99_osimagestream.yaml").write_text(_dump({"apiVersion": "machineconfiguration.openshift.io/v1",
                                                          "kind": "OSImageStream", "metadata": {"name": "cluster"},
                                                          "spec": {"defaultStream": os_stream}}))
    run([str(real.binary("machine-config-controller")), "bootstrap", f"--manifest-dir={mcc}",
         f"--templates={real.root / 'etc' / 'mcc' / 'templates'}", f"--pull-secret={mcc}/machineconfigcontroller-pull-secret",
         f"--dest-dir={mcs}", f"--payload-version={release.version}"], work)
    tls = ensure_self_signed(work / "tls", "https://localhost")
    for attempt in range(3):  # its ports are picked free, but another process on the machine may take one first
        secure, insecure = free_port(), free_port()
        log_path = work / f"mcs-{attempt}.log"
        with open(log_path, "wb") as log:
            server = subprocess.Popen([str(real.binary("machine-config-server")), "bootstrap", f"--server-basedir={mcs}",
                                       f"--bootstrap-kubeconfig={mcs}/kubeconfig", f"--cert={tls.cert}", f"--key={tls.key}",
                                       f"--secure-port={secure}", f"--insecure-port={insecure}",
                                       f"--payload-version={release.version}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            request = urllib.request.Request(f"http://127.0.0.1:{insecure}/config/master",
                                             headers={"Accept": "application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1"})

            def answer() -> bytes | bool | None:
                if server.poll() is not None:
                    if b"address already in use" in log_path.read_bytes():
                        return False
                    raise AssertionError(log_path.read_text())
                try:
                    with urllib.request.urlopen(request, timeout=5) as response:
                        return response.read()
                except OSError:
                    return None

            (body,) = wait_for(lambda: (a := answer()) is not None and (a,), timeout=30,
                               what="the bootstrap machine-config-server's answer")
            if isinstance(body, bytes):
                return body
        finally:
            server.kill()
            server.wait()
    raise AssertionError("the bootstrap machine-config-server found no free port in three attempts")
