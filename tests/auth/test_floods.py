"""Failed-authentication floods from one address get 503 + Retry-After (never a 4xx the real
client would take as final), cost nothing to boots from other addresses, and nothing to the
valid requests from the same address."""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import time
from pathlib import Path

import pytest

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


def pool_secret(pool: str, token: str) -> dict:
    return build_token_secret(namespace="clusters-a", nodepool=f"clusters/{pool}", token=token,
                              machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=pool), generation_time=time.time())


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_flood_from_one_address_holds_back_only_its_failures(tmp_path: Path, workers: str) -> None:
    # Many nodes behind one address (a NAT, a Service that rewrites the source): one of them
    # sends garbage. Its failures are held off; every other node there is still served.
    source = tmp_path / "source"
    for i in range(3):
        write_manifests(source / f"pool{i}.yaml", pool_secret(f"pool{i}", f"tok-{i}"))
    # A window far longer than the test: the address stays held throughout, however slow the machine.
    proc = ServerProcess(source, tmp_path / "cache", extra=[
        "--workers", workers, "--auth-failure-burst", "5", "--auth-failure-window", "120s"])
    proc.start()
    try:
        for i in range(3):
            wait_for(lambda i=i: get_from(proc, "127.0.0.1", f"tok-{i}")[0] == 200, timeout=30, what="the payloads served")
        answers = [get_from(proc, "127.0.0.2", f"forged-{i}") for i in range(8)]
        statuses = [status for status, _ in answers]
        assert statuses[:5] == [511] * 5  # unknown tokens: maybe newer than the server's view
        assert statuses[-1] == 503 and answers[-1][1] is not None and int(answers[-1][1]) >= 1
        assert all(status >= 500 for status in statuses)  # never a 4xx: a node would give up for good
        # The other nodes behind the held address, while the garbage goes on among them.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            garbage = [pool.submit(get_from, proc, "127.0.0.2", f"forged-more-{i}") for i in range(12)]
            valid = [pool.submit(get_from, proc, "127.0.0.2", f"tok-{i % 3}") for i in range(12)]
            assert [f.result()[0] for f in valid] == [200] * 12
            assert {f.result()[0] for f in garbage} == {503}
        # A node whose token is not known yet: held, its 511 is a 503 (retried alike), and it
        # is served from the held address as soon as its token Secret appears.
        assert get_from(proc, "127.0.0.2", "tok-new")[0] == 503
        write_manifests(source / "new.yaml", pool_secret("new", "tok-new"))
        wait_for(lambda: get_from(proc, "127.0.0.2", "tok-new")[0] == 200, timeout=30, interval=0.2,
                 what="the new token served from the held address")
        assert get_from(proc, "127.0.0.2", "forged-last")[0] == 503  # still held: the success passed through it
        assert get_from(proc, "127.0.0.1", "forged-elsewhere")[0] == 511  # other addresses: their own count
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
