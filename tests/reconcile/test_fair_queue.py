"""The reconciler over its fair work queue, file source (issues 30 and 33): one tenant's flood
does not hold back another tenant's first payload, and a restart renders nothing whose inputs
did not change, whatever order the first listing meets objects in."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

import pytest

from ignition_server.auth.rotation_policy import RotationPolicy
from ignition_server.auth.tokens import TokenAuthenticator
from ignition_server.metrics import ServerMetrics
from ignition_server.model.token_secret import is_token_secret
from ignition_server.reconcile.nodepools import NodePools
from ignition_server.reconcile.reconciler import Reconciler
from ignition_server.reconcile.releases import ANNOTATION_RELEASE_CATALOG
from ignition_server.reconcile.tenancy import Tenancy
from ignition_server.reconcile.wiring import build_reconciliation
from ignition_server.render.inputs import NodePoolInputs, RenderedPayload
from ignition_server.render.payload import render_payload
from ignition_server.sources.files import FileSource
from payload_cache import CacheConfig, PayloadCache
from testsupport import mco_base
from testsupport.clock import T0, Clock
from testsupport.harness import EXAMPLE_MACHINECONFIG, write_manifests
from testsupport.manifests import CA_PEM, build_token_secret, join_objects, kube_object
from testsupport.reconcile_world import renders, settle
from testsupport.reconciler_idle import wait_idle

SHARED = "ignition-server"
PULL = '{"auths":{"quay.io":{"auth":"dTpw"}}}'


def join_inputs(namespace: str, pull_secret: str = PULL) -> list[dict[str, Any]]:
    """Pull secret, kubeconfig and CA bundle: what a payload without a release component reads."""
    return join_objects(namespace, pull_secret, CA_PEM)[:3]


class RenderOrder:
    """The renderer, recording which NodePool each render was for, in the order they started."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def __call__(self, inputs: NodePoolInputs) -> RenderedPayload:
        self.started.append(inputs.nodepool)
        return render_payload(inputs)


def pool(namespace: str, name: str, *, release: str = "", version: str = "", created: str | None = None) -> dict[str, Any]:
    secret = build_token_secret(namespace=namespace, nodepool=f"{namespace}/{name}", token=f"tok-{namespace}-{name}",
                                release=release, release_version=version,
                                machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=name.replace("-", "")),
                                generation_time=T0)
    if created:
        secret["metadata"]["creationTimestamp"] = created
    return secret


def open_world(root: Path, clock: Clock, renderer: Callable[[NodePoolInputs], RenderedPayload] = render_payload,
               ) -> tuple[Reconciler, FileSource, PayloadCache]:
    """A reconciler as `serve` opens it over `root/source` and `root/cache` (again, after a restart),
    the server's own namespace shared, no debounce (the tests settle it)."""
    (root / "source").mkdir(exist_ok=True)
    cache = PayloadCache.open(CacheConfig(cache_dir=root / "cache"))
    source = FileSource(root / "source", retain=lambda obj: not is_token_secret(obj))
    reconciler = build_reconciliation(source=source, cache=cache, renderer=renderer, policy=RotationPolicy(ttl=100.0),
                                      metrics=ServerMetrics(), clock=clock, tenancy=Tenancy(frozenset({SHARED})),
                                      debounce=0.0).reconciler
    source.attach(reconciler.handle)
    return reconciler, source, cache


async def test_another_tenants_first_payload_goes_ahead_of_a_flood(tmp_path: Path) -> None:
    order = RenderOrder()
    clock = Clock()
    reconciler, source, cache = open_world(tmp_path, clock, order)
    flood = [pool("clusters-flood", f"np-{i}") for i in range(150)]
    write_manifests(tmp_path / "source" / "flood.yaml", *join_inputs("clusters-flood"), *flood)
    await source.poll_once()  # the flood is indexed and queued; its renders are under way
    assert len(order.started) < 50

    victim = pool("clusters-victim", "np-0")
    write_manifests(tmp_path / "source" / "victim.yaml", *join_inputs("clusters-victim"), victim)
    await source.poll_once()
    indexed_at = len(order.started)
    # Indexed with its batch, before any render of it: the node's token is known (never 511).
    grant = TokenAuthenticator(cache, clock).authenticate("tok-clusters-victim-np-0")
    assert grant.nodepool == "clusters-victim/np-0"

    await wait_idle(reconciler)
    victim_at = order.started.index("clusters-victim/np-0")
    # One turn of the flood's lane at most per worker, not the rest of the flood.
    assert victim_at - indexed_at <= 3, (indexed_at, victim_at)
    assert len(order.started) == 151 and len(cache.renders()) == 151


