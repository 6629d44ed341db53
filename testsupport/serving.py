"""A NodePool served by a real server process: its token Secret (in `clusters-demo`, generated
now), and the wait until the server has rendered it and written its status back."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from ignition_server.model.token_secret import is_token_secret, parse_token_secret
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, wait_for
from testsupport.manifests import build_token_secret


def token_secret(pool: str, token: str, *, generation_time: float | None = None, suffix: str = "0a1b2c3d") -> dict:
    """NodePool `pool`'s token Secret in `clusters-demo`, generated now unless told when."""
    return build_token_secret(
        namespace="clusters-demo",
        nodepool=f"clusters/{pool}",
        token=token,
        machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=pool),
        generation_time=time.time() if generation_time is None else generation_time,
        suffix=suffix,
    )


def current_secret(path: Path) -> dict:
    """The Secret in a manifest file, as it is now (the server writes back into it)."""
    return next(d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "Secret")


def wait_rendered(proc: ServerProcess, count: int) -> None:
    """Until `count` payloads are stored and their Secrets say AsExpected (written after the index is durable)."""
    wait_for(lambda: proc.metrics().get("ign_server_payload_cache_total") == count)
    manifests = [p for p in sorted(proc.source.rglob("*.yaml")) if not p.name.startswith(".")]  # not write-back temp files
    paths = [p for p in manifests if is_token_secret(current_secret(p))]
    wait_for(lambda: all(parse_token_secret(current_secret(p)).reason == "AsExpected" for p in paths))
