"""The routing table, its haproxy.cfg (checked by the real `haproxy -c`), and PROXY headers."""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ignition_server.http.proxy_protocol import V2_SIGNATURE, ProxyHeaderError, parse_v1, parse_v2
from proxy.publication import parse_token_map
from proxy.table import TableError, load_table, parse_backend
from testsupport.harness import ServerProcess, wait_for, write_manifests
from testsupport.manifests import build_token_secret
from testsupport.realtools import require_tool

TABLE = """
listen: 18443
state_dir: {state}
slots: 3
prometheus_listen: "127.0.0.1:18405"
routes:
- host: ignition.a.example.com
  mode: terminate
  publication: {pub}
  backends: ["10.0.0.5:9090", "[fd00::7]:9090"]
  send_proxy: true
  allow: ["10.0.0.0/8", "fd00::/8"]
- host: ignition.b.example.com
  backends: ["replica-b.example.com:9090"]
"""


def test_backends_parse_ipv4_ipv6_and_names() -> None:
    assert parse_backend("10.0.0.5:9090").address == "10.0.0.5:9090"
    six = parse_backend("[fd00::7]:9090")
    assert (six.host, six.port, str(six)) == ("fd00::7", 9090, "[fd00::7]:9090")
    assert parse_backend("replica.svc:1").host == "replica.svc"
    for bad in ("fd00::7:9090", "10.0.0.5", "host:0", "[::1:9", "bad host:1", "x:99999"):
        with pytest.raises(TableError):
            parse_backend(bad)


@pytest.mark.parametrize("change,message", [
    (lambda t: t.replace("mode: terminate", "mode: mirror"), "mode"),
    (lambda t: t.replace("  publication: {pub}\n", ""), "publication"),
    (lambda t: t.replace("ignition.b.example.com", "ignition.a.example.com"), "unique"),
    (lambda t: t.replace("slots: 3", "slots: 1"), "slots"),
    (lambda t: t.replace('"10.0.0.0/8"', '"10.0.0.0/33"'), "allow"),
    (lambda t: t.replace("listen: 18443", "listen: 0"), "listen"),
    (lambda t: t + "  surprise: 1\n", "unknown"),
])
def test_bad_tables_are_refused_with_the_reason(change, message) -> None:
    text = change(TABLE).format(state="/tmp/s", pub="/tmp/p")
    with pytest.raises(TableError, match=message):
        load_table(text)


def publish(tmp_path: Path) -> Path:
    """A real server's publication (its --edge-dir)."""
    source = write_manifests(tmp_path / "src" / "a.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters-a/workers", token="t-1")).parent
    server = ServerProcess(source, tmp_path / "cache", extra=["--edge-dir", str(tmp_path / "pub")]).start()
    try:
        wait_for(lambda: (tmp_path / "pub" / "publication.json").exists(), what="the publication")
    finally:
        server.stop()
    return tmp_path / "pub"


