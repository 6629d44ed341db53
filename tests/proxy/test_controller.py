"""ignition-proxy end to end: the real HAProxy (rendered and run by the controller) in front of
real server processes, the real Ignition client booting through it by SNI on one port."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from ignition_server.render.userdata import pointer_config
from proxy.runtime import Runtime
from testsupport.harness import (
    EXAMPLE_MACHINECONFIG,
    ProxyProcess,
    ServerProcess,
    handshakes,
    session_tickets,
    wait_for,
    write_manifests,
)
from testsupport.ignition_client import files_in, finish_fetch, ignition_fetch, require_ignition
from testsupport.manifests import build_token_secret
from testsupport.realtools import require_tool

pytestmark = [pytest.mark.haproxy, pytest.mark.ignition]
HOST_A, HOST_B = "localhost", socket.gethostname()  # both resolve to 127.0.0.1 here and are in the self-made certificates


def secret(namespace: str, pool: str, token: str, old: str | None = None) -> dict:
    return build_token_secret(namespace=namespace, nodepool=f"{namespace}/{pool}", token=token, old_token=old,
                              machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=pool), generation_time=time.time())


def dual_stack(source: Path, cache: Path, *extra: str) -> ServerProcess:
    """A server listening on [::] (both families); its own port, so --listen is added here."""
    server = ServerProcess(source, cache, extra=list(extra))
    if "--tls-cert" in extra:
        server.ca = Path(extra[extra.index("--tls-cert") + 1]).parent / "ca.crt"
    server.extra += ["--listen", f"[::]:{server.port}"]
    return server.start()


class Fleet:
    """Cluster A (two replicas sharing one CA, as a Deployment's pods do) and cluster B (one)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.source_a = write_manifests(tmp / "src-a" / "a.yaml", secret("clusters-a", "workers", "token-a-1")).parent
        self.source_b = write_manifests(tmp / "src-b" / "b.yaml", secret("clusters-b", "infra", "token-b-1")).parent
        self.edge_a, self.edge_b = tmp / "edge-a", tmp / "edge-b"
        # Dual-stack servers; HAProxy reaches them over ::1 (the only peer trusted to send PROXY
        # headers), the harness's readiness checks over 127.0.0.1 (served as they are).
        common = ["--proxy-protocol-from", "::1/128"]
        self.a1 = dual_stack(self.source_a, tmp / "a1" / "cache", "--edge-dir", str(self.edge_a), *common)
        tls = self.a1.cache_dir / "tls"  # one CA for the replicas of a cluster
        self.a2 = dual_stack(self.source_a, tmp / "a2" / "cache", "--source-read-only", "--tls-cert", str(tls / "serving.crt"),
                             "--tls-key", str(self.a1.serving_key(tmp / "a1-serving.key")), *common)
        self.b1 = dual_stack(self.source_b, tmp / "b1" / "cache", "--edge-dir", str(self.edge_b), *common)
        self.servers = [self.a1, self.a2, self.b1]
        wait_for(lambda: (self.edge_a / "publication.json").exists() and (self.edge_b / "publication.json").exists(),
                 what="both publications")
        wait_for(lambda: b"clusters-a/workers" in (self.a1.cache_dir / "edge" / "tokens.map").read_bytes(), what="A's token map")
        self.proxy = ProxyProcess(tmp / "state")
        self.port, self.state = self.proxy.port, self.proxy.state_dir

    def table(self, mode_a: str, mode_b: str, *, a_backends: list[str] | None = None, send_proxy: bool = True,
              allow_b: list[str] | None = None) -> None:
        a = a_backends if a_backends is not None else [f"[::1]:{self.a1.port}", f"[::1]:{self.a2.port}"]
        self.proxy.write_table([
            {"host": HOST_A, "mode": mode_a, "publication": str(self.edge_a), "backends": a, "send_proxy": send_proxy},
            {"host": HOST_B, "mode": mode_b, "publication": str(self.edge_b),
             "backends": [f"[::1]:{self.b1.port}"], "send_proxy": send_proxy, **({"allow": allow_b} if allow_b else {})},
        ])

    def start_proxy(self) -> None:
        self.proxy.start(require_tool("haproxy", "apt-get install haproxy"))
        wait_for(self.proxy.servers_up, timeout=20, what="every backend healthy")

    def runtime(self) -> Runtime:
        return Runtime(self.state / "haproxy.sock")

    def pointer(self, host: str, token: str, shape: str, pool: str, ca: Path) -> dict:
        return pointer_config(source_url=f"https://{host}:{self.port}", token=token, ca_pem=ca.read_bytes(),
                              shape=shape, nodepool=pool)

    def via_proxy(self, host: str, path: str, headers: dict[str, str] | list[tuple[str, str]] | None = None, *,
                  family: int = socket.AF_INET,
                  ca: Path | None = None) -> int:
        """One HTTPS request through the proxy with SNI `host` over the given address family."""
        context = ssl.create_default_context(cafile=str(ca or self.a1.ca_file))
        address = "::1" if family == socket.AF_INET6 else "127.0.0.1"
        with socket.create_connection((address, self.port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname=host) as tls:
                lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
                pairs = headers.items() if isinstance(headers, dict) else headers or []
                lines += [f"{k}: {v}" for k, v in pairs]
                tls.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
                data = b""
                while chunk := tls.recv(65536):
                    data += chunk
        return int(data.split(b" ", 2)[1])

    def serves(self, host: str, path: str) -> bool:
        """For a wait: a connection the proxy cuts while a backend moves is "not yet", as a node's
        client, which retries, takes it."""
        try:
            return self.via_proxy(host, path) == 200
        except OSError:
            return False

    def close(self) -> None:
        self.proxy.stop()
        for server in self.servers:
            server.kill()


@pytest.fixture
def fleet(tmp_path: Path):
    require_ignition()
    require_tool("haproxy", "apt-get install haproxy")
    fleet = Fleet(tmp_path)
    yield fleet
    fleet.close()


def served(server: ServerProcess, pool: str) -> float:
    return sum(v for k, v in server.metrics().items() if k.startswith("ign_server_get_request") and pool in k)


@pytest.mark.parametrize("mode_a,mode_b", [("terminate", "passthrough"), ("passthrough", "terminate")])
def test_real_client_boots_through_both_modes_and_shapes_by_sni(fleet: Fleet, tmp_path: Path, mode_a: str, mode_b: str) -> None:
    fleet.table(mode_a, mode_b)
    fleet.start_proxy()
    for host, token, pool, ca, file in (
        (HOST_A, "token-a-1", "clusters-a/workers", fleet.a1.ca_file, "/etc/workers.conf"),
        (HOST_B, "token-b-1", "clusters-b/infra", fleet.b1.ca_file, "/etc/infra.conf"),
    ):
        for shape in ("hypershift", "mcs"):
            run = ignition_fetch(fleet.pointer(host, token, shape, pool, ca), tmp_path / f"node-{host}-{shape}")
            assert run.returncode == 0, run.output
            assert file in files_in(run.config or {}), (host, shape)  # its own cluster's payload
    # Each cluster was reached only through its own route: A's token on B's host fails (a
    # different cluster: unknown token there) and B's servers never served A's pool.
    assert served(fleet.b1, "clusters-a") == 0
    assert served(fleet.a1, "clusters-b") + served(fleet.a2, "clusters-b") == 0
    # Both A replicas took a share (round robin, health-checked).
    assert served(fleet.a1, "clusters-a/workers") > 0 or served(fleet.a2, "clusters-a/workers") > 0
    # The node's own address reached the server through PROXY v2, not HAProxy's (::1).
    def clients() -> list[str]:
        return [json.loads(line).get("client") for server in (fleet.a1, fleet.a2, fleet.b1)
                for line in server.logs().splitlines() if '"ignition_server.access"' in line and "/readyz" not in line]

    wait_for(lambda: len(clients()) >= 4, what="the fetches' access lines (written in batches)")
    assert set(clients()) == {"127.0.0.1"}, set(clients())
    assert fleet.proxy.reloads() == 0


def test_forged_tokens_never_reach_a_backend(fleet: Fleet) -> None:
    fleet.table("terminate", "passthrough")
    fleet.start_proxy()
    before = [s.logs().count("/config/workers") + s.logs().count('"/ignition"') for s in (fleet.a1, fleet.a2)]
    forged_jwt = base64.b64encode(b"eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJrdWJlcm5ldGVzL3NlcnZpY2VhY2NvdW50In0.c2ln").decode()
    statuses = {
        "unknown opaque (URL)": fleet.via_proxy(HOST_A, "/config/workers?token=forged-token-1"),
        "unknown opaque (Bearer)": fleet.via_proxy(HOST_A, "/ignition", {
            "Authorization": "Bearer " + base64.b64encode(b"forged-token-2").decode(), "NodePool": "clusters-a/workers"}),
        "malformed": fleet.via_proxy(HOST_A, "/config/workers?token=bad%20token%0A"),
        # No kid and no held key verifies it: maybe a key the edge has not read yet (511, not served).
        "unknown key (forged JWT, no kid)": fleet.via_proxy(HOST_A, f"/config/workers?token={forged_jwt}"),
        "no token": fleet.via_proxy(HOST_A, "/ignition", {"NodePool": "clusters-a/workers"}),
    }
    assert statuses["unknown opaque (URL)"] == 511 and statuses["unknown opaque (Bearer)"] == 511
    assert statuses["unknown key (forged JWT, no kid)"] == 511
    assert all(400 <= code < 500 for name, code in statuses.items() if "unknown" not in name), statuses
    assert served(fleet.a1, "clusters-a") + served(fleet.a2, "clusters-a") == 0
    assert fleet.via_proxy(HOST_A, "/config/workers?token=token-a-1") == 200  # the good one does

    def lines() -> int:
        return sum(s.logs().count("/config/workers") + s.logs().count('"/ignition"') for s in (fleet.a1, fleet.a2))

    # Access lines are written in batches: once the good request's line is in, so is any earlier one.
    wait_for(lambda: lines() > sum(before), what="the good request's access line")
    assert lines() == sum(before) + 1, "a forged token reached a backend"


def test_two_credentials_in_one_request_never_reach_a_backend(fleet: Fleet) -> None:
    """The terminate route and the server read one credential from a request, or refuse it: a
    good token beside a forged one (or spelled two ways) is 400 at the edge, whichever the
    edge would have checked, and the server never sees it."""
    fleet.table("terminate", "passthrough")
    fleet.start_proxy()
    forged = "Bearer " + base64.b64encode(b"forged-token-2").decode()
    cases = {
        "query and header": ("/config/workers?token=token-a-1", [("Authorization", forged)]),
        "query on /ignition": ("/ignition?token=token-a-1", [("Authorization", forged)]),
        "twice": ("/config/workers?token=token-a-1&token=forged", []),
        "encoded name": ("/config/workers?token=token-a-1&tok%65n=forged", []),
        "other case": ("/config/workers?TOKEN=forged&token=token-a-1", []),
        "semicolon": ("/config/workers?token=token-a-1;token=forged", []),
        "two headers": ("/ignition", [("Authorization", "Bearer " + base64.b64encode(b"token-a-1").decode()),
                                      ("Authorization", forged)]),
    }
    statuses = {name: fleet.via_proxy(HOST_A, path, headers) for name, (path, headers) in cases.items()}
    assert statuses == {name: 400 for name in cases}
    assert fleet.via_proxy(HOST_A, "/config/workers?token=token-a-1") == 200

    def lines() -> int:
        return sum(s.logs().count("/config/workers") + s.logs().count('"/ignition') for s in (fleet.a1, fleet.a2))

    # Access lines are written in batches: once the good request's line is in, so is any earlier one.
    wait_for(lambda: lines() >= 1, what="the good request's access line")
    assert lines() == 1, "an ambiguous request reached a backend"


def test_backend_killed_and_token_rotated_mid_run_fail_no_fetch_and_need_no_reload(fleet: Fleet, tmp_path: Path) -> None:
    fleet.table("terminate", "passthrough")
    fleet.start_proxy()
    old_hash = hashlib.sha256(b"token-a-1").hexdigest()

    def boot(index: int, token: str, shape: str) -> subprocess.Popen[str]:
        pointer = fleet.pointer(HOST_A, token, shape, "clusters-a/workers", fleet.a1.ca_file)
        return ignition_fetch(pointer, tmp_path / f"n{index}", background=True)  # type: ignore[return-value]

    runs = [boot(i, "token-a-1", ("hypershift", "mcs")[i % 2]) for i in range(4)]
    fleet.a2.kill()  # SIGKILL mid-run
    # Rotation, as HyperShift writes it: the new token, the old one kept for the overlap.
    write_manifests(fleet.source_a / "a.yaml", secret("clusters-a", "workers", "token-a-2", old="token-a-1"))
    new_hash = hashlib.sha256(b"token-a-2").hexdigest()
    map_file = fleet.state / "maps" / "r_localhost.map"
    wait_for(lambda: new_hash in asyncio.run(fleet.runtime().map_entries(map_file)), timeout=20,
             what="the new token's hash in HAProxy's live map")
    assert old_hash in asyncio.run(fleet.runtime().map_entries(map_file))  # the overlap: both
    runs += [boot(10 + i, token, ("hypershift", "mcs")[i % 2]) for i, token in enumerate(["token-a-2", "token-a-1"] * 2)]
    for i, proc in enumerate(runs):
        output, _ = proc.communicate(timeout=90)
        run = finish_fetch(proc, output, tmp_path / f"n{i if i < 4 else 10 + i - 4}")
        assert run.returncode == 0, output
    assert fleet.proxy.reloads() == 0  # the map and the dead server went through the runtime API
    metrics = fleet.proxy.metrics()
    assert metrics["ign_proxy_reloads_total"] == 0
    assert metrics['ign_proxy_runtime_changes_total{kind="map"}'] >= 1
    assert metrics['ign_proxy_token_map_entries{route="r_localhost"}'] == 2


def test_backend_moves_without_reload_and_key_change_reloads(fleet: Fleet) -> None:
    fleet.table("passthrough", "passthrough", a_backends=[f"[::1]:{fleet.a1.port}"])
    fleet.start_proxy()
    fleet.a1.kill()
    fleet.table("passthrough", "passthrough", a_backends=[f"[::1]:{fleet.a2.port}"])
    wait_for(lambda: fleet.proxy.servers_up(), timeout=20, what="the moved backend healthy")
    wait_for(lambda: fleet.serves(HOST_A, "/config/workers?token=token-a-1"), what="A served by its new replica")
    assert fleet.proxy.reloads() == 0


def stalled_for(port: int, host: str | None) -> float:
    """Seconds the proxy keeps a connection that sends a ClientHello for `host` (None: nothing
    at all) and then waits."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        if host is not None:
            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            client = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=host)
            try:
                client.do_handshake()
            except ssl.SSLWantReadError:
                pass
            conn.sendall(outgoing.read())
        started = time.monotonic()
        conn.settimeout(90)
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass
        return time.monotonic() - started


def test_stalled_handshakes_are_cut_well_before_10s_in_both_modes(fleet: Fleet) -> None:
    """Issue 31, item 3: a connection that sends nothing is closed at the ingress' inspect-delay
    (3 s; it was 5 s), one that stops after its ClientHello by the server on a passthrough route
    (its --handshake-timeout, 2 s) and by HAProxy on a terminating one (the TLS frontend's
    client timeout, 3 s: HAProxy 2.6 has no handshake timeout of its own, and it was 60 s)."""
    fleet.table("terminate", "passthrough")
    fleet.start_proxy()
    times = {"nothing": stalled_for(fleet.port, None), "terminate": stalled_for(fleet.port, HOST_A),
             "passthrough": stalled_for(fleet.port, HOST_B)}
    assert all(1.5 < t < 5 for t in times.values()), times
    # Cutting stalls cuts no honest client, in either mode.
    assert fleet.via_proxy(HOST_A, "/healthz") == 200
    assert fleet.via_proxy(HOST_B, "/healthz", ca=fleet.b1.ca_file) == 200


def test_over_ipv6_loopback(fleet: Fleet) -> None:
    fleet.table("terminate", "passthrough")
    fleet.start_proxy()
    assert fleet.via_proxy(HOST_A, "/config/workers?token=token-a-1", family=socket.AF_INET6) == 200
    assert fleet.via_proxy(HOST_B, "/config/infra?token=token-b-1", family=socket.AF_INET6, ca=fleet.b1.ca_file) == 200


def test_allow_list_closes_a_route_to_other_sources(fleet: Fleet) -> None:
    fleet.table("terminate", "passthrough", allow_b=["192.0.2.0/24", "2001:db8::/32"])
    fleet.start_proxy()
    assert fleet.via_proxy(HOST_A, "/config/workers?token=token-a-1") == 200  # no list on A
    for family in (socket.AF_INET, socket.AF_INET6):
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            fleet.via_proxy(HOST_B, "/config/infra?token=token-b-1", family=family, ca=fleet.b1.ca_file)
    assert served(fleet.b1, "clusters-b") == 0


def served_certificate(port: int, host: str, ca: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            return tls.getpeercert(binary_form=True) or b""


def test_new_certificate_is_served_without_a_reload(fleet: Fleet, tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    from ignition_server.tls.certificates import ensure_self_signed

    fleet.table("terminate", "passthrough")
    fleet.start_proxy()
    before = served_certificate(fleet.port, HOST_A, fleet.a1.ca_file)
    # A new serving certificate from the same CA, published as the server would.
    issuer = tmp_path / "issuer"
    issuer.mkdir()
    for name in ("ca.crt", "ca.key"):
        (issuer / name).write_bytes((fleet.a1.cache_dir / "tls" / name).read_bytes())
    files = ensure_self_signed(issuer, None, password=fleet.a1.tls_password())  # the keys as a1 keeps them
    (fleet.edge_a / "edge.pem").write_bytes(files.cert.read_bytes() + files.key_pem())
    new = x509.load_pem_x509_certificate(files.cert.read_bytes()).public_bytes(Encoding.DER)
    assert new != before
    wait_for(lambda: served_certificate(fleet.port, HOST_A, fleet.a1.ca_file) == new, timeout=20,
             what="HAProxy serving the new certificate")
    assert fleet.via_proxy(HOST_A, "/config/workers?token=token-a-1") == 200
    assert fleet.proxy.reloads() == 0
    assert fleet.proxy.metrics()['ign_proxy_runtime_changes_total{kind="cert"}'] >= 1


def endpoint_slice(name: str, port: int, ready: bool = True) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv6",
        "metadata": {"name": name, "namespace": "ignition", "labels": {"kubernetes.io/service-name": "ignition-server"}},
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["::1"], "conditions": {"ready": ready}}],
    }


def test_backends_follow_endpointslices_without_reload(fleet: Fleet, tmp_path: Path) -> None:
    """Kubernetes mode: route A's servers are the ready endpoints of the Service's
    EndpointSlices (a real API server speaking the Kubernetes protocol, testsupport/kubeapi)."""
    from testsupport.kubeapi import KubeAPI

    with KubeAPI(tmp_path / "kubeapi") as api:
        api.namespace("ignition")
        api.create(endpoint_slice("ignition-server-a1", fleet.a1.port))
        fleet.proxy.write_table([
            {"host": HOST_A, "mode": "terminate", "publication": str(fleet.edge_a), "send_proxy": True,
             "endpoints": {"namespace": "ignition", "service": "ignition-server", "port": "https"}},
            {"host": HOST_B, "mode": "passthrough", "backends": [f"[::1]:{fleet.b1.port}"], "send_proxy": True},
        ])
        fleet.proxy.start(require_tool("haproxy", "apt-get install haproxy"), "--kubeconfig", str(api.kubeconfig))
        wait_for(fleet.proxy.servers_up, timeout=20, what="the endpoint's server healthy")
        assert fleet.via_proxy(HOST_A, "/config/workers?token=token-a-1") == 200
        assert served(fleet.a1, "clusters-a/workers") == 1 and served(fleet.a2, "clusters-a/workers") == 0
        # A pod goes, another comes: one slice not ready, a new one ready.
        fleet.a1.kill()
        api.replace(endpoint_slice("ignition-server-a1", fleet.a1.port, ready=False))
        api.create(endpoint_slice("ignition-server-a2", fleet.a2.port))
        wait_for(lambda: fleet.serves(HOST_A, "/config/workers?token=token-a-1")
                 and served(fleet.a2, "clusters-a/workers") >= 1, timeout=20, what="A served by the new endpoint")
        assert fleet.proxy.reloads() == 0


# What a client may offer: a CBC-SHA suite, AEAD ones, ChaCha20 (not FIPS), an old version.
TLS_PROBES = [
    ("-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA"),
    ("-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-SHA384"),
    ("-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"),
    ("-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"),
    ("-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"),
    ("-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384"),
    ("-tls1_1", "-cipher", "ECDHE-ECDSA-AES128-SHA:@SECLEVEL=0"),
]


@pytest.mark.parametrize("flags", [(), ("--tls-profile", "Modern"), ("--tls-profile", "Old"), ("--fips",)],
                         ids=["default", "modern", "old", "fips"])
def test_a_terminating_edge_offers_the_servers_tls_not_haproxys(tmp_path: Path, flags: tuple[str, ...]) -> None:
    """HAProxy's defaults took CBC-SHA suites and issued session tickets whatever the server's
    --tls-profile and --fips: the edge now offers exactly what the server's own context does."""
    haproxy = require_tool("haproxy", "apt-get install haproxy")
    source = write_manifests(tmp_path / "src" / "a.yaml", secret("clusters-a", "workers", "token-a-1")).parent
    edge = tmp_path / "edge"
    server = ServerProcess(source, tmp_path / "cache", extra=["--edge-dir", str(edge), *flags]).start()
    proxy = ProxyProcess(tmp_path / "state")
    try:
        wait_for(lambda: (edge / "publication.json").exists(), what="the publication")
        proxy.write_table([{"host": HOST_A, "mode": "terminate", "publication": str(edge),
                            "backends": [f"127.0.0.1:{server.port}"]}])
        proxy.start(haproxy)  # the controller starts HAProxy only with a config `haproxy -c` accepts
        wait_for(proxy.servers_up, timeout=20, what="the backend healthy")
        ca = server.ca_file
        at_server = {probe: handshakes(server.port, ca, *probe) for probe in TLS_PROBES}
        at_edge = {probe: handshakes(proxy.port, ca, *probe, servername=HOST_A) for probe in TLS_PROBES}
        assert at_edge == at_server
        assert any(at_server.values()) and not all(at_server.values())  # the probes tell profiles apart
        assert at_server[TLS_PROBES[0]] == (flags == ("--tls-profile", "Old"))  # CBC-SHA: only Old takes it
        for version in ("-tls1_2", "-tls1_3"):
            if handshakes(server.port, ca, version):  # a version the server takes
                assert not session_tickets(server.port, ca, version)
                assert not session_tickets(proxy.port, ca, version, servername=HOST_A), version
    finally:
        proxy.stop()
        server.kill()
