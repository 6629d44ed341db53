"""Smoke test of bench/rerender.py: the shared-ConfigMap re-render scenario at tiny size (3 clusters x
4 NodePools, 5 of 12 reading ConfigMap ignition-server/ca) against the real server process. The full-size
run (440 x 12, 1,000 shared) is by hand (bench/RERENDER.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import fleet, rerender


def test_fleet_points_exactly_the_shared_nodepools_at_the_configmap(tmp_path: Path) -> None:
    meta = rerender.generate(tmp_path / "f", 3, 4, 20, 5, 2, progress=False)
    source = Path(meta["source"])
    annotated = set()
    for cluster, pool in fleet.pools(3, 4):
        notes = fleet.read_secret(fleet.manifest_path(source, cluster, pool))["metadata"]["annotations"]
        if notes.get(rerender.SHARED_ANNOTATION) == rerender.SHARED_REF:
            annotated.add(fleet.nodepool_of(cluster, pool))
    assert annotated == set(meta["shared"]) and len(annotated) == 5
    cm = fleet.read_secret(rerender.configmap_path(source))
    assert cm["kind"] == "ConfigMap" and cm["data"]["ca-bundle.crt"].startswith("-----BEGIN CERTIFICATE-----")
    assert rerender.read_configmap_variant(source) == 0
    reused, why = rerender.fleet_reusable(tmp_path / "f", 3, 4, 20, 5, 2, fleet.DEFAULT_SEED)
    assert reused is not None, why
    assert rerender.fleet_reusable(tmp_path / "f", 3, 4, 20, 6, 2, fleet.DEFAULT_SEED)[0] is None


def test_changing_the_shared_configmap_rerenders_exactly_its_readers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = rerender.main([
        "--clusters", "3", "--pools", "4", "--shared", "5", "--payload-kib", "20", "--ca-kib", "4",
        "--requests", "150", "--concurrency", "8", "--settle", "1.5",
        "--fleet", str(tmp_path / "fleet"), "--work", str(tmp_path / "work"),
        "--cold-timeout", "60", "--rerender-timeout", "30", "--load-timeout", "30", "--json",
    ])
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["cold"]["payloads"] == 12, out
    assert summary["idle"]["statuses"] == {"200": 150}, out
    assert summary["rerender"]["renders_delta"] == 5, out
    assert summary["rerender"]["rendered_exactly_the_shared_set"], out
    assert summary["during"]["non_200"] == 0 and summary["during"]["corrupt"] == 0, out
    assert set(summary["during"]["statuses"]) == {"200"}, out
    assert summary["after"]["shared_with_new_ca"] == 5 and summary["after"]["others_with_a_ca"] == 0, out
    assert summary["rerender"]["wall_s"] is not None and summary["rerender"]["wall_s"] < 20, out
    assert code == 0, out
