"""The input graph keeps one set per distinct set of dependencies (issue 33: the owner's memory)."""

from __future__ import annotations

from ignition_server.model.objects import ObjectKey
from ignition_server.reconcile.input_graph import InputGraph


def key(kind: str, namespace: str, name: str) -> ObjectKey:
    return ObjectKey(kind, namespace, name)


def test_nodepools_reading_the_same_objects_share_one_set_and_still_answer_apart() -> None:
    graph = InputGraph()
    pools = [key("Secret", "clusters-c0", f"token-np-{i}") for i in range(12)]
    other = key("Secret", "clusters-c1", "token-np-0")
    cluster = [key("Secret", "clusters-c0", "pull-secret"), key("ConfigMap", "clusters-c0", "mco-base"),
               key("Release", "", "quay.io/r@sha256:1")]
    for pool in pools:  # each built anew, as a render's `gather` does
        graph.track(pool, frozenset(ObjectKey(k.kind, k.namespace, k.name) for k in cluster))
    graph.track(other, frozenset([key("Release", "", "quay.io/r@sha256:1")]))
    held = {id(graph._reads[pool]) for pool in pools}
    assert len(held) == 1  # 12 NodePools, one set (5,280 sets of ~14 keys were ~1 KB each)
    assert sorted(graph.readers_of(cluster[0])) == sorted(pools)
    assert sorted(graph.readers_of(cluster[2])) == sorted(pools + [other])
    # One NodePool reads something more: it gets its own set; the others keep theirs.
    extra = key("ConfigMap", "clusters-c0", "np-0-machineconfig")
    graph.track(pools[0], frozenset(cluster + [extra]))
    assert graph.reads(pools[0], extra) and not graph.reads(pools[1], extra)
    assert graph.readers_of(extra) == [pools[0]]
    assert all(graph.reads(pool, cluster[1]) for pool in pools)
    # Gone readers take their sets with them.
    for pool in pools + [other]:
        graph.forget(pool)
    assert len(graph._sets) == 0 and graph.objects_read() == []
