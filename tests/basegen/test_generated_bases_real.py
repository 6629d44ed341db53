"""Generated MCO bases with the REAL binaries (testsupport/real_release.py), compared with what the
real bootstrap machine-config-server serves for the same objects, item by item.

One registry and one release for the module; one server process generates the bases of two
clusters (two runs: one per cluster and release), and the reference payload of each NodePool
is made by running HyperShift's steps with the same real binaries (real_release.mcs_reference_payload).
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote

import pytest

from ignition_server.tls.certificates import make_ca
from testsupport.harness import ServerProcess, bearer, wait_for, write_manifests
from testsupport.manifests import KUBECONFIG, build_token_secret, kube_object, token_status
from testsupport.real_release import (  # noqa: F401
    RealMCO,
    RealRelease,
    hypershift_mcs_config,
    mcs_reference_payload,
    push_real_release,
    real_mco,
)
from testsupport.registry_world import Registry


@pytest.fixture(scope="module")
def real_world(real_mco: RealMCO, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, RealRelease]]:  # noqa: F811
    registry = Registry(tmp_path_factory.mktemp("registry")).start()
    try:
        yield registry, push_real_release(registry, real_mco)
    finally:
        registry.stop()


def machineconfig(name: str, config: dict[str, Any], kernel_arguments: list[str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
            "metadata": {"name": name, "labels": {"machineconfiguration.openshift.io/role": "worker"}},
            "spec": {"config": {"ignition": {"version": "3.2.0"}, **config}, "kernelArguments": kernel_arguments or []}}


def data_url(text: str) -> dict[str, str]:
    return {"source": "data:," + "".join(c if c.isalnum() or c in "-_.~" else "%%%02X" % ord(c) for c in text)}


def decoded(entry: dict[str, Any]) -> bytes:
    header, _, data = entry["contents"]["source"].partition(",")
    raw = base64.b64decode(data) if header.endswith(";base64") else unquote(data).encode()
    return gzip.decompress(raw) if entry["contents"].get("compression") == "gzip" else raw


def items(body: bytes) -> dict[str, Any]:
    """The payload item by item: files by path (mode, owner, overwrite, contents: the rendered
    name in them included), units by name, users, kernel arguments."""
    config = json.loads(body)
    out: dict[str, Any] = {}
    for entry in (config.get("storage") or {}).get("files") or []:
        contents = decoded(entry).decode()
        out["file " + entry["path"]] = (entry.get("mode"), entry.get("overwrite"), entry.get("user"), entry.get("group"), contents)
    for unit in (config.get("systemd") or {}).get("units") or []:
        out["unit " + unit["name"]] = (unit.get("enabled"), unit.get("mask"), unit.get("contents"),
                                       sorted((d["name"], d.get("contents")) for d in unit.get("dropins") or []))
    for user in (config.get("passwd") or {}).get("users") or []:
        out["user " + user["name"]] = user
    out["kernelArguments"] = config.get("kernelArguments")
    return out


def differences(ours: bytes, theirs: bytes) -> list[str]:
    a, b = items(ours), items(theirs)
    return sorted(f"{key}: {'ours only' if key not in b else 'theirs only' if key not in a else 'differs'}"
                  for key in set(a) | set(b) if a.get(key) != b.get(key))


def test_generated_bases_equal_the_bootstrap_mcs_payload_item_by_item(real_world, real_mco: RealMCO, tmp_path: Path) -> None:  # noqa: F811
    registry, release = real_world
    ca_a, ca_b = make_ca()[0].decode(), make_ca()[0].decode()
    clusters = {"clusters-a": hypershift_mcs_config("a", root_ca=ca_a, signer_ca=ca_a, tls_profile="Modern"),
                # With an additional trust bundle (the operator gets --additional-trust-bundle-config-file).
                "clusters-b": hypershift_mcs_config("b", root_ca=ca_b, signer_ca=ca_b, tls_profile="Old", user_ca_bundle=ca_a)}
    # A ConfigMap without its network configuration: the real operator fails, and says why.
    broken = hypershift_mcs_config("x", root_ca=ca_a, signer_ca=ca_a)
    del broken["cluster-network-02-config.yaml"]
    pools = {
        # A NodePool MachineConfig with a file and a kernel argument.
        ("clusters-a", "plain"): [machineconfig("50-plain", {"storage": {"files": [
            {"path": "/etc/plain.conf", "mode": 420, "contents": data_url("plain\n")}]}}, ["foo=bar"])],
        # One that overrides a base file and disables a base unit, and one more after it.
        ("clusters-a", "override"): [
            machineconfig("50-override", {
                "storage": {"files": [{"path": "/etc/crio/crio.conf.d/00-default", "mode": 384, "overwrite": True,
                                       "contents": data_url("[crio]\n# the NodePool's own\n")}]},
                "systemd": {"units": [{"name": "chrony-wait.service", "enabled": False}]}}),
            machineconfig("60-extra", {"systemd": {"units": [{"name": "extra.service", "enabled": True,
                                                             "contents": "[Service]\nExecStart=/bin/true\n"}]}})],
        ("clusters-a", "empty"): [],  # no MachineConfigs of its own: the base alone
        # What HyperShift's NodePool controller lets into a config beside MachineConfigs (a mirror set, and
        # a KubeletConfig and a ContainerRuntimeConfig pointed at the mco-built-in pools): the bootstrap
        # consumes them into the base, which is this NodePool's own run (model/bootstrap_objects.py).
        ("clusters-a", "consumed"): [
            machineconfig("50-consumed", {"storage": {"files": [
                {"path": "/etc/consumed.conf", "mode": 420, "contents": data_url("consumed\n")}]}}),
            {"apiVersion": "config.openshift.io/v1", "kind": "ImageDigestMirrorSet", "metadata": {"name": "cluster"},
             "spec": {"imageDigestMirrors": [{"source": "quay.io/openshift-release-dev/ocp-release",
                                              "mirrors": ["mirror-a.example.com/ocp/release"]}]}},
            {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "KubeletConfig", "metadata": {"name": "max-pods"},
             "spec": {"kubeletConfig": {"maxPods": 271}, "machineConfigPoolSelector": {
                 "matchLabels": {"machineconfiguration.openshift.io/mco-built-in": ""}}}},
            {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "ContainerRuntimeConfig", "metadata": {"name": "pids"},
             "spec": {"containerRuntimeConfig": {"pidsLimit": 4099}, "machineConfigPoolSelector": {
                 "matchLabels": {"machineconfiguration.openshift.io/mco-built-in": ""}}}}],
        # Named between two of MCO's generated MachineConfigs: merged after them here (README), said in
        # `message`; its file touches none of theirs, so the payload is still equal.
        ("clusters-a", "between"): [machineconfig("98-between", {"storage": {"files": [
            {"path": "/etc/between.conf", "mode": 420, "contents": data_url("between\n")}]}})],
        ("clusters-b", "plain"): [machineconfig("50-plain", {"storage": {"files": [
            {"path": "/etc/plain.conf", "mode": 420, "contents": data_url("plain b\n")}]}}),
            # HyperShift's own SSH key MachineConfig.
            machineconfig("99-worker-ssh", {"passwd": {"users": [
                {"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOc0re core@b"]}]}})],
    }
    source = tmp_path / "source"
    for namespace, files in clusters.items():
        write_manifests(source / f"{namespace}.yaml",
                        kube_object("Secret", namespace, "pull-secret", {".dockerconfigjson": registry.pull_secret()}),
                        kube_object("Secret", namespace, "bootstrap-kubeconfig", {"kubeconfig": KUBECONFIG}),
                        kube_object("ConfigMap", namespace, "user-ca-bundle", {"ca-bundle.crt": registry.ca_file.read_text()}),
                        kube_object("ConfigMap", namespace, "machine-config-server", files))
    write_manifests(source / "clusters-x.yaml",
                    kube_object("Secret", "clusters-x", "pull-secret", {".dockerconfigjson": registry.pull_secret()}),
                    kube_object("Secret", "clusters-x", "bootstrap-kubeconfig", {"kubeconfig": KUBECONFIG}),
                    kube_object("ConfigMap", "clusters-x", "user-ca-bundle", {"ca-bundle.crt": registry.ca_file.read_text()}),
                    kube_object("ConfigMap", "clusters-x", "machine-config-server", broken))
    paths = {}
    for (namespace, name), mcs in [*pools.items(), (("clusters-x", "plain"), pools[("clusters-b", "plain")])]:
        import yaml

        text = yaml.safe_dump_all(mcs, sort_keys=False)
        paths[(namespace, name)] = write_manifests(source / f"{namespace}-{name}.yaml", build_token_secret(
            namespace=namespace, nodepool=f"clusters/{namespace}-{name}", token=f"tok-{namespace}-{name}",
            release=release.pullspec, release_version=release.version, machineconfigs_yaml=text, generation_time=time.time()))
    started = time.monotonic()
    proc = ServerProcess(source, tmp_path / "cache", extra=["--release-resolve", "--generate-bases", "--registry-allow", registry.host]).start()
    bodies = {}
    for key in pools:
        status = wait_for(lambda key=key: (s := token_status(paths[key])).reason in ("AsExpected", "InvalidConfig") and s,
                          timeout=120, what=f"{key} rendered")
        assert status.reason == "AsExpected", status.message
        code, _, bodies[key] = proc.get("/ignition", bearer(f"tok-{key[0]}-{key[1]}"))
        assert code == 200
    cold = time.monotonic() - started
    # One per cluster and release, and one for the NodePool whose config the bootstrap consumes part of.
    assert proc.metrics().get('ign_server_base_generations_total{result="ok"}') == 3
    failed = wait_for(lambda: (s := token_status(paths[("clusters-x", "plain")])).reason == "InvalidConfig" and s,
                      timeout=60, what="the broken cluster's InvalidConfig")
    # The message names the step and points to the log; MCO's own words are in the log only (issue 31).
    assert "machine-config-operator failed; its output is in the server's log" in failed.message
    assert "cannot read" not in failed.message
    logs = proc.logs()
    assert "machine-config-operator exited with 255" in logs
    assert "cannot read" in logs and "cluster-network-02-config.yaml" in logs
    assert "s3cret" not in failed.message and registry.pull_secret() not in failed.message

    for (namespace, name), mcs in pools.items():
        import yaml

        reference = mcs_reference_payload(
            real_mco, tmp_path / f"ref-{namespace}-{name}", cluster_files=clusters[namespace],
            custom_yaml=yaml.safe_dump_all(mcs, sort_keys=False), bootstrap_kubeconfig=KUBECONFIG,
            pull_secret=registry.pull_secret(), release=release)
        assert differences(bodies[(namespace, name)], reference) == [], (namespace, name)
        if namespace == "clusters-b":  # the trust bundle reached the node, as in the reference
            assert items(bodies[(namespace, name)])["file /etc/pki/ca-trust/source/anchors/openshift-config-user-ca-bundle.crt"][4] == ca_a
        # The same items at every spec version a client may ask for (the reference answers 3.2.0 to all).
        for version in ("3.0.0", "3.1.0", "3.3.0", "3.4.0", "3.5.0", "3.6.0"):
            accept = {"Accept": f"application/vnd.coreos.ignition+json;version={version}, */*;q=0.1"}
            code, _, body = proc.get("/ignition", {**bearer(f"tok-{namespace}-{name}"), **accept})
            assert code == 200 and json.loads(body)["ignition"]["version"] == version, (version, code)
            assert differences(body, reference) == [], (namespace, name, version)

    ours = {key: items(body) for key, body in bodies.items()}
    assert "MachineConfig '98-between' is merged after MCO's 97-worker-generated-kubelet" in \
        token_status(paths[("clusters-a", "between")]).message
    assert "is merged after" not in token_status(paths[("clusters-a", "override")]).message
    # The kubelet's client CA (kubelet.conf points at it) is the cluster's signer CA.
    assert ours[("clusters-a", "plain")]["file /etc/kubernetes/kubelet-ca.crt"][4] == ca_a
    # The NodePool's override of a base file and unit wins, as in MCO's merge by name.
    assert "the NodePool's own" in ours[("clusters-a", "override")]["file /etc/crio/crio.conf.d/00-default"][4]
    assert ours[("clusters-a", "override")]["unit chrony-wait.service"][0] is False
    # Each cluster's TLS profile reaches the kubelet.
    kubelet_a = ours[("clusters-a", "plain")]["file /etc/kubernetes/kubelet.conf"][4]
    kubelet_b = ours[("clusters-b", "plain")]["file /etc/kubernetes/kubelet.conf"][4]
    assert "VersionTLS13" in kubelet_a and "VersionTLS10" in kubelet_b
    consumed = ours[("clusters-a", "consumed")]
    assert "mirror-a.example.com/ocp/release" in consumed["file /etc/containers/registries.conf"][4]
    assert re.search(r"maxPods\W+271", consumed["file /etc/kubernetes/kubelet.conf"][4])
    assert "4099" in "".join(str(v[4]) for k, v in consumed.items() if k.startswith("file /etc/crio/"))
    assert not re.search(r"maxPods\W+271", ours[("clusters-a", "plain")]["file /etc/kubernetes/kubelet.conf"][4])
    assert ours[("clusters-b", "plain")]["user core"]["sshAuthorizedKeys"] == ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOc0re core@b"]
    print(f"cold start to {len(pools)} payloads (three MCO runs): {cold:.1f} s")

    # Restarted (SIGKILL): every payload from the encrypted cache, no run, no registry request.
    # The broken cluster goes first: a restart is a fresh attempt for a base that failed (only
    # good bases are kept), and its retry would ask the registry whenever it came.
    paths[("clusters-x", "plain")].unlink()
    (source / "clusters-x.yaml").unlink()
    proc.kill()
    proc = ServerProcess(source, tmp_path / "cache", extra=["--release-resolve", "--generate-bases", "--registry-allow", registry.host]).start()
    for key, body in bodies.items():
        assert proc.get("/ignition", bearer(f"tok-{key[0]}-{key[1]}"))[2] == body
    metrics = proc.metrics()
    assert sum(v for k, v in metrics.items() if k.startswith("ign_server_base_generations_total")) == 0
    assert sum(v for k, v in metrics.items() if k.startswith("ign_server_registry_requests_total")) == 0


def test_azure_cloud_config_waits_for_its_hash_and_an_os_stream_is_its_own_run(real_world, real_mco: RealMCO, tmp_path: Path) -> None:  # noqa: F811
    import yaml

    from ignition_server.reconcile.generated_bases import hash_simple
    from testsupport.real_release import azure_cloud_config

    registry, release = real_world
    ca = make_ca()[0].decode()
    namespace = "clusters-az"
    files = hypershift_mcs_config("az", platform="Azure", root_ca=ca, signer_ca=ca, configuration_hash="h2")
    cloud = azure_cloud_config(namespace)
    source = tmp_path / "source"
    stale = [kube_object("ConfigMap", namespace, "machine-config-server", {**files, "configuration-hash": "h1"})]
    bundle = registry.ca_file.read_text() + "".join(make_ca()[0].decode() for _ in range(8))
    assert len(bundle) > 4096
    common = [kube_object("Secret", namespace, "pull-secret", {".dockerconfigjson": registry.pull_secret()}),
              kube_object("Secret", namespace, "bootstrap-kubeconfig", {"kubeconfig": KUBECONFIG}),
              # Past the slim size (4 KiB): its hash is checked on the full text.
              kube_object("ConfigMap", namespace, "user-ca-bundle", {"ca-bundle.crt": bundle}),
              kube_object("ConfigMap", namespace, "machine-config-server", files)]
    write_manifests(source / "cluster.yaml", *common[:-1], *stale)
    mcs = [machineconfig("50-az", {"storage": {"files": [{"path": "/etc/az.conf", "mode": 420, "contents": data_url("az\n")}]}})]
    text = yaml.safe_dump_all(mcs, sort_keys=False)
    paths = {}

    def token_secret(name: str, stream: str, pull_secret_hash: str, bundle_hash: str = hash_simple(bundle)) -> Path:
        secret = build_token_secret(namespace=namespace, nodepool=f"clusters/{name}", token=f"tok-{name}", release=release.pullspec,
                                    release_version=release.version, machineconfigs_yaml=text, generation_time=time.time())
        hashes = {"cloud-config-hash": hash_simple(cloud["data"]), "hc-configuration-hash": "h2",
                  "pull-secret-hash": pull_secret_hash, "additional-trust-bundle-hash": bundle_hash}
        for key, value in hashes.items():
            secret["data"][key] = base64.b64encode(value.encode()).decode()
        if stream:
            secret["data"]["os-stream"] = base64.b64encode(stream.encode()).decode()
        return write_manifests(source / f"{name}.yaml", secret)

    right = hash_simple(registry.pull_secret().encode())
    paths["default"] = token_secret("default", "", right)
    paths["streamed"] = token_secret("streamed", "rhel-10", "0badc0de")  # made for another pull secret
    proc = ServerProcess(source, tmp_path / "cache", extra=["--release-resolve", "--generate-bases", "--registry-allow", registry.host]).start()
    # The ConfigMap is older than the configuration the token Secret was made for: wait.
    status = wait_for(lambda: (s := token_status(paths["default"])).reason == "InvalidConfig" and s, timeout=60,
                      what="waiting for the machine-config-server ConfigMap")
    assert status.message == "machine-config-server configmap is out of date, waiting for update h1 != h2"
    assert wait_for(lambda: token_status(paths["streamed"]).message == "pull secret does not match hash", timeout=60,
                    what="the pull secret's hash said")
    token_secret("streamed", "rhel-10", right, bundle_hash="0badc0de")  # now made for another trust bundle
    write_manifests(source / "cluster.yaml", *common)
    # No cloud config yet: CloudConfigPending, nothing run.
    status = wait_for(lambda: (s := token_status(paths["default"])).reason == "CloudConfigPending" and s, timeout=60,
                      what="CloudConfigPending")
    assert "azure-cloud-config" in status.message
    assert proc.metrics().get('ign_server_base_generations_total{result="ok"}', 0) == 0
    # Another cloud config than the one asked for: still pending.
    other = azure_cloud_config(namespace, location="westeurope")
    write_manifests(source / "cloud.yaml", other)
    wait_for(lambda: "does not match" in token_status(paths["default"]).message, timeout=60, what="hash mismatch said")
    write_manifests(source / "cloud.yaml", cloud)
    # The large bundle's hash, checked on its full text once the run is asked for: held back, said.
    wait_for(lambda: token_status(paths["streamed"]).message == "additionalTrustBundle does not match hash", timeout=60,
             what="the trust bundle's hash said")
    token_secret("streamed", "rhel-10", right)
    for name in paths:
        wait_for(lambda name=name: token_status(paths[name]).reason == "AsExpected", timeout=120, what=f"{name} rendered")
    # One run per (cluster, release, os-stream): the streamed NodePool's is its own.
    assert proc.metrics().get('ign_server_base_generations_total{result="ok"}') == 2
    for name, stream in (("default", ""), ("streamed", "rhel-10")):
        code, _, body = proc.get("/ignition", bearer(f"tok-{name}"))
        assert code == 200
        reference = mcs_reference_payload(real_mco, tmp_path / f"ref-{name}", cluster_files=files, custom_yaml=text,
                                          bootstrap_kubeconfig=KUBECONFIG, pull_secret=registry.pull_secret(),
                                          release=release, os_stream=stream, cloud_config=cloud)
        assert differences(body, reference) == [], name
        assert '"location": "eastus"' in items(body)["file /etc/kubernetes/cloud.conf"][4]


def test_kubernetes_mode_the_writer_generates_and_shares(real_world, tmp_path: Path) -> None:
    """Two replicas: the Lease holder runs the real MCO once and publishes the base; the other
    serves the same bytes without a run."""
    from testsupport.kubeapi import KubeAPI

    registry, release = real_world
    ca = make_ca()[0].decode()
    with KubeAPI(tmp_path / "kubeapi", bookmark_interval=0.5) as api:
        api.namespace("ignition")
        api.namespace("clusters-k")
        for obj in (kube_object("Secret", "clusters-k", "pull-secret", {".dockerconfigjson": registry.pull_secret()}),
                    kube_object("Secret", "clusters-k", "bootstrap-kubeconfig", {"kubeconfig": KUBECONFIG}),
                    kube_object("ConfigMap", "clusters-k", "user-ca-bundle", {"ca-bundle.crt": registry.ca_file.read_text()}),
                    kube_object("ConfigMap", "clusters-k", "machine-config-server", hypershift_mcs_config("k", root_ca=ca, signer_ca=ca))):
            api.create(obj)
        api.create(build_token_secret(namespace="clusters-k", nodepool="clusters/workers", token="tok-k", release=release.pullspec,
                                      release_version=release.version, generation_time=time.time()))
        (tmp_path / "empty").mkdir()
        procs = [ServerProcess(tmp_path / "empty", tmp_path / name / "cache", extra=[
            "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition",
            "--replica-id", name, "--lease-duration", "3s", "--release-resolve", "--generate-bases",
            "--registry-allow", registry.host]).start()
            for name in ("r1", "r2")]
        bodies = []
        for proc in procs:
            wait_for(lambda proc=proc: proc.get("/ignition", bearer("tok-k"))[0] == 200, timeout=90, what="served")
            bodies.append(proc.get("/ignition", bearer("tok-k"))[2])
            assert items(bodies[-1])["file /etc/kubernetes/kubelet-ca.crt"][4] == ca
        assert bodies[0] == bodies[1]  # the same base on both replicas
        generated = sorted(p.metrics().get('ign_server_base_generations_total{result="ok"}', 0) for p in procs)
        assert generated == [0, 1]  # generated once, by the writer
        shared = [cm for cm in api.list("configmaps", "ignition") if cm["metadata"]["name"].startswith("ignition-server-base-")]
        assert len(shared) == 1 and "ignition-server.openshift.io/served-pool: master" in shared[0]["data"]["machineconfigs.yaml"]
        assert len(shared[0]["metadata"]["annotations"]["ignition-server.openshift.io/generated-base"]) == 64
