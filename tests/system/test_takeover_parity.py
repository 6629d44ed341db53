"""Taking over, end to end, against HyperShift's REAL ignition server: for annotated
HostedControlPlanes on the strict test API server, our server (`--take-over --generate-bases`,
the real MCO binaries from a real registry) writes the ConfigMaps and the CA Secret; a token
Secret as the NodePool controller writes it (its `config` made of the core ConfigMaps it counts)
is then served. The reference runs on the CPO's own objects (`hcp-inputs` on the same HCP and
inputs) in a second API server, with its Deployment as the CPO builds it for that HCP
(control-plane-operator/controllers/hostedcontrolplane/v2/ignitionserver/deployment.go):
- the init container's FEATURE_GATE_YAML is `FeatureGate{name: cluster, spec: spec.configuration.featureGate}`
  through api.YamlSerializer when the HCP sets one, the asset's `spec: {}` otherwise;
- OPENSHIFT_IMG_OVERRIDES is the management cluster's ICSP/IDMS (the HyperShift operator's,
  passed down through the CPO's own environment), never the HCP's `spec.imageContentSources`:
  "=" here, a management cluster without mirrors. The HCP's mirrors reach a node only through
  the core ConfigMap `ignition-config-40-image-content-source` (an ImageDigestMirrorSet in the
  token Secret's `config`, which the MCO's bootstrap turns into registries.conf).
The cases: no configuration; custom feature gates; mirrors (two sources, several mirrors each);
a cluster proxy (noProxy computed) with `trusted-ca-bundle-managed` (user-ca-bundle-config.yaml).
The payloads are compared item by item (testsupport/payload_diff.py); a difference is a failure.
"""

from __future__ import annotations

import base64
import gzip
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ignition_server.reconcile.generated_bases import hash_simple
from ignition_server.takeover.core_ignition import CORE_LABEL
from testsupport.harness import ServerProcess, bearer, wait_for
from testsupport.hcp_inputs import HcpInputs, HcpWorld, hcp_world
from testsupport.kubeapi import KubeAPI
from testsupport.manifests import build_token_secret
from testsupport.parity_world import secret as parity_secret
from testsupport.payload_diff import diff_payloads, item_counts, report
from testsupport.real_release import RealMCO, push_real_release, real_mco  # noqa: F401 (fixture)
from testsupport.reference_server import FEATURE_GATE_YAML, ReferenceServer, reference_binary  # noqa: F401 (fixture)
from testsupport.registry_world import Registry

MIRRORS = [
    {"source": "quay.io/openshift-release-dev/ocp-release",
     "mirrors": ["mirror-a.example.com/ocp/release", "mirror-b.example.com/ocp/release"]},
    {"source": "quay.io/openshift-release-dev/ocp-v4.0-art-dev",
     "mirrors": ["mirror-a.example.com/ocp/art", "mirror-b.example.com/ocp/art", "mirror-c.example.com/art"]},
]
# What api.YamlSerializer prints for FeatureGate{TypeMeta, ObjectMeta{Name: "cluster"}, Spec: ...}
# (sigs.k8s.io/yaml: keys sorted, `creationTimestamp: null`, the empty status), then the
# init container's heredoc adds a blank line.
# (TechPreviewNoUpgrade turns OSStreams on: the MCO's bootstrap then inspects the release's
# quay.io images over the network, which neither server can reach here.)
CUSTOM_GATES = {"featureSet": "CustomNoUpgrade", "customNoUpgrade": {"enabled": ["EventedPLEG"], "disabled": ["SELinuxMount"]}}
CUSTOM_GATE_YAML = """\
apiVersion: config.openshift.io/v1
kind: FeatureGate
metadata:
  creationTimestamp: null
  name: cluster
spec:
  customNoUpgrade:
    disabled:
    - SELinuxMount
    enabled:
    - EventedPLEG
  featureSet: CustomNoUpgrade
status:
  featureGates: null

"""


@dataclass(frozen=True)
class Case:
    name: str  # the HCP's name; its namespace is clusters-<name>
    configuration: dict[str, Any] | None = None
    mirrors: list[dict[str, Any]] | None = None
    trusted: bool = False  # trusted-ca-bundle-managed present (user-ca-bundle-config.yaml)
    feature_gate: str = FEATURE_GATE_YAML  # what the CPO would give the reference's Deployment

    @property
    def namespace(self) -> str:
        return f"clusters-{self.name}"

    @property
    def token(self) -> str:
        return f"tok-{self.name}"


CASES = (
    Case("plain"),
    Case("gates", configuration={"featureGate": CUSTOM_GATES}, feature_gate=CUSTOM_GATE_YAML),
    Case("mirrors", mirrors=MIRRORS),
    Case("proxy", configuration={"proxy": {"httpProxy": "http://proxy.example.com:3128",
                                           "httpsProxy": "http://proxy.example.com:3129",
                                           "noProxy": "internal.example.com,.corp.example.com"}}, trusted=True),
)


