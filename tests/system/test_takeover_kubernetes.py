"""Taking over from HyperShift's ignition server, end to end in Kubernetes mode: real server
processes (`serve --kubernetes --take-over`) against the strict test API server, and what they
write compared with HyperShift's own code (`hcp-inputs`) run on the same objects as the API holds them."""

from __future__ import annotations

import base64
import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest

from ignition_server.reconcile.generated_bases import hash_simple, precondition_failure
from ignition_server.takeover import ca_cert
from ignition_server.takeover.core_ignition import CORE_LABEL
from ignition_server.takeover.mcs_config import configuration_hash
from ignition_server.takeover.owned import DISABLE_IGNITION_SERVER, Named
from testsupport.deploy import rbac_rules
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, bearer, wait_for
from testsupport.hcp_inputs import HcpInputs, HcpWorld, hcp_world
from testsupport.kubeapi import KubeAPI
from testsupport.manifests import build_token_secret
from testsupport.parity_world import core_machineconfigs, secret as parity_secret
from testsupport.real_release import RealMCO, push_real_release, real_mco  # noqa: F401 (fixture)
from testsupport.registry_world import Registry

NAMESPACE = "clusters-hc1"
PLAIN = "clusters-plain"  # an HCP without the annotation


@pytest.fixture
def api(tmp_path: Path):
    with KubeAPI(tmp_path / "kubeapi", bookmark_interval=0.5) as server:
        server.namespace("ignition")
        yield server


@pytest.fixture
def replicas(tmp_path: Path, api: KubeAPI):
    def start(name: str) -> ServerProcess:
        (tmp_path / "empty").mkdir(exist_ok=True)
        proc = ServerProcess(tmp_path / "empty", tmp_path / name / "cache", extra=[
            "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition",
            "--replica-id", name, "--lease-duration", "3s", "--take-over"])
        return proc.start()

    return start


