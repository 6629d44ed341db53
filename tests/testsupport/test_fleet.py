"""The benchmarks' fleet generator (testsupport/fleet.py): deterministic, and every NodePool its own."""

from __future__ import annotations

from pathlib import Path

from testsupport import fleet


def test_fleet_is_deterministic_and_distinct(tmp_path: Path) -> None:
    meta = fleet.generate(tmp_path / "f", 1, 2, 20, progress=False)
    assert meta["tokens"]["clusters-c0/np-1"] == fleet.fleet_token(fleet.DEFAULT_SEED, 0, 1)
    assert fleet.current_tokens(tmp_path / "f") == meta["tokens"]
    a = fleet.machineconfigs_for("s", 0, 0, 20)
    assert a == fleet.machineconfigs_for("s", 0, 0, 20)
    assert a != fleet.machineconfigs_for("s", 0, 1, 20)
    assert "clusters-c0/np-0" in a
