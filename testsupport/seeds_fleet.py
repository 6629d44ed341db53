"""The seeds' fleet at real size: hosted clusters, each with an MCO base of HyperShift's real
payload shape, and NodePools of their own small MachineConfig (`python -m bench seeds`).

    python -m bench seeds --clusters 440 --pools 12 ...   (bench/seeds.py generates it)

What HyperShift's server serves a None-platform worker (../shared/real/README.md: 434 KB, 51
files, 27 units) is a machine-config-server `/config/worker` answer. One such answer is built
here per cluster, in that shape, and turned into the cluster's base ConfigMap by the code
`ignition-server base import --from FILE` runs (`from_mcs_config` + `base_configmap`):

- the release's part, the same bytes in every cluster (MCO's templates rendered for one
  release): 41 files (configure-ovs.sh, CRI-O, kubelet, NetworkManager, containers, sysctl...)
  and 27 systemd units, from one RNG seeded by the release;
- the cluster's part, from an RNG seeded by the seed and the cluster: its root CA and service
  CA bundles (`/etc/kubernetes/ca.crt`, the user CA bundle, the cloud CA), its pull secret
  (`/var/lib/kubelet/config.json`), and what the MCS appends for it (kubelet CA, bootstrap
  kubeconfig, node annotations, the MachineConfig in full and encapsulated), which the import
  drops and this server appends again from the cluster's own inputs.

Sizes: the served payload (this server appends the MCS's files again) is 413-420 KB, 52
files, 27 units, as the issue measured the real one through this server; the MCS answer built
here is 408 KB (HyperShift's: 434 KB; the difference is in what the MCS appends, which the
import drops and this server appends again from the cluster's inputs).

Synthetic rather than run through the real MCO binaries (bench/real_bases.py does that, one
cluster at a time): the real path takes a registry, the release's images and 2-12 s per
cluster, while what this bench measures depends on the payload's size, its file and unit
counts and what is per cluster versus per release, all of which are kept. The content is
random base64 where the real one is certificates and scripts, so gzip cannot squeeze it
away (real certificates do not compress either; real scripts compress better: the disk
figures are an upper bound).

Every NodePool has one MachineConfig of its own (the marker file testsupport/fleet.py's
checks read, a sysctl, a kubelet drop-in). Sources: `source/clusters-c<i>/cluster.yaml` (the
cluster's inputs and base), `source/clusters-c<i>/np-<j>.yaml` (a token Secret, as
testsupport/fleet.py lays them, so bench/run.py's helpers read them), `source/ignition-server/
catalog.yaml` (the one release catalog). Deterministic in the seed, but for the tokens'
generation time (now, so a start does not rotate them).
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

from ignition_server.base_import import base_configmap, from_mcs_config
from ignition_server.reconcile.releases import ANNOTATION_RELEASE_CATALOG
from testsupport import fleet as fleetgen
from testsupport.manifests import build_token_secret, kube_object

DEFAULT_SEED = "ignition-seeds"
RELEASE = "quay.io/openshift-release-dev/ocp-release@sha256:" + hashlib.sha256(b"seeds-release").hexdigest()
RELEASE_VERSION = "4.17.3"
ART = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:"
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# (path, mode, approximate bytes): MCO's worker templates for a None platform, by name; the
# sizes put the served payload at 413-420 KB (the real one: 434 KB as the MCS serves it).
RELEASE_FILES = (
    ("/usr/local/bin/configure-ovs.sh", 0o755, 24000), ("/etc/kubernetes/kubelet.conf", 0o644, 2400),
    ("/etc/crio/crio.conf.d/00-default", 0o644, 3600), ("/etc/containers/registries.conf", 0o644, 600),
    ("/etc/containers/policy.json", 0o644, 400), ("/etc/containers/storage.conf", 0o644, 1200),
    ("/etc/mco/proxy.env", 0o644, 60), ("/usr/local/bin/mco-hostname", 0o755, 1900),
    ("/usr/local/bin/resolv-prepender.sh", 0o755, 5200), ("/etc/NetworkManager/dispatcher.d/30-resolv-prepender", 0o755, 900),
    ("/usr/local/sbin/dynamic-system-reserved-calc.sh", 0o755, 3400), ("/usr/local/bin/nm-clean-initrd-state.sh", 0o755, 1600),
    ("/etc/NetworkManager/conf.d/01-ipv6.conf", 0o644, 100), ("/etc/NetworkManager/conf.d/sdn.conf", 0o644, 200),
    ("/etc/NetworkManager/dispatcher.d/pre-up.d/10-ofport-request.sh", 0o755, 1300),
    ("/etc/NetworkManager/dispatcher.d/99-vsphere-disable-tx-udp-tnl", 0o755, 600),
    ("/etc/sysctl.d/arp.conf", 0o644, 200), ("/etc/sysctl.d/inotify.conf", 0o644, 100),
    ("/etc/sysctl.d/enable-userfaultfd.conf", 0o644, 100), ("/etc/sysctl.d/vm-max-map.conf", 0o644, 60),
    ("/etc/sysctl.d/forward.conf", 0o644, 100), ("/etc/sysctl.d/gc-thresh.conf", 0o644, 150),
    ("/etc/modules-load.d/iptables.conf", 0o644, 150), ("/etc/systemd/system.conf.d/10-default-env-godebug.conf", 0o644, 80),
    ("/etc/kubernetes/crio-metrics-proxy.cfg", 0o644, 1100), ("/etc/kubernetes/manifests/criometricsproxy.yaml", 0o644, 2300),
    ("/etc/crio/crio.conf.d/01-ctrcfg-pidsLimit", 0o644, 80), ("/etc/audit/rules.d/mco-audit-quiet-containers.rules", 0o644, 600),
    ("/etc/tmpfiles.d/cleanup-cni.conf", 0o644, 100), ("/usr/local/bin/configure-ip-forwarding.sh", 0o755, 900),
    ("/etc/kubernetes/cni/net.d/.placeholder", 0o644, 0), ("/etc/ssh/sshd_config.d/10-mco-default.conf", 0o644, 300),
    ("/etc/pki/ca-trust/source/anchors/openshift-service-ca.crt", 0o644, 1400),
    ("/etc/kubernetes/apiserver-url.env", 0o644, 120), ("/usr/local/bin/wait-for-primary-ip.sh", 0o755, 700),
    ("/etc/systemd/system-generators/.keep", 0o644, 0), ("/var/lib/kubelet/seccomp/profiles/default.json", 0o644, 6500),
    ("/etc/crio/crio.conf.d/10-mco-default-madv.conf", 0o644, 80), ("/usr/local/bin/kubenswrapper-check.sh", 0o755, 700),
    ("/etc/node-sizing-enabled.env", 0o644, 60), ("/etc/containers/registries.d/sigstore-registries.yaml", 0o644, 700),
)
# (path, bytes of random PEM): the cluster's own. Most of a payload's bytes are CA bundles.
CLUSTER_FILES = (
    ("/etc/kubernetes/ca.crt", 16000), ("/etc/pki/ca-trust/source/anchors/openshift-config-user-ca-bundle.crt", 24000),
    ("/etc/kubernetes/static-pod-resources/configmaps/cloud-config/ca-bundle.pem", 12000),
    ("/etc/kubernetes/kubelet-plugins/volume/exec/.ca-bundle", 6000),
)
PULL_SECRET_PATH = "/var/lib/kubelet/config.json"
UNITS = ("kubelet.service", "crio.service", "machine-config-daemon-firstboot.service", "machine-config-daemon-pull.service",
         "nodeip-configuration.service", "ovs-configuration.service", "openvswitch.service", "ovsdb-server.service",
         "ovs-vswitchd.service", "node-valid-hostname.service", "kubelet-auto-node-size.service", "kubelet-cleanup.service",
         "wait-for-primary-ip.service", "rpm-ostreed.service", "zincati.service", "dummy-network.service",
         "kubelet-dependencies.target", "NetworkManager-clean-initrd-state.service", "docker.socket",
         "crio-wipe.service", "systemd-journald.service", "pivot.service", "aws-kubelet-nodename.service",
         "firewalld.service", "nmstate-configuration.service", "kubens.service", "var-lib-containers.mount")


def _pem(rng: random.Random, approx: int) -> str:
    return fleetgen._pem_block(rng, approx) if approx else ""


def _text(rng: random.Random, path: str, approx: int) -> str:
    lines = [f"# {path} (generated: testsupport/seeds_fleet.py)"]
    size = len(lines[0])
    while size < approx:
        line = f"{rng.choice(('export', 'set', 'key', 'value'))}_{rng.getrandbits(16):04x}=" + \
            base64.b64encode(rng.randbytes(rng.randint(12, 40))).decode()
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


def _file(path: str, mode: int, content: str) -> dict[str, Any]:
    # MCO writes its templates as `data:,` URL-escaped text.
    return {"path": path, "mode": mode, "overwrite": True, "user": {"name": "root"},
            "contents": {"source": "data:," + urllib.parse.quote(content, safe="")}}


def _unit(rng: random.Random, name: str) -> dict[str, Any]:
    if name in ("zincati.service", "docker.socket", "firewalld.service"):
        return {"name": name, "mask": True}
    unit: dict[str, Any] = {"name": name, "enabled": True, "contents": (
        f"[Unit]\nDescription={name} as MCO renders it\nAfter=network-online.target\n"
        f"[Service]\nType=oneshot\nRemainAfterExit=yes\nEnvironment=ID={rng.getrandbits(64):016x}\n"
        f"ExecStart=/usr/local/bin/{name.partition('.')[0]}\n[Install]\nWantedBy=multi-user.target\n")}
    if name in ("kubelet.service", "crio.service", "rpm-ostreed.service", "ovs-vswitchd.service"):
        unit["dropins"] = [{"name": "10-mco-default-env.conf", "contents": "[Service]\nEnvironment=GODEBUG=x509ignoreCN=0\n"}]
    return unit


def release_part(seed: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The files and units every cluster on the release has: (files, units)."""
    rng = random.Random(f"{seed}/release/{RELEASE_VERSION}")
    files = [_file(path, mode, _text(rng, path, size)) for path, mode, size in RELEASE_FILES]
    return files, [_unit(rng, name) for name in UNITS]


