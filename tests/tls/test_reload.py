"""TLS on the serving port: a given certificate is reloaded from disk when it changes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import ssl
from pathlib import Path

from ignition_server.tls.certificates import (
    TLSFiles,
    ensure_self_signed,
    reload_on_change,
    serving_context,
)
from ignition_server.tls.profiles import profile as tls_profile
from testsupport.harness import ServerProcess, wait_for, write_manifests
from testsupport.manifests import build_token_secret


def handshake_ok(port: int, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                return tls.version() in ("TLSv1.2", "TLSv1.3")
    except (ssl.SSLError, OSError):
        return False


def test_given_certificate_is_reloaded_when_it_changes(tmp_path: Path) -> None:
    first = ensure_self_signed(tmp_path / "pki-1", "https://127.0.0.1")
    second = ensure_self_signed(tmp_path / "pki-2", "https://127.0.0.1")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first.cert, cert)
    shutil.copy(first.key, key)
    write_manifests(tmp_path / "source" / "p.yaml", build_token_secret(namespace="ns", nodepool="ns/p", token="t"))
    proc = ServerProcess(tmp_path / "source", tmp_path / "cache", extra=["--tls-cert", str(cert), "--tls-key", str(key)])
    proc.ca = first.ca  # what the harness trusts for /readyz
    proc.start()
    try:
        assert handshake_ok(proc.port, first.ca) and not handshake_ok(proc.port, second.ca)
        # Rotate the certificate on disk (as cert-manager would): no restart.
        for source, target in ((second.cert, cert), (second.key, key)):
            tmp = target.with_suffix(".new")
            shutil.copy(source, tmp)
            os.replace(tmp, target)
        # Every serving process reloads on its own: once 32 new connections in a row get the new
        # certificate (the kernel spreads them over the workers: a worker still on the old pair is
        # skipped 32 times in a row about once in 4 billion; 8 let it slip through now and then),
        # none gets the old one.
        wait_for(lambda: all(handshake_ok(proc.port, second.ca) for _ in range(32)), what="the new certificate served")
        assert not any(handshake_ok(proc.port, first.ca) for _ in range(8))
        assert "reloaded the serving certificate" in proc.logs()
    finally:
        proc.kill()


def test_a_certificate_replaced_before_its_key_keeps_the_current_pair(tmp_path: Path) -> None:
    """A certificate written before its key (two renames, a reload in between) must not pair the
    new certificate with the old key: that broke every handshake while the log said the current
    pair was kept. The new pair is taken once both halves match."""
    first = ensure_self_signed(tmp_path / "pki-1", "https://127.0.0.1")
    second = ensure_self_signed(tmp_path / "pki-2", "https://127.0.0.1")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first.cert, cert)
    shutil.copy(first.key, key)
    (tmp_path / "source").mkdir()
    proc = ServerProcess(tmp_path / "source", tmp_path / "cache", extra=["--tls-cert", str(cert), "--tls-key", str(key)])
    proc.ca = first.ca
    proc.start()
    try:
        shutil.copy(second.cert, cert.with_suffix(".new"))
        os.replace(cert.with_suffix(".new"), cert)  # the certificate alone
        wait_for(lambda: proc.logs().count("does not match") >= 1, timeout=30, what="the mismatched pair noticed")
        assert all(handshake_ok(proc.port, first.ca) for _ in range(8))  # every process still serves the old pair
        shutil.copy(second.key, key.with_suffix(".new"))
        os.replace(key.with_suffix(".new"), key)  # then its key
        wait_for(lambda: all(handshake_ok(proc.port, second.ca) for _ in range(8)), what="the new pair served")
    finally:
        proc.kill()


def test_no_session_tickets_are_issued(tmp_path: Path) -> None:
    """A booting node never resumes a session: a ticket would be work for nothing per handshake."""
    import socket
    import ssl

    write_manifests(tmp_path / "source" / "p.yaml", build_token_secret(namespace="ns", nodepool="ns/p", token="t"))
    proc = ServerProcess(tmp_path / "source", tmp_path / "cache").start()
    try:
        for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            context = ssl.create_default_context(cafile=str(proc.ca_file))
            context.minimum_version = context.maximum_version = version
            with socket.create_connection(("127.0.0.1", proc.port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    assert tls.recv(100).startswith(b"HTTP/1.1 200")  # TLS 1.3 tickets arrive after the handshake
                    assert tls.session is not None and not tls.session.has_ticket, version
    finally:
        proc.kill()


async def test_a_pair_replaced_while_the_process_starts_is_reloaded(tmp_path: Path) -> None:
    """The pair replaced after a serving process loaded it, before its reload task first looked
    (a worker starting while cert-manager renews): still a change. The task once stamped the
    files when it started, took the new pair for the one loaded, and the process served the
    old certificate until the next renewal while the others served the new one."""
    first = ensure_self_signed(tmp_path / "pki-1", "https://127.0.0.1")
    second = ensure_self_signed(tmp_path / "pki-2", "https://127.0.0.1")
    files = TLSFiles(tmp_path / "tls.crt", tmp_path / "tls.key", None)
    shutil.copy(first.cert, files.cert)
    shutil.copy(first.key, files.key)
    context, loaded = serving_context(files, tls_profile("Default"))  # as the server and its workers load it
    for source, target in ((second.cert, files.cert), (second.key, files.key)):  # renewed meanwhile
        tmp = target.with_suffix(".new")
        shutil.copy(source, tmp)
        os.replace(tmp, target)
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    assert await asyncio.to_thread(handshake_ok, port, first.ca)  # the pair it loaded, until it looks
    reload = asyncio.create_task(reload_on_change(context, files, loaded=loaded, interval=0.01))
    try:
        for _ in range(500):
            if await asyncio.to_thread(handshake_ok, port, second.ca):
                break
            await asyncio.sleep(0.01)
        assert await asyncio.to_thread(handshake_ok, port, second.ca)
        assert not await asyncio.to_thread(handshake_ok, port, first.ca)
    finally:
        reload.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reload
        server.close()
        await server.wait_closed()
