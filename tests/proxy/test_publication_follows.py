"""The edge publication follows the server's serving pair: a certificate renewed or issued by a
rotated CA reaches `edge.pem`, and so the terminating proxy (`set ssl cert`, no reload), within
the publisher's 5 s. It was read once at the server's start: a proxy kept serving the first
certificate after the server had moved on (past the CA overlap, one nodes no longer trust)."""

from __future__ import annotations

import shutil
import socket
import ssl
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from ignition_server.tls.certificates import ensure_self_signed
from testsupport.harness import ProxyProcess, ServerProcess, wait_for, write_manifests
from testsupport.manifests import build_token_secret
from testsupport.realtools import require_tool

pytestmark = [pytest.mark.haproxy]


def served_certificate(port: int, ca: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        return tls.getpeercert(binary_form=True) or b""


def test_a_new_serving_certificate_reaches_the_terminating_proxy(tmp_path: Path) -> None:
    haproxy = require_tool("haproxy", "apt-get install haproxy")
    source = write_manifests(tmp_path / "src" / "a.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters-a/workers", token="t-1", generation_time=time.time())).parent
    edge = tmp_path / "edge"
    server = ServerProcess(source, tmp_path / "server" / "cache", extra=["--edge-dir", str(edge)]).start()
    proxy = ProxyProcess(tmp_path / "proxy" / "state")
    try:
        wait_for(lambda: (edge / "publication.json").exists(), what="the publication")
        proxy.write_table([{"host": "localhost", "mode": "terminate", "publication": str(edge),
                            "backends": [f"127.0.0.1:{server.port}"]}])
        proxy.start(haproxy)
        wait_for(proxy.servers_up, timeout=20, what="the server healthy behind the proxy")
        before = served_certificate(proxy.port, server.ca_file)
        # A new pair from the same CA, sealed as the server keeps it, put in place as a renewal does.
        tls, issuer = server.cache_dir / "tls", tmp_path / "issuer"
        issuer.mkdir()
        for name in ("ca.crt", "ca.key"):
            shutil.copy(tls / name, issuer / name)
        files = ensure_self_signed(issuer, server.url.replace("127.0.0.1", "localhost"), password=server.tls_password())
        shutil.copy(files.key, tls / "serving.key")
        shutil.copy(files.cert, tls / "serving.crt")
        new = x509.load_pem_x509_certificate(files.cert.read_bytes()).public_bytes(Encoding.DER)
        assert new != before
        wait_for(lambda: served_certificate(proxy.port, server.ca_file) == new, timeout=30,
                 what="the proxy serving the server's new certificate")
        assert proxy.reloads() == 0
    finally:
        proxy.stop()
        server.kill()