def test_render_cli_output_passes_haproxy_check(tmp_path: Path) -> None:
    haproxy = require_tool("haproxy", "apt-get install haproxy")
    pub = publish(tmp_path)
    table = tmp_path / "table.yaml"
    table.write_text(TABLE.format(state=tmp_path / "state", pub=pub))
    rendered = subprocess.run([sys.executable, "-m", "proxy", "render", "--config", str(table)],
                              capture_output=True, text=True, check=True).stdout
    assert "bind :::18443 v4v6" in rendered
    assert "req.ssl_sni -i ignition.a.example.com" in rendered and "src 10.0.0.0/8 fd00::/8" in rendered
    assert "server s1 fd00::7:9090" in rendered and "server s2 127.0.0.1:1 disabled" in rendered
    assert "send-proxy-v2 check-send-proxy" in rendered and "observe layer7" in rendered
    # A server connection carrying a client's PROXY header is that client's only (test_in_pod_edge).
    assert rendered.count("http-reuse never") == 1
    assert "prometheus-exporter" in rendered and "option redispatch" in rendered
    # The terminating bind offers the server's TLS (its tls.json), not HAProxy's defaults.
    assert "ssl-min-ver TLSv1.2 ciphers ECDHE-" in rendered and "no-tls-tickets" in rendered
    # HAProxy reads the files the controller would have put in place.
    state = tmp_path / "state"
    (state / "maps").mkdir(parents=True)
    (state / "maps" / "r_ignition_a_example_com.map").write_text("")
    (state / "certs").mkdir()
    (state / "certs" / "r_ignition_a_example_com.pem").write_bytes((pub / "edge.pem").read_bytes())
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(rendered.replace("replica-b.example.com", "127.0.0.1"))  # no DNS in the check
    check = subprocess.run([haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # A server older than tls.json: the bind offers the server's defaults, which HAProxy takes too.
    (pub / "tls.json").unlink()
    older = subprocess.run([sys.executable, "-m", "proxy", "render", "--config", str(table)],
                           capture_output=True, text=True, check=True).stdout
    assert "ciphers ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL" in older and "no-tls-tickets" in older
    cfg.write_text(older.replace("replica-b.example.com", "127.0.0.1"))
    check = subprocess.run([haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_bad_table_gives_a_clear_error(tmp_path: Path) -> None:
    table = tmp_path / "table.yaml"
    table.write_text("routes: []\nstate_dir: /tmp/x\n")
    run = subprocess.run([sys.executable, "-m", "proxy", "render", "--config", str(table)], capture_output=True, text=True)
    assert run.returncode == 2 and "routes must be a non-empty list" in run.stderr


def test_token_map_parsing_skips_odd_lines() -> None:
    good = "a" * 64
    assert parse_token_map(f"{good} ns/pool\nnot a line\n{'G' * 64} ns/x\n") == {good: "ns/pool"}


def v2(src: str, sport: int, family: int = socket.AF_INET) -> tuple[bytes, bytes]:
    size = 4 if family == socket.AF_INET else 16
    body = socket.inet_pton(family, src) + b"\0" * size + struct.pack("!HH", sport, 443)
    fam = 0x11 if family == socket.AF_INET else 0x21
    return V2_SIGNATURE + bytes([0x21, fam]) + struct.pack("!H", len(body)), body


def test_proxy_headers_parse() -> None:
    assert parse_v2(*v2("192.0.2.7", 5555)) == ("192.0.2.7", 5555)
    assert parse_v2(*v2("2001:db8::7", 6666, socket.AF_INET6)) == ("2001:db8::7", 6666)
    # An IPv4 node through a dual-stack edge (`bind :::443 v4v6`) as plain IPv4, as it is logged.
    assert parse_v2(*v2("::ffff:192.0.2.9", 7777, socket.AF_INET6)) == ("192.0.2.9", 7777)
    local = V2_SIGNATURE + bytes([0x20, 0x00]) + b"\0\0"
    assert parse_v2(local, b"") is None  # the proxy's own check
    assert parse_v1(b"PROXY TCP4 192.0.2.8 10.0.0.1 4444 443\r\n") == ("192.0.2.8", 4444)
    assert parse_v1(b"PROXY UNKNOWN\r\n") is None
    for bad in (b"PROXY TCP4 nope 10.0.0.1 1 2\r\n", b"PROXY SCTP a b c d\r\n"):
        with pytest.raises(ProxyHeaderError):
            parse_v1(bad)
    with pytest.raises(ProxyHeaderError):
        parse_v2(b"x" * 16, b"")


def test_only_trusted_peers_may_announce_an_address(tmp_path: Path) -> None:
    """A server trusting only 192.0.2.1 serves a direct client as it is: a PROXY header from
    an untrusted peer is not read as one (TLS fails), and the log shows the real address."""
    source = write_manifests(tmp_path / "src" / "a.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters-a/workers", token="t-1")).parent
    server = ServerProcess(source, tmp_path / "cache", extra=["--proxy-protocol-from", "192.0.2.1/32"]).start()
    try:
        header, body = v2("203.0.113.9", 1234)
        context = ssl.create_default_context(cafile=str(server.ca_file))
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            raw.sendall(header + body)
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                with context.wrap_socket(raw, server_hostname="localhost") as tls:
                    tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
                    tls.recv(100)
        wait_for(lambda: server.get("/config/workers?token=t-1")[0] == 200, what="served directly")
        # The access log line is written once the response is sent: on a busy machine, a moment after.
        wait_for(lambda: '"client": "127.0.0.1"' in server.logs(), what="the access log names the real address")
        assert "203.0.113.9" not in server.logs()
    finally:
        server.kill()


def test_pointer_urls_keep_ipv6_literals_bracketed() -> None:
    from ignition_server.render.userdata import pointer_config

    for shape, path in (("mcs", "/config/workers?token=t-1"), ("hypershift", "/ignition")):
        pointer = pointer_config(source_url="https://[fd00::1]:9090", token="t-1", ca_pem=b"x", shape=shape,
                                 nodepool="clusters-a/workers")
        assert pointer["ignition"]["config"]["merge"][0]["source"] == "https://[fd00::1]:9090" + path


def test_endpointslices_give_ready_addresses_with_the_named_port() -> None:
    from proxy.endpoints import backends_from_slices

    slices = [
        {"ports": [{"name": "https", "port": 9090}], "endpoints": [
            {"addresses": ["10.0.0.7"], "conditions": {"ready": True}},
            {"addresses": ["10.0.0.8"], "conditions": {"ready": False}},  # terminating or not ready yet
            {"addresses": ["10.0.0.6"]}]},  # no conditions: ready
        {"ports": [{"name": "metrics", "port": 8080}], "endpoints": [{"addresses": ["10.0.0.9"]}]},
        {"ports": [{"name": "https", "port": 9443}], "endpoints": [{"addresses": ["fd00::5", "not-an-ip"]}]},
    ]
    assert [str(b) for b in backends_from_slices(slices, "https")] == ["10.0.0.6:9090", "10.0.0.7:9090", "[fd00::5]:9443"]
    assert len(backends_from_slices(slices, 9090)) == 4  # a number: every slice, ready ones only


def test_endpoints_routes_in_the_table() -> None:
    base = "state_dir: /tmp/s\nroutes:\n- host: a.example.com\n  endpoints: {namespace: ignition, service: ignition-server, port: %s}\n"
    route = load_table(base % "https").routes[0]
    assert route.backends == () and route.endpoints is not None and route.endpoints.port == "https"
    for bad in ("Not_A_Port", "0"):
        with pytest.raises(TableError, match="endpoints port"):
            load_table(base % bad)


async def test_the_controllers_metrics_on_any_address_answer_ipv4_and_ipv6() -> None:
    from types import SimpleNamespace

    import aiohttp

    from proxy.cli import _serve_metrics
    from testsupport.harness import free_port

    port = free_port()
    controller = SimpleNamespace(metrics=SimpleNamespace(text=lambda: b"ign_proxy_reloads_total 0\n"))
    runner = await _serve_metrics(controller, f"[::]:{port}")  # type: ignore[arg-type]
    try:
        async with aiohttp.ClientSession() as session:
            for host in ("127.0.0.1", "[::1]"):
                async with session.get(f"http://{host}:{port}/metrics") as response:
                    assert response.status == 200 and b"ign_proxy_reloads_total" in await response.read()
    finally:
        await runner.cleanup()


def test_unix_backends_and_the_in_pod_table() -> None:
    unix = parse_backend("unix@/run/ignition/serve.sock")
    assert (unix.unix, unix.address, str(unix)) == (True, "unix@/run/ignition/serve.sock", "unix@/run/ignition/serve.sock")
    for bad in ("unix@relative.sock", "unix@/a b.sock"):
        with pytest.raises(TableError):
            parse_backend(bad)
    in_pod = """
listen: 9443
state_dir: /tmp/s
in_pod: true
routes:
- host: ignition.example.com
  mode: terminate
  publication: /tmp/p
  backends: ["unix@/run/ignition/serve.sock"]
"""
    assert load_table(in_pod).in_pod
    for change, message in [
        (lambda t: t.replace('"unix@/run/ignition/serve.sock"', '"10.0.0.5:9090"'), "in_pod"),
        (lambda t: t.replace("  mode: terminate\n", "  mode: passthrough\n"), "unix@"),
        (lambda t: t.replace('["unix@/run/ignition/serve.sock"]', '["unix@/run/a.sock", "10.0.0.5:9090"]'), "unix@"),
        (lambda t: t + "- host: other.example.com\n  backends: ['10.0.0.5:9090']\n", "in_pod"),
        (lambda t: t.replace("in_pod: true", "in_pod: yes please"), "in_pod"),
    ]:
        with pytest.raises(TableError, match=message):
            load_table(change(in_pod))