async def test_a_new_nodepool_goes_ahead_of_a_churn_of_rerenders(tmp_path: Path) -> None:
    order = RenderOrder()
    clock = Clock()
    reconciler, source, cache = open_world(tmp_path, clock, order)
    churn = [pool("clusters-churn", f"np-{i}") for i in range(80)]
    write_manifests(tmp_path / "source" / "churn-inputs.yaml", *join_inputs("clusters-churn"))
    write_manifests(tmp_path / "source" / "churn.yaml", *churn)
    await settle(reconciler, source)
    assert len(order.started) == 80

    # The tenant edits the pull secret all its NodePools read: each is re-rendered (routine).
    write_manifests(tmp_path / "source" / "churn-inputs.yaml",
                    *join_inputs("clusters-churn", PULL.replace("dTpw", "dTpx")))
    await source.poll_once()
    write_manifests(tmp_path / "source" / "victim.yaml", *join_inputs("clusters-victim"),
                    pool("clusters-victim", "np-0"))
    await source.poll_once()
    indexed_at = len(order.started)
    await wait_idle(reconciler)
    victim_at = order.started.index("clusters-victim/np-0")
    assert victim_at - indexed_at <= 2, (indexed_at, victim_at)
    assert len(order.started) == 80 + 80 + 1  # every re-render still happens, once
    assert len(cache.renders()) == 81 and reconciler.metrics.render_failures._value.get() == 0


