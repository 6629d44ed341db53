"""Slow clients cannot hold connections, and one address cannot hold them all."""

from __future__ import annotations

import base64
import socket
import ssl
import time
from pathlib import Path

from harness import EXAMPLE_MACHINECONFIG, ServerProcess, wait_for, write_manifests
from ignition_server.sources.manifests import build_token_secret


def tls(proc: ServerProcess, source_ip: str = "127.0.0.1") -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", proc.port), timeout=10, source_address=(source_ip, 0))
    return ssl.create_default_context(cafile=str(proc.ca_file)).wrap_socket(raw, server_hostname="127.0.0.1")


def boot(proc: ServerProcess, source_ip: str = "127.0.0.1") -> bytes:
    token = base64.b64encode(b"tok-good").decode()
    with tls(proc, source_ip) as conn:
        conn.sendall(f"GET /ignition HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n".encode())
        return conn.recv(64)


def closed(conn: ssl.SSLSocket) -> bool:
    """Whether the server closed it (a read that times out means it is still open)."""
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError, OSError):
        return True


def server(tmp_path: Path, *flags: str) -> ServerProcess:
    write_manifests(tmp_path / "source" / "pool.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters/workers", token="tok-good",
        machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="workers"), generation_time=time.time()))
    proc = ServerProcess(tmp_path / "source", tmp_path / "cache", extra=list(flags)).start()
    wait_for(lambda: boot(proc).startswith(b"HTTP/1.1 200"), timeout=30, what="served")
    return proc


def test_a_client_dribbling_its_headers_is_cut_off(tmp_path: Path) -> None:
    proc = server(tmp_path, "--header-timeout", "2s")
    try:
        slow = tls(proc)
        slow.settimeout(15)
        slow.sendall(b"GET /ignition HTTP/1.1\r\n")
        started = time.monotonic()
        cut = False
        for byte in b"Host: dribble.example\r\nX-Slow: " + b"a" * 40:
            try:
                slow.sendall(bytes([byte]))
            except (ConnectionError, ssl.SSLError, OSError):
                cut = True
                break
            time.sleep(0.25)
        assert cut or closed(slow)
        assert time.monotonic() - started < 10  # closed near the 2 s header timeout, not whenever it liked
        assert boot(proc).startswith(b"HTTP/1.1 200")  # others are served meanwhile
    finally:
        proc.kill()


def test_one_address_cannot_hold_every_connection(tmp_path: Path) -> None:
    # The limits hold per serving process (each worker counts its own connections): one
    # worker makes the count exact.
    proc = server(tmp_path, "--connections-per-source", "3", "--header-timeout", "30s", "--workers", "1")
    held = []
    try:
        held = [tls(proc) for _ in range(3)]  # idle, handshake done: each counts
        extra = tls(proc)
        extra.settimeout(5)
        assert closed(extra)  # the fourth from the same address is closed at once
        assert boot(proc, "127.0.0.2").startswith(b"HTTP/1.1 200")  # another address is not affected
        for conn in held:
            conn.close()
        wait_for(lambda: boot(proc).startswith(b"HTTP/1.1 200"), timeout=10, interval=0.2, what="room again")
    finally:
        for conn in held:
            conn.close()
        proc.kill()
