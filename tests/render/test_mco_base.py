"""MCO's base configuration and the machine-config-server's appended files, end to end.

The base is written here to MCO's shape (testsupport/mco_base.py: kubelet unit and drop-in, CRI-O
config, firstboot unit), since no release image can be pulled in the tests. Everything else
is real: the server process, the real Ignition client's files stage, ignition-validate.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

from ignition_server.model.token_secret import parse_token_secret
from ignition_server.reconcile.releases import ANNOTATION_RELEASE_CATALOG
from ignition_server.render.inputs import InvalidConfig, NodePoolInputs
from ignition_server.render.mco import rendered_name
from ignition_server.render.payload import render_payload
from testsupport import mco_base
from testsupport.clock import T0
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, wait_for, write_manifests
from testsupport.ignition_client import core_user, ignition_files_stage
from testsupport.manifests import CA_PEM, KUBECONFIG, build_token_secret, kube_object
from testsupport.realtools import require_tool
from testsupport.reconcile_world import inputs_world, renders, settle

LAYERED = "registry.example.com/custom/rhcos-layered@sha256:" + "d" * 64
RELEASE_2 = "quay.io/openshift-release-dev/ocp-release@sha256:" + "2" * 64
# The harness's MachineConfig, with what only the machine-config-daemon can apply.
NODEPOOL_MC = EXAMPLE_MACHINECONFIG.replace("spec:\n", """spec:
  kernelArguments: [nosmt, "systemd.unified_cgroup_hierarchy=1"]
  extensions: [usbguard]
  fips: true
  kernelType: realtime
""", 1)
LAYERED_MC = """\
---
apiVersion: machineconfiguration.openshift.io/v1
kind: MachineConfig
metadata:
  name: 99-layered-os
spec:
  osImageURL: {image}
