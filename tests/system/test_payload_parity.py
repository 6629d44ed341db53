"""Parity: for the same objects, our payload equals the one HyperShift's REAL ignition server
serves, item by item (testsupport/payload_diff.py), for every NodePool and every spec version a
node's Ignition may ask for.

Everything is real: the registry (TLS, htpasswd) holding a release with the real MCO binaries
and `render` (testsupport/real_release.py), HyperShift's ignition server (../shared/real) as its
deployment runs it, our server with `--release-resolve --generate-bases` (in Kubernetes mode on
the one test API server holding HyperShift's objects, testsupport/parity_world.py, and on the same
objects as manifests through the file source). The NodePools: an
override of a base file, of a base unit, an os-stream, extra user MachineConfigs (cluster A,
default TLS profile), one of cluster B (Modern TLS profile), one of cluster C (Old TLS profile,
an additional trust bundle). The token Secrets carry HyperShift's precondition hashes.

The module's fixture runs every binary once: the reference per cluster (its machine-config-server
step listens on fixed ports, so one at a time: ~8-12 s cold, ~4 s per further NodePool), then
ours in either source; the tests only compare what was fetched.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testsupport.harness import ServerProcess, bearer, wait_for, write_manifests
from testsupport.kubeapi import KubeAPI
from testsupport.manifests import token_status
from testsupport.parity_world import (
    CLIENT_VERSIONS,
    CLUSTERS,
    NODEPOOLS,
    NodePool,
    accept,
    cluster_inputs,
    cluster_objects,
    pointer_headers,
    token_secret,
    token_secret_name,
)
from testsupport.payload_diff import diff_payloads, item_counts, report
from testsupport.real_release import RealMCO, push_real_release, real_mco  # noqa: F401 (fixture)
from testsupport.reference_server import ReferenceServer, reference_binary  # noqa: F401 (fixture)
from testsupport.registry_world import Registry

IGNITION_REACHED = "hypershift.openshift.io/ignition-reached"
SOURCES = ("kubernetes", "files")  # our server on the same API server, and on the same objects as manifests


@dataclass
class Payloads:
    reference: dict[str, bytes] = field(default_factory=dict)  # NodePool key -> the reference's payload
    ours: dict[tuple[str, str, str], bytes] = field(default_factory=dict)  # (source, NodePool key, client version) -> ours
    our_failures: dict[tuple[str, str], str] = field(default_factory=dict)  # (source, NodePool key[@version]) -> why nothing
    reference_marked: set[str] = field(default_factory=set)  # NodePools whose token Secret the reference annotated
    reference_events: set[tuple[str, str]] = field(default_factory=set)  # (reason, token Secret) of its Events


def _token_message(api: KubeAPI, pool: NodePool) -> str:
    secret = api.get("secrets", pool.cluster.namespace, token_secret_name(pool)) or {}
    data = secret.get("data") or {}
    return " ".join(base64.b64decode(data[k]).decode(errors="replace") for k in ("reason", "message") if k in data)


def _file_message(source: Path, pool: NodePool) -> str:
    status = token_status(source / f"{pool.cluster.namespace}-{pool.name}.yaml")
    return f"{status.reason} {status.message}"


@pytest.fixture(scope="module")
def payloads(tmp_path_factory: pytest.TempPathFactory, real_mco: RealMCO, reference_binary: Path) -> Payloads:  # noqa: F811
    work = tmp_path_factory.mktemp("parity")
    registry = Registry(work / "registry").start()
    api = KubeAPI(work / "kubeapi", bookmark_interval=1.0)
    found = Payloads()
    try:
        release = push_real_release(registry, real_mco)
        inputs = {cluster: cluster_inputs(cluster, registry) for cluster in CLUSTERS}
        objects = {cluster: cluster_objects(cluster, inputs[cluster]) for cluster in CLUSTERS}
        tokens = {pool: token_secret(pool, release.pullspec, release.version, inputs[pool.cluster]) for pool in NODEPOOLS}
        for obj in [*(o for objs in objects.values() for o in objs), *tokens.values()]:
            api.create(obj)
        # The same objects as manifests, for our file source.
        source = work / "source"
        for cluster in CLUSTERS:
            write_manifests(source / f"{cluster.namespace}.yaml", *objects[cluster])
        for pool, obj in tokens.items():
            write_manifests(source / f"{pool.cluster.namespace}-{pool.name}.yaml", obj)
        # The reference: one process per control-plane namespace, as HyperShift deploys it; one
        # at a time (its MCS step's fixed ports).
        for cluster in CLUSTERS:
            reference = ReferenceServer(reference_binary, work / f"reference-{cluster.namespace}", api, cluster.namespace,
                                        ca_files=[registry.ca_file]).start()
            try:
                for pool in (p for p in NODEPOOLS if p.cluster == cluster):
                    found.reference[pool.key] = reference.fetch(pool.token_value, pointer_headers(pool))
                # Served, it marks the token Secret (an update of the object it read from its cache):
                # the test API server took the real client's writes.
                # (Not met: the first test says so; the payloads are still compared.)
                for pool in (p for p in NODEPOOLS if p.cluster == cluster):
                    with contextlib.suppress(AssertionError):
                        wait_for(lambda pool=pool: (api.get("secrets", cluster.namespace, token_secret_name(pool)) or {}).get(
                            "metadata", {}).get("annotations", {}).get(IGNITION_REACHED) == "True", timeout=30,
                            what=f"the reference's ignition-reached on {pool.key}")
                        found.reference_marked.add(pool.key)
                wanted = {("GetPayload", token_secret_name(p)) for p in NODEPOOLS if p.cluster == cluster}

                def events() -> bool:  # the recorder posts them in the background
                    found.reference_events.update((e.get("reason"), e.get("involvedObject", {}).get("name"))
                                                  for e in api.list("events", cluster.namespace))
                    return wanted <= found.reference_events

                with contextlib.suppress(AssertionError):
                    wait_for(events, timeout=30, what=f"the reference's Events in {cluster.namespace}")
            finally:
                reference.kill()
        # Ours, generating its bases: in Kubernetes mode on the same API server, and on the files.
        common = ["--release-resolve", "--generate-bases", "--registry-ca-file", str(registry.ca_file),
                  "--registry-allow", registry.host]
        (work / "empty").mkdir()
        api.namespace("ignition-server")
        kubernetes = ServerProcess(work / "empty", work / "ours-kubernetes" / "cache", extra=[
            "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition-server", *common])
        _fetch_ours(kubernetes, "kubernetes", found, lambda pool: _token_message(api, pool))
        files = ServerProcess(source, work / "ours-files" / "cache", extra=common)
        _fetch_ours(files, "files", found, lambda pool: _file_message(source, pool))
        _keep(work, found)
    finally:
        api.close()
        registry.stop()
    return found


def _fetch_ours(ours: ServerProcess, label: str, found: Payloads, message: Callable[[NodePool], str]) -> None:
    """Every NodePool's payload from our server at every client version (one deadline for all:
    a generator that never succeeds costs minutes, not minutes per NodePool)."""
    ours.start()
    try:
        served: set[str] = set()

        def all_served() -> bool:
            served.update(p.key for p in NODEPOOLS if p.key not in served and ours.get("/ignition", bearer(p.token_value))[0] == 200)
            return len(served) == len(NODEPOOLS)

        try:
            wait_for(all_served, timeout=240, interval=0.5, what=f"our payloads ({label})")
        except AssertionError:
            pass  # each NodePool not served says why, in its test
        for pool in NODEPOOLS:
            if pool.key not in served:
                found.our_failures[(label, pool.key)] = message(pool) or ours.logs()[-3000:]
                continue
            for version in CLIENT_VERSIONS:
                status, _headers, body = ours.get("/ignition", {**bearer(pool.token_value), **accept(version)})
                if status == 200:
                    found.ours[(label, pool.key, version)] = body
                else:
                    found.our_failures[(label, f"{pool.key}@{version}")] = f"{status} {body[:300]!r}"
    finally:
        ours.kill()


def _keep(work: Path, found: Payloads) -> None:
    """The fetched payloads beside the test's logs, to read a failure's whole context."""
    for key, body in found.reference.items():
        (work / f"reference-{key.replace('/', '_')}.json").write_bytes(body)
    for (label, key, version), body in found.ours.items():
        (work / f"ours-{label}-{key.replace('/', '_')}-{version}.json").write_bytes(body)


def test_the_reference_served_a_real_worker_payload(payloads: Payloads) -> None:
    """The reference ran for real: MCO's base (kubelet, CRI-O), the MCS's appended files, and
    each NodePool's own MachineConfigs are in its payloads."""
    assert set(payloads.reference) == {p.key for p in NODEPOOLS}
    for key, body in payloads.reference.items():
        config = json.loads(body)
        files = {f["path"] for f in config["storage"]["files"]}
        units = {u["name"] for u in config["systemd"]["units"]}
        assert {"/etc/kubernetes/kubelet.conf", "/etc/ignition-machine-config-encapsulated.json",
                "/etc/machine-config-daemon/node-annotations.json", "/etc/kubernetes/kubeconfig"} <= files, key
        assert {"kubelet.service", "crio.service", "machine-config-daemon-firstboot.service"} <= units, key
    assert "/etc/extra/settings.conf" in body_files(payloads.reference["clusters-a/extra"])
    # It wrote to the test API server as to a real one (client-go's protobuf bodies): the
    # ignition-reached annotation (an Update) and its Events (Creates).
    assert payloads.reference_marked == {p.key for p in NODEPOOLS}
    assert {("GetPayload", token_secret_name(p)) for p in NODEPOOLS} <= payloads.reference_events


def body_files(body: bytes) -> set[str]:
    return {f["path"] for f in json.loads(body)["storage"]["files"]}


@pytest.mark.parametrize("version", CLIENT_VERSIONS)
@pytest.mark.parametrize("pool", NODEPOOLS, ids=lambda p: p.key)
@pytest.mark.parametrize("source", SOURCES)
def test_our_payload_equals_the_references(payloads: Payloads, source: str, pool: NodePool, version: str) -> None:
    failure = payloads.our_failures.get((source, pool.key))
    assert failure is None, f"our server ({source}) served nothing for {pool.key}: {failure}"
    ours = payloads.ours.get((source, pool.key, version))
    assert ours is not None, payloads.our_failures.get((source, f"{pool.key}@{version}"))
    differences = diff_payloads(payloads.reference[pool.key], ours)
    equal, total = item_counts(payloads.reference[pool.key], ours)
    assert not differences, f"{pool.key} at {version} ({source}): {equal} of {total} items equal\n{report(differences)}"
