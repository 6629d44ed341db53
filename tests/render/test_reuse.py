"""Renders that share a RenderReuse (render/reuse.py) make the same bytes as renders that do not.

Many NodePools on one base, of every shape the merge and the checks treat differently (files
over the base's, the base's MachineConfig replaced, kernel arguments and the rest the daemon
applies, features of later spec versions, spec 2.x, configs the client would refuse), rendered
with one reuse in an interleaved order, twice, each compared with a render without it: bytes,
spec version and notes, or the same error. On MCO's shape (testsupport/mco_base.py), on a
generated base, and on HyperShift's real payload imported as a base (the real MCO binaries).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from ignition_server.render.checked import CheckedItems, Reduced
from ignition_server.render.inputs import InvalidConfig, NodePoolInputs, RenderedPayload
from ignition_server.render.machineconfig import parse_machineconfigs
from ignition_server.render.mco import ANNOTATION_SERVED_POOL
from ignition_server.render.payload import render_payload, renderer
from ignition_server.render.reuse import RenderReuse
from testsupport import mco_base
from testsupport.harness import EXAMPLE_MACHINECONFIG
from testsupport.manifests import CA_PEM, KUBECONFIG
from testsupport.real_base import RealCluster, nodepool_inputs, real_cluster, real_mco_tree
from testsupport.real_release import require_real_dir, unpack_tree


def mc(name: str, spec: dict) -> str:
    return yaml.safe_dump({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
                           "metadata": {"name": name}, "spec": spec}, sort_keys=False)


def file(path: str, text: str = "x", mode: int = 0o644, **extra: object) -> dict:
    return {"path": path, "mode": mode, "contents": {"source": "data:," + text}, **extra}


def config(version: str = "3.2.0", files: list | None = None, units: list | None = None, **rest: object) -> dict:
    out: dict = {"ignition": {"version": version}, **rest}
    if files:
        out["storage"] = {"files": files}
    if units:
        out["systemd"] = {"units": units}
    return out


def nodepool_configs(base_file: str, base_name: str) -> list[str]:
    """NodePool MachineConfig texts: `base_file` is a path the base writes, `base_name` its MachineConfig."""
    sha = "sha256-" + "0" * 64
    return [
        EXAMPLE_MACHINECONFIG.format(name="np-a"),
        EXAMPLE_MACHINECONFIG.format(name="np-b"),
        mc("50-over-base", {"config": config(files=[file(base_file, "mine", 0o600)])}),
        mc("60-daemon", {"kernelArguments": ["nosmt", "a=b"], "extensions": ["usbguard"], "fips": True,
                         "kernelType": "realtime", "config": config(files=[file("/etc/d", "d")])}),
        mc("50-hash", {"config": config("3.1.0", files=[{"path": "/etc/remote", "contents": {"source": "https://example.com/x",
                                                                                             "verification": {"hash": sha}}}])}),
        mc("50-setuid", {"config": config("3.6.0", files=[file("/usr/local/bin/s", "s", 0o4755)])}),
        mc("50-kargs-in-config", {"config": config("3.3.0", kernelArguments={"shouldExist": ["k=1"], "shouldNotExist": ["q"]})}),
        mc(base_name, {"config": config(files=[file("/etc/replaced", "r")])}),  # replaces the base's MachineConfig
        mc("50-spec2", {"config": {"ignition": {"version": "2.2.0"},
                                   "storage": {"files": [{"filesystem": "root", "path": "/etc/two", "mode": 420,
                                                          "contents": {"source": "data:,two"}}]}}}),
        mc("50-units", {"config": config(units=[{"name": "a.service", "enabled": True, "contents": "[Unit]\n"},
                                                {"name": "kubelet.service", "dropins": [{"name": "99-x.conf", "contents": "[Service]\n"}]}])}),
        # What the client refuses: the same error with and without the reuse.
        mc("50-unknown-key", {"config": config(files=[file("/etc/u", "u", colour="blue")])}),
        mc("50-bad-unit", {"config": config(units=[{"name": "nosuffix", "contents": "x"}])}),
        mc("50-bad-url", {"config": config(files=[{"path": "/etc/b", "contents": {"source": "ftp://example.com/b"}}])}),
        mc("50-relative", {"config": config(files=[file("etc/relative")])}),
        mc("50-dup", {"config": config(files=[file(base_file, "again")])}) + "---\n"
        + mc("51-dup", {"config": config(files=[file(base_file, "and again")])}),
        mc("50-link-over-file", {"config": config(storage={"links": [{"path": base_file, "target": "/etc/elsewhere"}]})}),
        # Refused only once merged: the base writes files below this link.
        mc("50-link-over-base-dir", {"config": config(storage={"links": [{"path": base_file.rpartition("/")[0],
                                                                          "target": "/tmp"}]})}),
        "not: [valid",
    ]


def outcome(render: Callable[[NodePoolInputs], RenderedPayload], inputs: NodePoolInputs) -> tuple:
    try:
        rendered = render(inputs)
    except InvalidConfig as exc:
        return ("error", type(exc).__name__, str(exc))
    return ("ok", rendered.body, rendered.min_version, rendered.notes)


def assert_same_with_reuse(all_inputs: list[NodePoolInputs], reuse: RenderReuse) -> list[tuple]:
    """Each render with `reuse` (in this order, then again) is the render without it."""
    expected = [outcome(render_payload, inputs) for inputs in all_inputs]
    with_reuse = renderer(reuse)
    for _ in range(2):
        got = [outcome(with_reuse, inputs) for inputs in all_inputs]
        for inputs, want, have in zip(all_inputs, expected, got):
            assert have == want, inputs.nodepool
    return expected


def synthetic_inputs(base: str | None, texts: list[str], cluster: str) -> list[NodePoolInputs]:
    return [NodePoolInputs(nodepool=f"clusters/{cluster}-{i}", secret=f"clusters-{cluster}/t{i}", machineconfigs_yaml=text,
                           release=mco_base.RELEASE, release_version=mco_base.RELEASE_VERSION,
                           pull_secret='{"auths":{}}', bootstrap_kubeconfig=KUBECONFIG, ca_bundle=CA_PEM,
                           mco_base_yaml=base, os_image_url=mco_base.RHCOS, extensions_image=mco_base.RHCOS_EXTENSIONS,
                           kubelet_ca=CA_PEM, cloud_ca=CA_PEM)
            for i, text in enumerate(texts)]


def parses(text: str) -> bool:
    try:
        parse_machineconfigs(text)
    except InvalidConfig:
        return False
    return True


def interleave(*groups: list[NodePoolInputs]) -> list[NodePoolInputs]:
    """One of each group in turn, as the work queue's round robin over namespaces takes them."""
    return [inputs for row in zip(*groups) for inputs in row]