def cluster_secrets(seed: str, cluster: int) -> dict[str, str]:
    """The cluster's own: its CAs, signer CA, pull secret and bootstrap kubeconfig."""
    rng = random.Random(f"{seed}/cluster/{cluster}")
    auth = base64.b64encode(f"c{cluster}:{rng.getrandbits(128):032x}".encode()).decode()
    pull = json.dumps({"auths": {host: {"auth": auth, "email": f"c{cluster}@example.com"}
                                 for host in ("quay.io", "registry.redhat.io", "cloud.openshift.com", "registry.connect.redhat.com")}})
    signer = _pem(rng, 2400)
    kubeconfig = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "local",
        "clusters": [{"name": "local", "cluster": {"server": f"https://api.c{cluster}.example.com:6443",
                                                   "certificate-authority-data": base64.b64encode(signer.encode()).decode()}}],
        "users": [{"name": "kubelet", "user": {"token": f"{rng.getrandbits(256):064x}"}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "kubelet"}}]})
    secrets = {path: _pem(rng, size) for path, size in CLUSTER_FILES}
    return {**secrets, PULL_SECRET_PATH: pull, "signer-ca": signer, "kubeconfig": kubeconfig}


def mcs_config(seed: str, cluster: int, release: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None) -> str:
    """Cluster `cluster`'s machine-config-server `/config/worker` answer (Ignition 3.2 JSON)."""
    files, units = release or release_part(seed)
    own = cluster_secrets(seed, cluster)
    mine = [_file(path, 0o644, own[path]) for path, _ in CLUSTER_FILES] + [_file(PULL_SECRET_PATH, 0o600, own[PULL_SECRET_PATH])]
    config: dict[str, Any] = {"ignition": {"version": "3.2.0"},
                              "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": [f"ssh-ed25519 AAAAC3{cluster:08d} core"]}]},
                              "storage": {"files": files + mine}, "systemd": {"units": units}}
    name = "rendered-worker-" + hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:32]
    mc: dict[str, Any] = {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig", "metadata": {"name": name},
          "spec": {"config": config, "osImageURL": ART + "c" * 64, "kernelArguments": [], "extensions": []}}
    encapsulated = {**mc, "spec": {**mc["spec"], "config": {"ignition": {"version": "3.2.0"}}}}
    appended = [
        _file("/etc/kubernetes/kubelet-ca.crt", 0o644, own["signer-ca"]),
        _file("/etc/machine-config-daemon/node-annotations.json", 0o644, json.dumps({
            "machineconfiguration.openshift.io/currentConfig": name, "machineconfiguration.openshift.io/desiredConfig": name,
            "machineconfiguration.openshift.io/state": "Done"})),
        _file("/etc/kubernetes/kubeconfig", 0o644, own["kubeconfig"]),
        _file("/etc/mcs-machine-config-content.json", 0o644, json.dumps(mc, indent=4)),
        _file("/etc/ignition-machine-config-encapsulated.json", 0o644, json.dumps(encapsulated)),
    ]
    served = {**config, "storage": {"files": files + mine + appended}}
    return json.dumps(served)


