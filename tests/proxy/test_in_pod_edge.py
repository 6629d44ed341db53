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