"""


@pytest.fixture
def world(tmp_path: Path):
    return inputs_world(tmp_path)


def release_catalog(*releases: tuple[str, str]) -> dict:
    entries = [{"pullSpec": spec, "version": version,
                "images": {"rhel-coreos": mco_base.RHCOS, "rhel-coreos-extensions": mco_base.RHCOS_EXTENSIONS,
                           "haproxy-router": "quay.io/x/haproxy@sha256:" + "f" * 64}}
               for spec, version in releases]
    return kube_object("ConfigMap", "ignition-server", "catalog", {"releases.yaml": yaml.safe_dump(entries)},
                       {ANNOTATION_RELEASE_CATALOG: "true"})


def join_inputs(namespace: str) -> list[dict]:
    return [
        kube_object("Secret", namespace, "pull-secret", {".dockerconfigjson": '{"auths":{"quay.io":{"auth":"dTpw"}}}'}),
        kube_object("Secret", namespace, "bootstrap-kubeconfig", {"kubeconfig": KUBECONFIG}),
        kube_object("ConfigMap", namespace, "user-ca-bundle", {"ca-bundle.crt": CA_PEM}),
    ]


def nodepool(namespace: str, pool: str, token: str, *, release: str = mco_base.RELEASE,
             version: str = mco_base.RELEASE_VERSION, extra: str = "") -> dict:
    return build_token_secret(namespace=namespace, nodepool=f"clusters/{pool}", token=token, release=release,
                              release_version=version, machineconfigs_yaml=NODEPOOL_MC.format(name=pool) + extra,
                              generation_time=T0)


def decode(source: str) -> bytes:
    header, _, data = source.partition(",")
    return base64.b64decode(data) if header.endswith(";base64") else unquote(data).encode()


def files_of(config: dict) -> dict[str, tuple[bytes, int]]:
    return {f["path"]: (decode(f["contents"]["source"]), f["mode"]) for f in config["storage"]["files"]}


def validate(tmp_path: Path, body: bytes, name: str = "payload.ign") -> None:
    path = tmp_path / name
    path.write_bytes(body)
    check = subprocess.run([require_tool("ignition-validate", "apt-get install ignition"), str(path)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def inputs(**kwargs: object) -> NodePoolInputs:
    defaults: dict = dict(nodepool="clusters/np", secret="clusters-a/token-np-1",
                          machineconfigs_yaml=NODEPOOL_MC.format(name="np"), release=mco_base.RELEASE,
                          release_version=mco_base.RELEASE_VERSION, mco_base_yaml=mco_base.base_yaml(),
                          os_image_url=mco_base.RHCOS, extensions_image=mco_base.RHCOS_EXTENSIONS)
    defaults.update(kwargs)
    return NodePoolInputs(**defaults)


# ---------------------------------------------------------------------------------------------
# the served payload


def test_served_payload_with_a_base_validates_applies_and_names_one_rendered_config(tmp_path: Path) -> None:
    source = tmp_path / "source"
    write_manifests(source / "releases.yaml", release_catalog((mco_base.RELEASE, mco_base.RELEASE_VERSION)))
    write_manifests(source / "c1.yaml", *join_inputs("clusters-c1"), mco_base.base_configmap("clusters-c1"),
                    kube_object("ConfigMap", "clusters-c1", "kubelet-ca", {"ca.crt": CA_PEM}),
                    kube_object("ConfigMap", "clusters-c1", "cloud-provider-ca", {"ca-bundle.pem": CA_PEM}),
                    nodepool("clusters-c1", "workers", "tok-c1"))
    server = ServerProcess(source, tmp_path / "cache").start()
    try:
        headers = {"Authorization": "Bearer " + base64.b64encode(b"tok-c1").decode()}
        def served() -> bytes | None:
            status, _, body = server.get("/ignition", headers)
            return body if status == 200 else None

        body = wait_for(served, what="payload served")

        def written_status() -> str | None:
            secret = parse_token_secret(next(d for d in yaml.safe_load_all((source / "c1.yaml").read_text())
                                             if d and d["metadata"]["name"].startswith("token-")))
            return secret.message if secret.reason == "AsExpected" else None

        status_message = wait_for(written_status, what="status written back")
    finally:
        server.stop()
    config = json.loads(body)
    validate(tmp_path, body)
    files = files_of(config)

    # The base, the NodePool's MachineConfig and the join files are all there.
    for path, (mode, text) in mco_base.BASE_FILES.items():
        assert files[path] == (text.encode(), mode), path
    assert files["/etc/workers.conf"][1] == 0o644
    assert {u["name"] for u in config["systemd"]["units"]} >= {"workers.service", "kubelet.service"}
    assert files["/etc/kubernetes/kubeconfig"][1] == 0o600
    assert files["/etc/kubernetes/kubelet-ca.crt"] == (CA_PEM.encode(), 0o644)  # what the kubelet config names
    assert files["/etc/kubernetes/static-pod-resources/configmaps/cloud-config/ca-bundle.pem"] == (CA_PEM.encode(), 0o644)
    units = {u["name"]: u for u in config["systemd"]["units"]}
    assert units["machine-config-daemon-firstboot.service"]["enabled"] is True
    assert [d["name"] for d in units["kubelet.service"]["dropins"]] == ["10-mco-default-env.conf", "20-logging.conf"]
    assert all(f.get("overwrite") is True for f in config["storage"]["files"])  # MCO's default

    # Encapsulated config and node annotations name the same rendered config, and carry
    # what the first boot does before the kubelet starts.
    encapsulated = json.loads(files["/etc/ignition-machine-config-encapsulated.json"][0])
    annotations = json.loads(files["/etc/machine-config-daemon/node-annotations.json"][0])
    content = json.loads(files["/etc/mcs-machine-config-content.json"][0])
    name = encapsulated["metadata"]["name"]
    assert re.fullmatch(r"rendered-worker-[0-9a-f]{32}", name)
    assert annotations["machineconfiguration.openshift.io/currentConfig"] == name
    assert annotations["machineconfiguration.openshift.io/desiredConfig"] == name
    assert annotations["machineconfiguration.openshift.io/state"] == "Done"
    assert annotations["machineconfiguration.openshift.io/desiredImage"] == mco_base.RHCOS
    assert content["metadata"]["name"] == name
    assert name == rendered_name(content["spec"])  # the name is the spec's
    assert f"MCO base merged: {name}" in status_message
    spec = encapsulated["spec"]
    # Emptied: the lowest version that expresses the payload (the body is rendered once and
    # served at any version from there; the daemon reads every 3.x).
    assert spec["config"] == {"ignition": {"version": content["spec"]["config"]["ignition"]["version"]}}
    assert spec["config"]["ignition"]["version"] <= config["ignition"]["version"]
    assert spec["osImageURL"] == mco_base.RHCOS
    assert spec["baseOSExtensionsContainerImage"] == mco_base.RHCOS_EXTENSIONS
    assert spec["kernelArguments"] == ["nosmt", "systemd.unified_cgroup_hierarchy=1"]
    assert spec["extensions"] == ["usbguard"] and spec["fips"] is True and spec["kernelType"] == "realtime"
    # Carried, not dropped: nothing says a field was ignored, and the payload has no kernel
    # arguments of its own (the daemon applies them), so it needs no spec 3.3.
    assert "kernelArguments" not in config
    assert config["ignition"]["version"] < "3.3.0"

    # The real client's files stage lays every file down with its mode.
    res, root = ignition_files_stage(tmp_path, config, prepare=core_user)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    for entry in config["storage"]["files"]:
        landed = root / entry["path"].lstrip("/")
        assert landed.read_bytes() == decode(entry["contents"]["source"]), entry["path"]
        assert landed.stat().st_mode & 0o7777 == entry["mode"], entry["path"]
    assert (root / "etc/systemd/system/kubelet.service").read_text() == mco_base.KUBELET_UNIT
    assert "KUBELET_LOG_LEVEL=2" in (root / "etc/systemd/system/kubelet.service.d/20-logging.conf").read_text()
    assert (root / "etc/systemd/system/machine-config-daemon-firstboot.service").exists()
    on_disk = json.loads((root / "etc/ignition-machine-config-encapsulated.json").read_text())
    assert on_disk["metadata"]["name"] == json.loads(
        (root / "etc/machine-config-daemon/node-annotations.json").read_text())["machineconfiguration.openshift.io/desiredConfig"]


def test_a_layered_os_image_named_by_a_machineconfig_reaches_the_first_boot() -> None:
    rendered = render_payload(inputs(machineconfigs_yaml=NODEPOOL_MC.format(name="np") + LAYERED_MC.format(image=LAYERED)))
    files = files_of(json.loads(rendered.body))
    encapsulated = json.loads(files["/etc/ignition-machine-config-encapsulated.json"][0])
    assert encapsulated["spec"]["osImageURL"] == LAYERED
    assert encapsulated["metadata"]["annotations"]["machineconfiguration.openshift.io/os-image-url-overridden"] == "true"
    annotations = json.loads(files["/etc/machine-config-daemon/node-annotations.json"][0])
    assert annotations["machineconfiguration.openshift.io/desiredImage"] == LAYERED
    # A base MachineConfig (generated by the controller) does not override the release's image.
    base = mco_base.base_machineconfigs()
    base[0]["spec"]["osImageURL"] = "quay.io/stale/bootstrap-image@sha256:" + "0" * 64
    plain = render_payload(inputs(mco_base_yaml=yaml.safe_dump_all(base)))
    encapsulated = json.loads(files_of(json.loads(plain.body))["/etc/ignition-machine-config-encapsulated.json"][0])
    assert encapsulated["spec"]["osImageURL"] == mco_base.RHCOS


def test_the_rendered_name_follows_the_spec_and_nothing_else() -> None:
    def name_of(**kwargs: object) -> str:
        files = files_of(json.loads(render_payload(inputs(**kwargs)).body))
        return json.loads(files["/etc/ignition-machine-config-encapsulated.json"][0])["metadata"]["name"]

    first = name_of()
    assert name_of() == first  # deterministic: every replica names it the same
    assert name_of(secret="clusters-a/token-np-2", nodepool="clusters/other") == first  # not the NodePool's identity
    assert name_of(mco_base_yaml=mco_base.base_yaml(kubelet_log_level="4")) != first
    assert name_of(os_image_url=LAYERED) != first


def test_kernel_arguments_of_an_ignition_config_move_into_the_encapsulated_machineconfig(tmp_path: Path) -> None:
    kargs_mc = """\
