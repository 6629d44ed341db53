"""`serve --workers N`: the owner renders and rotates, worker processes serve on one port.

What must hold: a worker's moment of lag never turns a node away (it asks the owner before
any refusal), a killed worker is started again and costs no boot, the owner's /metrics counts
every worker's requests, and SIGTERM or the owner's death leaves no worker behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import yaml

from ignition_server.auth.presented import Presented
from ignition_server.auth.tokens import Grant, Refusal, TokenAuthenticator
from ignition_server.http.app import IgnitionHandlers, ServingState
from ignition_server.metrics import ServerMetrics
from ignition_server.model.token_secret import parse_token_secret
from ignition_server.render.spec import encode
from payload_cache import CacheConfig, PayloadCache, RenderRecord, TokenRecord, TokenState
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, bearer, wait_for, worker_pids, write_manifests
from testsupport.manifests import build_token_secret


def token_secret(pool: str, token: str) -> dict:
    return build_token_secret(namespace="clusters-demo", nodepool=f"clusters/{pool}", token=token,
                              machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=pool), generation_time=time.time())


def start(tmp_path: Path, *objects: dict, workers: int = 2, token_ttl: str = "11h", port: int | None = None) -> ServerProcess:
    source = tmp_path / "source"
    if objects:
        write_manifests(source / "pools.yaml", *objects)
    proc = ServerProcess(source, tmp_path / "cache", token_ttl=token_ttl, extra=["--workers", str(workers)])
    if port is not None:
        proc.port = port
    proc.start()
    try:
        wait_for(lambda: proc.metrics().get("ign_server_payload_cache_total") == len(objects), what="payloads rendered")
        # Secrets say AsExpected once their render is durable in the index (a SIGKILL keeps it).
        wait_for(lambda: all(parse_token_secret(d).reason == "AsExpected" for d in manifests(proc)
                             if d.get("kind") == "Secret" and d["metadata"]["name"].startswith("token-")),
                 what="renders durable")
    except BaseException:
        proc.kill()
        raise
    return proc


def manifests(proc: ServerProcess) -> list[dict]:
    return [d for d in yaml.safe_load_all((proc.source / "pools.yaml").read_text()) if d]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes: its parent (the owner) has not reaped it yet.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


async def test_a_worker_asks_the_owner_before_it_refuses(tmp_path: Path, serving_client) -> None:
    """The mechanism behind "no stale window": a worker whose replica lacks a token (or holds
    it as rotated out) serves it if the owner grants it, and refuses only with the owner's answer."""
    owner = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache"))
    blob = owner.put_blob(encode({"ignition": {"version": "3.2.0"}}, "3.2.0"))
    owner.put_render(RenderRecord("ns/token-p", "clusters/p", "digest", blob, "3.2.0", 0.0))
    _generation, tokens, renders = owner.index_rows()
    replica = PayloadCache.replica(CacheConfig(cache_dir=tmp_path / "cache"), tokens, renders)
    replica.put_token("stale", TokenRecord("clusters/p", "ns/token-p", TokenState.RETIRED, None))
    asked: list[Presented] = []

    async def owner_says(presented: Presented, remote: str | None) -> Grant:
        asked.append(presented)
        if presented.authorization == bearer("refused")["Authorization"]:
            raise Refusal(403, "token was rotated out")
        return Grant(nodepool="clusters/p", secret="ns/token-p")

    handlers = IgnitionHandlers(cache=replica, authenticator=TokenAuthenticator(replica), metrics=ServerMetrics(),
                                state=ServingState(ready=True), second_opinion=owner_says)
    client = await serving_client(handlers)
    assert (await client.get("/ignition", headers=bearer("new-to-the-worker"))).status == 200
    assert (await client.get("/ignition", headers=bearer("stale"))).status == 200
    refused = await client.get("/ignition", headers=bearer("refused"))
    assert refused.status == 403 and "rotated out" in await refused.text()
    assert len(asked) == 3
    # Without an owner to ask (one process), the replica's own answer stands.
    alone = IgnitionHandlers(cache=replica, authenticator=TokenAuthenticator(replica), metrics=ServerMetrics(),
                             state=ServingState(ready=True))
    client = await serving_client(alone)
    assert (await client.get("/ignition", headers=bearer("new-to-the-worker"))).status == 511
    assert (await client.get("/ignition", headers=bearer("stale"))).status == 403


def test_replica_follows_the_owners_index_change_by_change(tmp_path: Path) -> None:
    owner = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache"))
    owner.put_token("before", TokenRecord("clusters/a", "ns/a", TokenState.CURRENT, None))
    told: list[tuple[int, tuple]] = []
    generation, tokens, renders = owner.follow(lambda generation, change: told.append((generation, change)))
    replica = PayloadCache.replica(CacheConfig(cache_dir=tmp_path / "cache"), tokens, renders)
    owner.put_token("after", TokenRecord("clusters/a", "ns/a", TokenState.CURRENT, None))
    owner.put_render(RenderRecord("ns/a", "clusters/a", "d", "b" * 64, "3.2.0", 1.0))
    owner.put_token("before", TokenRecord("clusters/a", "ns/a", TokenState.RETIRED, 5.0))
    owner.forget_expired(now=10.0)
    assert all(g > generation for g, _ in told)
    replica.apply(change for _, change in told)
    assert replica.index_rows()[1:] == owner.index_rows()[1:]
    assert replica.lookup_token("before") is None and replica.lookup_token("after") is not None


