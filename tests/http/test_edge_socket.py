"""serve --edge-socket: plain HTTP on a unix socket for the pod's own TLS edge, each connection
naming its node in a PROXY v2 header (issue 32)."""

from __future__ import annotations

import base64
import fcntl
import json
import socket
import struct
import termios
import time
from pathlib import Path

import pytest

from ignition_server.http.proxy_protocol import NOT_YET, header_now
from testsupport import fleet as fleetgen
from testsupport.harness import ServerProcess, wait_for

from .test_connection_guard import connections, server

V2 = b"\r\n\r\n\x00\r\nQUIT\n"


def v2_header(client: str, port: int = 40000) -> bytes:
    """What HAProxy's send-proxy-v2 sends for a TCP4 client (PROXY command, no TLVs)."""
    body = socket.inet_aton(client) + socket.inet_aton("10.0.0.1") + struct.pack("!HH", port, 9090)
    return V2 + bytes([0x21, 0x11]) + struct.pack("!H", len(body)) + body


def v1_header(client: str, port: int = 40000) -> bytes:
    """What nginx's `proxy_protocol on` sends (v1 only)."""
    return f"PROXY TCP4 {client} 10.0.0.1 {port} 9090\r\n".encode()


def ask(sock_path: Path, header: bytes, token: str = "tok-good", keep: socket.socket | None = None) -> tuple[bytes, socket.socket]:
    """One GET /ignition over the edge socket (on `keep`'s connection if given): the status line and the connection."""
    conn = keep or socket.socket(socket.AF_UNIX)
    if keep is None:
        conn.settimeout(10)
        conn.connect(str(sock_path))
    auth = base64.b64encode(token.encode()).decode()
    conn.sendall(header + f"GET /ignition HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {auth}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += conn.recv(65536)
    return head.split(b"\r\n")[0], conn


def clients(proc: ServerProcess) -> list[str]:
    return [json.loads(line)["client"] for line in proc.logs().splitlines()
            if '"ignition_server.access"' in line and '"GET /ignition' in line]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_edge_socket_serves_each_node_as_its_proxy_header_names_it(tmp_path: Path, workers: str) -> None:
    sock = tmp_path / "edge" / "serve.sock"
    sock.parent.mkdir()
    proc = server(tmp_path, "--edge-socket", str(sock), "--workers", workers, "--connections-per-source", "2",
                  "--header-timeout", "60s")
    held: list[socket.socket] = []
    try:
        assert sock.stat().st_mode & 0o777 == 0o660  # the pod's edge, no one else
        status, conn = ask(sock, v2_header("192.0.2.7"))
        assert status == b"HTTP/1.1 200 OK"
        status, conn = ask(sock, b"", keep=conn)  # kept alive: the header came once, with the connection
        assert status == b"HTTP/1.1 200 OK"
        conn.close()
        status, conn = ask(sock, v1_header("192.0.2.11"))  # nginx's `proxy_protocol on`
        assert status == b"HTTP/1.1 200 OK"
        conn.close()
        status, conn = ask(sock, v2_header("192.0.2.8"), token="tok-unknown")
        assert status.startswith(b"HTTP/1.1 511")  # the server's check still decides, statuses as over TLS
        conn.close()
        status, conn = ask(sock, b"")  # no header: the pod itself (a probe)
        assert status == b"HTTP/1.1 200 OK"
        conn.close()
        # Each worker writes its own lines: counted, not in order.
        wait_for(lambda: clients(proc).count("192.0.2.7") == 2 and clients(proc).count("192.0.2.8") == 1
                 and clients(proc).count("192.0.2.11") == 1,
                 what="the nodes' addresses in the access log")
        # Per-node limits hold behind the edge: 192.0.2.9's quota of 2, not the edge's.
        for _ in range(2):
            conn = socket.socket(socket.AF_UNIX)
            conn.connect(str(sock))
            conn.sendall(v2_header("192.0.2.9"))
            held.append(conn)
        wait_for(lambda: sum(connections(proc)[0].values()) == 2, what="both counted")
        third = socket.socket(socket.AF_UNIX)
        third.settimeout(10)
        third.connect(str(sock))
        third.sendall(v2_header("192.0.2.9"))
        assert third.recv(1) == b""  # over its quota: closed
        third.close()
        status, conn = ask(sock, v2_header("192.0.2.10"))
        assert status == b"HTTP/1.1 200 OK"
        conn.close()
    finally:
        for conn in held:
            conn.close()
        proc.stop()
    assert not sock.exists()  # removed at shutdown


def test_a_whole_v1_header_is_read_with_the_accept() -> None:
    """nginx's v1 line, arrived whole with its request, is read off at once, exactly (no coroutine,
    no byte-by-byte read: that was every connection of an nginx edge); a split one waits for the rest."""
    edge, server_end = socket.socketpair(socket.AF_UNIX)
    with edge, server_end:
        server_end.setblocking(False)
        assert header_now(server_end) is NOT_YET  # nothing yet
        edge.sendall(b"PROXY TCP4 192.0.2.11 10.0")
        assert header_now(server_end) is NOT_YET  # split: left for the careful path, nothing read
        edge.sendall(b".0.1 40000 9090\r\nGET / HTTP/1.1\r\n\r\n")
        assert header_now(server_end) == ("192.0.2.11", 40000)
        assert server_end.recv(100) == b"GET / HTTP/1.1\r\n\r\n"  # the request, untouched
    edge, server_end = socket.socketpair(socket.AF_UNIX)
    with edge, server_end:
        edge.sendall(b"PROXY " + b"9" * 200 + b"\r\n")  # longer than any v1 line: the careful path refuses it
        assert header_now(server_end) is NOT_YET


def test_a_stale_socket_is_replaced_at_start(tmp_path: Path) -> None:
    sock = tmp_path / "serve.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))  # left by a killed server: bound, no one listening
    stale.close()
    proc = server(tmp_path, "--edge-socket", str(sock), "--workers", "0")
    try:
        start = time.monotonic()
        status, conn = ask(sock, v2_header("192.0.2.7"))
        assert status == b"HTTP/1.1 200 OK" and time.monotonic() - start < 10
        conn.close()
    finally:
        proc.stop()


def test_a_payload_is_handed_to_the_edge_in_one_write(tmp_path: Path) -> None:
    """A ~300 KiB payload waits whole in the edge's socket: the serving process wrote it at once
    instead of in 200 KiB steps, each waiting for HAProxy to read (its CPU per request)."""
    meta = fleetgen.generate(tmp_path / "fleet", 1, 1, 300, progress=False)
    nodepool, token = next(iter(meta["tokens"].items()))
    sock = tmp_path / "edge" / "serve.sock"
    sock.parent.mkdir()
    proc = ServerProcess(Path(meta["source"]), tmp_path / "cache", extra=["--edge-socket", str(sock), "--workers", "0"])
    request = (v2_header("192.0.2.7") + b"GET /ignition HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
               + base64.b64encode(token.encode()) + f"\r\nNodePool: {nodepool}\r\n\r\n".encode())

    def response() -> bytes:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(10)
            conn.connect(str(sock))
            conn.sendall(request)
            data = b""
            while chunk := conn.recv(1 << 20):
                data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                if body and len(body) >= int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]):
                    return data
            return data

    try:
        proc.start()
        wait_for(lambda: response().startswith(b"HTTP/1.1 200"), timeout=120, what="the payload")
        whole = len(response())
        assert whole > 300 * 1024
        with socket.socket(socket.AF_UNIX) as conn:  # asked, and nothing read
            conn.connect(str(sock))
            conn.sendall(request)

            def waiting() -> int:
                return struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.FIONREAD, b"\0" * 4))[0]
            wait_for(lambda: waiting() == whole, timeout=10, what=f"the whole response waiting ({whole} bytes)")
    finally:
        proc.stop()
