"""Random `spec.configuration`s, every field of every struct HyperShift's ClusterConfiguration
reaches a candidate, each given a value of its Go type: the CPO's `configuration-hash` (Go's
json.Marshal of the typed struct: field order, omitempty, durations as Go prints them, `<>&`
escaped) and the objects it copies from the configuration (APIServer, Image, Proxy, Network) are
ours, byte for byte, on each. Seeded: a failure names its seed, and repeats."""

from __future__ import annotations

import base64
import json
import random
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from ignition_server.takeover.mcs_config import HASH_KEY, configuration_hash, mcs_config_map
from testsupport.hcp_inputs import HcpInputs, hcp_world

SHAPES = json.loads(resources.files("ignition_server.takeover").joinpath("go_types.json").read_text())
WORDS = ["a", "cluster", "Default", "x<y&z>", "café", "10.0.0.0/16", "true", "123", "", "two words", "key: value"]
DURATIONS = ["300s", "1h", "90m", "1.5s", "0s", "2h45m30s", "250ms"]
COPIED = ("cluster-apiserver-config.yaml", "image-config.yaml", "cluster-proxy-01-config.yaml",
          "cluster-network-02-config.yaml")


def value(shape: Any, rnd: random.Random, depth: int) -> Any:
    if isinstance(shape, str):
        return {"string": lambda: rnd.choice(WORDS), "bool": lambda: rnd.random() < 0.5,
                "int": lambda: rnd.randint(-5, 300), "uint": lambda: rnd.randint(0, 300),
                "bytes": lambda: base64.b64encode(rnd.randbytes(rnd.randint(0, 6))).decode()}[shape]()
    (kind, inner), = shape.items()
    if kind == "ptr":
        return value(inner, rnd, depth)
    if kind == "list":
        return [value(inner, rnd, depth + 1) for _ in range(rnd.randint(0, 2))]
    if kind == "map":
        return {rnd.choice(WORDS) or "k": value(inner, rnd, depth + 1) for _ in range(rnd.randint(0, 2))}
    if kind == "struct":
        return struct(inner, rnd, depth + 1)
    if inner.endswith("v1.Duration"):
        return rnd.choice(DURATIONS)
    if inner.endswith("IntOrString"):
        return rnd.choice([3, "25%"])
    return {"raw": rnd.choice(WORDS)}


def struct(name: str, rnd: random.Random, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in SHAPES["structs"][name]:
        if field.get("inline"):
            out.update(value(field["type"], rnd, depth))
        elif depth < 7 and rnd.random() < (0.8 if depth <= 1 else 0.35):
            out[field["name"]] = value(field["type"], rnd, depth)
    return out


@pytest.mark.parametrize("seed", range(24))
def test_random_configurations_hash_and_copy_as_the_cpo_does(seed: int, hcp_inputs: HcpInputs, tmp_path: Path) -> None:
    rnd = random.Random(seed)
    configuration = struct(SHAPES["roots"]["ClusterConfiguration"], rnd, 0)
    world = hcp_world(configuration=configuration)
    cpo = hcp_inputs.run(world.objects(), tmp_path)
    ours = mcs_config_map(world.hcp, world.named())["data"]
    assert configuration_hash(world.hcp) == cpo.printed_hash, f"seed {seed}"
    assert ours[HASH_KEY] == cpo.config_maps["machine-config-server"]["data"][HASH_KEY]
    for key in COPIED:
        assert ours[key] == cpo.config_maps["machine-config-server"]["data"][key], f"seed {seed}: {key}"