def generated_base() -> str:
    mcs = mco_base.base_machineconfigs()
    for m in mcs:
        m["metadata"]["annotations"][ANNOTATION_SERVED_POOL] = "master"
    return yaml.safe_dump_all(mcs, sort_keys=False)


def test_many_nodepools_on_mco_shaped_bases_render_the_same_bytes_with_the_reuse() -> None:
    texts = nodepool_configs("/etc/kubernetes/kubelet.conf", "00-worker")
    groups = [synthetic_inputs(mco_base.base_yaml(kubelet_log_level=str(level)), texts, f"c{level}") for level in (2, 4)]
    groups.append(synthetic_inputs(generated_base(), texts, "generated"))
    groups.append(synthetic_inputs(None, texts, "nobase"))
    reuse = RenderReuse(bases=2, items=64)  # smaller than the work: entries go and come back
    expected = assert_same_with_reuse(interleave(*groups), reuse)
    assert reuse.base_misses == 3 and reuse.base_unpacked > 0  # parsed once each, then unpacked in their turn
    # The shapes above are what they say: most render, those meant to fail fail, at several versions.
    assert sum(1 for e in expected if e[0] == "ok") >= 4 * 10
    assert {e[2] for e in expected if e[0] == "ok"} >= {"3.0.0", "3.1.0", "3.3.0", "3.6.0"}
    errors = [e[2] for e in expected if e[0] == "error"]
    assert len(errors) == 4 * 6 and any("is below" in e and "which is a link" in e for e in errors)


def test_a_changed_base_is_never_served_from_the_reuse() -> None:
    reuse = RenderReuse()
    render = renderer(reuse)
    before = synthetic_inputs(mco_base.base_yaml(), [EXAMPLE_MACHINECONFIG.format(name="p")], "c")[0]
    first = render(before)
    # One byte of one file of the base changes (a log level 2 → 3), nothing else.
    changed = replace(before, mco_base_yaml=mco_base.base_yaml(kubelet_log_level="3"))
    assert changed.mco_base_yaml != before.mco_base_yaml
    after = render(changed)
    assert after.body != first.body
    assert after == render_payload(changed)
    assert render(before) == first  # and back
    assert (reuse.base_misses, reuse.base_hits) == (2, 1)


