"""Smoke test of the benchmark code (bench/): a tiny fleet, the cold and warm-restart scenarios end
to end against the real server process. The benchmarks themselves run at full size by hand
(bench/README.md), not in CI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import fleet, run


def test_fleet_is_deterministic_and_distinct(tmp_path: Path) -> None:
    meta = fleet.generate(tmp_path / "f", 1, 2, 20, progress=False)
    assert meta["tokens"]["clusters-c0/np-1"] == fleet.fleet_token(fleet.DEFAULT_SEED, 0, 1)
    assert fleet.current_tokens(tmp_path / "f") == meta["tokens"]
    a = fleet.machineconfigs_for("s", 0, 0, 20)
    assert a == fleet.machineconfigs_for("s", 0, 0, 20)
    assert a != fleet.machineconfigs_for("s", 0, 1, 20)
    assert "clusters-c0/np-0" in a


def test_warm_restart_serves_every_nodepool_without_rendering(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet_dir = tmp_path / "fleet"
    assert fleet.main(["--clusters", "2", "--pools", "3", "--payload-kib", "20", "--out", str(fleet_dir)]) == 0
    code = run.main([
        "--fleet", str(fleet_dir), "--work", str(tmp_path / "work"), "--scenarios", "cold,warm,memory",
        "--json", "--cold-timeout", "60", "--serve-timeout", "30",
    ])
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["cold"]["payloads"] == 6, out
    assert summary["warm"]["renders_after_restart"] == 0, out
    assert summary["warm"]["served"] == 6 and summary["warm"]["statuses"] == {"200": 6}, out
    assert summary["warm"]["corrupt"] == 0, out
    assert summary["memory"]["rss_mib"] > 0
    assert code == 0, out


def test_storm_scenarios_run_and_say_their_verdicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The boot-storm bench end to end, briefly: the C load client in boot mode, a worker killed
    in the middle, verdicts and storm.json (figures from so short a run mean nothing)."""
    from bench import storm

    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build bench/loadclient.c")
    code = storm.main(["--seconds", "3", "--connections", "4", "--payload-kib", "20", "--scenarios", "steady,kill-worker",
                       "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")])
    out = capsys.readouterr().out
    assert "steady       PASS" in out and "kill-worker" in out, out
    outcomes = json.loads((tmp_path / "results" / "storm.json").read_text())["outcomes"]
    assert [o["scenario"] for o in outcomes] == ["steady", "kill-worker"]
    assert all(o["result"]["permanent_failures"] == 0 for o in outcomes)
    assert outcomes[1]["result"]["events"], "the worker was killed in the middle"
    assert code in (0, 1)  # a 3 s storm on a busy machine may miss the recovery target; the run itself must work


def test_releases_bench_reads_each_release_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench import releases

    code = releases.main(["--clusters", "3", "--pools", "4", "--releases", "3", "--layer-mib", "0.5",
                          "--work", str(tmp_path / "work")])
    out = capsys.readouterr().out
    summary = json.loads(out)
    assert summary["served"] == 12 and summary["failed"] == 0, out
    assert summary["release_fetches_metric"] == 3 and summary["release_fetches_registry_log"] == 3, out
    assert code == 0, out