def as_created(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as a client creates it (the API server sets uid, resourceVersion, creationTimestamp)."""
    out = copy.deepcopy(obj)
    for field_name in ("uid", "resourceVersion", "creationTimestamp"):
        out["metadata"].pop(field_name, None)
    return out


def create_world(api: KubeAPI, world: HcpWorld) -> None:
    for obj in world.objects():
        api.create(as_created(obj))


def held(api: KubeAPI, world: HcpWorld) -> list[dict[str, Any]]:
    """The world's objects as the API holds them now (what the server reads)."""
    found = []
    for obj in world.objects():
        plural = {"Secret": "secrets", "ConfigMap": "configmaps", "HostedControlPlane": "hostedcontrolplanes"}[obj["kind"]]
        current = api.get(plural, world.namespace, obj["metadata"]["name"])
        assert current is not None
        found.append(current)
    return found


def core_config_maps(api: KubeAPI, namespace: str) -> dict[str, dict[str, Any]]:
    """What HyperShift's NodePool controller counts: the ConfigMaps labelled core-ignition-config."""
    return {cm["metadata"]["name"]: cm for cm in api.list("configmaps", namespace)
            if (cm["metadata"].get("labels") or {}).get(CORE_LABEL) == "true"}


def matches_cpo(api: KubeAPI, world: HcpWorld, hcp_inputs: HcpInputs, workdir: Path) -> bool:
    """Every ConfigMap hcp-inputs writes for the objects as held now is in the API with the same data,
    and the core ones are exactly those hcp-inputs writes."""
    cpo = hcp_inputs.run(held(api, world), workdir)
    for name, cm in cpo.config_maps.items():
        ours = api.get("configmaps", world.namespace, name)
        if ours is None or ours["data"] != cm["data"]:
            return False
    wanted_core = {n for n, cm in cpo.config_maps.items() if (cm["metadata"].get("labels") or {}).get(CORE_LABEL)}
    return set(core_config_maps(api, world.namespace)) == wanted_core


def writes(proc: ServerProcess) -> float:
    """What a replica asked the API server to write (its Lease renewals included)."""
    return sum(v for k, v in proc.metrics().items() if k.startswith("ign_server_api_requests_total")
               and any(f'verb="{verb}"' in k for verb in ("create", "update", "patch", "delete")))


def relists(proc: ServerProcess) -> float:
    return sum(v for k, v in proc.metrics().items()
               if k.startswith("ign_server_source_watch_restarts_total") and 'reason="gone"' in k)


def object_writes(api: KubeAPI) -> int:
    """Writes of ConfigMaps and Secrets the API server took, from any client."""
    return sum(n for (verb, plural), n in api.server.requests.items()
               if plural in ("configmaps", "secrets") and verb in ("create", "update", "patch", "delete"))


def test_an_annotated_hcp_gets_what_the_cpo_stops_writing(api: KubeAPI, replicas, hcp_inputs: HcpInputs,
                                                          tmp_path: Path) -> None:
    world = hcp_world("hc1", trusted=True)
    create_world(api, world)
    plain = hcp_world("plain")
    del plain.hcp["metadata"]["annotations"][DISABLE_IGNITION_SERVER]
    create_world(api, plain)
    writer = replicas("r1")
    wait_for(lambda: writer.metrics().get("ign_server_leader") == 1, timeout=30, what="r1 holding the Lease")

    # machine-config-server and the two core ConfigMaps, as HyperShift's code writes them for these objects.
    wait_for(lambda: matches_cpo(api, world, hcp_inputs, tmp_path / "cpo"), timeout=30, what="the CPO's ConfigMaps")
    assert len(core_config_maps(api, NAMESPACE)) == 2
    hcp_uid = api.get("hostedcontrolplanes", NAMESPACE, "hc1")["metadata"]["uid"]
    for name in ("machine-config-server", *core_config_maps(api, NAMESPACE)):
        owner = api.get("configmaps", NAMESPACE, name)["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("HostedControlPlane", "hc1", hcp_uid)

    # The CA Secret: this server's CA (the one its pointer configs trust), no key, our finalizer.
    secret = wait_for(lambda: api.get("secrets", NAMESPACE, ca_cert.NAME), timeout=30, what="the CA Secret")
    assert secret["type"] == "kubernetes.io/tls" and secret["data"]["tls.key"] == ""
    assert base64.b64decode(secret["data"]["tls.crt"]) == writer.ca_file.read_bytes()
    assert ca_cert.FINALIZER in secret["metadata"]["finalizers"]
    # The root CA's key was read (root-ca is fetched whole) but is never in any object the server wrote.
    assert all("ca.key" not in (cm.get("data") or {}) for cm in api.list("configmaps", NAMESPACE))

    # The CPO's delete (every reconcile under the annotation): the Secret stays readable, as it was.
    api.delete("secrets", NAMESPACE, ca_cert.NAME)
    api.delete("secrets", NAMESPACE, ca_cert.NAME)
    time.sleep(2)
    kept = api.get("secrets", NAMESPACE, ca_cert.NAME)
    assert kept is not None and kept["metadata"]["deletionTimestamp"]
    assert kept["data"]["tls.crt"] == secret["data"]["tls.crt"]

    # A re-list writes nothing: the watches expire and list again.
    before = object_writes(api)
    api.server.faults.gone_next_watches = 3  # the three resumes (ConfigMap, Secret, HCP) answer 410 Gone
    api.stop()
    api.start()
    wait_for(lambda: relists(writer) >= 3, timeout=30, what="the watches listing again")
    time.sleep(2)
    assert object_writes(api) == before

    # A second replica, not the writer, writes nothing at all (its Lease neither).
    before = object_writes(api)
    standby = replicas("r2")
    time.sleep(3)
    assert standby.metrics().get("ign_server_leader") == 0 and writes(standby) == 0
    assert object_writes(api) == before

    # Mirrors added: the IDMS ConfigMap (3 core ConfigMaps); removed: deleted again (2).
    mirrors = [{"source": "quay.io/openshift-release-dev/ocp-release",
                "mirrors": ["mirror.example.com/ocp/release", "backup.example.com/ocp/release"]}]
    api.patch("hostedcontrolplanes", NAMESPACE, "hc1", {"spec": {"imageContentSources": mirrors}})
    world.hcp["spec"]["imageContentSources"] = mirrors
    wait_for(lambda: len(core_config_maps(api, NAMESPACE)) == 3, timeout=30, what="the mirrors' ConfigMap")
    wait_for(lambda: matches_cpo(api, world, hcp_inputs, tmp_path / "cpo-mirrors"), timeout=30, what="the CPO's IDMS")
    api.patch("hostedcontrolplanes", NAMESPACE, "hc1", {"spec": {"imageContentSources": None}})
    del world.hcp["spec"]["imageContentSources"]
    wait_for(lambda: len(core_config_maps(api, NAMESPACE)) == 2, timeout=30, what="the mirrors' ConfigMap deleted")

    # An input changed: machine-config-server follows, as the CPO's would.
    old = api.get("configmaps", NAMESPACE, "machine-config-server")["data"]
    new_ca = world.kubelet_client_ca()["data"]["ca.crt"].replace("MIIBkub", "MIIBnew")
    api.patch("configmaps", NAMESPACE, "kubelet-client-ca", {"data": {"ca.crt": new_ca}})
    world.kubelet_client_ca = lambda: {**HcpWorld.kubelet_client_ca(world), "data": {"ca.crt": new_ca}}  # type: ignore[method-assign]
    wait_for(lambda: api.get("configmaps", NAMESPACE, "machine-config-server")["data"]["signer-ca.crt"] == new_ca,
             timeout=30, what="machine-config-server updated")
    assert matches_cpo(api, world, hcp_inputs, tmp_path / "cpo-changed")
    assert api.get("configmaps", NAMESPACE, "machine-config-server")["data"]["configuration-hash"] == old["configuration-hash"]

    # The HCP without the annotation: nothing written, and none of the Secrets only the takeover
    # reads is fetched there (pull-secret is, by name, as NodePools' renders read it anyway).
    assert not core_config_maps(api, PLAIN) and api.get("configmaps", PLAIN, "machine-config-server") is None
    assert api.get("secrets", PLAIN, ca_cert.NAME) is None
    read_there = {r[2] for r in api.server.reads if r[0] == "secrets" and r[1] == PLAIN}
    assert read_there <= {"pull-secret"}, read_there
    read_there = {r[2] for r in api.server.reads if r[0] == "configmaps" and r[1] == PLAIN}
    assert not read_there & {"kubelet-client-ca", "trusted-ca-bundle-managed", "machine-config-server"}, read_there

    # A token Secret made by the NodePool controller for this configuration is served.
    written_hash = api.get("configmaps", NAMESPACE, "machine-config-server")["data"]["configuration-hash"]
    assert precondition_failure({"hc-configuration-hash": written_hash}, None, None, written_hash) is None
    token = build_token_secret(namespace=NAMESPACE, nodepool="clusters/workers", token="tok-hc1",
                               machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="workers"), generation_time=time.time())
    token["data"]["hc-configuration-hash"] = base64.b64encode(written_hash.encode()).decode()
    api.create(token)
    wait_for(lambda: writer.get("/ignition", bearer("tok-hc1"))[0] == 200, timeout=30, what="the payload served")

    # Every request made is allowed by deploy/'s RBAC.
    groups = {"leases": "coordination.k8s.io", "hostedcontrolplanes": "hypershift.openshift.io"}
    used = {(groups.get(plural, ""), plural, verb) for verb, plural in api.server.requests}
    assert used <= rbac_rules(), used - rbac_rules()

    # The annotation removed: our CA Secret goes (finalizer off), so the CPO makes its own again.
    api.patch("hostedcontrolplanes", NAMESPACE, "hc1", {"metadata": {"annotations": {DISABLE_IGNITION_SERVER: None}}})
    wait_for(lambda: api.get("secrets", NAMESPACE, ca_cert.NAME) is None, timeout=30, what="the CA Secret let go")
    assert api.get("configmaps", NAMESPACE, "machine-config-server") is not None  # the CPO's again: left as they are


def test_the_ca_secret_outlives_the_cpos_delete_loop_and_the_hcp_deletion_completes(api: KubeAPI, replicas) -> None:
    world = hcp_world("hc1")
    world.hcp["metadata"]["finalizers"] = ["hypershift.openshift.io/finalizer"]  # HyperShift's own, on a real HCP
    create_world(api, world)
    proc = replicas("r1")
    made = wait_for(lambda: api.get("secrets", NAMESPACE, ca_cert.NAME), timeout=30, what="the CA Secret")
    assert base64.b64decode(made["data"]["tls.crt"]) == proc.ca_file.read_bytes()

    # A stand-in for the CPO's loop: DELETE every 0.2 s; every GET meanwhile finds it, our CA in it.
    for _ in range(15):
        api.delete("secrets", NAMESPACE, ca_cert.NAME)
        seen = api.get("secrets", NAMESPACE, ca_cert.NAME)
        assert seen is not None and seen["data"]["tls.crt"] == made["data"]["tls.crt"]
        time.sleep(0.2)
    assert seen["metadata"]["deletionTimestamp"] and seen["metadata"]["finalizers"] == [ca_cert.FINALIZER]

    # The HCP deleted: our finalizer goes, the Secret with it; HyperShift's finalizer removed, the HCP goes too.
    api.delete("hostedcontrolplanes", NAMESPACE, "hc1")
    wait_for(lambda: api.get("secrets", NAMESPACE, ca_cert.NAME) is None, timeout=30, what="the CA Secret let go")
    api.patch("hostedcontrolplanes", NAMESPACE, "hc1", {"metadata": {"finalizers": None}})
    assert api.get("hostedcontrolplanes", NAMESPACE, "hc1") is None
    time.sleep(2)
    assert api.get("secrets", NAMESPACE, ca_cert.NAME) is None  # not made again for a deleted HCP
    assert "takeover of clusters-hc1/hc1 failed" not in proc.logs()


def test_with_generated_bases_a_token_secret_for_this_configuration_is_served_on_mcos_base(
        api: KubeAPI, tmp_path: Path, real_mco: RealMCO) -> None:  # noqa: F811
    """The real MCO binaries generate the base from the machine-config-server ConfigMap we wrote:
    a token Secret carrying HyperShift's hashes (`hc-configuration-hash` as the NodePool controller
    computes it from the HCP's configuration), made once the core ConfigMaps are counted, is served."""
    registry = Registry(tmp_path / "registry").start()
    try:
        release = push_real_release(registry, real_mco)
        world = hcp_world("hc1")
        pull_secret = registry.pull_secret()
        for obj in world.objects():
            if obj["metadata"]["name"] == Named.PULL_SECRET:
                obj["data"] = {".dockerconfigjson": base64.b64encode(pull_secret.encode()).decode()}
            api.create(as_created(obj))
        kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "b",
                      "clusters": [{"name": "c", "cluster": {"server": "https://api-int.hc1.example.com:6443"}}],
                      "users": [{"name": "u", "user": {"token": "bootstrap"}}],
                      "contexts": [{"name": "b", "context": {"cluster": "c", "user": "u"}}]}
        api.create(parity_secret(NAMESPACE, "bootstrap-kubeconfig", {"kubeconfig": json.dumps(kubeconfig)}))
        (tmp_path / "empty").mkdir()
        proc = ServerProcess(tmp_path / "empty", tmp_path / "ours" / "cache", extra=[
            "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition", "--take-over",
            "--release-resolve", "--generate-bases", "--registry-ca-file", str(registry.ca_file),
            "--registry-allow", registry.host]).start()
        # As the NodePool controller does: token Secrets once it counts the core ConfigMaps.
        wait_for(lambda: len(core_config_maps(api, NAMESPACE)) == 2, timeout=30, what="the core ConfigMaps")
        hashes = {"pull-secret-hash": hash_simple(pull_secret.encode()),
                  "hc-configuration-hash": configuration_hash(world.hcp)}  # what the NodePool controller writes
        token = build_token_secret(namespace=NAMESPACE, nodepool="clusters/workers", token="tok-workers",
                                   release=release.pullspec, release_version=release.version,
                                   machineconfigs_yaml="\n---\n".join(core_machineconfigs()), generation_time=time.time())
        token["data"].update({k: base64.b64encode(v.encode()).decode() for k, v in hashes.items()})
        api.create(token)
        _status, _headers, body = wait_for(lambda: (got := proc.get("/ignition", bearer("tok-workers")))[0] == 200 and got,
                                          timeout=240, interval=0.5, what="the payload, on a generated base")
        files = {f["path"] for f in json.loads(body)["storage"]["files"]}
        assert "/etc/kubernetes/kubelet.conf" in files  # MCO's base, made from our machine-config-server
        assert proc.metrics().get('ign_server_base_generations_total{result="ok"}') == 1
        assert api.get("configmaps", NAMESPACE, "machine-config-server")["data"]["configuration-hash"] == hashes["hc-configuration-hash"]
    finally:
        registry.stop()
