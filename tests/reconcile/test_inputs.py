"""The reconciler's inputs end to end: join files, node HAProxy, IBM Cloud VPC, release catalog,
the dependency index, user-data Secrets and the edge token map. Real renderers, real tools."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

from ignition_server.basegen.generator import BaseGenerator
from ignition_server.model.bootstrap_objects import NONE
from ignition_server.model.objects import ObjectKey
from ignition_server.model.token_secret import parse_token_secret
from ignition_server.reconcile.generated_bases import generated_base, generated_key
from ignition_server.reconcile.releases import ANNOTATION_RELEASE_CATALOG
from payload_cache import PayloadCache
from testsupport import mco_base
from testsupport.clock import T0, Clock
from testsupport.harness import EXAMPLE_MACHINECONFIG, write_manifests
from testsupport.ignition_client import ignition_files_stage
from testsupport.manifests import CA_PEM, KUBECONFIG, build_token_secret, join_objects, kube_object
from testsupport.realtools import require_tool
from testsupport.reconcile_world import file_reconciler, inputs_world, renders, settle

RELEASE = "quay.io/openshift-release-dev/ocp-release@sha256:" + "1" * 64
HAPROXY_IMAGE = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "2" * 64


def catalog(*pull_specs: str) -> dict:
    releases = [{"pullSpec": p, "version": "4.17.3", "images": {"haproxy-router": HAPROXY_IMAGE}} for p in pull_specs]
    return kube_object("ConfigMap", "ignition-server", "catalog", {"releases.yaml": yaml.safe_dump(releases)},
                       {ANNOTATION_RELEASE_CATALOG: "true"})


def token_secret(namespace: str, pool: str, token: str, annotations: dict | None = None) -> dict:
    obj = build_token_secret(namespace=namespace, nodepool=f"clusters/{pool}", token=token, release=RELEASE,
                             machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=pool), generation_time=T0)
    obj["metadata"]["annotations"].update(annotations or {})
    return obj


def full_cluster(namespace: str) -> list[dict]:
    return [
        kube_object("Secret", namespace, "pull-secret", {".dockerconfigjson": '{"auths":{"quay.io":{"auth":"dTpw"}}}'}),
        kube_object("Secret", namespace, "bootstrap-kubeconfig", {"kubeconfig": KUBECONFIG}),
        kube_object("ConfigMap", namespace, "user-ca-bundle", {"ca-bundle.crt": CA_PEM}),
        kube_object("ConfigMap", namespace, "apiserver-proxy", {
            "listenIP": "172.20.0.1", "listenPort": "6443",
            "backends": "c100-1.example.com:32167,c100-2.example.com:32167",
            "backupBackends": "[2001:db8::10]:32167",
        }),
        kube_object("ConfigMap", namespace, "ibmcloud-vpc", {
            "clusterID": "c100", "accountID": "acct1", "region": "us-south", "zones": "us-south-1,us-south-2",
            "privateEndpoints": "c100-1.private.example.com:32167", "publicEndpoints": "c100-1.example.com:32167",
            "publicServiceEndpoint": "true", "registryHost": "us.icr.io", "secondaryStorage": "ext4",
        }),
    ]


@pytest.fixture
def world(tmp_path: Path):
    return inputs_world(tmp_path)


def payload_files(cache: PayloadCache, secret_ref: str) -> dict[str, tuple[bytes, int]]:
    config = json.loads(cache.get_blob(cache.get_render(secret_ref).blob_id))
    files = {}
    for entry in config["storage"]["files"]:
        source = entry["contents"]["source"]
        header, _, data = source.partition(",")
        raw = base64.b64decode(data) if header.endswith(";base64") else unquote(data).encode()
        if entry["contents"].get("compression") == "gzip":
            raw = gzip.decompress(raw)
        files[entry["path"]] = (raw, entry.get("mode", 0o644))
    return files


async def test_full_payload_has_join_files_haproxy_and_ibm_and_passes_the_real_tools(world, tmp_path: Path) -> None:
    reconciler, source, cache, source_dir, _clock, outputs = world
    write_manifests(source_dir / "releases.yaml", catalog(RELEASE))
    write_manifests(source_dir / "c100.yaml", *full_cluster("clusters-c100"), token_secret("clusters-c100", "workers", "tok-1"))
    await settle(reconciler, source, outputs)
    files = payload_files(cache, "clusters-c100/token-workers-00000000")
    assert files["/etc/kubernetes/kubeconfig"][1] == 0o600
    assert b"172.20.0.1:6443" in files["/etc/kubernetes/kubeconfig"][0]
    assert files["/var/lib/kubelet/config.json"][1] == 0o600
    haproxy_cfg = next(content for path, (content, _) in files.items() if path.endswith("haproxy.cfg"))
    assert b"c100-1.example.com:32167" in haproxy_cfg and b"backup" in haproxy_cfg
    static_pod = next(content for path, (content, _) in files.items() if path.endswith("kube-apiserver-proxy.yaml"))
    assert HAPROXY_IMAGE.encode() in static_pod
    # The provider ID ibm://<account>///<cluster>/<worker> is built at boot from these.
    assert any(b"IBM_ACCOUNT_ID='acct1'" in c and b"IBM_CLUSTER_ID='c100'" in c for c, _ in files.values())
    assert "/etc/workers.conf" in files  # the NodePool's own MachineConfig is still there
    documents = yaml.safe_load_all((source_dir / "c100.yaml").read_text())
    secret = parse_token_secret(next(d for d in documents if d["metadata"]["name"].startswith("token-")))
    assert secret.reason == "AsExpected"
    assert "not in the source" not in secret.message  # every join input was there
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_bytes(haproxy_cfg)
    check = subprocess.run([require_tool("haproxy", "apt-get install haproxy"), "-c", "-f", str(cfg)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    body = cache.get_blob(cache.get_render("clusters-c100/token-workers-00000000").blob_id)
    path = tmp_path / "payload.ign"
    path.write_bytes(body)
    check = subprocess.run([require_tool("ignition-validate", "apt-get install ignition"), str(path)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    res, root = ignition_files_stage(tmp_path, json.loads(body))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    landed = root / "etc/kubernetes/apiserver-proxy-config/haproxy.cfg"
    assert landed.read_bytes() == haproxy_cfg
    assert (root / "etc/kubernetes/kubeconfig").stat().st_mode & 0o777 == 0o600
    assert (root / "etc/systemd/system/workers.service").exists()


async def test_a_shared_input_rerenders_exactly_its_nodepools(world) -> None:
    reconciler, source, cache, source_dir, _clock, outputs = world
    shared = {"ignition-server.openshift.io/input-user-ca-bundle": "shared/ca"}
    marked = {"ignition-server.openshift.io/shareable": "true"}
    write_manifests(source_dir / "shared.yaml", kube_object("ConfigMap", "shared", "ca", {"ca-bundle.crt": CA_PEM}, marked))
    write_manifests(source_dir / "a.yaml", *[token_secret("clusters-a", f"a{i}", f"tok-a{i}") for i in range(3)],
                    kube_object("ConfigMap", "clusters-a", "user-ca-bundle", {"ca-bundle.crt": CA_PEM}))
    write_manifests(source_dir / "b.yaml", *[token_secret("clusters-b", f"b{i}", f"tok-b{i}", shared) for i in range(2)])
    await settle(reconciler, source, outputs)
    assert renders(reconciler) == 5
    before = renders(reconciler)
    write_manifests(source_dir / "shared.yaml", kube_object("ConfigMap", "shared", "ca", {"ca-bundle.crt": CA_PEM + CA_PEM.replace("MIIB", "MIIC")}, marked))
    await settle(reconciler, source, outputs)
    assert renders(reconciler) - before == 2
    before = renders(reconciler)
    # An input appearing counts as a change too: a pull secret for cluster A only.
    write_manifests(source_dir / "pull.yaml", kube_object("Secret", "clusters-a", "pull-secret", {".dockerconfigjson": '{"auths":{}}'}))
    await settle(reconciler, source, outputs)
    assert renders(reconciler) - before == 3
    before = renders(reconciler)
    # An unrelated object changes nothing.
    write_manifests(source_dir / "other.yaml", kube_object("ConfigMap", "clusters-a", "unrelated", {"x": "1"}))
    await settle(reconciler, source, outputs)
    assert renders(reconciler) == before


async def test_unknown_release_is_invalid_until_the_catalog_knows_it(world) -> None:
    reconciler, source, cache, source_dir, _clock, outputs = world
    write_manifests(source_dir / "c.yaml", full_cluster("clusters-c")[3], token_secret("clusters-c", "workers", "tok"))
    write_manifests(source_dir / "plain.yaml", token_secret("clusters-p", "plain", "tok-p"))
    await settle(reconciler, source, outputs)
    def docs() -> list[dict]:
        return [d for d in yaml.safe_load_all((source_dir / "c.yaml").read_text()) if d["kind"] == "Secret"]

    failing = parse_token_secret(docs()[0])
    assert failing.reason == "InvalidConfig" and RELEASE in failing.message and "release catalog" in failing.message
    assert cache.get_render("clusters-c/token-workers-00000000") is None
    # A NodePool that needs no component image renders without its release known.
    assert cache.get_render("clusters-p/token-plain-00000000") is not None
    write_manifests(source_dir / "releases.yaml", catalog(RELEASE))
    await settle(reconciler, source, outputs)
    assert parse_token_secret(docs()[0]).reason == "AsExpected"
    assert cache.get_render("clusters-c/token-workers-00000000") is not None


async def test_user_data_secret_and_edge_map_follow_rotations(world) -> None:
    reconciler, source, cache, source_dir, clock, outputs = world
    write_manifests(source_dir / "p.yaml", token_secret("clusters-a", "workers", "tok-0"))
    await settle(reconciler, source, outputs)
    user_data_file = source_dir / "user-data-workers-00000000.yaml"

    def pointer() -> dict:
        obj = yaml.safe_load(user_data_file.read_text())
        assert base64.b64decode(obj["data"]["disableTemplating"]) == b"true"
        assert obj["metadata"]["namespace"] == "clusters-a"
        return json.loads(base64.b64decode(obj["data"]["value"]))

    header = pointer()["ignition"]["config"]["merge"][0]["httpHeaders"][0]
    assert header == {"name": "Authorization", "value": "Bearer " + base64.b64encode(b"tok-0").decode()}
    clock.now = T0 + 50
    assert await reconciler.rotation.rotate_due() == 1
    await settle(reconciler, source, outputs)
    current = parse_token_secret([d for d in yaml.safe_load_all((source_dir / "p.yaml").read_text())][0]).token
    header = pointer()["ignition"]["config"]["merge"][0]["httpHeaders"][0]
    assert header["value"] == "Bearer " + base64.b64encode(current.encode()).decode()
    edge = (source_dir.parent / "cache" / "edge" / "tokens.map").read_text().splitlines()
    assert sorted(edge) == sorted(f"{hashlib.sha256(t.encode()).hexdigest()} clusters/workers" for t in (current, "tok-0"))
    assert "tok-0" not in "".join(edge)


async def test_user_data_with_a_large_ca_follows_rotations(tmp_path: Path) -> None:
    # A pointer config over 4 KiB (a big CA bundle) is held by the source as a digest only.
    big_ca = CA_PEM * 12
    clock = Clock()
    reconciler, source, cache, source_dir, outputs = file_reconciler(tmp_path, clock, shared=(), ca_pem=big_ca.encode())
    write_manifests(source_dir / "p.yaml", token_secret("clusters-a", "workers", "tok-0"))
    await settle(reconciler, source, outputs)
    clock.now = T0 + 50
    assert await reconciler.rotation.rotate_due() == 1
    await settle(reconciler, source, outputs)
    await settle(reconciler, source, outputs)
    current = parse_token_secret(yaml.safe_load((source_dir / "p.yaml").read_text())).token
    obj = yaml.safe_load((source_dir / "user-data-workers-00000000.yaml").read_text())
    pointer = json.loads(base64.b64decode(obj["data"]["value"]))
    header = pointer["ignition"]["config"]["merge"][0]["httpHeaders"][0]
    assert header["value"] == "Bearer " + base64.b64encode(current.encode()).decode()


def test_generated_key_says_whether_the_nodepool_is_on_a_generated_base(tmp_path: Path) -> None:
    """Without its cluster's `machine-config-server` ConfigMap a NodePool has no generated base (gather
    then refuses mirror sets for want of one); with it, it has one, whose key may wait
    (until the config is read, or the release's digest known): on a generated base all the same, and queued by it."""
    reconciler, *_ = inputs_world(tmp_path)
    secret = parse_token_secret(token_secret("clusters-a", "workers", "tok-workers"))
    objects: dict[ObjectKey, dict] = {}
    found = generated_key(secret, secret.annotations, objects.get, reconciler.releases)
    assert (found.key, found.configured, generated_base(secret) in found.deps) == (None, False, False)
    config = kube_object("ConfigMap", "clusters-a", "machine-config-server", {"configuration-hash": "c1"})
    objects[ObjectKey("ConfigMap", "clusters-a", "machine-config-server")] = config
    waiting = generated_key(secret, secret.annotations, objects.get, reconciler.releases, consumed=None)  # config not read
    assert (waiting.key, waiting.configured, generated_base(secret) in waiting.deps) == (None, True, True)
    found = generated_key(secret, secret.annotations, objects.get, reconciler.releases, consumed=NONE)
    assert found.key is not None and found.configured and found.deps == waiting.deps


async def test_a_generated_base_does_not_lift_the_token_secrets_configuration_precondition(tmp_path: Path) -> None:
    """HyperShift's GetPayload checks a token Secret's `hc-configuration-hash` on every payload:
    a Secret made for another cluster configuration waits (InvalidConfig, in HyperShift's words),
    even once the generated base for the current configuration is known (as it is after the
    first NodePool of the cluster, or a restart)."""
    reconciler, source, cache, source_dir, _clock, outputs = inputs_world(tmp_path)
    store: dict[str, bytes] = {}
    generator = BaseGenerator(files=None, load=store.get, save=store.__setitem__,  # type: ignore[arg-type]
                              work_dir=tmp_path / "work")
    reconciler.base_waits.generator = generator
    release = mco_base.RELEASE
    images = {"rhel-coreos": mco_base.RHCOS, "rhel-coreos-extensions": mco_base.RHCOS_EXTENSIONS,
              "machine-config-operator": "quay.io/x/mco@sha256:" + "e" * 64}
    write_manifests(source_dir / "catalog.yaml", kube_object("ConfigMap", "ignition-server", "catalog", {
        "releases.yaml": yaml.safe_dump([{"pullSpec": release, "version": mco_base.RELEASE_VERSION, "images": images}])},
        {ANNOTATION_RELEASE_CATALOG: "true"}))
    pull = '{"auths":{"quay.io":{"auth":"dTpw"}}}'
    write_manifests(source_dir / "inputs.yaml", *join_objects("clusters-a", pull, CA_PEM)[:3],
                    kube_object("ConfigMap", "clusters-a", "machine-config-server",
                                {"configuration-hash": "c1", "cluster-infrastructure-02-config.yaml": "x"}))

    def nodepool(name: str, configuration_hash: str) -> dict:
        secret = build_token_secret(namespace="clusters-a", nodepool=f"clusters/{name}", token=f"tok-{name}",
                                    release=release, release_version=mco_base.RELEASE_VERSION,
                                    machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=name))
        secret["data"]["hc-configuration-hash"] = base64.b64encode(configuration_hash.encode()).decode()
        return secret

    write_manifests(source_dir / "a.yaml", nodepool("current", "c1"))
    await settle(reconciler, source, outputs)
    current = reconciler.tokens.get(ObjectKey("Secret", "clusters-a", "token-current-00000000"))
    assert current is not None
    key = generated_key(current, current.annotations, source.get, reconciler.releases, reconciler.tenancy).key
    assert key is not None
    generator.adopt(key, mco_base.base_yaml())  # the base of configuration c1, generated
    reconciler.base_waits.generated(key)
    await settle(reconciler, source, outputs)
    assert cache.get_render("clusters-a/token-current-00000000") is not None

    write_manifests(source_dir / "b.yaml", nodepool("stale", "c0"))  # made for configuration c0
    await settle(reconciler, source, outputs)
    assert cache.get_render("clusters-a/token-stale-00000000") is None
    stale = parse_token_secret(next(d for d in yaml.safe_load_all((source_dir / "b.yaml").read_text())))
    assert stale.reason == "InvalidConfig" and "machine-config-server configmap is out of date" in stale.message
