"""The TLS edge in the server's own pod (issue 32): `ignition-proxy run` on an `in_pod` table
terminates TLS with the server's certificate on the public port, checks the token as terminate
routes do, and hands each request to the serving processes over `serve --edge-socket` (plain
HTTP, PROXY v2 naming the node)."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import ssl
import time
from pathlib import Path

import pytest

from testsupport import fleet
from testsupport.harness import ProxyProcess, ServerProcess, raw_status, wait_for, write_manifests
from testsupport.manifests import build_token_secret
from testsupport.realtools import require_tool


def connection(port: int, ca: Path, source: str = "127.0.0.1") -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10, source_address=(source, 0))
    return conn


def bearer(token: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {base64.b64encode(token.encode()).decode()}")]


def served_certificate(port: int, ca: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True) or b""


def tls_record_lengths(port: int, ca: Path, headers: list[tuple[str, str]]) -> tuple[int, list[int]]:
    """One GET /ignition over TLS 1.3, decrypted here while the records are read off the wire:
    the body's length and each application-data record's length, in order."""
    context = ssl.create_default_context(cafile=str(ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_3  # record lengths as sent: no CBC padding
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    lengths: list[int] = []
    wire = b""
    plain = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        def pump() -> bool:
            nonlocal wire
            raw.sendall(outgoing.read())
            data = raw.recv(1 << 16)
            wire += data
            while len(wire) >= 5 and len(wire) >= 5 + int.from_bytes(wire[3:5], "big"):
                size = int.from_bytes(wire[3:5], "big")
                if wire[0] == 23:  # application data (TLS 1.3 wraps everything after the hello so)
                    lengths.append(size)
                wire = wire[5 + size:]
            incoming.write(data)
            return bool(data)
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                assert pump(), "closed during the handshake"
        lengths.clear()  # the handshake's own encrypted records
        request = "GET /ignition HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        tls.write((request + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode())
        while True:
            raw.sendall(outgoing.read())
            try:
                chunk = tls.read(1 << 16)
                if not chunk:
                    break
                plain += chunk
            except ssl.SSLWantReadError:
                if not pump():
                    break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
    head, _, body = plain.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return len(body), lengths


def server_connects(proxy: ProxyProcess) -> int:
    """How many connections HAProxy has opened to the server (its `connect` counter, all slots)."""
    lines = proxy.runtime_command("show stat -1 4 -1").splitlines()
    header = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:] if line]
    return sum(int(row["connect"] or 0) for row in rows if row["svname"].startswith("s"))


@pytest.fixture
def haproxy() -> str:
    path = require_tool("haproxy", "apt-get install haproxy")
    assert shutil.which(path) or Path(path).exists()
    return path


def test_the_in_pod_edge_serves_as_the_server_does(tmp_path: Path, haproxy: str) -> None:
    source = write_manifests(tmp_path / "src" / "a.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters-a/workers", token="t-1", generation_time=time.time())).parent
    sock = tmp_path / "run" / "serve.sock"
    sock.parent.mkdir()
    edge = tmp_path / "pub"
    server = ServerProcess(source, tmp_path / "cache", extra=["--edge-dir", str(edge), "--edge-socket", str(sock),
                                                            "--workers", "2"]).start()
    proxy = ProxyProcess(tmp_path / "proxy" / "state")
    try:
        wait_for(lambda: (edge / "publication.json").exists(), what="the publication")
        wait_for(lambda: raw_status(connection(server.port, server.ca_file), "/ignition", bearer("t-1")) == 200,
                 timeout=60, what="the payload")
        proxy.write_table([{"host": "ignition.example.com", "mode": "terminate", "publication": str(edge),
                            "backends": [f"unix@{sock}"]}], in_pod=True)
        proxy.start(haproxy)
        wait_for(proxy.servers_up, what="the server healthy behind the edge")
        rendered = (tmp_path / "proxy" / "state" / "haproxy.cfg").read_text()
        assert "frontend ingress" not in rendered and f"server s0 unix@{sock}" in rendered
        # The same certificate (and CA) as the server's own port.
        assert served_certificate(proxy.port, server.ca_file) == served_certificate(server.port, server.ca_file)
        # The statuses a node sees, through the edge as from the server. A credential the edge's
        # pre-check refuses is answered 403 there (proxy/jwt_frontend.py, as on every terminate
        # route) where the server says 401: both final to the Ignition client, which gives up.
        for headers, status in [(bearer("t-1"), {200}), (bearer("never-issued"), {511}),
                                ([("Authorization", "Basic eA==")], {401, 403}), ([], {401, 403})]:
            direct = raw_status(connection(server.port, server.ca_file), "/ignition", headers)
            through = raw_status(connection(proxy.port, server.ca_file, "127.0.0.7"), "/ignition", headers)
            assert direct in status and through in status, (headers, direct, through)
        # The node's own address reaches the server (its limits and log), not the edge's.
        wait_for(lambda: any(json.loads(line).get("client") == "127.0.0.7" and json.loads(line).get("status") == 200
                             for line in server.logs().splitlines() if '"ignition_server.access"' in line),
                 what="the node's address in the server's access log")
        # Nothing of it listens beyond the pod: the server's side is a 0660 unix socket.
        assert sock.stat().st_mode & 0o777 == 0o660
        # A kept-alive node keeps its server connection, storm or not: a server connection
        # carries its client's PROXY header, so no other client can reuse it. Shared (HAProxy's
        # default), the storm's dead ones filled the idle pool and most of these requests paid
        # a new connection to the server (HAProxy closing the last one).
        for _ in range(12):  # a storm: one request per connection
            assert raw_status(connection(proxy.port, server.ca_file), "/ignition", bearer("t-1")) == 200
        before = server_connects(proxy)
        kept = [connection(proxy.port, server.ca_file) for _ in range(4)]
        for _ in range(5):
            for conn in kept:  # interleaved, so the others' server connections wait idle meanwhile
                conn.request("GET", "/ignition", headers=dict(bearer("t-1")))
                response = conn.getresponse()
                response.read()
                assert response.status == 200
        for conn in kept:
            conn.close()
        assert server_connects(proxy) - before == len(kept)
    finally:
        proxy.stop()
        server.stop()


def test_the_in_pod_edge_sends_a_payload_in_full_tls_records(tmp_path: Path, haproxy: str) -> None:
    """A payload of real size leaves the edge in writes of more than one TLS record: with HAProxy's
    default 16 KiB buffer each read from the server and each write to the node carried at most
    16,320 bytes, one record never full (ten records of 16,337 bytes for this payload), so the
    edge and the node paid twice the reads, sends and wake-ups (proxy/render.py, IN_POD_BUFSIZE).
    A full record (16 KiB of data + 17 bytes) is one that a larger write was cut into."""
    meta = fleet.generate(tmp_path / "fleet", 1, 1, 120, progress=False)
    nodepool, token = next(iter(meta["tokens"].items()))
    headers = [*bearer(token), ("NodePool", nodepool)]
    sock = tmp_path / "run" / "serve.sock"
    sock.parent.mkdir()
    edge = tmp_path / "pub"
    server = ServerProcess(Path(meta["source"]), tmp_path / "cache",
                           extra=["--edge-dir", str(edge), "--edge-socket", str(sock)]).start()
    proxy = ProxyProcess(tmp_path / "proxy" / "state")
    try:
        wait_for(lambda: (edge / "publication.json").exists(), what="the publication")
        wait_for(lambda: raw_status(connection(server.port, server.ca_file), "/ignition", headers) == 200,
                 timeout=60, what="the payload")
        proxy.write_table([{"host": "ignition.example.com", "mode": "terminate", "publication": str(edge),
                            "backends": [f"unix@{sock}"]}], in_pod=True)
        proxy.start(haproxy)
        wait_for(proxy.servers_up, what="the server healthy behind the edge")
        size, records = tls_record_lengths(proxy.port, server.ca_file, headers)
        assert size > 100 * 1024, size
        full = sum(1 for n in records if n == 16384 + 17)
        assert full >= size // (2 * 16384), (size, records)
    finally:
        proxy.stop()
        server.stop()
