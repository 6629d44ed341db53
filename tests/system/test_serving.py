"""The serving core end to end: a real server process, real TLS, the real Ignition client."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ignition_server.model.token_secret import parse_token_secret
from ignition_server.render.userdata import pointer_config
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, bearer, wait_for, write_manifests
from testsupport.ignition_client import files_in, finish_fetch, ignition_fetch, require_ignition
from testsupport.manifests import build_token_secret
from testsupport.serving import current_secret, token_secret, wait_rendered

pytestmark = pytest.mark.ignition


@pytest.fixture
def server(tmp_path: Path):
    servers: list[ServerProcess] = []

    def make(token_ttl: str = "11h", source: Path | None = None, cache_dir: Path | None = None,
             extra: tuple[str, ...] = ()) -> ServerProcess:
        proc = ServerProcess(source or tmp_path / "source", cache_dir or tmp_path / "cache", token_ttl=token_ttl,
                             extra=list(extra))
        proc.source.mkdir(exist_ok=True)
        servers.append(proc)
        return proc

    yield make
    for proc in servers:
        proc.kill()


@pytest.mark.parametrize("shape", ["hypershift", "mcs"])
def test_real_client_fetches_payload_in_both_shapes(server, tmp_path: Path, shape: str) -> None:
    require_ignition()
    proc = server()
    write_manifests(proc.source / "pool.yaml", token_secret("workers", "tok-alpha-1"))
    proc.start()
    wait_rendered(proc, 1)
    pointer = pointer_config(
        source_url=proc.url, token="tok-alpha-1", ca_pem=proc.ca_file.read_bytes(), shape=shape, nodepool="clusters/workers"
    )
    run = ignition_fetch(pointer, tmp_path / "node")
    assert run.returncode == 0, run.output
    assert run.config is not None
    assert files_in(run.config)["/etc/workers.conf"] == "data:,hello%20from%20workers%0A"
    units = {u["name"]: u for u in run.config["systemd"]["units"]}
    assert units["workers.service"]["enabled"] is True
    assert "tok-alpha-1" not in proc.logs()
    assert proc.metrics()['ign_server_get_request{nodePool="clusters/workers"}'] == 1


def test_refusals_follow_the_retry_contract(server) -> None:
    proc = server()
    write_manifests(proc.source / "pool.yaml", token_secret("workers", "tok-good"))
    proc.start()
    wait_rendered(proc, 1)
    assert proc.get("/ignition")[0] == 401
    assert proc.get("/ignition", {"Authorization": "Bearer %%%"})[0] == 401
    assert proc.get("/ignition", {"Authorization": "Basic " + base64.b64encode(b"a:b").decode()})[0] == 401
    assert proc.get("/ignition", bearer("never-seen"))[0] == 511
    assert proc.get("/ignition", {**bearer("tok-good"), "NodePool": "clusters/other"})[0] == 403
    assert proc.get("/config/other?token=tok-good")[0] == 403
    assert proc.get("/ignition", bearer("tok-good"), method="POST")[0] == 405
    status, headers, body = proc.get("/ignition", {**bearer("tok-good"), "NodePool": "clusters/workers"})
    assert status == 200
    assert headers["Cache-Control"] == "no-store"
    assert json.loads(body)["ignition"]["version"] == "3.2.0"
    assert proc.get("/config/workers?token=tok-good")[0] == 200
    # The client's maximum decides the version it gets.
    status, headers, body = proc.get(
        "/ignition", {**bearer("tok-good"), "Accept": "application/vnd.coreos.ignition+json;version=3.1.0, */*;q=0.1"}
    )
    assert status == 200 and json.loads(body)["ignition"]["version"] == "3.1.0"
    assert headers["Content-Type"].endswith("version=3.1.0")
    status, _, body = proc.get(
        "/ignition", {**bearer("tok-good"), "Accept": "application/vnd.coreos.ignition+json;version=3.6.0"}
    )
    assert status == 200 and json.loads(body)["ignition"]["version"] == "3.6.0"
    logs = proc.logs()
    assert "tok-good" not in logs and "never-seen" not in logs


@pytest.mark.parametrize("workers", ["0", "1"])
def test_only_a_get_that_served_a_payload_sets_ignition_reached(server, workers: str) -> None:
    # HEAD is answered like GET without the body: no node booted from it, so it must not tell
    # HyperShift (and whoever watches the annotation) that one did.
    proc = server(extra=("--workers", workers))
    probed = write_manifests(proc.source / "probed.yaml", token_secret("probed", "tok-probed"))
    booted = write_manifests(proc.source / "booted.yaml", token_secret("booted", "tok-booted"))
    proc.start()
    wait_rendered(proc, 2)
    for shape in ("/ignition", "/config/probed?token=tok-probed"):
        assert proc.get(shape, bearer("tok-probed") if shape == "/ignition" else None, method="HEAD")[0] == 200
    assert proc.get("/ignition", bearer("tok-booted"))[0] == 200
    # ign_server_get_request counts them all, as HyperShift's does: its handler has no method check (net/http
    # runs it for a HEAD, drops the body) and counts every request it answered with the payload.
    wait_for(lambda: proc.metrics().get('ign_server_get_request{nodePool="clusters/probed"}') == 2,
             what="both HEADs counted")
    wait_for(lambda: parse_token_secret(current_secret(booted)).ignition_reached, what="ignition-reached after a GET")
    assert proc.stop() == 0  # drains: a write-back already asked for is done before exit
    assert not parse_token_secret(current_secret(probed)).ignition_reached


def test_unknown_token_gets_511_and_the_client_retries_until_it_appears(server, tmp_path: Path) -> None:
    require_ignition()
    proc = server()
    write_manifests(proc.source / "other.yaml", token_secret("other", "tok-other"))
    proc.start()
    pointer = pointer_config(source_url=proc.url, token="tok-late", ca_pem=proc.ca_file.read_bytes(), nodepool="clusters/late")
    client = ignition_fetch(pointer, tmp_path / "node", background=True)
    # The client keeps retrying a 511 (several answered) instead of giving up.
    wait_for(lambda: proc.metrics().get('ign_server_responses_total{code="511"}', 0) >= 3, what="three 511s")
    assert client.poll() is None, "the client must keep retrying a 511"
    write_manifests(proc.source / "late.yaml", token_secret("late", "tok-late"))
    output, _ = client.communicate(timeout=30)
    run = finish_fetch(client, output, tmp_path / "node")
    assert run.returncode == 0, output
    assert "/etc/late.conf" in files_in(run.config or {})
    assert output.count("GET result: Network Authentication Required") >= 2, output


def test_rotation_keeps_the_previous_token_and_retires_the_one_before(server, tmp_path: Path) -> None:
    require_ignition()
    # A rotation every 6 s: the real client's fetch with the previous token must fit between two
    # rotations, and on a loaded machine 3 s (a 6 s TTL) was not always enough.
    proc = server(token_ttl="12s")
    path = write_manifests(proc.source / "pool.yaml", token_secret("workers", "tok-gen-0"))
    proc.start()
    wait_rendered(proc, 1)
    ca = proc.ca_file.read_bytes()

    def token_now() -> str:
        return parse_token_secret(current_secret(path)).token or ""

    # First rotation: tok-gen-0 becomes old_token and must still boot a node.
    first = wait_for(lambda: token_now() if token_now() != "tok-gen-0" else None, timeout=30)
    assert parse_token_secret(current_secret(path)).old_token == "tok-gen-0"
    run = ignition_fetch(pointer_config(source_url=proc.url, token="tok-gen-0", ca_pem=ca), tmp_path / "node-a")
    assert run.returncode == 0, run.output
    # Second rotation: tok-gen-0 is two rotations old: refused for good (403, the client stops).
    wait_for(lambda: token_now() not in ("tok-gen-0", first), timeout=30)
    assert proc.get("/ignition", bearer("tok-gen-0"))[0] == 403
    run = ignition_fetch(pointer_config(source_url=proc.url, token="tok-gen-0", ca_pem=ca), tmp_path / "node-b", timeout=20)
    assert run.returncode not in (0, None), run.output
    # Counted once the rotation is durable in the index too (just after the manifest is written).
    wait_for(lambda: proc.metrics()["ign_server_token_rotation_total"] >= 2, what="two rotations counted")
    # Also after a crash and restart: the retired token is remembered as a keyed hash.
    proc.kill()
    proc.start()
    assert proc.get("/ignition", bearer("tok-gen-0"))[0] == 403
    assert proc.get("/ignition", bearer(token_now()))[0] == 200
    # Rotation never re-renders.
    assert proc.metrics().get("ign_server_payload_cache_miss_total", 0) == 0


def test_restart_after_kill_serves_every_payload_before_any_render(server) -> None:
    proc = server()
    pools = [f"pool-{i}" for i in range(6)]
    for pool in pools:
        write_manifests(proc.source / f"{pool}.yaml", token_secret(pool, f"tok-{pool}"))
    proc.start()
    wait_rendered(proc, len(pools))
    assert proc.metrics()["ign_server_payload_cache_miss_total"] == len(pools)
    proc.kill()
    proc.start(wait=False)
    proc.wait_ready()
    for pool in pools:
        status, _, body = proc.get("/ignition", bearer(f"tok-{pool}"))
        assert status == 200, body
        assert f"/etc/{pool}.conf".encode() in body
    wait_for(lambda: "listed " in proc.logs(), what="the first listing")  # applied: still nothing to render
    metrics = proc.metrics()
    assert metrics.get("ign_server_payload_cache_miss_total", 0) == 0
    assert metrics.get("ign_server_payload_generation_seconds_count", 0) == 0


def test_invalid_config_keeps_the_last_good_payload_and_says_why(server) -> None:
    proc = server()
    path = write_manifests(proc.source / "pool.yaml", token_secret("workers", "tok-w"))
    proc.start()
    wait_rendered(proc, 1)
    wait_for(lambda: parse_token_secret(current_secret(path)).reason == "AsExpected")
    good = proc.get("/ignition", bearer("tok-w"))[2]
    broken = current_secret(path)
    bad_config = EXAMPLE_MACHINECONFIG.format(name="workers").replace("path: /etc/workers.conf", "path: etc/relative")
    broken["data"]["config"] = build_token_secret(
        namespace="x", nodepool="x/y", token="t", machineconfigs_yaml=bad_config
    )["data"]["config"]
    write_manifests(path, broken)
    secret = wait_for(lambda: (s := parse_token_secret(current_secret(path))).reason == "InvalidConfig" and s)
    assert "etc/relative" in secret.message
    assert proc.get("/ignition", bearer("tok-w"))[2] == good
    # Fixed again: back to AsExpected, and the new payload is served.
    fixed = current_secret(path)
    fixed["data"]["config"] = build_token_secret(
        namespace="x", nodepool="x/y", token="t", machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="fixed")
    )["data"]["config"]
    write_manifests(path, fixed)
    wait_for(lambda: parse_token_secret(current_secret(path)).reason == "AsExpected")
    assert b"/etc/fixed.conf" in proc.get("/ignition", bearer("tok-w"))[2]


def test_sigterm_drains_and_exits_zero(server) -> None:
    proc = server()
    write_manifests(proc.source / "pool.yaml", token_secret("workers", "tok-t"))
    proc.start()
    assert proc.stop() == 0


def test_a_response_in_flight_at_sigterm_completes(server) -> None:
    import os
    import signal
    import socket

    proc = server()
    # A payload far larger than the socket buffers, read slowly: its response is still being
    # written when SIGTERM arrives.
    noise = base64.b64encode(os.urandom(6 * 1024 * 1024)).decode()
    big = EXAMPLE_MACHINECONFIG.format(name="big").replace(
        "source: data:,hello%20from%20big%0A", f"source: data:;base64,{noise}")
    write_manifests(proc.source / "big.yaml", build_token_secret(
        namespace="clusters-demo", nodepool="clusters/big", token="tok-big", machineconfigs_yaml=big,
        generation_time=time.time()))
    proc.start()
    wait_rendered(proc, 1)
    raw = socket.create_connection(("127.0.0.1", proc.port), timeout=30)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    conn = proc.ssl_context().wrap_socket(raw, server_hostname="localhost")
    token = base64.b64encode(b"tok-big").decode()
    conn.sendall(f"GET /ignition HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n"
                 f"Connection: close\r\n\r\n".encode())
    received = conn.recv(64 * 1024)
    assert received.startswith(b"HTTP/1.1 200")
    proc.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "draining" in proc.logs(), what="the server draining")
    assert proc.proc.poll() is None, "exited with a response in flight"
    chunks = [received]
    while chunk := conn.recv(256 * 1024):
        chunks.append(chunk)
    conn.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    assert len(body) == length and noise[-1000:].encode() in body
    assert json.loads(body)["storage"]["files"]
    assert proc.proc.wait(30) == 0


def test_cache_survives_an_unreadable_source_and_holds_no_plaintext(server, tmp_path: Path) -> None:
    proc = server()
    marker_token = "tok-secret-marker-9f8e7d"
    write_manifests(proc.source / "pool.yaml", token_secret("marker", marker_token))
    proc.start()
    wait_rendered(proc, 1)
    status, _, body = proc.get("/ignition", bearer(marker_token))
    assert status == 200
    # Nothing in the cache dir (or its key file's neighbours) holds the payload or the token in clear.
    needles = [marker_token.encode(), base64.b64encode(marker_token.encode()), b"hello%20from%20marker", body[:64]]
    for file in proc.cache_dir.rglob("*"):
        if file.is_file() and file.parent.name != "tls":
            content = file.read_bytes()
            for needle in needles:
                assert needle not in content, f"{needle!r} found in {file}"
    # As if the API server were down: the source is gone after a restart; the cache still serves.
    proc.kill()
    proc.source.rename(tmp_path / "source-away")
    proc.start()
    status, _, again = proc.get("/ignition", bearer(marker_token))
    assert status == 200 and again == body
    wait_for(lambda: "unavailable, serving from the cache" in proc.logs(), what="the source's absence logged")


def test_a_payload_the_client_cannot_read_gets_a_4xx_that_says_why(server) -> None:
    proc = server()
    kargs = EXAMPLE_MACHINECONFIG.format(name="kargs") + "  kernelArguments:\n  - nosmt\n"
    write_manifests(proc.source / "pool.yaml", build_token_secret(
        namespace="clusters-demo", nodepool="clusters/kargs", token="tok-k", machineconfigs_yaml=kargs,
        generation_time=time.time()))
    proc.start()
    wait_rendered(proc, 1)
    status, _, body = proc.get("/ignition", {**bearer("tok-k"), "Accept": "application/vnd.coreos.ignition+json;version=3.2.0"})
    assert status == 406 and b"3.3.0" in body and b"kernelArguments" in body
    # `render --spec-version` says the same thing in the same words.
    cli = subprocess.run(
        [sys.executable, "-m", "ignition_server", "render", "--source", str(proc.source), "--nodepool", "clusters/kargs",
         "--spec-version", "3.2.0"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and f"error: {body.decode().strip()}" in cli.stderr, cli.stderr
    status, _, body = proc.get("/ignition", {**bearer("tok-k"), "Accept": "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0.1"})
    assert status == 200 and json.loads(body)["kernelArguments"]["shouldExist"] == ["nosmt"]
    # curl-like: the lowest version >= 3.2.0 that expresses the payload.
    assert json.loads(proc.get("/ignition", bearer("tok-k"))[2])["ignition"]["version"] == "3.3.0"


def test_a_tampered_payload_is_never_served_and_is_rendered_again(server) -> None:
    proc = server()
    write_manifests(proc.source / "pool.yaml", token_secret("workers", "tok-tamper"))
    proc.start()
    wait_rendered(proc, 1)
    good = proc.get("/ignition", bearer("tok-tamper"))[2]
    proc.kill()  # so the payload is read from disk, not from the memory tier
    blob = next(p for p in (proc.cache_dir / "blobs").rglob("*") if p.is_file())
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
    proc.start()
    status, headers, _ = proc.get("/ignition", bearer("tok-tamper"))
    assert status == 503 and headers["Retry-After"]
    assert any((proc.cache_dir / "quarantine").iterdir())
    # The reconciler renders it again; the same payload comes back.
    assert wait_for(lambda: proc.get("/ignition", bearer("tok-tamper"))[2] == good)
    assert proc.metrics()["ign_server_cache_quarantined_blobs_total"] == 1
