"""The takeover controller on its own (reconcile/takeover.py), over an in-memory source that
answers as the API server does (resourceVersion preconditions, 409, finalizers): who writes,
what, when it fails, and letting go. End to end against the test API server and HyperShift's
own code: tests/system/test_takeover_kubernetes.py."""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
from typing import Any

import pytest

from ignition_server.basegen.steps import FEATURE_GATE
from ignition_server.model.objects import ObjectKey, object_key
from ignition_server.reconcile.faults import Faults
from ignition_server.reconcile.takeover import MAX_RACES, Takeover
from ignition_server.sources.events import Change
from ignition_server.sources.kube import KubeError
from ignition_server.takeover import ca_cert
from ignition_server.takeover.mcs_config import configuration_hash
from ignition_server.takeover.owned import DISABLE_IGNITION_SERVER, Named
from testsupport.hcp_inputs import hcp_world

CA = b"-----BEGIN CERTIFICATE-----\nMIIBours\n-----END CERTIFICATE-----\n"


class Source:
    """Objects by key, written as the API server writes them; every write and Event recorded."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.versions = itertools.count(100)
        self.objects: dict[ObjectKey, dict[str, Any]] = {}
        for obj in objects:
            self.put(obj)
        self.writes: list[tuple[str, str]] = []
        self.events: list[tuple[str, str]] = []
        self.conflicts = 0  # the next N writes answer 409

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = ca_cert.trim_secret(copy.deepcopy(obj)) if obj["kind"] == "Secret" else copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(next(self.versions))
        key = object_key(obj)
        assert key is not None
        self.objects[key] = obj
        return obj

    def get(self, key: ObjectKey) -> dict[str, Any] | None:
        return self.objects.get(key)

    def _raced(self) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise KubeError(409, "the object has been modified")

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._raced()
        key = object_key(obj)
        assert key is not None and key not in self.objects and not obj["metadata"].get("resourceVersion")
        self.writes.append(("create", str(key)))
        return self.put(obj)

    async def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._raced()
        key = object_key(obj)
        assert key is not None
        current = self.objects[key]
        if obj["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise KubeError(409, "the object has been modified")
        if current["metadata"].get("deletionTimestamp"):
            assert not set(obj["metadata"].get("finalizers") or []) - set(current["metadata"].get("finalizers") or [])
        self.writes.append(("replace", str(key)))
        if obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            del self.objects[key]
            return obj
        return self.put(obj)

    async def delete(self, key: ObjectKey, *, resource_version: str | None = None) -> bool:
        self._raced()
        current = self.objects.get(key)
        if current is None:
            return False
        if resource_version and resource_version != current["metadata"]["resourceVersion"]:
            raise KubeError(409, "precondition failed")
        self.writes.append(("delete", str(key)))
        if current["metadata"].get("finalizers"):
            self.cpo_deletes(key)
        else:
            del self.objects[key]
        return True

    def cpo_deletes(self, key: ObjectKey) -> None:
        """A DELETE of an object with finalizers: marked, kept."""
        marked = copy.deepcopy(self.objects[key])
        marked["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
        self.put(marked)

    async def record_event(self, about: ObjectKey, reason: str, message: str, *, warning: bool = True) -> None:
        self.events.append((reason, message))


def setup(*, writer: bool = True, ca: bytes | None = CA, drop: str | None = None, **spec: Any) -> tuple[Source, Takeover, ObjectKey]:
    world = hcp_world("hc1", **spec)
    source = Source([o for o in world.objects() if o["metadata"]["name"] != drop])
    takeover = Takeover(source=source, writer=lambda: writer, ca_pem=lambda: ca, faults=Faults())
    key = ObjectKey("HostedControlPlane", world.namespace, "hc1")
    return source, takeover, key


def secret(source: Source, key: ObjectKey) -> dict[str, Any] | None:
    return source.get(ObjectKey("Secret", key.namespace, ca_cert.NAME))


async def test_an_annotated_hcp_gets_its_config_maps_and_ca_secret_once() -> None:
    source, takeover, key = setup()
    await takeover.reconcile(key)
    assert sorted(source.writes) == sorted(("create", f"{kind} clusters-hc1/{name}") for kind, name in (
        ("ConfigMap", "machine-config-server"), ("ConfigMap", "ignition-config-fips"),
        ("ConfigMap", "ignition-config-worker-ssh"), ("Secret", ca_cert.NAME)))
    # machine-config-server before the core ConfigMaps the NodePool controller waits for (it then
    # makes token Secrets, whose renders read machine-config-server).
    assert source.writes[0] == ("create", "ConfigMap clusters-hc1/machine-config-server")
    made = secret(source, key)
    assert made is not None and base64.b64decode(made["data"]["tls.crt"]) == CA and made["data"]["tls.key"] == ""
    assert made["type"] == "kubernetes.io/tls" and made["metadata"]["finalizers"] == [ca_cert.FINALIZER]
    assert not source.events and takeover.queue.waiting_later(key)  # looked at again after `resync`
    # Again, with nothing changed: nothing written.
    await takeover.reconcile(key)
    assert len(source.writes) == 4


async def test_a_replica_that_does_not_write_writes_nothing_until_it_is_the_writer() -> None:
    world = hcp_world("hc1")
    source = Source(world.objects())
    writer = False
    takeover = Takeover(source=source, writer=lambda: writer, ca_pem=lambda: CA, faults=Faults(), standby=0.01)
    key = ObjectKey("HostedControlPlane", world.namespace, "hc1")
    takeover.changed(Change("ADDED", key, source.objects[key]))
    await takeover.queue.join()
    assert source.writes == [] and takeover.standing_by(key)
    await asyncio.sleep(0.05)
    assert source.writes == [] and takeover.standing_by(key)
    writer = True  # the Lease passes to it: queued again within `standby`
    await asyncio.sleep(0.05)
    await takeover.queue.join()
    assert len(source.writes) == 4 and not takeover.standing_by(key)
    takeover.cancel()


async def test_a_missing_input_is_an_event_on_the_hcp_and_a_retry_with_back_off() -> None:
    source, takeover, key = setup(drop=Named.KUBELET_CLIENT_CA)
    await takeover.reconcile(key)
    # The core ConfigMaps and the CA Secret do not wait for machine-config-server's inputs.
    assert ("create", "ConfigMap clusters-hc1/ignition-config-fips") in source.writes
    assert not any("machine-config-server" in w[1] for w in source.writes)
    assert [r for r, _ in source.events] == ["IgnitionTakeoverFailed"]
    assert "ConfigMap kubelet-client-ca is missing" in source.events[0][1]
    assert takeover.queue.waiting_later(key)
    await takeover.reconcile(key)  # the same failure: no second Event
    assert len(source.events) == 1
    # The input arrives: queued by the change, written, and said.
    cm = hcp_world("hc1").kubelet_client_ca()
    source.put(cm)
    takeover.changed(Change("ADDED", ObjectKey("ConfigMap", key.namespace, Named.KUBELET_CLIENT_CA), cm))
    assert takeover.queue.queued(key)
    await takeover.reconcile(key)
    assert ("create", "ConfigMap clusters-hc1/machine-config-server") in source.writes
    assert [r for r, _ in source.events] == ["IgnitionTakeoverFailed", "IgnitionTakeoverSucceeded"]


async def test_without_its_own_ca_the_config_maps_are_written_and_the_secret_is_not() -> None:
    source, takeover, key = setup(ca=None)
    await takeover.reconcile(key)
    assert secret(source, key) is None and len(source.writes) == 3
    assert "no CA of its own" in source.events[0][1]


async def test_a_conflict_is_decided_again_without_an_event_until_it_keeps_happening() -> None:
    source, takeover, key = setup()
    source.conflicts = 1
    await takeover.reconcile(key)
    assert not source.events and takeover.queue.waiting_later(key)
    await takeover.reconcile(key)
    assert len(source.writes) == 4 and not source.events
    source.objects.pop(ObjectKey("ConfigMap", key.namespace, "ignition-config-fips"))
    source.conflicts = MAX_RACES + 1
    for _ in range(MAX_RACES + 1):
        await takeover.reconcile(key)
    assert [r for r, _ in source.events] == ["IgnitionTakeoverFailed"] and "409" in source.events[0][1]


async def test_the_cpos_delete_leaves_ours_readable_and_unchanged() -> None:
    source, takeover, key = setup()
    await takeover.reconcile(key)
    source.cpo_deletes(ObjectKey("Secret", key.namespace, ca_cert.NAME))
    writes = len(source.writes)
    await takeover.reconcile(key)
    kept = secret(source, key)
    assert kept is not None and kept["metadata"]["deletionTimestamp"] and len(source.writes) == writes


def cpo_secret(namespace: str, type_: str = "kubernetes.io/tls") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": type_,
            "metadata": {"name": ca_cert.NAME, "namespace": namespace},
            "data": {"tls.crt": base64.b64encode(b"the CPO's CA").decode(), "tls.key": base64.b64encode(b"its key").decode()}}


async def test_the_cpos_own_ca_secret_is_taken_over_in_place_its_key_overwritten() -> None:
    source, takeover, key = setup()
    source.put(cpo_secret(key.namespace))
    assert "tls.key" not in secret(source, key)["data"]  # never kept
    await takeover.reconcile(key)
    assert ("replace", f"Secret clusters-hc1/{ca_cert.NAME}") in source.writes
    taken = secret(source, key)
    assert taken["data"] == {"tls.crt": base64.b64encode(CA).decode(), "tls.key": ""}
    assert ca_cert.FINALIZER in taken["metadata"]["finalizers"]


async def test_a_ca_secret_of_another_type_is_deleted_then_made_again() -> None:
    source, takeover, key = setup()
    source.put(cpo_secret(key.namespace, "Opaque"))
    await takeover.reconcile(key)
    assert ("delete", f"Secret clusters-hc1/{ca_cert.NAME}") in source.writes and secret(source, key) is None
    await takeover.reconcile(key)
    assert secret(source, key)["type"] == "kubernetes.io/tls"


async def test_a_ca_secret_being_deleted_without_our_finalizer_is_waited_for() -> None:
    source, takeover, key = setup()
    theirs = cpo_secret(key.namespace)
    theirs["metadata"]["finalizers"] = ["example.com/other"]
    source.put(theirs)
    source.cpo_deletes(ObjectKey("Secret", key.namespace, ca_cert.NAME))
    await takeover.reconcile(key)
    assert not any(ca_cert.NAME in w[1] for w in source.writes)
    assert "made again once gone" in source.events[0][1]


@pytest.mark.parametrize("how", ["annotation removed", "hcp deleting", "hcp gone"])
async def test_letting_go_removes_our_finalizer_and_our_secret(how: str) -> None:
    source, takeover, key = setup()
    await takeover.reconcile(key)
    hcp = source.objects[key]
    if how == "annotation removed":
        del hcp["metadata"]["annotations"][DISABLE_IGNITION_SERVER]
    elif how == "hcp deleting":
        hcp["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    else:
        del source.objects[key]
    writes = len(source.writes)
    await takeover.reconcile(key)
    assert secret(source, key) is None
    assert source.writes[writes:] == [("replace", f"Secret clusters-hc1/{ca_cert.NAME}"), ("delete", f"Secret clusters-hc1/{ca_cert.NAME}")]
    assert source.get(ObjectKey("ConfigMap", key.namespace, "machine-config-server")) is not None  # the CPO's again
    # The resync timer left from before finds nothing to do, and sets none again.
    takeover.queue.forget(key)
    await takeover.reconcile(key)
    assert len(source.writes) == writes + 2 and not takeover.queue.waiting_later(key) and not source.events


async def test_changes_queue_the_hcps_that_read_them_and_nothing_else() -> None:
    source, takeover, key = setup()
    takeover.changed(Change("ADDED", key, source.objects[key]))
    takeover.queue.forget(key)

    def queues(kind: str, namespace: str, name: str) -> bool:
        changed = ObjectKey(kind, namespace, name)
        takeover.changed(Change("MODIFIED", changed, {"kind": kind, "metadata": {"name": name, "namespace": namespace}}))
        queued = takeover.queue.queued(key)
        takeover.queue.forget(key)
        return queued

    for kind, name in [("Secret", "root-ca"), ("Secret", "pull-secret"), ("Secret", "ssh-key"), ("Secret", ca_cert.NAME),
                       ("ConfigMap", "kubelet-client-ca"), ("ConfigMap", "trusted-ca-bundle-managed"),
                       ("ConfigMap", "machine-config-server"), ("ConfigMap", "ignition-config-40-image-content-source")]:
        assert queues(kind, key.namespace, name), (kind, name)
    assert not queues("Secret", key.namespace, "token-workers-1234")
    assert not queues("ConfigMap", "clusters-other", "kubelet-client-ca")
    takeover.cancel()


def test_the_source_keeps_no_private_key_and_fetches_secrets_only_for_annotated_hcps() -> None:
    world = hcp_world("hc1")
    root_ca = ca_cert.trim_secret(world.root_ca())
    assert set(root_ca["data"]) == {"ca.crt"} and "ca.key" in world.root_ca()["data"]
    ours = {"data": {"tls.crt": "eA==", "tls.key": ""}, "metadata": {"name": ca_cert.NAME}}
    assert ca_cert.trim_secret(ours) == ours
    refs = {(k.kind, k.namespace, k.name) for k in ca_cert.references(world.hcp)}
    assert refs == {("Secret", "clusters-hc1", name) for name in ("root-ca", "pull-secret", "ssh-key", ca_cert.NAME)} | {
        ("ConfigMap", "clusters-hc1", name) for name in (
            "kubelet-client-ca", "trusted-ca-bundle-managed", "machine-config-server", "ignition-config-fips",
            "ignition-config-worker-ssh", "ignition-config-40-image-content-source")}
    del world.hcp["metadata"]["annotations"][DISABLE_IGNITION_SERVER]
    assert list(ca_cert.references(world.hcp)) == []
    assert ca_cert.is_ours({"metadata": {"name": ca_cert.NAME, "finalizers": [ca_cert.FINALIZER]}})
    assert not ca_cert.is_ours({"metadata": {"name": ca_cert.NAME}})


async def test_the_feature_gate_is_the_hcps_once_machine_config_server_was_written_for_it() -> None:
    gates = {"featureSet": "CustomNoUpgrade", "customNoUpgrade": {"enabled": ["EventedPLEG"]}}
    source, takeover, key = setup(configuration={"featureGate": gates})
    takeover.changed(Change("ADDED", key, source.objects[key]))
    written = configuration_hash(source.objects[key])
    gate = takeover.feature_gate(key.namespace, written)
    assert gate is not None and "featureSet: CustomNoUpgrade" in gate and "- EventedPLEG" in gate
    # machine-config-server still describes an older configuration: not known yet (its rewrite asks again).
    assert takeover.feature_gate(key.namespace, "0000") is None
    # No taken-over HCP there: HyperShift's default, as without a takeover.
    assert takeover.feature_gate("clusters-other", written) == FEATURE_GATE
    takeover.cancel()


async def test_the_route_hostnames_of_taken_over_hcps_are_told_as_they_change() -> None:
    told: list[frozenset[str]] = []
    source, takeover, key = setup(services=[{"service": "Ignition", "servicePublishingStrategy": {
        "type": "Route", "route": {"hostname": "Ignition.HC1.example.com."}}}])
    takeover.on_hosts = told.append
    takeover.changed(Change("ADDED", key, source.objects[key]))
    other = source.put({**copy.deepcopy(source.objects[key]), "metadata": {
        **copy.deepcopy(source.objects[key]["metadata"]), "namespace": "clusters-hc2"}})
    other["spec"]["services"][0]["servicePublishingStrategy"]["route"]["hostname"] = "ignition.hc2.example.com"
    takeover.changed(Change("ADDED", object_key(other), other))  # the same batch: told once
    await asyncio.sleep(0)
    takeover.changed(Change("MODIFIED", key, source.objects[key]))  # unchanged: not told again
    await asyncio.sleep(0)
    assert told == [frozenset({"ignition.hc1.example.com", "ignition.hc2.example.com"})]
    del source.objects[key]["metadata"]["annotations"][DISABLE_IGNITION_SERVER]
    takeover.changed(Change("MODIFIED", key, source.objects[key]))
    await asyncio.sleep(0)
    assert told[-1] == frozenset({"ignition.hc2.example.com"})
    takeover.cancel()
