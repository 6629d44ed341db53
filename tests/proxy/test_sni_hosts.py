"""Taken-over clusters behind a *terminate* route (issue 29): each cluster's Route hostname gets,
at the proxy, a certificate for that name signed by the CA of its `ignition-server-ca-cert`,
chosen by SNI as the server itself chooses (tls/sni.py), from what the server publishes
(`--edge-dir`: `hosts`, tls/sni_files.py). Real server, real HAProxy, `openssl s_client
-servername ... -verify_hostname` against the CA, as tests/system/test_takeover_sni.py does
against the server alone."""

from __future__ import annotations

import json
import ssl
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ignition_server.tls.sni import write_hosts
from testsupport.harness import ProxyProcess, ServerProcess, sni_handshake, status_over_tls, wait_for, write_manifests
from testsupport.manifests import build_token_secret
from testsupport.realtools import require_tool

pytestmark = [pytest.mark.haproxy]
HOSTS = ("ignition.alpha.apps.example.com", "ignition-beta.hosted.example.net", "nodes.gamma.example.org")


def fetch(port: int, host: str, ca: Path, target: str) -> int:
    """One GET through the proxy, SNI and Host `host`, verified for that name with `ca`."""
    return status_over_tls(port, host, ssl.create_default_context(cafile=str(ca)), target)


def published_hosts(edge: Path) -> list[str]:
    try:
        return sorted(json.loads((edge / "publication.json").read_text()).get("hosts", {}))
    except (OSError, ValueError):
        return []


@pytest.mark.parametrize("in_pod", [False, True], ids=["front-proxy", "in-pod-edge"])
def test_a_terminate_route_serves_each_taken_over_hostname_its_own_certificate(tmp_path: Path, in_pod: bool) -> None:
    """In front of the servers (SNI-routed: the published names go to the route, others nowhere)
    and as the in-pod edge (one TLS bind: the published names get theirs, others the default one)."""
    haproxy = require_tool("haproxy", "apt-get install haproxy")
    source = write_manifests(tmp_path / "src" / "a.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters-a/workers", token="t-1", generation_time=time.time())).parent
    edge = tmp_path / "edge"
    sock = tmp_path / "run" / "serve.sock"
    sock.parent.mkdir()
    server = ServerProcess(source, tmp_path / "server" / "cache", extra=[
        "--edge-dir", str(edge), *(["--edge-socket", str(sock)] if in_pod else [])]).start()
    proxy = ProxyProcess(tmp_path / "proxy" / "state")
    try:
        tls_dir = server.cache_dir / "tls"
        write_hosts(tls_dir, HOSTS)  # what the takeover writes for the HCPs it took over
        wait_for(lambda: published_hosts(edge) == sorted(HOSTS), timeout=20, what="the hostnames published")
        proxy.write_table([{"host": "localhost", "mode": "terminate", "publication": str(edge),
                            "backends": [f"unix@{sock}" if in_pod else f"127.0.0.1:{server.port}"]}], in_pod=in_pod)
        proxy.start(haproxy)
        wait_for(proxy.servers_up, timeout=20, what="the server healthy behind the proxy")

        for host in HOSTS:
            verdict, san = sni_handshake(proxy.port, host, server.ca_file)
            assert verdict.endswith("(ok)"), (host, verdict)
            assert f"DNS:{host}" in san, san
            assert not any(other in san for other in HOSTS if other != host), f"{host}'s certificate names another: {san}"
            wait_for(lambda host=host: wait_for_payload(proxy.port, host, server.ca_file), timeout=30,
                     what=f"a payload through {host}")
        # A name the server did not publish: not routed (no certificate at all), or in the pod, the
        # default certificate, which does not cover it.
        verdict, san = sni_handshake(proxy.port, "attacker.example.com", server.ca_file)
        assert "attacker" not in san and not (verdict.endswith("(ok)") and san), (verdict, san)
        assert (san == "") != in_pod, san
        # The route's own host still gets the server's certificate.
        assert sni_handshake(proxy.port, "localhost", server.ca_file)[0].endswith("(ok)")

        # The CA's key is nowhere the proxy reads: every key it was handed is a leaf's.
        ca_public = x509.load_pem_x509_certificate((tls_dir / "ca.crt").read_bytes()).public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        handed = [p for d in (edge, proxy.state_dir) for p in d.rglob("*.pem")]
        assert len([p for p in handed if p.parent.name != "keys"]) >= 2 * len(HOSTS)
        for pem in handed:
            if b"PRIVATE KEY" in pem.read_bytes():
                key = serialization.load_pem_private_key(pem.read_bytes(), None)
                assert key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) \
                    != ca_public, f"{pem} holds the CA's key"

        # A cluster no longer taken over: its name is no longer served (a reload: the set changed).
        write_hosts(tls_dir, HOSTS[:2])
        wait_for(lambda: f"DNS:{HOSTS[2]}" not in sni_handshake(proxy.port, HOSTS[2], server.ca_file)[1], timeout=30,
                 what="gamma's hostname no longer served")
        verdict, san = sni_handshake(proxy.port, HOSTS[0], server.ca_file)
        assert verdict.endswith("(ok)") and f"DNS:{HOSTS[0]}" in san, (verdict, san)
        assert proxy.reloads() >= 1
    finally:
        proxy.stop()
        server.kill()


