"""The plan for one HostedControlPlane: what to create, update and delete so that its namespace
holds what the CPO would write, and nothing when it already does (a re-list writes nothing; a
cluster switching over, whose CPO wrote the same ConfigMaps, costs no write at all)."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ignition_server.takeover.core_ignition import CORE_LABEL, FIPS, IMAGE_CONTENT_SOURCE, WORKER_SSH
from ignition_server.takeover.mcs_config import NAME as MCS
from ignition_server.takeover.owned import DISABLE_IGNITION_SERVER, MissingInput
from ignition_server.takeover.plan import Plan, plan
from testsupport.hcp_inputs import HcpInputs, HcpWorld, hcp_world

MIRRORS = [{"source": "quay.io/openshift-release-dev/ocp-release", "mirrors": ["mirror.example/ocp"]}]


def applied(existing: dict[str, dict[str, Any]], done: Plan) -> dict[str, dict[str, Any]]:
    """The namespace after the plan, as the API server leaves it (a new resourceVersion per write)."""
    out = copy.deepcopy(existing)
    for number, obj in enumerate(done.writes):
        written = copy.deepcopy(obj)
        written["metadata"]["resourceVersion"] = str(1000 + number)
        out[obj["metadata"]["name"]] = written
    for obj in done.deletes:
        out.pop(obj["metadata"]["name"])
    return out


def test_a_fresh_namespace_gets_the_configmaps_and_a_second_pass_writes_nothing() -> None:
    world = hcp_world(trusted=True)
    first = plan(world.hcp, world.named(), {})
    assert sorted(o["metadata"]["name"] for o in first.writes) == sorted([MCS, FIPS, WORKER_SSH])
    assert all("resourceVersion" not in o["metadata"] for o in first.writes) and not first.deletes
    assert plan(world.hcp, world.named(), applied({}, first)) == Plan()


def test_a_changed_input_rewrites_only_what_it_changes_from_the_version_read() -> None:
    world = hcp_world(trusted=True)
    namespace = applied({}, plan(world.hcp, world.named(), {}))
    assert world.trusted_bundle is not None
    world.trusted_bundle["metadata"]["resourceVersion"] = "48999"  # serialized whole: the MCS ConfigMap changes
    again = plan(world.hcp, world.named(), namespace)
    assert [o["metadata"]["name"] for o in again.writes] == [MCS]
    assert again.writes[0]["metadata"]["resourceVersion"] == namespace[MCS]["metadata"]["resourceVersion"]
    world.hcp["spec"]["fips"] = True
    assert [o["metadata"]["name"] for o in plan(world.hcp, world.named(), namespace).writes] == [FIPS, MCS]


def test_an_update_keeps_what_others_put_there_as_the_cpos_does() -> None:
    world = hcp_world()
    namespace = applied({}, plan(world.hcp, world.named(), {}))
    fips = namespace[FIPS]
    fips["metadata"]["labels"]["team"] = "nodes"
    fips["metadata"]["ownerReferences"].insert(0, {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"})
    fips["metadata"]["ownerReferences"][1]["blockOwnerDeletion"] = False
    fips["data"]["stray"] = "removed"
    (update,) = plan(world.hcp, world.named(), namespace).writes
    assert update["metadata"]["labels"] == {"team": "nodes", CORE_LABEL: "true"}
    assert [r["kind"] for r in update["metadata"]["ownerReferences"]] == ["ConfigMap", "HostedControlPlane"]
    assert update["metadata"]["ownerReferences"][1]["blockOwnerDeletion"] is True
    assert list(update["data"]) == ["config"]


def test_the_mirrors_configmap_comes_and_goes_with_the_mirrors() -> None:
    world = hcp_world(mirrors=MIRRORS)
    namespace = applied({}, plan(world.hcp, world.named(), {}))
    assert IMAGE_CONTENT_SOURCE in namespace
    world.hcp["spec"]["imageContentSources"] = []
    gone = plan(world.hcp, world.named(), namespace)
    assert gone.writes == [] and [o["metadata"]["name"] for o in gone.deletes] == [IMAGE_CONTENT_SOURCE]
    assert gone.deletes[0] is namespace[IMAGE_CONTENT_SOURCE]  # with the uid and resourceVersion read


def test_without_the_annotation_nothing_is_planned() -> None:
    world = hcp_world(mirrors=MIRRORS)
    del world.hcp["metadata"]["annotations"][DISABLE_IGNITION_SERVER]
    assert plan(world.hcp, world.named(), {}) == Plan()


def test_missing_inputs_stop_what_the_cpo_stops() -> None:
    world = hcp_world()
    partial = plan(world.hcp, replace(world.named(), kubelet_client_ca=None), {})
    assert sorted(o["metadata"]["name"] for o in partial.writes) == [FIPS, WORKER_SSH]
    assert partial.error is not None and "kubelet-client-ca" in partial.error
    with pytest.raises(MissingInput, match="ssh-key"):
        plan(world.hcp, replace(world.named(), ssh_key=None), {})


def test_a_cluster_switching_over_costs_no_write(hcp_inputs: HcpInputs, tmp_path: Path) -> None:
    """Before the annotation, the CPO wrote these ConfigMaps itself; after it, the plan finds them right."""
    world: HcpWorld = hcp_world(mirrors=MIRRORS, trusted=True, fips=True)
    written_by_cpo = hcp_inputs.run(world.objects(), tmp_path).config_maps
    for number, cm in enumerate(written_by_cpo.values()):
        cm["metadata"].update({"resourceVersion": str(500 + number), "uid": f"cm-{number}"})
    assert plan(world.hcp, world.named(), written_by_cpo) == Plan()