def test_the_reuse_parses_a_base_once_and_never_changes_it() -> None:
    reuse = RenderReuse()
    render = renderer(reuse)
    base = mco_base.base_yaml()
    texts = nodepool_configs("/etc/kubernetes/kubelet.conf", "00-worker")
    for inputs in synthetic_inputs(base, texts, "c"):
        outcome(render, inputs)
    reaching_the_base = [text for text in texts if parses(text)]  # the NodePool's own are parsed first
    assert len(reaching_the_base) > 10
    assert (reuse.base_misses, reuse.base_hits, reuse.base_unpacked) == (1, len(reaching_the_base) - 1, 0)
    assert reuse.base(base) == parse_machineconfigs(base)  # renders read the shared MachineConfigs, never wrote them


def test_a_base_json_cannot_copy_is_parsed_again_rather_than_packed() -> None:
    """A YAML alias puts one object in two places; a date is no JSON: neither is packed, and
    renders on them are the same with the reuse (parsed again once the objects are out)."""
    aliased = mco_base.base_yaml() + "---\n" + mc("98-aliased", {"config": config(files=[file("/etc/aliased")])}).replace(
        "metadata:\n", "metadata:\n  labels: &labels {a: b}\n  annotations: *labels\n", 1)
    dated = mco_base.base_yaml() + "---\n" + mc("98-dated", {"config": config(files=[file("/etc/dated")])}).replace(
        "metadata:\n", "metadata:\n  annotations: {since: 2026-01-01}\n", 1)
    texts = [EXAMPLE_MACHINECONFIG.format(name=f"p{i}") for i in range(3)]
    reuse = RenderReuse(bases=1)
    assert_same_with_reuse(interleave(synthetic_inputs(aliased, texts, "a"), synthetic_inputs(dated, texts, "d")), reuse)
    assert reuse.base_unpacked == 0 and reuse.base_misses == 2 * 2 * 3


def test_nothing_is_packed_beyond_its_budget() -> None:
    reuse = RenderReuse(bases=1, packed_bytes=0)
    texts = [EXAMPLE_MACHINECONFIG.format(name=f"p{i}") for i in range(2)]
    bases = [mco_base.base_yaml(kubelet_log_level=str(level)) for level in (2, 3)]
    assert_same_with_reuse(interleave(*(synthetic_inputs(base, texts, f"c{i}") for i, base in enumerate(bases))), reuse)
    assert reuse.base_unpacked == 0 and reuse.base_misses == 2 * 2 * 2


# ---------------------------------------------------------------------------------------------
# HyperShift's real payload as the base (the real MCO binaries; skipped locally without them)


@pytest.fixture(scope="module")
def real_clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RealCluster]]:
    work = tmp_path_factory.mktemp("real-base")
    real = real_mco_tree(unpack_tree(require_real_dir(), work / "mco"))
    yield [real_cluster(real, work / name, name) for name in ("c1", "c2")]


def test_many_nodepools_on_real_bases_render_the_same_bytes_with_the_reuse(real_clusters: list[RealCluster]) -> None:
    texts = nodepool_configs("/etc/kubernetes/kubelet.conf", "00-worker-mcs")
    groups = [[nodepool_inputs(cluster, i, text) for i, text in enumerate(texts)] for cluster in real_clusters]
    groups.append([nodepool_inputs(real_clusters[0], 100 + i) for i in range(len(texts))])  # the fleet's shape
    reuse = RenderReuse(bases=1)  # the round robin of many clusters: each base unpacked in its turn
    expected = assert_same_with_reuse(interleave(*groups), reuse)
    assert reuse.base_misses == 2 and reuse.base_unpacked > 10
    ok = [e for e in expected if e[0] == "ok"]
    assert sum(1 for e in ok if len(e[1]) > 400_000) >= 3 * 10  # real size (but where the base was replaced)


class Recording(CheckedItems):
    """CheckedItems that keeps what each check looked at (the items it did not know clean)."""

    def __init__(self) -> None:
        super().__init__()
        self.looked_at: list[Reduced] = []

    def reduce(self, config: dict, check: str, version: str) -> Reduced:
        reduced = super().reduce(config, check, version)
        self.looked_at.append(reduced)
        return reduced