def wait_for_payload(port: int, host: str, ca: Path) -> bool:
    try:
        return fetch(port, host, ca, "/config/workers?token=t-1") == 200
    except OSError:
        return False


@pytest.mark.parametrize("name", ["../../etc/x", "a b", "-rf.example.com", "*.example.com", "Upper.example.com"])
def test_a_name_that_is_not_a_host_name_is_neither_issued_nor_read(tmp_path: Path, name: str) -> None:
    """A Route's hostname becomes a file name and a HAProxy SNI filter: anything else is refused on both sides."""
    from ignition_server.edge_publication import publication_document
    from ignition_server.tls.certificates import ensure_self_signed
    from ignition_server.tls.sni_files import HostCertificateFiles
    from proxy.publication import PublicationError, parse_publication

    ensure_self_signed(tmp_path / "tls", None)
    (tmp_path / "tls" / "sni-hosts.json").write_text(json.dumps([name, "ok.example.com"]))
    files = HostCertificateFiles.for_dir(tmp_path / "tls", None, tmp_path / "hosts")
    assert files is not None
    assert list(files.update()) == ["ok.example.com"]
    assert [p.name for p in (tmp_path / "hosts").iterdir()] == ["ok.example.com.pem"]

    document = publication_document(keys=[], issuers=[], token_map=None, cert=tmp_path / "c.pem", ca=None, backend="x:1",
                                    hosts={name: tmp_path / "h.pem"})
    with pytest.raises(PublicationError):
        parse_publication(document.decode())


def test_the_files_are_redone_only_when_the_list_or_the_ca_changes(tmp_path: Path) -> None:
    """The publisher asks `due` every 5 s: two stats, and a write only when something changed."""
    from ignition_server.tls.certificates import ensure_self_signed
    from ignition_server.tls.sni_files import HostCertificateFiles

    ensure_self_signed(tmp_path / "tls", None)
    files = HostCertificateFiles.for_dir(tmp_path / "tls", None, tmp_path / "hosts")
    assert files is not None and files.due()
    write_hosts(tmp_path / "tls", ["a.example.com"])
    first = files.update()["a.example.com"].read_bytes()
    assert not files.due()
    assert files.update()["a.example.com"].read_bytes() == first  # nothing re-issued
    write_hosts(tmp_path / "tls", ["a.example.com", "b.example.com"])
    assert files.due()
    assert sorted(files.update()) == ["a.example.com", "b.example.com"]
    # A CA rotation (a new ca.crt): every certificate is issued again, from the CA that signs now.
    (tmp_path / "tls" / "ca.crt").write_bytes((tmp_path / "tls" / "ca.crt").read_bytes() + b"\n")
    assert files.due()
    assert files.update()["a.example.com"].read_bytes() != first


def test_a_fleets_hostnames_fit_haproxys_configuration(tmp_path: Path) -> None:
    """Hundreds of taken-over clusters behind one terminate route: HAProxy takes at most 64 words a
    line, so the ingress matches the names from a file, and the crt-list holds one line each;
    `haproxy -c` accepts what the controller writes."""
    import subprocess

    import yaml

    from ignition_server.edge_publication import publication_document
    from ignition_server.tls.certificates import ensure_self_signed
    from ignition_server.tls.sni_files import HostCertificateFiles
    from proxy.controller import Controller, read_desired

    haproxy = require_tool("haproxy", "apt-get install haproxy")
    files = ensure_self_signed(tmp_path / "tls", "https://localhost:9090")
    hosts = [f"ignition.c{i:03d}.apps.example.com" for i in range(300)]
    write_hosts(tmp_path / "tls", hosts)
    issuer = HostCertificateFiles.for_dir(tmp_path / "tls", None, tmp_path / "edge" / "hosts")
    assert issuer is not None
    published = issuer.update()
    (tmp_path / "edge" / "edge.pem").write_bytes(files.cert.read_bytes() + files.key_pem())
    (tmp_path / "edge" / "publication.json").write_bytes(publication_document(
        keys=[], issuers=[], token_map=None, cert=tmp_path / "edge" / "edge.pem", ca=files.ca, backend="127.0.0.1:9090",
        hosts=published))
    table = tmp_path / "table.yaml"
    table.write_text(yaml.safe_dump({"listen": 18443, "state_dir": str(tmp_path / "state"), "routes": [
        {"host": "localhost", "mode": "terminate", "publication": str(tmp_path / "edge"), "backends": ["127.0.0.1:9090"]}]}))
    Controller(table)._write_files(read_desired(table))
    rendered = (tmp_path / "state" / "haproxy.cfg").read_text()
    assert max(len(line.split()) for line in rendered.splitlines()) < 64
    check = subprocess.run([haproxy, "-c", "-f", str(tmp_path / "state" / "haproxy.cfg")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
