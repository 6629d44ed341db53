"""One request carries one credential: two, or one spelled so readers may disagree, get 400
from the real server (and from the real HAProxy edge: tests/proxy/test_edge.py)."""

from __future__ import annotations

import base64
import http.client
import time
from pathlib import Path

import pytest

from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, raw_status, wait_for, write_manifests
from testsupport.manifests import build_token_secret


def bearer(token: str) -> str:
    return "Bearer " + base64.b64encode(token.encode()).decode()


def raw_get(proc: ServerProcess, target: str, headers: list[tuple[str, str]]) -> int:
    return raw_status(http.client.HTTPSConnection("127.0.0.1", proc.port, context=proc.ssl_context(), timeout=10),
                      target, headers)


@pytest.fixture
def server(tmp_path: Path):
    tmp = tmp_path
    for pool in ("a", "b"):
        write_manifests(tmp / "source" / f"{pool}.yaml", build_token_secret(
            namespace="clusters-x", nodepool=f"clusters/{pool}", token=f"tok-{pool}",
            machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=pool), generation_time=time.time()))
    proc = ServerProcess(tmp / "source", tmp / "cache").start()
    wait_for(lambda: raw_get(proc, "/config/a?token=tok-a", []) == 200, timeout=60, what="served")
    yield proc
    proc.kill()


AMBIGUOUS = [
    ("/ignition?token=tok-b", [("Authorization", bearer("tok-a"))]),  # header and query
    ("/ignition", [("Authorization", bearer("tok-a")), ("Authorization", bearer("tok-b"))]),
    ("/config/a?token=tok-a", [("Authorization", bearer("tok-b"))]),
    ("/config/a?token=tok-a&token=tok-b", []),  # twice
    ("/config/a?token=tok-a&tok%65n=tok-b", []),  # a percent-encoded name
    ("/config/a?tok%65n=tok-a", []),
    ("/config/a?TOKEN=tok-a&token=tok-a", []),
    ("/config/a?token=tok-a;token=tok-b", []),  # ';' a separator to some readers
    ("/config/a?x=1;token=tok-a", []),
    ("/config/a;x=1?token=tok-a", []),
    ("/ignition?token=tok-a", []),  # the URL shape's parameter on the header shape's path
]


def test_two_credentials_or_an_ambiguous_spelling_get_400_and_one_is_served(server: ServerProcess) -> None:
    got = {(target, len(headers)): raw_get(server, target, headers) for target, headers in AMBIGUOUS}
    assert got == {key: 400 for key in got}
    # One credential, plainly, from the same address after all those refusals:
    assert raw_get(server, "/config/a?token=tok-a", []) == 200
    assert raw_get(server, "/ignition", [("Authorization", bearer("tok-a"))]) == 200
    assert raw_get(server, "/config/a?token=tok-a&other=1", []) == 200