def test_workers_serve_both_shapes_and_the_owner_counts_every_request(tmp_path: Path) -> None:
    proc = start(tmp_path, token_secret("workers", "tok-w"))
    try:
        statuses = [proc.get("/ignition", bearer("tok-w"))[0] for _ in range(30)]
        statuses += [proc.get("/config/workers?token=tok-w")[0] for _ in range(10)]
        assert statuses == [200] * 40
        # Each urllib request is a new connection: SO_REUSEPORT spreads them over both workers.
        # (The access log is written in batches, one per turn of a worker's event loop.)
        wait_for(lambda: len(re.findall(r'"request_id": "(w\d)-', proc.logs())) == 40, what="40 access log lines")
        assert set(re.findall(r'"request_id": "(w\d)-', proc.logs())) == {"w0", "w1"}
        metrics = proc.metrics()  # no wait: a scrape collects the workers' counts first
        assert metrics['ign_server_get_request{nodePool="clusters/workers"}'] == 40
        assert metrics['ign_server_responses_total{code="200"}'] == 40
        assert metrics["ign_server_workers_serving"] == 2
        assert proc.get("/ignition", bearer("never-issued"))[0] == 511
        assert proc.get("/config/other?token=tok-w")[0] == 403
        assert "tok-w" not in proc.logs()
    finally:
        proc.kill()


def test_a_rotation_never_gets_a_node_refused_by_a_worker(tmp_path: Path) -> None:
    proc = start(tmp_path, token_secret("workers", "tok-0"), token_ttl="3s")
    try:
        seen: set[str] = set()
        statuses: list[int] = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            secret = parse_token_secret(next(d for d in manifests(proc) if d["metadata"]["name"].startswith("token-")))
            # The manifest's current token: in the index it is current, or previous for the
            # moment between a rotation and its write-back; never retired.
            assert secret.token
            seen.add(secret.token)
            statuses.append(proc.get("/ignition", bearer(secret.token))[0])
        assert len(seen) >= 3, "the test needs at least two rotations"
        assert set(statuses) == {200}, sorted(set(statuses))
    finally:
        proc.kill()


def test_a_killed_worker_is_started_again_and_costs_no_boot(tmp_path: Path) -> None:
    proc = start(tmp_path, token_secret("workers", "tok-k"))
    outcomes: list[int | str] = []
    stop = threading.Event()

    def storm() -> None:
        while not stop.is_set():
            try:
                outcomes.append(proc.get("/ignition", bearer("tok-k"))[0])
            except OSError as exc:  # a connection the dead worker held: the client retries it
                outcomes.append(type(exc).__name__)

    thread = threading.Thread(target=storm)
    thread.start()
    try:
        victim = wait_for(lambda: worker_pids(proc).get(1))
        wait_for(lambda: len(outcomes) >= 20, what="the storm under way")
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: worker_pids(proc).get(1, victim) != victim, what="worker 1 started again")
        wait_for(lambda: proc.metrics().get("ign_server_workers_serving") == 2, what="two workers serving")
        served_before = len(outcomes)
        wait_for(lambda: len(outcomes) >= served_before + 20, what="the storm going on")
    finally:
        stop.set()
        thread.join()
    statuses = [o for o in outcomes if isinstance(o, int)]
    assert set(statuses) == {200}, sorted(set(map(str, outcomes)))
    assert len(outcomes) - len(statuses) <= 5  # at most the connections the killed worker held
    assert proc.metrics()["ign_server_worker_restarts_total"] == 1
    proc.kill()


def test_sigterm_drains_the_workers_and_exits_zero(tmp_path: Path) -> None:
    proc = start(tmp_path, token_secret("workers", "tok-t"))
    pids = list(wait_for(lambda: (p := worker_pids(proc)) and len(p) == 2 and p).values())
    assert proc.get("/ignition", bearer("tok-t"))[0] == 200
    assert proc.stop() == 0
    assert not any(alive(pid) for pid in pids)


def test_the_owners_death_takes_the_workers_with_it_and_a_restart_serves_at_once(tmp_path: Path) -> None:
    proc = start(tmp_path, token_secret("a", "tok-a"), token_secret("b", "tok-b"))
    pids = list(wait_for(lambda: (p := worker_pids(proc)) and len(p) == 2 and p).values())
    proc.kill()
    wait_for(lambda: not any(alive(pid) for pid in pids), timeout=15, what="the workers gone")
    proc.start()
    try:
        assert proc.get("/ignition", bearer("tok-a"))[0] == 200
        assert proc.get("/ignition", bearer("tok-b"))[0] == 200
        status, _headers, body = proc.get("/config/a?token=tok-a")
        assert status == 200 and json.loads(body)["ignition"]["version"]
    finally:
        proc.kill()


def test_the_default_worker_count_follows_the_cpus_and_a_containers_cpu_limit(tmp_path: Path) -> None:
    from ignition_server.workers.pool import default_worker_count

    cpus = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("max 100000\n")
    assert default_worker_count(cpu_max) == cpus
    cpu_max.write_text("50000 100000\n")  # half a CPU: still one worker
    assert default_worker_count(cpu_max) == 1
    cpu_max.write_text(f"{cpus * 100000 + 1} 100000\n")  # a limit above the cpuset: the cpuset
    assert default_worker_count(cpu_max) == cpus
    assert default_worker_count(tmp_path / "absent") == cpus