def cluster_objects(seed: str, cluster: int, release: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The cluster's inputs: pull secret, bootstrap kubeconfig, kubelet CA, and the imported base."""
    namespace = fleetgen.namespace_of(cluster)
    own = cluster_secrets(seed, cluster)
    base = base_configmap(from_mcs_config(mcs_config(seed, cluster, release)), name="mco-base-" + RELEASE_VERSION.replace(".", "-"),
                          namespace=namespace, release=RELEASE, version=RELEASE_VERSION)
    return [
        kube_object("Secret", namespace, "pull-secret", {".dockerconfigjson": own[PULL_SECRET_PATH]}),
        kube_object("Secret", namespace, "bootstrap-kubeconfig", {"kubeconfig": own["kubeconfig"]}),
        kube_object("ConfigMap", namespace, "kubelet-ca", {"ca.crt": own["signer-ca"]}),
        base,
    ]


def catalog() -> dict[str, Any]:
    entries = [{"pullSpec": RELEASE, "version": RELEASE_VERSION,
                "images": {"rhel-coreos": ART + "c" * 64, "rhel-coreos-extensions": ART + "e" * 64,
                           "haproxy-router": ART + "f" * 64}}]
    return kube_object("ConfigMap", "ignition-server", "catalog", {"releases.yaml": yaml.safe_dump(entries)},
                       {ANNOTATION_RELEASE_CATALOG: "true"})


def nodepool_machineconfig(cluster: int, pool: int, variant: int = 0) -> str:
    nodepool = fleetgen.nodepool_of(cluster, pool)
    mc = {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
          "metadata": {"name": f"50-np-{pool}", "labels": {"machineconfiguration.openshift.io/role": "worker"}},
          "spec": {"config": {"ignition": {"version": "3.2.0"}, "storage": {"files": [
              _file(fleetgen.MARKER_PATH, 0o644, f"{nodepool}\nvariant={variant}\n")]},
              "systemd": {"units": [{"name": "kubelet.service", "dropins": [{
                  "name": "20-nodepool.conf",
                  "contents": f"[Service]\nEnvironment=KUBELET_NODE_LABELS=hypershift.openshift.io/nodePool=np-{pool}\n"}]}]}}}}
    return yaml.dump(mc, Dumper=_Dumper, sort_keys=False, width=1 << 30)


def write_yaml(path: Path, *objects: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # not .yaml: the server never reads a half-written file
    tmp.write_text(yaml.dump_all(list(objects), Dumper=_Dumper, sort_keys=False, width=1 << 30))
    tmp.replace(path)


def generate(out: Path, clusters: int, per_cluster: int, seed: str = DEFAULT_SEED,
             progress: bool | None = None) -> dict[str, Any]:
    """Write the fleet under `out`; fleet.json (testsupport/fleet.py's shape, so bench/run.py's
    helpers read it) is written last, so a half-written fleet is never taken for a whole one."""
    if progress is None:
        progress = sys.stderr.isatty()
    (out / "fleet.json").unlink(missing_ok=True)
    source = out / "source"
    now = time.time()
    release = release_part(seed)
    write_yaml(source / "ignition-server" / "catalog.yaml", catalog())
    (out / "mcs-config-c0.json").write_text(mcs_config(seed, 0, release))  # what `base import` takes, for checks
    tokens: dict[str, str] = {}
    started = time.monotonic()
    for cluster in range(clusters):
        namespace = fleetgen.namespace_of(cluster)
        write_yaml(source / namespace / "cluster.yaml", *cluster_objects(seed, cluster, release))
        for pool in range(per_cluster):
            secret = build_token_secret(
                namespace=namespace, nodepool=fleetgen.nodepool_of(cluster, pool),
                token=fleetgen.fleet_token(seed, cluster, pool), machineconfigs_yaml=nodepool_machineconfig(cluster, pool),
                release=RELEASE, release_version=RELEASE_VERSION, generation_time=now,
                suffix=hashlib.sha256(f"{seed}/{cluster}/{pool}".encode()).hexdigest()[:8])
            fleetgen.write_manifest(fleetgen.manifest_path(source, cluster, pool), secret)
            tokens[fleetgen.nodepool_of(cluster, pool)] = fleetgen.fleet_token(seed, cluster, pool)
        if progress and (cluster % 10 == 9 or cluster == clusters - 1):
            rate = (cluster + 1) / max(time.monotonic() - started, 1e-6)
            print(f"\rseeds fleet: {cluster + 1}/{clusters} clusters ({rate:.0f}/s)", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    meta = {"kind": "seeds", "clusters": clusters, "pools": per_cluster, "payload_kib": 416, "seed": seed,
            "source": str(source), "marker_path": fleetgen.MARKER_PATH, "tokens": tokens, "generated_at": now}
    (out / "fleet.json").write_text(json.dumps(meta, indent=1))
    return meta
