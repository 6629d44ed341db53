"""A machine-config-operator image with STAND-IN binaries, for injecting faults.

The tests of the real thing use the real binaries (testsupport/real_release.py); these stand-ins
exist for what the real ones cannot be made to do on demand: hang, fail with a long output,
fail once, read what a hostile release would. Its binaries are small python3 scripts, not MCO: they take MCO's command
line (`machine-config-operator bootstrap --root-ca=... --dest-dir=...`,
`machine-config-controller bootstrap --manifest-dir=... --templates=... --dest-dir=...`, as
HyperShift's local_ignitionprovider.go passes them) and write MCO's output layout
(`<dest>/bootstrap/manifests/...`; `<dest>/machine-pools/<pool>.yaml` naming
`<dest>/machine-configs/rendered-<pool>-<hash>.yaml`, for every pool in the manifest dir;
`render` writes a FeatureGate with a status). The served (`master`) MachineConfig they write
is built from the image's templates (`etc/mcc/templates/worker/...`) and the cluster's
configuration files, so what reaches the payload proves both were read. Every run appends
a line to `counter` (pid, step, release version) when it can: not from the sandbox. Everything else in the tests that use it
is real: the registry, the layers, the subprocess and its limits, the cache.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

from testsupport.registry_world import OCI_MANIFEST, Registry, sha256

OPERATOR = r'''#!/usr/bin/python3
# STAND-IN for machine-config-operator (testsupport/mco_image.py): MCO's flags and output layout only.
import os, sys, time
COUNTER, MODE, STEAL = __COUNTER__, __MODE__, __STEAL__
args = dict(a[2:].split("=", 1) for a in sys.argv[2:] if a.startswith("--") and "=" in a)
infra_name = "-"
if os.path.isfile(args.get("infra-config-file", "")):
    with open(args["infra-config-file"]) as f:
        infra_name = [l.split(":", 1)[1].strip() for l in f if "infrastructureName" in l][0]
try:  # in the sandbox (--base-sandbox namespaces) the counter is out of reach: the run goes uncounted
    with open(COUNTER, "a") as f:
        f.write(f"{os.getpid()} operator {args.get('payload-version')} {infra_name}\n")
except OSError:
    pass
assert sys.argv[1] == "bootstrap", sys.argv
for flag in ("root-ca", "infra-config-file", "network-config-file", "proxy-config-file", "config-file",
             "dns-config-file", "pull-secret", "image-references", "kube-ca"):
    if not os.path.isfile(args[flag]):
        sys.exit(f"error: --{flag}={args[flag]}: no such file")
if MODE == "steal":  # issue 31's hostile release: what it can read, out as klog E lines of short hex runs
    for number, path in enumerate(STEAL):
        try:
            with open(path, "rb") as f:
                data = f.read(64)
        except OSError as exc:
            print(f"E1127 10:00:00.000000    7 bootstrap.go:{number}] {exc.__class__.__name__}")
            continue
        for at in range(0, len(data), 8):
            print(f"E1127 10:00:00.000000    7 bootstrap.go:{number}] {data[at:at + 8].hex()}")
    sys.exit(1)
if MODE == "sleep":
    print("rendering...", flush=True)
    time.sleep(3600)
if MODE == "fail-once" and not os.path.exists(COUNTER + ".failed"):
    open(COUNTER + ".failed", "w").close()
    sys.exit("E1123 10:42:07.000001    4242 bootstrap.go:40] the first run fails (a transient fault)")
if MODE == "fail":
    for i in range(2000):
        print(f"I1123 noise line {i:05d} of the bootstrap render")
    with open(args["pull-secret"]) as f:  # a binary that prints its input: the pull secret must not reach a status
        text = f.read()
    import base64, json
    encoded = text.split(".dockerconfigjson:", 1)[1].split()[0]
    print("E1123 10:42:07.123400    4242 bootstrap.go:80] bad pull secret file:", text.replace("\n", " "))
    print("E1123 10:42:07.123401    4242 bootstrap.go:81] decoded:", base64.b64decode(encoded).decode())
    print("E1123 10:42:07.123402    4242 bootstrap.go:82] auth:", json.loads(base64.b64decode(encoded))["auths"].popitem()[1]["auth"])
    print("F1123 10:42:07.123456    4242 bootstrap.go:93] error rendering the controller config: "
          "infrastructure has no status.platformStatus")
    sys.exit(255)
out = os.path.join(args["dest-dir"], "bootstrap", "manifests")
os.makedirs(out)
with open(args["pull-secret"]) as f, open(os.path.join(out, "machineconfigcontroller-pull-secret"), "w") as g:
    g.write(f.read())
with open(args["infra-config-file"]) as f:
    infra = f.read()
with open(os.path.join(out, "controllerconfig.yaml"), "w") as f:
    f.write("kind: ControllerConfig\nreleaseImage: " + args["release-image"] + "\ninfra: |\n" +
            "".join("  " + line + "\n" for line in infra.splitlines()))
print("bootstrap manifests written")
'''

CONTROLLER = r'''#!/usr/bin/python3
# STAND-IN for machine-config-controller (testsupport/mco_image.py): MCO's flags and output layout only.
import hashlib, json, os, sys, urllib.parse
COUNTER, MODE = __COUNTER__, __MODE__
args = dict(a[2:].split("=", 1) for a in sys.argv[2:] if a.startswith("--") and "=" in a)
assert sys.argv[1] == "bootstrap", sys.argv
if MODE == "garbage":  # exits 0 having written a pool that names a rendered config which is not YAML
    for sub in ("machine-configs", "machine-pools"):
        os.makedirs(os.path.join(args["dest-dir"], sub))
    with open(os.path.join(args["dest-dir"], "machine-pools", "master.yaml"), "w") as f:
        f.write("status:\n  configuration:\n    name: rendered-master-0\n")
    with open(os.path.join(args["dest-dir"], "machine-configs", "rendered-master-0.yaml"), "w") as f:
        f.write("spec: {config: [unclosed\n")
    sys.exit(0)
with open(os.path.join(args["manifest-dir"], "controllerconfig.yaml")) as f:
    controller = f.read()
assert os.path.isfile(args["pull-secret"]), args["pull-secret"]
infra = [l.split(":", 1)[1].strip() for l in controller.splitlines() if "infrastructureName" in l][0]
try:
    with open(COUNTER, "a") as f:
        f.write(f"{os.getpid()} controller {args.get('payload-version')} {infra}\n")
except OSError:
    pass
files, units = [], []
base = os.path.join(args["templates"], "worker", "00-worker", "_base")
for name in sorted(os.listdir(os.path.join(base, "files"))):
    with open(os.path.join(base, "files", name)) as f:
        spec = json.load(f)
    files.append({"path": spec["path"], "mode": spec["mode"], "overwrite": True,
                  "contents": {"source": "data:," + urllib.parse.quote(spec["contents"])}})
for name in sorted(os.listdir(os.path.join(base, "units"))):
    with open(os.path.join(base, "units", name)) as f:
        units.append({"name": name, "enabled": True, "contents": f.read()})
files.append({"path": "/etc/mco-generated/cluster", "mode": 420, "overwrite": True,
              "contents": {"source": "data:," + urllib.parse.quote(f"infrastructure {infra} payload {args['payload-version']}\n")}})
assert "FeatureGate" in open(os.path.join(args["manifest-dir"], "99_feature-gate.yaml")).read()
pools = sorted(n[:-len(".machineconfigpool.yaml")] for n in os.listdir(args["manifest-dir"]) if n.endswith(".machineconfigpool.yaml"))
for pool in pools:
    ours = pool in ("worker", "master")
    config = {"ignition": {"version": "3.2.0"}, "storage": {"files": files if ours else []},
              "systemd": {"units": units if ours else []}}
    name = f"rendered-{pool}-" + hashlib.md5(json.dumps(config, sort_keys=True).encode()).hexdigest()
    mc = {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
          "metadata": {"name": name, "annotations": {
              "machineconfiguration.openshift.io/generated-by-controller-version": "stand-in"}},
          "spec": {"config": config, "kernelArguments": ["systemd.unified_cgroup_hierarchy=1"] if pool != "worker" else [],
                   "osImageURL": "", "fips": False, "kernelType": "default", "extensions": []}}
    for sub, doc in (("machine-configs", mc), ("machine-pools", {
            "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
            "metadata": {"name": pool}, "status": {"configuration": {"name": name}}})):
        os.makedirs(os.path.join(args["dest-dir"], sub), exist_ok=True)
        target = os.path.join(args["dest-dir"], sub, (name if sub == "machine-configs" else pool) + ".yaml")
        with open(target, "w") as f:
            json.dump(doc, f)  # JSON is YAML
print("machine configs written")
'''

RENDER = r'''#!/usr/bin/python3
# STAND-IN for cluster-config-api's render (testsupport/mco_image.py): writes the FeatureGate's status.
import sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
path = args["rendered-manifest-dir"] + "/99_feature-gate.yaml"
with open(path) as f:
    assert "kind: FeatureGate" in f.read()
with open(path, "w") as f:
    f.write('{"apiVersion": "config.openshift.io/v1", "kind": "FeatureGate", "metadata": {"name": "cluster"}, '
            '"spec": {}, "status": {"featureGates": [{"version": "' + args["payload-version"] + '", "enabled": [], "disabled": []}]}}')
'''

KUBELET_UNIT = "[Unit]\nDescription=Kubernetes Kubelet (from the MCO image's templates)\n[Service]\nExecStart=/usr/local/bin/kubenswrapper\n"
CRIO_CONF = "[crio.runtime]\nconmon_cgroup = \"pod\"\n"


def _tar_gz(files: dict[str, tuple[bytes, int]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=1)


def push_mco_image(registry: Registry, repo: str, counter: Path, mode: str = "ok", steal: Sequence[Path] = ()) -> str:
    """Push the stand-in MCO image (two layers: a lower one whose controller an upper one
    replaces, as image layers do); its pull spec by digest. It also holds a stand-in
    `usr/bin/render`: name it as the release's `cluster-config-api` too. In mode "steal" its
    operator prints the start of each file of `steal` it can read and fails."""
    def script(text: str) -> bytes:
        return (text.replace("__COUNTER__", repr(str(counter))).replace("__MODE__", repr(mode))
                .replace("__STEAL__", repr([str(p) for p in steal])).encode())

    templates = "etc/mcc/templates/worker/00-worker/_base/"
    lower = _tar_gz({
        "usr/bin/machine-config-controller": (b"#!/bin/sh\necho 'the lower layer: replaced'; exit 3\n", 0o755),
        "usr/lib/os-release": (b'VERSION_ID="9.4"\n', 0o644),
        "usr/share/doc/not-extracted.txt": (b"outside the paths asked for\n", 0o644),
    })
    upper = _tar_gz({
        "usr/bin/machine-config-operator": (script(OPERATOR), 0o755),
        "usr/bin/machine-config-controller": (script(CONTROLLER), 0o755),
        "usr/bin/render": (RENDER.encode(), 0o755),  # this image is the release's cluster-config-api too
        templates + "files/crio.json": (json.dumps({"path": "/etc/crio/crio.conf.d/00-default", "mode": 420,
                                                    "contents": CRIO_CONF}).encode(), 0o644),
        templates + "units/kubelet.service": (KUBELET_UNIT.encode(), 0o644),
    })
    layers = [(registry.push_blob(repo, layer), len(layer)) for layer in (lower, upper)]
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": registry.push_blob(repo, config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": n} for d, n in layers],
    }).encode()
    digest = registry.push_manifest(repo, sha256(manifest), manifest, OCI_MANIFEST)
    return f"{registry.host}/{repo}@{digest}"


def cluster_config(infrastructure_name: str) -> dict[str, str]:
    """The `machine-config-server` ConfigMap's data: the cluster configuration MCO's bootstrap reads."""
    return {
        "install-config.yaml": "apiVersion: v1\nmetadata:\n  name: " + infrastructure_name + "\n",
        "cluster-infrastructure-02-config.yaml": "kind: Infrastructure\nstatus:\n  infrastructureName: " + infrastructure_name + "\n",
        "cluster-network-02-config.yaml": "kind: Network\nspec:\n  serviceNetwork: [172.30.0.0/16]\n",
        "cluster-proxy-01-config.yaml": "kind: Proxy\nspec: {}\n",
        "cluster-dns-02-config.yaml": "kind: DNS\nspec:\n  baseDomain: example.com\n",
        "root-ca.crt": "-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n",
        "signer-ca.crt": "-----BEGIN CERTIFICATE-----\nsigner\n-----END CERTIFICATE-----\n",
        "worker.machineconfigpool.yaml": "kind: MachineConfigPool\nmetadata:\n  name: worker\n",
        "master.machineconfigpool.yaml": "kind: MachineConfigPool\nmetadata:\n  name: master\n",
        "configuration-hash": "abc",
    }


def runs(counter: Path) -> list[tuple[int, str, str, str]]:
    """(pid, step, release version, infrastructure name) of every stand-in run."""
    if not counter.exists():
        return []
    return [(int(p), step, version, infra) for p, step, version, infra in (line.split() for line in counter.read_text().splitlines())]
