"""Failed-authentication floods from one address get 503 + Retry-After (never a 4xx the real
client would take as final), and cost nothing to boots from other addresses."""

from __future__ import annotations

import base64
import http.client
import time
from pathlib import Path

from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, wait_for, write_manifests
from testsupport.manifests import build_token_secret


def get_from(proc: ServerProcess, source_ip: str, token: str) -> tuple[int, str | None]:
    conn = http.client.HTTPSConnection("127.0.0.1", proc.port, context=proc.ssl_context(), timeout=10,
                                       source_address=(source_ip, 0))
    try:
        conn.request("GET", "/ignition", headers={"Authorization": "Bearer " + base64.b64encode(token.encode()).decode()})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("Retry-After")
    finally:
        conn.close()


def test_a_flood_from_one_address_is_held_off_and_boots_elsewhere_go_on(tmp_path: Path) -> None:
    source = tmp_path / "source"
    write_manifests(source / "pool.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters/workers", token="tok-good",
        machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="workers"), generation_time=time.time()))
    proc = ServerProcess(source, tmp_path / "cache", extra=["--auth-failure-burst", "5", "--auth-failure-window", "3s"])
    proc.start()
    try:
        wait_for(lambda: get_from(proc, "127.0.0.1", "tok-good")[0] == 200, timeout=30, what="the payload served")
        answers = [get_from(proc, "127.0.0.2", f"forged-{i}") for i in range(12)]
        statuses = [status for status, _ in answers]
        assert statuses[:5] == [511] * 5  # unknown tokens: maybe newer than the server's view
        assert statuses[-1] == 503 and answers[-1][1] is not None and int(answers[-1][1]) >= 1
        assert all(status >= 500 for status in statuses)  # never a 4xx: a node would give up for good
        # Boots from another address are not affected, not even by the flood's window.
        assert get_from(proc, "127.0.0.1", "tok-good")[0] == 200
        # Even the right token waits its turn from the flooding address; after the window it passes.
        assert get_from(proc, "127.0.0.2", "tok-good")[0] == 503
        wait_for(lambda: get_from(proc, "127.0.0.2", "tok-good")[0] == 200, timeout=15, interval=0.5,
                 what="the address let through after its window")
    finally:
        proc.kill()


def test_the_limiter_holds_a_source_for_its_window_and_stays_bounded() -> None:
    from ignition_server.http.limits import FailedAuthLimiter

    now = [100.0]
    limiter = FailedAuthLimiter(burst=3, window=10.0, max_sources=4, clock=lambda: now[0])
    for _ in range(3):
        limiter.failed("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") is None  # at the burst, not over it
    now[0] += 2.0
    limiter.failed("10.0.0.1")  # over: held until 10 s after the first failure
    assert limiter.retry_after("10.0.0.1") == 8
    assert limiter.retry_after("10.0.0.2") is None
    limiter.hold("10.0.0.3", 2.5)  # another process's verdict
    assert limiter.retry_after("10.0.0.3") == 3
    now[0] += 8.0
    assert limiter.retry_after("10.0.0.1") is None and limiter.retry_after("10.0.0.3") is None
    for i in range(10):  # more held sources than the bound: the oldest make room
        limiter.hold(f"192.0.2.{i}", 60)
    assert len(limiter._held) <= 4
    assert limiter.retry_after("192.0.2.9") is not None and limiter.retry_after("192.0.2.0") is None
