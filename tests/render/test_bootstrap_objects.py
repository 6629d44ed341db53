"""A token Secret's config as HyperShift's NodePool controller writes it: MachineConfigs beside the
kinds the MCO's bootstrap consumes (an ImageDigestMirrorSet for every cluster with
`spec.imageContentSources`). Those are found (cheaply: a MachineConfig is not parsed) for the
generated base, and skipped, not refused, by the render's parse of the config."""

from __future__ import annotations

import pytest
import yaml

from ignition_server.model.bootstrap_objects import NONE, bootstrap_objects
from ignition_server.render.inputs import InvalidConfig
from ignition_server.render.machineconfig import parse_machineconfigs
from testsupport.harness import EXAMPLE_MACHINECONFIG

IDMS = {"apiVersion": "config.openshift.io/v1", "kind": "ImageDigestMirrorSet", "metadata": {"name": "cluster"},
        "spec": {"imageDigestMirrors": [{"source": "quay.io/openshift-release-dev/ocp-release",
                                         "mirrors": ["mirror-a.example.com/ocp/release"]}]}}
KUBELET = {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "KubeletConfig", "metadata": {"name": "max-pods"},
           "spec": {"kubeletConfig": {"maxPods": 300},
                    "machineConfigPoolSelector": {"matchLabels": {"machineconfiguration.openshift.io/mco-built-in": ""}}}}


def hypershift_config(*objects: dict, pools: tuple[str, ...] = ("workers",)) -> str:
    """As the NodePool controller joins them (config.go `parse`): each document's text, sorted, `\\n---\\n`."""
    texts = [EXAMPLE_MACHINECONFIG.format(name=p) for p in pools] + [yaml.safe_dump(o) for o in objects]
    return "\n---\n".join(sorted(texts))


def test_the_consumed_kinds_are_found_in_order_and_machineconfigs_are_not() -> None:
    found = bootstrap_objects(hypershift_config(KUBELET, IDMS, pools=("a", "b")))
    assert [d["kind"] for d in found.documents] == ["ImageDigestMirrorSet", "KubeletConfig"]  # the config's order
    assert found.kinds == ("ImageDigestMirrorSet", "KubeletConfig")
    assert list(yaml.safe_load_all(found.text)) == [IDMS, KUBELET]
    assert "ImageDigestMirrorSet 'cluster'" in found.describe()
    assert bootstrap_objects(hypershift_config(pools=("a", "b"))) is NONE and NONE.digest == ""


def test_the_digest_follows_the_consumed_objects_only() -> None:
    one = bootstrap_objects(hypershift_config(IDMS, pools=("a",)))
    assert one.digest == bootstrap_objects(hypershift_config(IDMS, pools=("b", "c"))).digest  # other MachineConfigs
    other = {**IDMS, "spec": {"imageDigestMirrors": [{"source": "quay.io/x", "mirrors": ["m.example.com/x"]}]}}
    assert one.digest != bootstrap_objects(hypershift_config(other)).digest
    assert one.digest != bootstrap_objects(hypershift_config(IDMS, KUBELET)).digest


@pytest.mark.parametrize("text", [
    "{apiVersion: config.openshift.io/v1, kind: ImageDigestMirrorSet, metadata: {name: cluster}}",  # flow style
    "apiVersion: v1\nkind: List\nitems:\n- apiVersion: config.openshift.io/v1\n  kind: ImageDigestMirrorSet\n"
    "  metadata: {name: cluster}\n",
    'kind: "ImageDigestMirrorSet"\napiVersion: config.openshift.io/v1\nmetadata:\n  name: cluster\n',
    "--- !!map\nkind: ImageDigestMirrorSet\napiVersion: config.openshift.io/v1\nmetadata: {name: cluster}\n",
])
def test_documents_not_plainly_machineconfigs_are_parsed(text: str) -> None:
    assert bootstrap_objects(EXAMPLE_MACHINECONFIG.format(name="a") + "\n---\n" + text).kinds == ("ImageDigestMirrorSet",)


def test_what_looks_like_a_kind_inside_a_machineconfig_or_a_wrong_group_is_not_consumed() -> None:
    inner = EXAMPLE_MACHINECONFIG.format(name="a").replace(
        "source: data:,hello%20from%20a%0A", "source: |-\n            kind: ImageDigestMirrorSet")
    assert bootstrap_objects(inner) is NONE
    wrong = {**IDMS, "apiVersion": "example.com/v1"}
    assert bootstrap_objects(hypershift_config(wrong)) is NONE
    assert bootstrap_objects("a: [unclosed\n---\n" + yaml.safe_dump(IDMS)).kinds == ()  # the render says why


def test_the_renders_parse_skips_them_and_refuses_anything_else() -> None:
    text = hypershift_config(IDMS, KUBELET, pools=("a",))
    with pytest.raises(InvalidConfig, match="is not a machineconfiguration.openshift.io/v1 MachineConfig"):
        parse_machineconfigs(text)  # a base, or an imported one: no such thing in it
    assert [mc["metadata"]["name"] for mc in parse_machineconfigs(text, bootstrap_consumed=True)] == ["50-a"]
    pool = yaml.safe_dump({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
                           "metadata": {"name": "x"}})
    with pytest.raises(InvalidConfig, match="MachineConfigPool"):
        parse_machineconfigs(hypershift_config(IDMS) + "\n---\n" + pool, bootstrap_consumed=True)
