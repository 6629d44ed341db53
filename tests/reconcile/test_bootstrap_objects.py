"""A token Secret whose config holds an ImageDigestMirrorSet (KubeletConfig...), as HyperShift's
NodePool controller writes one for every cluster with `spec.imageContentSources`: with
`--generate-bases` it goes into the base's generation and key (NodePools with the same set share
a base, a different set is another), the render skips it, a restart generates and renders
nothing again; on an imported base, or none, it is refused naming the kind and the flag.
In-process over a real file source and cache; the generator records what it is asked (the
real MCO binaries run in tests/system/test_takeover_parity.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ignition_server.basegen.generator import BaseGenerator, BaseJob
from ignition_server.model.objects import ObjectKey
from ignition_server.model.token_secret import parse_token_secret
from ignition_server.reconcile.generated_bases import generated_key
from ignition_server.reconcile.reconciler import Reconciler
from ignition_server.reconcile.releases import ANNOTATION_RELEASE_CATALOG
from testsupport import mco_base
from testsupport.clock import Clock
from testsupport.harness import EXAMPLE_MACHINECONFIG, write_manifests
from testsupport.manifests import CA_PEM, build_token_secret, join_objects, kube_object
from testsupport.reconcile_world import file_reconciler, renders, settle

NAMESPACE = "clusters-a"


def mirror_set(*mirrors: str) -> dict:
    return {"apiVersion": "config.openshift.io/v1", "kind": "ImageDigestMirrorSet", "metadata": {"name": "cluster"},
            "spec": {"imageDigestMirrors": [{"source": "quay.io/openshift-release-dev/ocp-release", "mirrors": list(mirrors)}]}}


def nodepool(name: str, *objects: dict) -> dict:
    texts = [EXAMPLE_MACHINECONFIG.format(name=name)] + [yaml.safe_dump(o) for o in objects]
    return build_token_secret(namespace=NAMESPACE, nodepool=f"clusters/{name}", token=f"tok-{name}",
                              release=mco_base.RELEASE, release_version=mco_base.RELEASE_VERSION,
                              machineconfigs_yaml="\n---\n".join(sorted(texts)))


class Recording(BaseGenerator):
    """Asked for bases, runs nothing: the test generates them (adopt)."""

    asked: list[BaseJob]

    def request(self, job: BaseJob) -> None:
        if self.known(job.key) is None and all(j.key != job.key for j in self.asked):
            self.asked.append(job)


def world(tmp_path: Path, clock: Clock, store: dict[str, bytes]) -> tuple[Reconciler, object, Recording]:
    reconciler, source, _cache, source_dir, _outputs = file_reconciler(tmp_path, clock, shared={"ignition-server"})
    generator = Recording(files=None, load=store.get, save=store.__setitem__, work_dir=tmp_path)  # type: ignore[arg-type]
    generator.asked = []
    reconciler.base_waits.generator = generator
    return reconciler, source, generator


def write_catalog(source_dir: Path) -> None:
    images = {"rhel-coreos": mco_base.RHCOS, "rhel-coreos-extensions": mco_base.RHCOS_EXTENSIONS,
              "machine-config-operator": "quay.io/x/mco@sha256:" + "e" * 64}
    write_manifests(source_dir / "catalog.yaml", kube_object("ConfigMap", "ignition-server", "catalog", {
        "releases.yaml": yaml.safe_dump([{"pullSpec": mco_base.RELEASE, "version": mco_base.RELEASE_VERSION, "images": images}])},
        {ANNOTATION_RELEASE_CATALOG: "true"}))


def write_cluster(source_dir: Path) -> None:
    write_catalog(source_dir)
    write_manifests(source_dir / "inputs.yaml", *join_objects(NAMESPACE, '{"auths":{}}', CA_PEM)[:3],
                    kube_object("ConfigMap", NAMESPACE, "machine-config-server", {"cluster-infrastructure-02-config.yaml": "x"}))


def payload_paths(reconciler: Reconciler, name: str) -> set[str]:
    record = reconciler.cache.get_render(f"{NAMESPACE}/token-{name}-00000000")
    assert record is not None, f"{name} has no payload"
    return {f["path"] for f in json.loads(reconciler.cache.get_blob(record.blob_id))["storage"]["files"]}


async def test_mirror_sets_key_the_generated_base_and_a_restart_generates_and_renders_nothing(tmp_path: Path) -> None:
    clock, store = Clock(), {}
    reconciler, source, generator = world(tmp_path, clock, store)
    source_dir = tmp_path / "source"
    write_cluster(source_dir)
    a, b = mirror_set("mirror-a.example.com/release"), mirror_set("mirror-b.example.com/release")
    write_manifests(source_dir / "pools.yaml", nodepool("one", a), nodepool("two", a), nodepool("three", b),
                    nodepool("plain"))
    await settle(reconciler, source)  # type: ignore[arg-type]
    await settle(reconciler, source)  # type: ignore[arg-type]  (the configs read, then the bases asked)
    # Three bases for four NodePools: one per mirror set, one without.
    assert len(generator.asked) == 3, [j.bootstrap_objects for j in generator.asked]
    by_text = {json.dumps(list(yaml.safe_load_all(j.bootstrap_objects)), sort_keys=True): j for j in generator.asked}
    assert set(by_text) == {json.dumps(objects, sort_keys=True) for objects in ([a], [b], [])}
    one, two = (reconciler.tokens.get(ObjectKey("Secret", NAMESPACE, f"token-{n}-00000000")) for n in ("one", "two"))
    assert one is not None and two is not None and one.config_digest != two.config_digest
    assert reconciler.base_waits.consumed(one) is reconciler.base_waits.consumed(two)  # one copy of a set
    # Without any, the key is what it was before mirror sets were taken (an upgrade generates nothing again).
    plain = reconciler.tokens.get(ObjectKey("Secret", NAMESPACE, "token-plain-00000000"))
    assert plain is not None
    assert generated_key(plain, plain.annotations, source.get, reconciler.releases).key == by_text["[]"].key  # type: ignore[attr-defined]
    for job in generator.asked:
        generator.adopt(job.key, mco_base.base_yaml())
        reconciler.base_waits.generated(job.key)
    await settle(reconciler, source)  # type: ignore[arg-type]
    for name in ("one", "two", "three", "plain"):
        assert "/etc/" + name + ".conf" in payload_paths(reconciler, name)  # the mirror set skipped, not refused
    rendered = renders(reconciler)
    digests = {r.secret: r.inputs_digest for r in reconciler.cache.renders()}

    # A restart: the same cache and generated bases (the encrypted state), a new process.
    again, source2, generator2 = world(tmp_path, clock, store)
    await settle(again, source2)  # type: ignore[arg-type]
    await settle(again, source2)  # type: ignore[arg-type]
    assert generator2.asked == [] and renders(again) == 0
    assert {r.secret: r.inputs_digest for r in again.cache.renders()} == digests
    assert rendered == 4


async def test_without_a_generated_base_a_mirror_set_is_refused_naming_it_and_the_flag(tmp_path: Path) -> None:
    clock = Clock()
    reconciler, source, _cache, source_dir, _outputs = file_reconciler(tmp_path, clock, shared={"ignition-server"})
    # An imported base for the release (`base import`), and a cluster with none at all.
    write_catalog(source_dir)
    write_manifests(source_dir / "inputs.yaml", *join_objects(NAMESPACE, '{"auths":{}}', CA_PEM)[:3],
                    mco_base.base_configmap(NAMESPACE), *join_objects("clusters-b", '{"auths":{}}', CA_PEM)[:3])
    bare = nodepool("bare", mirror_set("m.example.com/x"))
    bare["metadata"]["namespace"] = "clusters-b"
    write_manifests(source_dir / "pools.yaml", nodepool("mirrored", mirror_set("m.example.com/x")), nodepool("fine"), bare)
    await settle(reconciler, source)
    statuses = {s["metadata"]["name"]: parse_token_secret(s) for s in yaml.safe_load_all((source_dir / "pools.yaml").read_text())}
    mirrored, bare_status = statuses["token-mirrored-00000000"], statuses["token-bare-00000000"]
    assert mirrored.reason == "InvalidConfig"
    assert "ImageDigestMirrorSet 'cluster'" in mirrored.message and "imported ConfigMap" in mirrored.message
    assert bare_status.reason == "InvalidConfig" and "--generate-bases" in bare_status.message
    assert statuses["token-fine-00000000"].reason == "AsExpected"  # the cluster's other NodePools are served
    assert reconciler.cache.get_render(f"{NAMESPACE}/token-mirrored-00000000") is None
