"""Smoke test of bench/rerender.py: the shared-ConfigMap re-render scenario at tiny size (3 clusters x
4 NodePools, 5 of 12 reading ConfigMap ignition-server/ca) against the real server process. The full-size
run (440 x 12, 1,000 shared) is by hand (bench/RERENDER.md)."""

from __future__ import annotations

import json
from pathlib import Path

from testsupport.harness import run_bench


def test_changing_the_shared_configmap_rerenders_exactly_its_readers(tmp_path: Path) -> None:
    ran = run_bench(
        "rerender", "--clusters", "3", "--pools", "4", "--shared", "5", "--payload-kib", "20", "--ca-kib", "4",
        "--requests", "150", "--concurrency", "8", "--settle", "1.5",
        "--fleet", str(tmp_path / "fleet"), "--work", str(tmp_path / "work"),
        "--cold-timeout", "60", "--rerender-timeout", "30", "--load-timeout", "30", "--json", timeout=300,
    )
    code, out = ran.returncode, ran.stdout + ran.stderr
    summary = json.loads(ran.stdout.strip().splitlines()[-1])
    assert summary["cold"]["payloads"] == 12, out
    assert summary["idle"]["statuses"] == {"200": 150}, out
    assert summary["rerender"]["renders_delta"] == 5, out
    assert summary["rerender"]["rendered_exactly_the_shared_set"], out
    assert summary["during"]["non_200"] == 0 and summary["during"]["corrupt"] == 0, out
    assert set(summary["during"]["statuses"]) == {"200"}, out
    assert summary["after"]["shared_with_new_ca"] == 5 and summary["after"]["others_with_a_ca"] == 0, out
    assert summary["rerender"]["wall_s"] is not None and summary["rerender"]["wall_s"] < 20, out
    assert code == 0, out