@dataclass
class Found:
    ours: dict[str, bytes] = field(default_factory=dict)
    ours_failed: dict[str, str] = field(default_factory=dict)
    reference: dict[str, bytes] = field(default_factory=dict)
    reference_failed: dict[str, str] = field(default_factory=dict)
    config_maps_differ: dict[str, list[str]] = field(default_factory=dict)  # case -> ConfigMaps not equal to the CPO's


def world_of(case: Case, pull_secret: str) -> HcpWorld:
    world = hcp_world(case.name, configuration=case.configuration, mirrors=case.mirrors, trusted=case.trusted)
    world.extra.append(parity_secret(case.namespace, "bootstrap-kubeconfig", {"kubeconfig": json.dumps(KUBECONFIG)}))
    world.pull_secret = lambda: {**HcpWorld.pull_secret(world), "data": {  # type: ignore[method-assign]
        ".dockerconfigjson": base64.b64encode(pull_secret.encode()).decode()}}
    return world


KUBECONFIG = {"apiVersion": "v1", "kind": "Config", "current-context": "b",
              "clusters": [{"name": "c", "cluster": {"server": "https://api-int.hc1.example.com:6443"}}],
              "users": [{"name": "u", "user": {"token": "bootstrap"}}],
              "contexts": [{"name": "b", "context": {"cluster": "c", "user": "u"}}]}


def as_created(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("uid", "resourceVersion", "creationTimestamp")}
    return {**obj, "metadata": meta}


def held(api: KubeAPI, world: HcpWorld) -> list[dict[str, Any]]:
    plurals = {"Secret": "secrets", "ConfigMap": "configmaps", "HostedControlPlane": "hostedcontrolplanes"}
    found = [api.get(plurals[o["kind"]], world.namespace, o["metadata"]["name"]) for o in world.objects()]
    assert all(o is not None for o in found)
    return [o for o in found if o is not None]


def node_pool_config(core: dict[str, dict[str, Any]]) -> str:
    """The token Secret's `config` as HyperShift's NodePool controller makes it from the core
    ConfigMaps (config.go, `parse`): every document of each ConfigMap's `config`, a MachineConfig
    labelled with the worker role, the texts sorted and joined with `\\n---\\n`."""
    texts = []
    for cm in core.values():
        for doc in yaml.safe_load_all(cm["data"]["config"]):
            if not doc:
                continue
            if doc.get("kind") == "MachineConfig":
                doc.setdefault("metadata", {}).setdefault("labels", {})["machineconfiguration.openshift.io/role"] = "worker"
            texts.append(yaml.safe_dump(doc, sort_keys=True))
    return "\n---\n".join(sorted(texts))


def token_secret(case: Case, core: dict[str, dict[str, Any]], release: Any, pull_secret: str,
                 configuration_hash: str) -> dict[str, Any]:
    token = build_token_secret(namespace=case.namespace, nodepool=f"clusters/{case.name}-workers", token=case.token,
                               release=release.pullspec, release_version=release.version,
                               machineconfigs_yaml=node_pool_config(core), generation_time=time.time())
    hashes = {"pull-secret-hash": hash_simple(pull_secret.encode()), "hc-configuration-hash": configuration_hash}
    token["data"].update({k: base64.b64encode(v.encode()).decode() for k, v in hashes.items()})
    return token


