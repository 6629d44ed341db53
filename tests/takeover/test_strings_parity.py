"""Random strings where the CPO serializes what it is given (AWS resource tags into the
Infrastructure, the SSH key into the MachineConfig, the trusted bundle's annotations and data):
hcp-inputs, HyperShift's own code, and the takeover either write the same bytes or both refuse.

What this holds the takeover to, beyond tests/takeover/test_cpo_parity.py's cases: go-yaml's
quoting, folding at 80 columns and escapes (characters beyond U+FFFF, the BOM, C0 controls); what
go-yaml's reader makes of the raw NEL Go's JSON leaves in a string (folded like a line break); what
it refuses (DEL, C1 controls, U+FFFE/FFFF; NEL in a key; a key over 1024 characters as JSON).
Seeded: a failure names its seed and case, and repeats.
"""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Any

import pytest

from ignition_server.takeover.core_ignition import core_config_maps
from ignition_server.takeover.go_yaml import NotSerializable
from ignition_server.takeover.mcs_config import mcs_config_map
from testsupport.hcp_inputs import HcpInputs, HcpWorld, hcp_world

RARE = "é☃\u00a0\u0085\u2028\u2029\ufeff\x01\x1b𝄞\t\r\n\"'\\#:-?{}[],&*!|>%@`"
CASES_PER_SEED = 25


def random_text(rnd: random.Random) -> str:
    if rnd.random() < 0.6:
        pool = string.ascii_letters + " " * 10 + string.digits + RARE
    else:
        pool = string.printable + "\u00a0\u2028\ufeff𝄞"
    if rnd.random() < 0.02:
        pool += "\x7f\x9f"
    text = "".join(rnd.choice(pool) for _ in range(rnd.randint(0, 160)))
    return "\ufeff" + text if rnd.random() < 0.1 else text


def world(values: list[str]) -> HcpWorld:
    tags = [{"key": f"k{i}", "value": v} for i, v in enumerate(values[:5])]
    built = hcp_world(platform={"type": "AWS", "aws": {"region": "us-east-1", "resourceTags": tags}},
                      ssh_key=values[5], trusted=True)
    assert built.trusted_bundle is not None
    built.trusted_bundle["metadata"]["annotations"] = {values[6][:100] or "x": values[7]}
    built.trusted_bundle["data"]["extra"] = values[7]
    return built


def ours(built: HcpWorld) -> dict[str, dict[str, Any]] | None:
    try:
        return {"machine-config-server": mcs_config_map(built.hcp, built.named()),
                **core_config_maps(built.hcp, built.named())}
    except NotSerializable:
        return None


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_strings_are_written_or_refused_as_the_cpo_does(seed: int, hcp_inputs: HcpInputs, tmp_path: Path) -> None:
    rnd = random.Random(seed)
    for case in range(CASES_PER_SEED):
        built = world([random_text(rnd) for _ in range(8)])
        mine = ours(built)
        try:
            cpo = hcp_inputs.run(built.objects(), tmp_path / str(case)).config_maps
        except AssertionError as refused:
            assert "yaml" in str(refused) and mine is None, f"seed {seed} case {case}: {refused}"
            continue
        assert mine is not None, f"seed {seed} case {case}: the CPO writes what we refuse"
        for name, config_map in cpo.items():
            for key, value in config_map["data"].items():
                assert mine[name]["data"][key] == value, f"seed {seed} case {case}: {name} {key}"
