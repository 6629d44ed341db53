"""What the takeover does with the inputs it is given, as HyperShift's own code does (hcp-inputs run
on the same objects): a missing object the CPO requires writes nothing and names it; a key missing
inside one writes what the CPO writes; the core ConfigMaps counted are the CPO's; the hash is the
one HyperShift's NodePool controller writes from the HostedCluster."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest

from ignition_server.takeover import core_ignition
from ignition_server.takeover.core_ignition import FIPS, IMAGE_CONTENT_SOURCE, WORKER_SSH, core_config_maps, names
from ignition_server.takeover.mcs_config import configuration_hash, fnv1a32, mcs_config_map
from ignition_server.takeover.owned import MissingInput, Named, taken_over
from testsupport.hcp_inputs import HcpInputs, as_documents, hcp_world

MISSING = {
    "root-ca": ("root_ca", "Secret root-ca"),
    "pull-secret": ("pull_secret", "Secret pull-secret"),
    "kubelet-client-ca": ("kubelet_client_ca", "ConfigMap kubelet-client-ca"),
    "ssh-key": ("ssh_key", "ssh-key"),
}


def compute(hcp: dict, named: Named) -> dict:
    return {"machine-config-server": mcs_config_map(hcp, named), **core_config_maps(hcp, named)}


@pytest.mark.parametrize("missing", sorted(MISSING))
def test_a_missing_required_object_writes_nothing_and_is_named(missing: str, hcp_inputs: HcpInputs,
                                                               tmp_path: Path) -> None:
    world = hcp_world(mirrors=[{"source": "quay.io/a", "mirrors": ["m.example/a"]}])
    field, named_as = MISSING[missing]
    objects = [o for o in world.objects() if o["metadata"]["name"] != missing or o["kind"] == "HostedControlPlane"]
    assert named_as in hcp_inputs.fails(objects, tmp_path)
    with pytest.raises(MissingInput, match=named_as):
        compute(world.hcp, replace(world.named(), **{field: None}))


def test_an_ssh_key_secret_without_its_key_is_refused_as_the_cpo_refuses_it(hcp_inputs: HcpInputs,
                                                                            tmp_path: Path) -> None:
    world = hcp_world()
    assert world.ssh_secret is not None
    world.ssh_secret["data"] = {"id_ed25519.pub": "eA=="}
    assert "id_rsa.pub" in hcp_inputs.fails(world.objects(), tmp_path)
    with pytest.raises(MissingInput, match="id_rsa.pub"):
        core_config_maps(world.hcp, world.named())


def test_ca_objects_without_their_key_write_empty_cas_as_the_cpo_does(hcp_inputs: HcpInputs, tmp_path: Path) -> None:
    world = hcp_world()
    objects = world.objects()
    for obj in objects:
        if obj["metadata"]["name"] in ("root-ca", "kubelet-client-ca"):
            obj["data"] = {"other": "eA=="}
    cpo = hcp_inputs.run(objects, tmp_path).config_maps["machine-config-server"]["data"]
    named = Named(*(next(o for o in objects if o["metadata"]["name"] == n)
                    for n in ("root-ca", "pull-secret", "kubelet-client-ca")), ssh_key=world.ssh_secret)
    assert cpo["root-ca.crt"] == cpo["signer-ca.crt"] == ""
    assert mcs_config_map(world.hcp, named)["data"] == cpo


def test_the_mirrors_config_map_exists_only_while_there_are_mirrors(hcp_inputs: HcpInputs, tmp_path: Path) -> None:
    """HyperShift's NodePool controller wants exactly 2 core ConfigMaps, 3 with mirrors (on releases
    whose NodePool controller renders the node's HAProxy); the CPO deletes the mirrors' one when the
    HCP's imageContentSources empties."""
    with_mirrors = hcp_world(mirrors=[{"source": "quay.io/a", "mirrors": ["m.example/a", "n.example/a"]}])
    without = copy.deepcopy(with_mirrors)
    without.hcp["spec"]["imageContentSources"] = []
    assert names(with_mirrors.hcp) == (FIPS, WORKER_SSH, IMAGE_CONTENT_SOURCE)
    assert names(without.hcp) == (FIPS, WORKER_SSH)
    for world, where in ((with_mirrors, "with"), (without, "without")):
        cpo = hcp_inputs.run(world.objects(), tmp_path / where).config_maps
        core = {n for n, cm in cpo.items() if cm["metadata"].get("labels", {}).get(core_ignition.CORE_LABEL) == "true"}
        assert core == set(names(world.hcp)) == set(core_config_maps(world.hcp, world.named()))


def test_the_configuration_hash_of_the_hosted_cluster_is_the_hcps() -> None:
    """The NodePool controller hashes the HostedCluster's spec.configuration, which HyperShift's
    operator copies into the HCP's: the same object gives the same hash from either."""
    world = hcp_world(configuration={"apiServer": {"audit": {"profile": "Default"}},
                                     "image": {"registrySources": {"allowedRegistries": ["quay.io"]}}})
    hosted_cluster = {"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
                      "metadata": {"name": "hc1", "namespace": "clusters"},
                      "spec": {"configuration": copy.deepcopy(world.hcp["spec"]["configuration"]),
                               "platform": {"type": "None"}}}
    assert configuration_hash(hosted_cluster) == configuration_hash(world.hcp)
    assert configuration_hash({"spec": {}}) == fnv1a32(b"null")


def test_fnv1a32_is_hypershifts_hash_bytes() -> None:
    assert fnv1a32(b"") == "811c9dc5"
    assert fnv1a32(b"a") == "e40c292c"
    assert fnv1a32(b"foobar") == "bf9cf968"


def test_taken_over_is_the_annotation_with_any_value() -> None:
    world = hcp_world()
    assert taken_over(world.hcp)
    world.hcp["metadata"]["annotations"]["hypershift.openshift.io/disable-ignition-server"] = ""
    assert taken_over(world.hcp)
    world.hcp["metadata"]["annotations"].clear()
    assert not taken_over(world.hcp)


def test_the_objects_handed_to_hcp_inputs_read_back_as_given() -> None:
    """JSON documents: PyYAML and go-yaml read every string the same way."""
    import yaml
    objects = hcp_world(trusted=True).objects()
    assert list(yaml.safe_load_all(as_documents(objects))) == objects


def test_a_slim_copy_is_refused_not_serialized_as_its_digest() -> None:
    """The CPO serializes trusted-ca-bundle-managed whole: a source's slim copy (values over 4 KiB
    held as digests) would put "sha256:..." where the bundle goes."""
    from ignition_server.model.objects import slim
    world = hcp_world(trusted=True)
    assert world.trusted_bundle is not None
    world.trusted_bundle["data"]["ca-bundle.crt"] = "x" * 5000
    with pytest.raises(ValueError, match="trusted-ca-bundle-managed is a slim copy"):
        replace(world.named(), trusted_ca_bundle=slim(world.trusted_bundle))