---
apiVersion: machineconfiguration.openshift.io/v1
kind: MachineConfig
metadata: {name: 60-kargs}
spec:
  config:
    ignition: {version: 3.3.0}
    kernelArguments:
      shouldExist: [hugepages=16]
"""
    rendered = render_payload(inputs(machineconfigs_yaml=NODEPOOL_MC.format(name="np") + kargs_mc))
    config = json.loads(rendered.body)
    assert "kernelArguments" not in config and rendered.min_version < "3.3.0"
    encapsulated = json.loads(files_of(config)["/etc/ignition-machine-config-encapsulated.json"][0])
    assert encapsulated["spec"]["kernelArguments"] == ["nosmt", "systemd.unified_cgroup_hierarchy=1", "hugepages=16"]
    validate(tmp_path, rendered.body)
    # shouldNotExist cannot move (the MachineConfig has no such field): it stays, at spec 3.3.
    kept = render_payload(inputs(machineconfigs_yaml=kargs_mc.replace("shouldExist", "shouldNotExist")))
    assert json.loads(kept.body)["kernelArguments"] == {"shouldNotExist": ["hugepages=16"]}
    assert kept.min_version == "3.3.0"


def test_a_base_and_release_mco_would_refuse_say_why() -> None:
    with pytest.raises(InvalidConfig, match="kernel-devel"):
        render_payload(inputs(machineconfigs_yaml=NODEPOOL_MC.format(name="np").replace("[usbguard]", "[kernel-devel]")))
    with pytest.raises(InvalidConfig, match="rhel-coreos"):
        render_payload(inputs(os_image_url=""))
    with pytest.raises(InvalidConfig, match="MCO base configuration"):
        render_payload(inputs(mco_base_yaml="kind: [unclosed"))
    # Without a base nothing changes: no appended files, dropped fields are named.
    plain = render_payload(inputs(mco_base_yaml=None))
    assert "/etc/ignition-machine-config-encapsulated.json" not in files_of(json.loads(plain.body))
    assert any("spec.extensions is not applied" in n for n in plain.notes)


# ---------------------------------------------------------------------------------------------
# the reconciler


async def test_a_base_change_rerenders_exactly_that_clusters_nodepools_on_that_release(world) -> None:
    reconciler, source, cache, source_dir, _clock, outputs = world
    releases = [(mco_base.RELEASE, "4.17.3"), (RELEASE_2, "4.18.0")]
    write_manifests(source_dir / "releases.yaml", release_catalog(*releases))
    write_manifests(source_dir / "a-base.yaml", mco_base.base_configmap("clusters-a"))
    write_manifests(source_dir / "a-base-2.yaml", mco_base.base_configmap("clusters-a", release=RELEASE_2, version="4.18.0",
                                                                        name="mco-base-4-18-0"))
    write_manifests(source_dir / "b-base.yaml", mco_base.base_configmap("clusters-b"))
    write_manifests(source_dir / "a.yaml", *join_inputs("clusters-a"),
                    nodepool("clusters-a", "a1", "tok-a1"), nodepool("clusters-a", "a2", "tok-a2"),
                    nodepool("clusters-a", "a3", "tok-a3", release=RELEASE_2, version="4.18.0"))
    write_manifests(source_dir / "b.yaml", *join_inputs("clusters-b"), nodepool("clusters-b", "b1", "tok-b1"))
    await settle(reconciler, source, outputs)
    for ref in ("clusters-a/token-a1-00000000", "clusters-a/token-a2-00000000",
                "clusters-a/token-a3-00000000", "clusters-b/token-b1-00000000"):
        assert cache.get_render(ref) is not None, ref
    before = renders(reconciler)
    old_blob = cache.get_render("clusters-a/token-a1-00000000").blob_id

    write_manifests(source_dir / "a-base.yaml", mco_base.base_configmap("clusters-a", kubelet_log_level="4"))
    await settle(reconciler, source, outputs)
    assert renders(reconciler) - before == 2  # a1 and a2: not a3 (other release), not b1 (other cluster)
    payload = cache.get_blob(cache.get_render("clusters-a/token-a1-00000000").blob_id)
    assert cache.get_render("clusters-a/token-a1-00000000").blob_id != old_blob
    assert b"KUBELET_LOG_LEVEL%3D4" in payload or b"KUBELET_LOG_LEVEL=4" in payload

    # A broken base: the last good payload keeps serving, the Secret says why.
    before = renders(reconciler)
    broken = mco_base.base_configmap("clusters-a")
    broken["data"]["machineconfigs.yaml"] = "kind: [unclosed"
    write_manifests(source_dir / "a-base.yaml", broken)
    await settle(reconciler, source, outputs)
    assert cache.get_render("clusters-a/token-a1-00000000").blob_id != old_blob  # still the last good one
    documents = list(yaml.safe_load_all((source_dir / "a.yaml").read_text()))
    secret = parse_token_secret(next(d for d in documents if d["metadata"]["name"] == "token-a1-00000000"))
    assert secret.reason == "InvalidConfig" and "MCO base configuration" in secret.message

    # The base removed: that cluster's NodePools on that release render without it.
    (source_dir / "a-base.yaml").unlink()
    await settle(reconciler, source, outputs)
    plain = cache.get_blob(cache.get_render("clusters-a/token-a1-00000000").blob_id)
    assert b"ignition-machine-config-encapsulated" not in plain
    assert b"ignition-machine-config-encapsulated" in cache.get_blob(cache.get_render("clusters-a/token-a3-00000000").blob_id)


async def test_a_base_matched_by_version_when_no_base_names_the_pull_spec(world) -> None:
    reconciler, source, cache, source_dir, _clock, outputs = world
    write_manifests(source_dir / "releases.yaml", release_catalog((mco_base.RELEASE, "4.17.3")))
    write_manifests(source_dir / "a.yaml", *join_inputs("clusters-a"), mco_base.base_configmap("clusters-a", release=""),
                    nodepool("clusters-a", "a1", "tok-a1"))
    await settle(reconciler, source, outputs)
    assert b"ignition-machine-config-encapsulated" in cache.get_blob(cache.get_render("clusters-a/token-a1-00000000").blob_id)


# ---------------------------------------------------------------------------------------------
# the cluster-wide proxy


async def test_the_cluster_proxy_reaches_crio_kubelet_and_the_pointer_config(world, tmp_path: Path) -> None:
    reconciler, source, cache, source_dir, _clock, outputs = world
    outputs.pointer = type(outputs.pointer)(outputs.pointer.public_url, outputs.pointer.ca_pem,
                                            proxy=(("httpsProxy", "http://proxy.example:3128"), ("noProxy", ("10.0.0.0/8",))))
    proxy = kube_object("ConfigMap", "clusters-a", "cluster-proxy", {
        "httpProxy": "http://proxy.example:3128", "httpsProxy": "http://proxy.example:3128",
        "noProxy": ".cluster.local,.svc,10.0.0.0/16"})
    write_manifests(source_dir / "releases.yaml", release_catalog((mco_base.RELEASE, "4.17.3")))
    write_manifests(source_dir / "a.yaml", *join_inputs("clusters-a"), mco_base.base_configmap("clusters-a"), proxy,
                    nodepool("clusters-a", "a1", "tok-a1"))
    await settle(reconciler, source, outputs)
    body = cache.get_blob(cache.get_render("clusters-a/token-a1-00000000").blob_id)
    config = json.loads(body)
    env = files_of(config)["/etc/mco/proxy.env"][0].decode()
    assert "HTTP_PROXY=http://proxy.example:3128\n" in env and "NO_PROXY=.cluster.local,.svc,10.0.0.0/16\n" in env
    units = {u["name"]: u for u in config["systemd"]["units"]}
    for unit in ("crio.service", "kubelet.service", "rpm-ostreed.service"):
        dropin = next(d for d in units[unit]["dropins"] if d["name"] == "10-mco-default-env.conf")
        assert dropin["contents"] == "[Service]\nEnvironmentFile=/etc/mco/proxy.env\n"  # the base's empty one lost
    validate(tmp_path, body)
    res, root = ignition_files_stage(tmp_path, config, prepare=core_user)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "EnvironmentFile=/etc/mco/proxy.env" in (root / "etc/systemd/system/crio.service.d/10-mco-default-env.conf").read_text()
    assert (root / "etc/mco/proxy.env").read_text() == env

    # The pointer config the server writes carries ignition.proxy, and the client accepts it.
    user_data = yaml.safe_load((source_dir / "user-data-a1-00000000.yaml").read_text())
    pointer = json.loads(base64.b64decode(user_data["data"]["value"]))
    assert pointer["ignition"]["proxy"] == {"httpsProxy": "http://proxy.example:3128", "noProxy": ["10.0.0.0/8"]}
    validate(tmp_path, json.dumps(pointer).encode(), "pointer.ign")

    # A malformed proxy is a clear error, and the last good payload keeps serving.
    write_manifests(source_dir / "a.yaml", *join_inputs("clusters-a"), mco_base.base_configmap("clusters-a"),
                    kube_object("ConfigMap", "clusters-a", "cluster-proxy", {"httpProxy": "proxy.example:3128"}),
                    nodepool("clusters-a", "a1", "tok-a1"))
    await settle(reconciler, source, outputs)
    assert cache.get_blob(cache.get_render("clusters-a/token-a1-00000000").blob_id) == body
    secret = parse_token_secret(next(d for d in yaml.safe_load_all((source_dir / "a.yaml").read_text())
                                     if d and d["metadata"]["name"] == "token-a1-00000000"))
    assert secret.reason == "InvalidConfig" and "httpProxy" in secret.message


def test_userdata_command_carries_the_node_proxy(tmp_path: Path) -> None:
    source = tmp_path / "source"
    write_manifests(source / "a.yaml", nodepool("clusters-a", "a1", "tok-a1"))
    (tmp_path / "ca.crt").write_text(CA_PEM)
    env = {**os.environ, "IGNITION_SERVER_NODE_NO_PROXY": "10.0.0.0/8,.example.com"}
    out = subprocess.run([sys.executable, "-m", "ignition_server", "userdata", "--source", str(source),
                          "--nodepool", "clusters/a1", "--public-url", "https://ign.example.com:9090",
                          "--ca-file", str(tmp_path / "ca.crt"), "--node-https-proxy", "http://proxy.example:3128"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    pointer = json.loads(out.stdout)
    assert pointer["ignition"]["proxy"] == {"httpsProxy": "http://proxy.example:3128",
                                            "noProxy": ["10.0.0.0/8", ".example.com"]}
    validate(tmp_path, out.stdout.encode(), "pointer.ign")


# ---------------------------------------------------------------------------------------------
# base import


def _import(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ignition_server", "base", "import", *args],
                          capture_output=True, text=True)


def test_base_import_from_bootstrap_output_renders_the_same_payload(tmp_path: Path) -> None:
    out = tmp_path / "bootstrap" / "machine-configs"
    out.mkdir(parents=True)
    for mc in mco_base.base_machineconfigs():
        (out / f"{mc['metadata']['name']}.yaml").write_text(yaml.safe_dump(mc))
    master = {**mco_base.base_machineconfigs()[0], "metadata": {
        "name": "00-master", "labels": {"machineconfiguration.openshift.io/role": "master"}}}
    (out / "00-master.yaml").write_text(yaml.safe_dump(master))
    (out / "rendered-worker-0123.yaml").write_text(yaml.safe_dump({**mco_base.base_machineconfigs()[0],
                                                                   "metadata": {"name": "rendered-worker-0123"}}))
    result = _import("--from", str(tmp_path / "bootstrap"), "--namespace", "clusters-a",
                     "--release", mco_base.RELEASE, "--release-version", "4.17.3", "--output", str(tmp_path / "base.yaml"))
    assert result.returncode == 0, result.stderr
    configmap = yaml.safe_load((tmp_path / "base.yaml").read_text())
    assert configmap["metadata"]["annotations"]["ignition-server.openshift.io/mco-base"] == "true"
    assert configmap["metadata"]["name"] == "mco-base-4-17-3" and configmap["data"]["release"] == mco_base.RELEASE
    names = [mc["metadata"]["name"] for mc in yaml.safe_load_all(configmap["data"]["machineconfigs.yaml"])]
    assert names == ["00-worker", "01-worker-container-runtime", "01-worker-kubelet", "99-worker-ssh"]
    imported = render_payload(inputs(mco_base_yaml=configmap["data"]["machineconfigs.yaml"]))
    assert imported.body == render_payload(inputs()).body


def test_base_import_from_an_mcs_answer_keeps_the_base_and_drops_what_mcs_appended(tmp_path: Path) -> None:
    served = render_payload(inputs(machineconfigs_yaml=""))  # what an MCS would answer for /config/worker
    (tmp_path / "worker.ign").write_bytes(served.body)
    result = _import("--from", str(tmp_path / "worker.ign"), "--namespace", "clusters-a",
                     "--release-version", "4.17.3")
    assert result.returncode == 0, result.stderr
    configmap = yaml.safe_load(result.stdout)
    assert "release" not in configmap["data"] and configmap["data"]["releaseVersion"] == "4.17.3"
    (mc,) = yaml.safe_load_all(configmap["data"]["machineconfigs.yaml"])
    paths = {f["path"] for f in mc["spec"]["config"]["storage"]["files"]}
    assert "/etc/ignition-machine-config-encapsulated.json" not in paths
    assert "/etc/machine-config-daemon/node-annotations.json" not in paths
    assert "/etc/kubernetes/kubeconfig" not in paths
    assert set(mco_base.BASE_FILES) <= paths
    # Rendered again from the imported base, a NodePool gets the base's files and its own.
    again = files_of(json.loads(render_payload(inputs(mco_base_yaml=configmap["data"]["machineconfigs.yaml"])).body))
    assert set(mco_base.BASE_FILES) | {"/etc/np.conf"} <= set(again)

    bad = _import("--from", str(tmp_path / "worker.ign"), "--namespace", "clusters-a")
    assert bad.returncode != 0 and "--release" in bad.stderr


def _routable_address() -> str:
    """An address of this host that is not loopback: Go's proxy rules (and so Ignition's) never
    send loopback traffic through a proxy."""
    import socket

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.254", 9))  # no packet is sent: this only picks the route
        address = probe.getsockname()[0]
    except OSError:
        pytest.skip("no non-loopback IPv4 address")
    finally:
        probe.close()
    if address.startswith("127."):
        pytest.skip("no non-loopback IPv4 address")
    return address


def test_the_real_client_fetches_the_payload_through_the_pointer_configs_proxy(tmp_path: Path) -> None:
    """A real forward proxy (tinyproxy) between the real Ignition client and the server: the
    pointer's ignition.proxy is what makes the client go through it."""
    from ignition_server.render.userdata import pointer_config
    from testsupport.harness import free_port, wait_for_port
    from testsupport.ignition_client import ignition_fetch, require_ignition

    require_ignition()
    tinyproxy = require_tool("tinyproxy", "apt-get install tinyproxy")
    address = _routable_address()
    source = tmp_path / "source"
    write_manifests(source / "releases.yaml", release_catalog((mco_base.RELEASE, mco_base.RELEASE_VERSION)))
    write_manifests(source / "c1.yaml", *join_inputs("clusters-c1"), mco_base.base_configmap("clusters-c1"),
                    nodepool("clusters-c1", "workers", "tok-c1"))
    port = free_port()
    server = ServerProcess(source, tmp_path / "cache", port=port,
                           extra=["--listen", f"0.0.0.0:{port}", "--public-url", f"https://{address}:{port}"]).start()
    proxy_port = free_port()
    log = tmp_path / "tinyproxy.log"
    (tmp_path / "tinyproxy.conf").write_text(
        f'Port {proxy_port}\nListen 127.0.0.1\nTimeout 60\nLogFile "{log}"\nLogLevel Connect\nMaxClients 20\nAllow 127.0.0.1\n')
    proxy = subprocess.Popen([tinyproxy, "-d", "-c", str(tmp_path / "tinyproxy.conf")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for_port(proxy_port)
        wait_for(lambda: server.get("/ignition", {"Authorization": "Bearer " + base64.b64encode(b"tok-c1").decode()})[0] == 200,
                 what="payload rendered")
        pointer = pointer_config(source_url=f"https://{address}:{port}", token="tok-c1",
                                 ca_pem=server.ca_file.read_bytes(), nodepool="clusters/workers",
                                 proxy={"httpsProxy": f"http://127.0.0.1:{proxy_port}"})
        run = ignition_fetch(pointer, tmp_path / "node")
        assert run.returncode == 0, run.output[-4000:]
        assert run.config is not None and "/etc/ignition-machine-config-encapsulated.json" in {
            f["path"] for f in run.config["storage"]["files"]}
        tunnel = f"CONNECT {address}:{port} "
        seen = log.read_text().count(tunnel)
        assert seen >= 1
        # Without the proxy in the pointer, the proxy sees nothing new.
        del pointer["ignition"]["proxy"]
        run = ignition_fetch(pointer, tmp_path / "node-direct")
        assert run.returncode == 0, run.output[-4000:]
        assert log.read_text().count(tunnel) == seen
    finally:
        proxy.kill()
        proxy.wait(10)
        server.stop()


def test_base_index_names_the_releases_a_change_touches_and_picks_one_base_per_release() -> None:
    from ignition_server.model.objects import ObjectKey
    from ignition_server.reconcile.bases import BaseIndex, base_key

    index = BaseIndex()
    first = ObjectKey("ConfigMap", "clusters-a", "base-b")
    second = ObjectKey("ConfigMap", "clusters-a", "base-a")
    r1 = {base_key("clusters-a", "spec:" + mco_base.RELEASE), base_key("clusters-a", "version:4.17.3")}
    assert index.update(first, mco_base.base_configmap("clusters-a", name="base-b")) == r1
    assert index.find("clusters-a", mco_base.RELEASE, "4.17.3") == first
    assert index.find("clusters-b", mco_base.RELEASE, "4.17.3") is None  # another cluster's base is not this one's
    index.update(second, mco_base.base_configmap("clusters-a", name="base-a"))
    assert index.find("clusters-a", mco_base.RELEASE, "4.17.3") == second  # the name that sorts first
    # Moving a base to another release touches both releases; deleting it, its last one.
    moved = index.update(second, mco_base.base_configmap("clusters-a", name="base-a", release=RELEASE_2, version="4.18.0"))
    assert moved == r1 | {base_key("clusters-a", "spec:" + RELEASE_2), base_key("clusters-a", "version:4.18.0")}
    assert index.find("clusters-a", mco_base.RELEASE, "4.17.3") == first
    assert index.find("clusters-a", "quay.io/other@sha256:" + "9" * 64, "4.18.0") == second  # by version
    assert index.update(second, None) == {base_key("clusters-a", "spec:" + RELEASE_2), base_key("clusters-a", "version:4.18.0")}
    assert index.find("clusters-a", RELEASE_2, "4.18.0") is None and not index.knows(second)
    # No release named: not used.
    unnamed = mco_base.base_configmap("clusters-a", release="", version="")
    assert index.update(ObjectKey("ConfigMap", "clusters-a", "x"), unnamed) == set()