def fleet(source_dir: Path, rng: random.Random) -> None:
    """Clusters whose payloads read a release catalog (an MCO base's OS images, the node
    HAProxy's image), MCO bases and a mirror set, written with creation times (the order a
    listing applies a batch in) and file names (the order it reads them in) shuffled."""
    stamps = [f"2026-0{1 + i // 28}-{1 + i % 28:02d}T00:00:00Z" for i in range(60)]
    rng.shuffle(stamps)
    stamp = iter(stamps)

    def created(obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["creationTimestamp"] = next(stamp)
        return obj

    images = {"rhel-coreos": mco_base.RHCOS, "rhel-coreos-extensions": mco_base.RHCOS_EXTENSIONS,
              "haproxy-router": "quay.io/x/haproxy@sha256:" + "f" * 64}
    catalog = kube_object("ConfigMap", SHARED, "catalog", {"releases.yaml": (
        f"- pullSpec: {mco_base.RELEASE}\n  version: {mco_base.RELEASE_VERSION}\n  images:\n"
        + "".join(f"    {name}: {image}\n" for name, image in images.items()))}, {ANNOTATION_RELEASE_CATALOG: "true"})
    mirrors = {"apiVersion": "config.openshift.io/v1", "kind": "ImageDigestMirrorSet", "metadata": {"name": "art"},
               "spec": {"imageDigestMirrors": [{"source": "quay.io/openshift-release-dev/ocp-release",
                                                "mirrors": ["mirror.example.com/ocp-release"]}]}}
    documents: list[tuple[str, list[dict[str, Any]]]] = [("catalog", [created(catalog)]), ("mirrors", [created(mirrors)])]
    for c in range(4):
        namespace = f"clusters-{c}"
        objects = [created(o) for o in join_objects(namespace, PULL, CA_PEM)]
        if c % 2 == 0:  # half the clusters on an MCO base (OS images from the catalog)
            objects.append(created(mco_base.base_configmap(namespace)))
        objects += [created(pool(namespace, f"np-{p}", release=mco_base.RELEASE, version=mco_base.RELEASE_VERSION))
                    for p in range(3)]
        documents += [(f"{namespace}-{i}", [obj]) for i, obj in enumerate(objects)]
    names = [f"{rng.randrange(16 ** 8):08x}" for _ in documents]
    for name, (_what, objects) in zip(names, documents):
        write_manifests(source_dir / f"{name}.yaml", *objects)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_restart_renders_nothing_whatever_order_the_listing_meets_objects(tmp_path: Path, seed: int) -> None:
    clock = Clock()
    reconciler, source, cache = open_world(tmp_path, clock)
    fleet(tmp_path / "source", random.Random(seed))
    await settle(reconciler, source)
    assert renders(reconciler) == 12
    stored = {r.secret: r.inputs_digest for r in cache.renders()}
    assert len(stored) == 12
    cache.flush()

    again, source2, cache2 = open_world(tmp_path, clock)
    await settle(again, source2)
    assert renders(again) == 0
    assert {r.secret: r.inputs_digest for r in cache2.renders()} == stored


async def test_a_shared_input_changed_while_down_renders_exactly_its_readers(tmp_path: Path) -> None:
    clock = Clock()
    reconciler, source, cache = open_world(tmp_path, clock)
    fleet(tmp_path / "source", random.Random(4))
    await settle(reconciler, source)
    before = {r.secret: r.inputs_digest for r in cache.renders()}
    cache.flush()
    # While down: one cluster's MCO base changes (its three NodePools read it, no other does).
    base_file = next(p for p in (tmp_path / "source").iterdir() if "mco-base" in p.read_text()
                     and "clusters-0" in p.read_text())
    write_manifests(base_file, mco_base.base_configmap("clusters-0", kubelet_log_level="4"))

    again, source2, cache2 = open_world(tmp_path, clock)
    await settle(again, source2)
    assert renders(again) == 3
    after = {r.secret: r.inputs_digest for r in cache2.renders()}
    assert sorted(s for s in after if after[s] != before[s]) == [f"clusters-0/token-np-{p}-00000000" for p in range(3)]


async def test_no_render_starts_while_the_source_reads_a_batch(tmp_path: Path) -> None:
    """A poll's files are read with the queue held (Reconciliation.ingesting): renders already
    queued wait, so a flood is read at full speed and another tenant's token Secret in the same
    poll is indexed without waiting on the flood's renders for the CPU (issue 30, 10,000 token
    Secrets: 5.5 s to the victim's first payload, most of it its poll's parse slowed by renders)."""
    started: list[str] = []

    def quick(inputs: NodePoolInputs) -> RenderedPayload:  # renders as cheap as can be: many fit in one read
        started.append(inputs.nodepool)
        return RenderedPayload(b'{"ignition":{"version":"3.2.0"}}', "3.2.0")

    (tmp_path / "source").mkdir()
    cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache"))
    renders_seen: list[int] = []  # renders started so far, as the source reads each object

    def retain(obj: dict[str, Any]) -> bool:
        renders_seen.append(len(started))
        return not is_token_secret(obj)

    source = FileSource(tmp_path / "source", retain=retain)
    reconciliation = build_reconciliation(source=source, cache=cache, renderer=quick, policy=RotationPolicy(ttl=100.0),
                                          metrics=ServerMetrics(), clock=Clock(), debounce=0.0)
    write_manifests(tmp_path / "source" / "flood.yaml", *join_inputs("clusters-flood"),
                    *(pool("clusters-flood", f"np-{i}") for i in range(100)))
    await source.run(reconciliation.handle, ingesting=reconciliation.ingesting, iterations=0)
    assert len(started) < 20  # the flood's renders are under way

    for i in range(100, 600):  # more of the flood, a file each, and the victim last
        write_manifests(tmp_path / "source" / f"flood-{i}.yaml", pool("clusters-flood", f"np-{i}"))
    write_manifests(tmp_path / "source" / "victim.yaml", *join_inputs("clusters-victim"), pool("clusters-victim", "np-0"))
    renders_seen.clear()
    await source.poll_once()
    assert len(renders_seen) == 504
    # At most the renders already running when the poll began reach the renderer meanwhile.
    assert renders_seen[-1] - renders_seen[0] <= NodePools.render_concurrency, renders_seen
    assert TokenAuthenticator(cache, Clock()).authenticate("tok-clusters-victim-np-0").nodepool == "clusters-victim/np-0"
    await wait_idle(reconciliation.reconciler)
    assert len(started) == 601