def test_a_second_nodepool_checks_only_what_is_its_own(real_clusters: list[RealCluster]) -> None:
    """The base's items are checked by the first render; the next NodePool's checks look only at
    the items that differ (its own file and unit, the appended files that name it)."""
    reuse = RenderReuse()
    reuse.checked = recording = Recording()
    render = renderer(reuse)
    cluster = real_clusters[0]
    first = json.loads(render(nodepool_inputs(cluster, 1)).body)
    recording.looked_at.clear()
    second = json.loads(render(nodepool_inputs(cluster, 2)).body)
    kept = [f["path"] for r in recording.looked_at for f in r.config.get("storage", {}).get("files", [])] + \
        [u["name"] for r in recording.looked_at for u in r.config.get("systemd", {}).get("units", [])]
    differing = [f["path"] for f in second["storage"]["files"] if f not in first["storage"]["files"]] + \
                [u["name"] for u in second["systemd"]["units"] if u not in first["systemd"]["units"]]
    assert len(second["storage"]["files"]) > 50
    assert sorted(set(kept)) == sorted(differing)
    assert "/etc/c1-p2.conf" in kept and "/etc/mcs-machine-config-content.json" in kept
    assert len(kept) < 2 * len(differing)  # all its checks together (its own MachineConfig at its own version too)


def test_a_real_base_of_a_changed_cluster_is_never_served_from_the_reuse(real_clusters: list[RealCluster]) -> None:
    reuse = RenderReuse()
    render = renderer(reuse)
    one, other = real_clusters
    served = render(nodepool_inputs(one, 1))
    # The same NodePool inputs but the other cluster's base (its own certificates and pull secret).
    swapped = nodepool_inputs(one, 1, base_yaml=other.base_yaml)
    assert render(swapped) == render_payload(swapped) != served


def test_real_base_files_are_the_reference_payload(real_clusters: list[RealCluster], tmp_path: Path) -> None:
    """The base is HyperShift's payload: every file it holds is in the NodePool's payload, as it was."""
    cluster = real_clusters[0]
    reference = {f["path"]: f for f in json.loads(cluster.payload)["storage"]["files"]}
    body = json.loads(renderer()(nodepool_inputs(cluster, 0)).body)
    served = {f["path"]: f for f in body["storage"]["files"]}
    kept = set(reference) - {"/etc/kubernetes/kubeconfig", "/etc/mcs-machine-config-content.json",
                             "/etc/ignition-machine-config-encapsulated.json",
                             "/etc/machine-config-daemon/node-annotations.json", "/etc/kubernetes/kubelet-ca.crt"}
    assert len(kept) > 40
    assert all(served[p]["contents"] == reference[p]["contents"] for p in kept)


# ---------------------------------------------------------------------------------------------
# Sized for the fleet of issue 33: a cold start renders 440 clusters' NodePools in round robin


def test_the_reuse_holds_a_lap_of_the_seeds_fleet() -> None:
    """The work queue's round robin meets each of 440 clusters once a lap: a cache that holds less
    than a lap drops each entry before it is asked again (least recently used first) and is never
    hit. At 440 x 12 the packed bases (32 MiB) and checked items (8,192) held less: every render
    parsed its base's YAML again. Extrapolated from a lap over 4 clusters of the seeds fleet."""
    from ignition_server.base_import import BASE_KEY, base_configmap, from_mcs_config
    from ignition_server.render import reuse as reuse_module
    from testsupport import fleet as fleetgen, seeds_fleet as seeds

    release = seeds.release_part(seeds.DEFAULT_SEED)
    reuse = RenderReuse()
    render = renderer(reuse)
    learned, packed = [], []
    for cluster in range(4):
        own = seeds.cluster_secrets(seeds.DEFAULT_SEED, cluster)
        base = base_configmap(from_mcs_config(seeds.mcs_config(seeds.DEFAULT_SEED, cluster, release)), name="b",
                              namespace="n", release=seeds.RELEASE, version=seeds.RELEASE_VERSION)["data"][BASE_KEY]
        render(NodePoolInputs(
            nodepool=fleetgen.nodepool_of(cluster, 0), secret="n/t", machineconfigs_yaml=seeds.nodepool_machineconfig(cluster, 0),
            release=seeds.RELEASE, release_version=seeds.RELEASE_VERSION, pull_secret=own[seeds.PULL_SECRET_PATH],
            bootstrap_kubeconfig=own["kubeconfig"], kubelet_ca=own["signer-ca"], mco_base_yaml=base,
            os_image_url=seeds.ART + "c" * 64, extensions_image=seeds.ART + "e" * 64))
        learned.append(len(reuse.checked))
        packed.append(len(reuse_module._pack(tuple(parse_machineconfigs(base))) or b""))
    per_cluster = (learned[3] - learned[1]) / 2  # a cluster's own items and its render's, at every check
    assert per_cluster > 20 and min(packed) > 50_000
    assert reuse_module.ITEMS >= learned[1] + 438 * per_cluster
    assert reuse_module.PACKED_BYTES >= 440 * max(packed)
