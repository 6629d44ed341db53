"""The fleet of `python -m bench rerender` (testsupport/shared_input_fleet.py): exactly the chosen
NodePools read the shared ConfigMap, and a fleet is reused only when it is the one asked for."""

from __future__ import annotations

from pathlib import Path

from testsupport import fleet, shared_input_fleet


def test_fleet_points_exactly_the_shared_nodepools_at_the_configmap(tmp_path: Path) -> None:
    meta = shared_input_fleet.generate(tmp_path / "f", 3, 4, 20, 5, 2, progress=False)
    source = Path(meta["source"])
    annotated = set()
    for cluster, pool in fleet.pools(3, 4):
        notes = fleet.read_secret(fleet.manifest_path(source, cluster, pool))["metadata"]["annotations"]
        if notes.get(shared_input_fleet.SHARED_ANNOTATION) == shared_input_fleet.SHARED_REF:
            annotated.add(fleet.nodepool_of(cluster, pool))
    assert annotated == set(meta["shared"]) and len(annotated) == 5
    cm = fleet.read_secret(shared_input_fleet.configmap_path(source))
    assert cm["kind"] == "ConfigMap" and cm["data"]["ca-bundle.crt"].startswith("-----BEGIN CERTIFICATE-----")
    assert shared_input_fleet.read_configmap_variant(source) == 0
    reused, why = shared_input_fleet.fleet_reusable(tmp_path / "f", 3, 4, 20, 5, 2, fleet.DEFAULT_SEED)
    assert reused is not None, why
    assert shared_input_fleet.fleet_reusable(tmp_path / "f", 3, 4, 20, 6, 2, fleet.DEFAULT_SEED)[0] is None