def core_of(config_maps: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: cm for n, cm in config_maps.items() if (cm["metadata"].get("labels") or {}).get(CORE_LABEL) == "true"}


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory, real_mco: RealMCO, reference_binary: Path,  # noqa: F811
          hcp_inputs: HcpInputs) -> Found:
    work = tmp_path_factory.mktemp("takeover-parity")
    registry = Registry(work / "registry").start()
    ours_api = KubeAPI(work / "kubeapi-ours", bookmark_interval=1.0)
    reference_api = KubeAPI(work / "kubeapi-reference", bookmark_interval=1.0)
    result = Found()
    try:
        release = push_real_release(registry, real_mco)
        pull_secret = registry.pull_secret()
        worlds = {case.name: world_of(case, pull_secret) for case in CASES}
        ours_api.namespace("ignition")
        for world in worlds.values():
            for obj in world.objects():
                ours_api.create(as_created(obj))
        (work / "empty").mkdir()
        ours = ServerProcess(work / "empty", work / "ours" / "cache", extra=[
            "--kubernetes", "--kubeconfig", str(ours_api.kubeconfig), "--pod-namespace", "ignition", "--take-over",
            "--release-resolve", "--generate-bases", "--registry-ca-file", str(registry.ca_file),
            "--registry-allow", registry.host]).start()
        # HyperShift's code on the objects as the API holds them (user-ca-bundle-config.yaml is the
        # trusted-ca-bundle-managed ConfigMap serialized with the metadata the API server gave it).
        cpo = {case.name: hcp_inputs.run(held(ours_api, worlds[case.name]), work / f"cpo-{case.name}") for case in CASES}
        try:
            for case in CASES:
                wanted = cpo[case.name].config_maps

                def written(case: Case = case, wanted: dict[str, dict[str, Any]] = wanted) -> bool:
                    have = {n: ours_api.get("configmaps", case.namespace, n) for n in wanted}
                    return all(cm is not None and cm["data"] == wanted[n]["data"] for n, cm in have.items()) and \
                        set(core_of({cm["metadata"]["name"]: cm for cm in ours_api.list("configmaps", case.namespace)})) \
                        == set(core_of(wanted))
                try:
                    wait_for(written, timeout=60, what=f"the CPO's ConfigMaps in {case.namespace}")
                except AssertionError:
                    result.config_maps_differ[case.name] = sorted(wanted)
                # As the NodePool controller: the token Secret from the core ConfigMaps it counts (ours).
                ours_core = core_of({cm["metadata"]["name"]: cm for cm in ours_api.list("configmaps", case.namespace)})
                ours_api.create(token_secret(case, ours_core, release, pull_secret,
                                             wanted["machine-config-server"]["data"]["configuration-hash"]))
            pending = {case.name: case for case in CASES}

            def all_served() -> bool:
                for name, case in list(pending.items()):
                    try:
                        status, _headers, body = ours.get("/ignition", bearer(case.token))
                    except OSError:  # one poll's connection lost: asked again, as a node's Ignition would
                        continue
                    if status == 200:
                        result.ours[name] = body
                        del pending[name]
                return not pending

            try:
                wait_for(all_served, timeout=300, interval=1.0, what="our payloads")
            except AssertionError:
                for name, case in pending.items():
                    token = ours_api.list("secrets", case.namespace)
                    notes = [base64.b64decode(s["data"].get("message", "")).decode(errors="replace")
                             for s in token if "token" in s["data"]]
                    result.ours_failed[name] = f"{notes} {ours.logs()[-2000:]}"
        finally:
            ours.kill()
        # The reference, on the CPO's objects, one namespace at a time (its MCS step's fixed ports).
        for case in CASES:
            world = worlds[case.name]
            for obj in world.objects():
                if obj["kind"] != "HostedControlPlane":
                    reference_api.create(as_created(obj))
            for cm in cpo[case.name].config_maps.values():
                reference_api.create(as_created(cm))
            reference_api.create(token_secret(case, core_of(cpo[case.name].config_maps), release, pull_secret,
                                              cpo[case.name].config_maps["machine-config-server"]["data"]["configuration-hash"]))
            reference = ReferenceServer(reference_binary, work / f"reference-{case.name}", reference_api, case.namespace,
                                        ca_files=[registry.ca_file], feature_gate=case.feature_gate,
                                        img_overrides="=").start()
            try:
                result.reference[case.name] = reference.fetch(case.token)
            except AssertionError as failed:
                result.reference_failed[case.name] = str(failed)[-3000:]
            finally:
                reference.kill()
        for name, body in result.reference.items():
            (work / f"reference-{name}.json").write_bytes(body)
        for name, body in result.ours.items():
            (work / f"ours-{name}.json").write_bytes(body)
    finally:
        ours_api.close()
        reference_api.close()
        registry.stop()
    return result


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_taken_over_clusters_payload_equals_the_references_on_the_cpos_objects(found: Found, case: Case) -> None:
    assert case.name not in found.config_maps_differ, f"our ConfigMaps differ from the CPO's: {found.config_maps_differ}"
    assert case.name not in found.reference_failed, found.reference_failed[case.name]
    assert case.name not in found.ours_failed, f"ours served nothing: {found.ours_failed[case.name]}"
    reference, ours = found.reference[case.name], found.ours[case.name]
    differences = diff_payloads(reference, ours)
    equal, total = item_counts(reference, ours)
    assert not differences, f"{case.name}: {equal} of {total} items equal\n{report(differences)}"


def test_the_cases_reach_the_payload(found: Found) -> None:
    """The inputs varied are seen in the reference's payload (else the comparison proves little):
    the mirrors in registries.conf, the custom gates in the kubelet's configuration, the cluster proxy in MCO's proxy.env."""
    def file_text(body: bytes, path: str) -> str:
        from urllib.parse import unquote
        for f in json.loads(body)["storage"]["files"]:
            if f["path"] == path:
                source = f["contents"]["source"]
                raw = base64.b64decode(source.split(",", 1)[1]) if ";base64," in source else \
                    unquote(source.split(",", 1)[1]).encode()
                return (gzip.decompress(raw) if f["contents"].get("compression") == "gzip" else raw).decode()
        raise AssertionError(f"no {path}")

    assert "mirror-b.example.com/ocp/release" in file_text(found.reference["mirrors"], "/etc/containers/registries.conf")
    assert "mirror-b.example.com" not in file_text(found.reference["plain"], "/etc/containers/registries.conf")
    assert file_text(found.reference["gates"], "/etc/kubernetes/kubelet.conf") != \
        file_text(found.reference["plain"], "/etc/kubernetes/kubelet.conf")
    assert "proxy.example.com:3129" in file_text(found.reference["proxy"], "/etc/mco/proxy.env")
