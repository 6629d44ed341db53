"""deploy/proxy: what an admin applies to run the front proxy is consistent with the code and
works: kubectl renders it, the proxy's own parser takes its table, HAProxy takes the config it
renders, the Role is exactly what the proxy asks of a real API server, and the pod is as
unprivileged as the server's."""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.table import Table, load_table
from testsupport.deploy import DEPLOY, check_unprivileged_pod, named_stage, one as server_object, readme_rbac_table
from testsupport.harness import (
    ProxyProcess,
    ServerProcess,
    free_port,
    seconds_until_closed,
    status_over_tls,
    wait_for,
    write_manifests,
)
from testsupport.manifests import build_token_secret
from testsupport.realtools import require_tool

PROXY = DEPLOY / "proxy"


def documents() -> list[dict[str, Any]]:
    return [d for path in sorted(PROXY.glob("*.yaml")) if path.name != "kustomization.yaml"
            for d in yaml.safe_load_all(path.read_text()) if d]


def one(kind: str) -> dict[str, Any]:
    found = [d for d in documents() if d["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def table_text() -> str:
    return one("ConfigMap")["data"]["table.yaml"]


def pod() -> dict[str, Any]:
    return one("Deployment")["spec"]["template"]["spec"]


def container() -> dict[str, Any]:
    (only,) = pod()["containers"]
    return only


def role_rules() -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in one("Role")["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_the_readme_rbac_table_is_the_role() -> None:
    assert readme_rbac_table("### Deploying the proxy") == role_rules()


def port_of(listen: str) -> int:
    return int(listen.rpartition(":")[2])


def local_table(state_dir: Path, **ports: int) -> str:
    """The ConfigMap's table as a test runs it: its own state dir and free ports, nothing else changed."""
    data = yaml.safe_load(table_text())
    data["state_dir"] = str(state_dir)
    data["listen"] = ports["listen"]
    data["metrics_listen"] = f"127.0.0.1:{ports['metrics']}"
    data["prometheus_listen"] = f"127.0.0.1:{ports['prometheus']}"
    return yaml.safe_dump(data)


def test_kustomize_renders_the_proxy_apart_from_the_server() -> None:
    kubectl = require_tool("kubectl", "apt-get install kubernetes-client")
    listed = set(yaml.safe_load((PROXY / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in PROXY.glob("*.yaml") if p.name != "kustomization.yaml"}
    out = subprocess.run([kubectl, "kustomize", str(PROXY)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in rendered)
    assert kinds == sorted(["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Role", "RoleBinding",
                            "Service", "Service", "ServiceAccount", "ServiceMonitor"])
    namespace = server_object("Namespace")["metadata"]["name"]
    assert {d["metadata"]["namespace"] for d in rendered} == {namespace}
    # `kubectl apply -k deploy/` stays the server alone.
    server = subprocess.run([kubectl, "kustomize", str(PROXY.parent)], capture_output=True, text=True, timeout=60)
    assert server.returncode == 0, server.stderr
    assert "ignition-proxy" not in server.stdout


def test_the_table_is_the_proxys_own_and_routes_to_the_servers_endpointslices() -> None:
    table: Table = load_table(table_text())  # raises TableError, naming what is wrong
    (route,) = table.routes
    assert route.mode == "passthrough" and route.endpoints is not None and not route.backends
    # The Service it names is the server's, in its namespace, with that port name.
    service = next(d for d in (yaml.safe_load_all((PROXY.parent / "services.yaml").read_text()))
                   if d["metadata"]["name"] == route.endpoints.service)
    assert service["metadata"]["namespace"] == route.endpoints.namespace
    assert route.endpoints.port in {p["name"] for p in service["spec"]["ports"]}
    servers = server_object("StatefulSet")["spec"]["replicas"]
    assert table.slots >= servers  # every replica gets a server line without a reload
    # The Role is where the route's EndpointSlices are.
    assert one("Role")["metadata"]["namespace"] == route.endpoints.namespace


def test_the_pod_is_unprivileged_and_its_probes_ask_what_the_proxy_serves() -> None:
    deployment = one("Deployment")
    assert deployment["spec"]["replicas"] == 2
    spec = pod()
    main = check_unprivileged_pod(spec)
    assert spec["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]
    table = load_table(table_text())
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports["https"] == table.listen
    # Liveness: the controller's metrics; readiness: HAProxy's own exporter (so HAProxy runs).
    assert main["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert ports["metrics"] == port_of(table.metrics_listen or "")
    assert main["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "haproxy-metrics"}
    assert ports["haproxy-metrics"] == port_of(table.prometheus_listen or "")
    # The table is the ConfigMap, mounted whole (a subPath would never see an edit); the state dir is written.
    env = {e["name"]: e.get("value") for e in main["env"]}
    mounts = {m["name"]: m for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["table"]["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]
    assert str(Path(env["IGNITION_PROXY_CONFIG"]).parent) == mounts["table"]["mountPath"] and "subPath" not in mounts["table"]
    assert mounts["state"]["mountPath"] == str(table.state_dir) and "emptyDir" in volumes["state"]
    # Nodes reach it on a NodePort; a drain keeps one proxy.
    nodeport = next(s for s in documents() if s["kind"] == "Service" and s["spec"].get("type") == "NodePort")
    assert nodeport["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert {p["targetPort"] for p in nodeport["spec"]["ports"]} == {"https"}
    assert 0 < one("PodDisruptionBudget")["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    # The ServiceMonitor scrapes both exporters through the metrics Service.
    monitored = {e["port"] for e in one("ServiceMonitor")["spec"]["endpoints"]}
    metrics = next(s for s in documents() if s["kind"] == "Service" and s["spec"].get("type") != "NodePort")
    assert monitored == {p["name"] for p in metrics["spec"]["ports"]} == {"metrics", "haproxy-metrics"}
    assert metrics["metadata"]["labels"] == one("ServiceMonitor")["spec"]["selector"]["matchLabels"]
    # The uid is the image's (tests/system/test_container.py checks the image's user).
    user = next(line.split()[1] for line in reversed(named_stage("proxy")) if line.upper().startswith("USER "))
    assert spec["securityContext"]["runAsUser"] == int(user.split(":")[0])


def test_the_rendered_config_passes_haproxy_check(tmp_path: Path) -> None:
    haproxy = require_tool("haproxy", "apt-get install haproxy")
    config = tmp_path / "table.yaml"
    config.write_text(local_table(tmp_path / "state", listen=free_port(), metrics=free_port(), prometheus=free_port()))
    rendered = subprocess.run([sys.executable, "-m", "proxy", "render", "--config", str(config)],
                              capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    assert "use_backend r_ignition_example_com if { req.ssl_sni -i ignition.example.com }" in rendered.stdout
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(rendered.stdout)
    check = subprocess.run([haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def endpoint_slice(namespace: str, service: str, port_name: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": f"{service}-abcde", "namespace": namespace, "labels": {"kubernetes.io/service-name": service}},
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
    }


def via_proxy(port: int, host: str, path: str, token: str, ca: Path) -> int:
    """One HTTPS request to the proxy with SNI `host`, as a node asks (`Bearer base64(token)`);
    passthrough: the server's certificate, whose names are the test server's, so only the CA is checked."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    bearer = base64.b64encode(token.encode()).decode()
    return status_over_tls(port, host, context, path, f"Authorization: Bearer {bearer}\r\n")


def shipped_proxy_protocol_from() -> str:
    env = {e["name"]: e.get("value") for e in server_object("StatefulSet")["spec"]["template"]["spec"]["containers"][0]["env"]}
    return str(env.get("IGNITION_SERVER_PROXY_PROTOCOL_FROM") or "")


def shipped_trust() -> list[str]:
    """The server's flags for the shipped trust: the pod network, where the proxy pods are,
    stands here for the test proxy's own address (HAProxy reaches the server from 127.0.0.1)."""
    return ["--proxy-protocol-from", "127.0.0.1/32"] if shipped_proxy_protocol_from() else []


def probe(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.status


@pytest.mark.haproxy
def test_the_shipped_table_routes_a_node_and_the_role_is_exactly_what_it_asks(tmp_path: Path) -> None:
    """The ConfigMap's table run by `ignition-proxy run` (the real HAProxy) against a real API
    server (testsupport/kubeapi) holding the server Service's EndpointSlice: a node's request with the
    route's SNI reaches the server, the probes answer, and the requests the proxy made are the Role."""
    haproxy = require_tool("haproxy", "apt-get install haproxy")
    from testsupport.kubeapi import KubeAPI

    table = load_table(table_text())
    (route,) = table.routes
    assert route.endpoints is not None
    source = write_manifests(tmp_path / "src" / "a.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters-a/workers", token="tok-a")).parent
    server = ServerProcess(source, tmp_path / "server" / "cache", extra=shipped_trust()).start()
    proxy = ProxyProcess(tmp_path / "proxy" / "state")
    prometheus = free_port()
    proxy.table_path.parent.mkdir(parents=True)
    proxy.table_path.write_text(local_table(proxy.state_dir, listen=proxy.port, metrics=proxy.metrics_port,
                                            prometheus=prometheus))
    with KubeAPI(tmp_path / "kubeapi") as api:
        api.namespace(route.endpoints.namespace)
        api.create(endpoint_slice(route.endpoints.namespace, route.endpoints.service, str(route.endpoints.port), server.port))
        try:
            proxy.start(haproxy, "--kubeconfig", str(api.kubeconfig))
            wait_for(proxy.servers_up, timeout=20, what="the EndpointSlice's server healthy")
            assert via_proxy(proxy.port, route.host, "/ignition", "tok-a", server.ca_file) == 200
            # Passthrough: the server itself judges the token (unknown: 511, which a node retries).
            assert via_proxy(proxy.port, route.host, "/ignition", "forged", server.ca_file) == 511
            # The probes' paths on the ports the table gives the controller and HAProxy.
            probes = {p["name"]: p["containerPort"] for p in container()["ports"]}
            local = {"metrics": proxy.metrics_port, "haproxy-metrics": prometheus}
            for kind in ("livenessProbe", "readinessProbe"):
                get = container()[kind]["httpGet"]
                assert get["port"] in probes and probe(local[get["port"]], get["path"]) == 200
        finally:
            proxy.stop()
            server.stop()
        asked = {("discovery.k8s.io" if plural == "endpointslices" else "", plural, verb)
                 for verb, plural in api.server.requests}
    assert asked == role_rules()
    binding = one("RoleBinding")
    assert binding["roleRef"]["name"] == one("Role")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": one("ServiceAccount")["metadata"]["name"],
                                    "namespace": one("ServiceAccount")["metadata"]["namespace"]}]


# -- one client stalling handshakes through the shipped proxy (issue 31, item 3) ------------

def client_hello(host: str) -> bytes:
    """A real ClientHello for `host` (SNI), as a TLS client's first flight."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=host)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


class StallFlood:
    """One client (one address) opening connections to the proxy at `rate` a second, each
    sending a ClientHello for the route and then nothing, and never closing them itself."""

    def __init__(self, port: int, host: str, source: str, rate: float) -> None:
        self.port, self.source, self.rate = port, source, rate
        self.hello = client_hello(host)
        self.opened: list[socket.socket] = []
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            due = started + len(self.opened) / self.rate
            if (wait := due - time.monotonic()) > 0:
                self.stop.wait(wait)
                continue
            try:
                conn = socket.create_connection(("127.0.0.1", self.port), timeout=2, source_address=(self.source, 0))
                conn.sendall(self.hello)
            except OSError:
                self.failed += 1
                self.stop.wait(1 / self.rate)
                continue
            self.opened.append(conn)

    def __enter__(self) -> StallFlood:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)
        for conn in self.opened:
            conn.close()


def node_boot(port: int, host: str, source: str, token: str, ca: Path) -> int:
    """A node's fetch through the proxy from `source`: its status, or 0 when the connection failed."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    bearer = base64.b64encode(token.encode()).decode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(f"GET /ignition HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {bearer}\r\n"
                        "Connection: close\r\n\r\n".encode())
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
        return int(data.split(b" ", 2)[1])
    except (OSError, ssl.SSLError, IndexError, ValueError):
        return 0


def test_the_shipped_server_trusts_the_proxys_header_and_names_its_network() -> None:
    """The table sends PROXY v2, and the server is told to read it from the pod network, which
    a node's own address (outside it) is not, and whose choice the manifest explains."""
    (route,) = load_table(table_text()).routes
    assert route.send_proxy
    cidrs = [ipaddress.ip_network(c.strip()) for c in shipped_proxy_protocol_from().split(",") if c.strip()]
    assert cidrs, "the server trusts no proxy: every node behind it shares the proxy's connection quota"
    assert not any(ipaddress.ip_network("0.0.0.0/0").subnet_of(c) for c in cidrs if c.version == 4)  # not everyone
    assert "pod network" in (DEPLOY / "statefulset.yaml").read_text()
    nodeport = next(d for d in documents() if d["kind"] == "Service" and d["spec"].get("type") == "NodePort")
    assert nodeport["spec"]["externalTrafficPolicy"] == "Local"  # the node's address reaches HAProxy


@pytest.mark.haproxy
def test_one_client_stalling_handshakes_through_the_shipped_proxy_fails_no_nodes_boot(tmp_path: Path) -> None:
    """Issue 31, item 3: the shipped table, run by the real controller and HAProxy in front of a
    server started with the shipped trust (the test proxy's own address, 127.0.0.1, in place of
    the pod network). One client opens ~100 connections a second from one address, each a
    ClientHello and then nothing; 20 nodes, each from its own address, boot through the proxy
    meanwhile. Before: no PROXY header, so the server counted everything under HAProxy's address,
    the stalled handshakes held that address's quota of 256 (10 s each), and 20 of 20 boots
    failed. Now each node has its own quota, and a stalled handshake is cut within 2 s at the
    server (3 s at HAProxy for one that never sends its ClientHello)."""
    haproxy = require_tool("haproxy", "apt-get install haproxy")
    from testsupport.kubeapi import KubeAPI

    (route,) = load_table(table_text()).routes
    assert route.endpoints is not None
    source = write_manifests(tmp_path / "src" / "a.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters-a/workers", token="tok-a")).parent
    server = ServerProcess(source, tmp_path / "server" / "cache", extra=shipped_trust()).start()
    proxy = ProxyProcess(tmp_path / "proxy" / "state")
    proxy.table_path.parent.mkdir(parents=True)
    proxy.table_path.write_text(local_table(proxy.state_dir, listen=proxy.port, metrics=proxy.metrics_port,
                                            prometheus=free_port()))
    with KubeAPI(tmp_path / "kubeapi") as api:
        api.namespace(route.endpoints.namespace)
        api.create(endpoint_slice(route.endpoints.namespace, route.endpoints.service, str(route.endpoints.port), server.port))
        try:
            proxy.start(haproxy, "--kubeconfig", str(api.kubeconfig))
            wait_for(proxy.servers_up, timeout=20, what="the EndpointSlice's server healthy")
            assert node_boot(proxy.port, route.host, "127.0.0.10", "tok-a", server.ca_file) == 200
            # Stalled handshakes are cut well before 10 s: after the ClientHello by the server
            # (passthrough), before it by HAProxy's inspect-delay.
            with socket.create_connection(("127.0.0.1", proxy.port), source_address=("127.0.0.5", 0)) as stalled:
                stalled.sendall(client_hello(route.host))
                after_hello = seconds_until_closed(stalled)
            with socket.create_connection(("127.0.0.1", proxy.port), source_address=("127.0.0.5", 0)) as silent:
                silent_for = seconds_until_closed(silent)
            assert after_hello < 5 and silent_for < 5, (after_hello, silent_for)

            with StallFlood(proxy.port, route.host, "127.0.0.5", rate=100) as flood:
                # Past the quota at the old 10 s hold (~4 s at this rate; longer on a slow machine).
                wait_for(lambda: len(flood.opened) >= 300, timeout=30, what="300 stalled connections")
                statuses = [node_boot(proxy.port, route.host, f"127.0.0.{20 + n}", "tok-a", server.ca_file)
                            for n in range(20)]
                opened = len(flood.opened)
            print(f"\nstall flood: {opened} stalled connections opened; node boots: {statuses.count(200)}/20 succeeded;"
                  f" stalled at {after_hello:.1f} s after a ClientHello, {silent_for:.1f} s before one")
            assert statuses == [200] * 20, statuses
        finally:
            proxy.stop()
            server.stop()
