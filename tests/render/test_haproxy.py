"""The node-local kube-apiserver proxy: every rendered haproxy.cfg goes through the real `haproxy -c`."""

from __future__ import annotations

import base64
import shutil
import subprocess
from urllib.parse import unquote

import pytest
import yaml

from ignition_server.render.haproxy import (
    APISERVER_IP_UNIT,
    HAPROXY_CFG_PATH,
    HEALTH_CHECK_LIVEZ,
    STATIC_POD_PATH,
    ApiServerAccess,
    Backend,
    parse_backends,
    render_apiserver_ip_unit,
    render_haproxy_cfg,
    render_haproxy_fragment,
    render_setup_script,
    render_static_pod,
)
from ignition_server.render.inputs import InvalidConfig
from testsupport.realtools import require_tool

HAPROXY = shutil.which("haproxy") or "haproxy"


@pytest.fixture
def real_haproxy() -> None:
    require_tool("haproxy", "apt-get install haproxy")


needs_haproxy = pytest.mark.usefixtures("real_haproxy")


def haproxy_check(tmp_path, cfg: str) -> subprocess.CompletedProcess:
    path = tmp_path / "haproxy.cfg"
    path.write_text(cfg)
    return subprocess.run([HAPROXY, "-c", "-f", str(path)], capture_output=True, text=True, timeout=60)


def assert_valid(tmp_path, cfg: str) -> None:
    res = haproxy_check(tmp_path, cfg)
    assert res.returncode == 0, f"haproxy -c failed:\n{res.stdout}{res.stderr}\n--- config ---\n{cfg}"


def decode(source: str) -> bytes:
    if source.startswith("data:;base64,"):
        return base64.b64decode(source.split(",", 1)[1])
    assert source.startswith("data:,")
    return unquote(source.split(",", 1)[1]).encode()


def server_lines(cfg: str) -> list[str]:
    return [line.strip() for line in cfg.splitlines() if line.strip().startswith("server ")]


# --- haproxy -c on every shape ----------------------------------------------------------


@pytest.mark.haproxy
@needs_haproxy
def test_one_backend(tmp_path):
    access = ApiServerAccess(backends=(Backend("10.0.0.10", 6443),))
    cfg = render_haproxy_cfg(access)
    assert "bind 172.20.0.1:6443" in cfg
    assert "option httpchk GET /version" in cfg
    assert server_lines(cfg) == ["server controlplane-1 10.0.0.10:6443"]
    assert "resolvers" not in cfg  # only with DNS names
    assert_valid(tmp_path, cfg)


@pytest.mark.haproxy
@needs_haproxy
def test_three_backends_with_backups_ordered_primaries_first(tmp_path):
    access = ApiServerAccess(
        listen_port=2040,
        backends=(
            Backend("203.0.113.5", 30000, backup=True),
            Backend("10.0.0.1", 32167),
            Backend("10.0.0.2", 32167),
        ),
        health_check=HEALTH_CHECK_LIVEZ,
    )
    cfg = render_haproxy_cfg(access)
    assert server_lines(cfg) == [
        "server controlplane-1 10.0.0.1:32167",
        "server controlplane-2 10.0.0.2:32167",
        "server backup-1 203.0.113.5:30000 backup",
    ]
    assert "option httpchk GET /livez?exclude=etcd&exclude=log" in cfg
    assert "&amp;" not in cfg
    assert "option allbackups" in cfg
    assert_valid(tmp_path, cfg)


@pytest.mark.haproxy
@needs_haproxy
def test_fifty_backends(tmp_path):
    backends = tuple(Backend(f"10.1.{i // 250}.{i % 250 + 1}", 6443, backup=i >= 40) for i in range(50))
    cfg = render_haproxy_cfg(ApiServerAccess(backends=backends))
    lines = server_lines(cfg)
    assert len(lines) == 50
    assert sum(line.endswith(" backup") for line in lines) == 10
    assert all(not line.endswith(" backup") for line in lines[:40])
    assert_valid(tmp_path, cfg)


@pytest.mark.haproxy
@needs_haproxy
def test_ipv6_literals_bind_and_servers(tmp_path):
    access = ApiServerAccess(
        listen_ip="fd00:172:20::1",
        backends=(Backend("2001:db8::1", 6443), Backend("[2001:db8::2]", 6443, backup=True)),
    )
    cfg = render_haproxy_cfg(access)
    assert "bind [fd00:172:20::1]:6443" in cfg
    assert server_lines(cfg) == [
        "server controlplane-1 [2001:db8::1]:6443",
        "server backup-1 [2001:db8::2]:6443 backup",
    ]
    assert_valid(tmp_path, cfg)


@pytest.mark.haproxy
@needs_haproxy
def test_dns_names_that_do_not_resolve_still_pass(tmp_path):
    access = ApiServerAccess(
        listen_port=2040,
        backends=parse_backends(
            "c100-1.containers.test.cloud.ibm.com:32167,c100-2.containers.test.cloud.ibm.com:32167,"
            "c100-3.containers.test.cloud.ibm.com:32167"
        )
        + (Backend("does-not-exist.invalid", 31000, backup=True), Backend("10.9.9.9", 31000, backup=True)),
    )
    cfg = render_haproxy_cfg(access)
    assert "init-addr last,libc,none" in cfg
    assert "resolvers node" in cfg and "parse-resolv-conf" in cfg
    assert "server controlplane-1 c100-1.containers.test.cloud.ibm.com:32167 check-sni " \
        "c100-1.containers.test.cloud.ibm.com" in cfg
    assert server_lines(cfg)[-2:] == [
        "server backup-1 does-not-exist.invalid:31000 check-sni does-not-exist.invalid backup",
        "server backup-2 10.9.9.9:31000 backup",
    ]
    assert_valid(tmp_path, cfg)


@pytest.mark.haproxy
@needs_haproxy
def test_without_init_addr_unresolvable_names_fail_the_check(tmp_path):
    """Why init-addr is there: the same server line without it (and without resolvers,
    which also make HAProxy tolerate a failed start-up resolution) fails `haproxy -c`."""
    access = ApiServerAccess(backends=(Backend("does-not-exist.invalid", 6443),))
    cfg = render_haproxy_cfg(access).replace(" init-addr last,libc,none", "")
    cfg = cfg.replace(" resolvers node resolve-prefer ipv4", "")
    assert haproxy_check(tmp_path, cfg).returncode != 0


OPERATOR_TEMPLATE = """\
global
  maxconn 2000
${resolvers_section}
defaults
  mode tcp
  timeout client 1h
  timeout server 1h
  timeout connect 5s

# proxy box in front of the management cluster, see runbook
frontend apiserver_local
  bind ${listen_ip}:${listen_port}
  default_backend proxybox

backend proxybox
  option httpchk ${health_check_method} ${health_check_uri}
  default-server ${default_server}
${servers}
"""


@pytest.mark.haproxy
@needs_haproxy
def test_operator_template_override(tmp_path):
    access = ApiServerAccess(backends=(Backend("proxybox.corp.example", 8443), Backend("10.2.0.1", 8443)))
    cfg = render_haproxy_cfg(access, OPERATOR_TEMPLATE)
    assert "frontend apiserver_local" in cfg and "timeout client 1h" in cfg
    assert "bind 172.20.0.1:6443" in cfg
    assert "server controlplane-1 proxybox.corp.example:8443" in cfg
    assert_valid(tmp_path, cfg)


@pytest.mark.haproxy
@needs_haproxy
def test_broken_template_fails_haproxy_check(tmp_path):
    """The check is real: a template with a bad directive is rejected by haproxy -c."""
    broken = OPERATOR_TEMPLATE.replace("default_backend proxybox", "default_backend nowhere").replace(
        "maxconn 2000", "maxconn lots"
    )
    cfg = render_haproxy_cfg(ApiServerAccess(backends=(Backend("10.0.0.1", 6443),)), broken)
    res = haproxy_check(tmp_path, cfg)
    assert res.returncode != 0
    assert "nowhere" in res.stdout + res.stderr or "maxconn" in res.stdout + res.stderr


def test_template_with_unknown_placeholder_is_invalid_config():
    with pytest.raises(InvalidConfig, match=r"\$\{backend_list\}"):
        render_haproxy_cfg(ApiServerAccess(backends=(Backend("10.0.0.1", 6443),)), "x ${backend_list}\n")
    with pytest.raises(InvalidConfig, match="malformed"):
        render_haproxy_cfg(ApiServerAccess(backends=(Backend("10.0.0.1", 6443),)), "x $ y\n")


# --- input validation (no config injection) ------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"backends": ()}, "at least one backend"),
        ({"listen_ip": "c100.example"}, "listen_ip"),
        ({"listen_port": 0}, "port"),
        ({"listen_port": 70000}, "port"),
        ({"health_check": "GET /version # x"}, "health_check"),
        ({"health_check": "GET /version\n  server evil 1.2.3.4:1"}, "health_check"),
        ({"health_check": "POST /version"}, "health_check"),
    ],
)
def test_invalid_access(kwargs, match):
    args = {"backends": (Backend("10.0.0.1", 6443),), **kwargs}
    with pytest.raises(InvalidConfig, match=match):
        ApiServerAccess(**args)


@pytest.mark.parametrize("host", ["evil.example\n  server x 1.2.3.4", "a b", "", "-bad.example", "1.2.3.999"])
def test_invalid_backend_host(host):
    with pytest.raises(InvalidConfig):
        Backend(host, 6443)


def test_health_check_path_only_gets_get():
    access = ApiServerAccess(backends=(Backend("10.0.0.1", 6443),), health_check="/livez?exclude=etcd&exclude=log")
    assert access.health_check == HEALTH_CHECK_LIVEZ


def test_parse_backends():
    assert parse_backends(" a.example:1, [2001:db8::1]:2 ,10.0.0.1:3", backup=True) == (
        Backend("a.example", 1, True),
        Backend("2001:db8::1", 2, True),
        Backend("10.0.0.1", 3, True),
    )
    with pytest.raises(InvalidConfig):
        parse_backends("a.example")


# --- static pod, unit, fragment -------------------------------------------------------------


def test_static_pod_manifest():
    access = ApiServerAccess(listen_port=2040, backends=(Backend("10.0.0.1", 6443),), health_check=HEALTH_CHECK_LIVEZ)
    pod = yaml.safe_load(render_static_pod(access, "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:ab"))
    assert pod["kind"] == "Pod" and pod["metadata"]["name"] == "kube-apiserver-proxy"
    assert pod["metadata"]["namespace"] == "kube-system"
    spec = pod["spec"]
    assert spec["hostNetwork"] is True
    (c,) = spec["containers"]
    assert c["image"] == "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:ab"
    assert c["command"][-2:] == ["-f", "/usr/local/etc/haproxy"]
    assert c["livenessProbe"]["httpGet"] == {
        "host": "172.20.0.1", "port": 2040, "path": "/livez?exclude=etcd&exclude=log", "scheme": "HTTPS",
    }
    assert c["volumeMounts"][0]["mountPath"] == "/usr/local/etc/haproxy"
    assert spec["volumes"][0]["hostPath"]["path"] == "/etc/kubernetes/apiserver-proxy-config"
    with pytest.raises(InvalidConfig):
        render_static_pod(access, "")


def test_setup_script_and_unit_order_before_kubelet():
    v4 = render_setup_script(ApiServerAccess(backends=(Backend("10.0.0.1", 1),)))
    assert "ip addr replace 172.20.0.1/32 brd 172.20.0.1 scope host dev lo" in v4
    v6 = render_setup_script(ApiServerAccess(listen_ip="fd00::1", backends=(Backend("10.0.0.1", 1),)))
    assert "ip -6 addr replace fd00::1/128 dev lo" in v6
    unit = render_apiserver_ip_unit()
    assert "Type=oneshot" in unit and "RemainAfterExit=yes" in unit
    assert "Before=kubelet.service" in unit
    assert "WantedBy=multi-user.target kubelet.service" in unit


def test_fragment_shape():
    access = ApiServerAccess(backends=(Backend("10.0.0.1", 6443),))
    frag = render_haproxy_fragment(access, "registry.example/haproxy@sha256:00")
    files = {f["path"]: f for f in frag["storage"]["files"]}
    assert set(files) == {
        HAPROXY_CFG_PATH, STATIC_POD_PATH,
        "/usr/local/bin/setup-apiserver-ip.sh", "/usr/local/bin/teardown-apiserver-ip.sh",
    }
    assert files[HAPROXY_CFG_PATH]["mode"] == 0o644
    assert files["/usr/local/bin/setup-apiserver-ip.sh"]["mode"] == 0o755
    assert decode(files[HAPROXY_CFG_PATH]["contents"]["source"]).decode() == render_haproxy_cfg(access)
    (unit,) = frag["systemd"]["units"]
    assert unit["name"] == APISERVER_IP_UNIT and unit["enabled"] is True
    # Deterministic: replicas render the same bytes.
    assert render_haproxy_fragment(access, "registry.example/haproxy@sha256:00") == frag


@pytest.mark.haproxy
@needs_haproxy
def test_fragment_haproxy_cfg_passes_check(tmp_path):
    access = ApiServerAccess(backends=(Backend("10.0.0.1", 6443), Backend("api.example.com", 443, backup=True)))
    frag = render_haproxy_fragment(access, "img")
    cfg = next(f for f in frag["storage"]["files"] if f["path"] == HAPROXY_CFG_PATH)
    assert_valid(tmp_path, decode(cfg["contents"]["source"]).decode())


# --- a real HAProxy with the rendered config: TLS health checks and failover to backup ------

import datetime  # noqa: E402
import http.client  # noqa: E402
import socket  # noqa: E402
import ssl  # noqa: E402
import threading  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

from testsupport.harness import wait_for  # noqa: E402


def _self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-apiserver")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1)).sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "apiserver.crt", tmp_path / "apiserver.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class FakeApiserver:
    """HTTPS server answering /version (and /livez) like a kube-apiserver, named by its body."""

    def __init__(self, name: str, cert, key):
        outer = self
        self.name, self.healthy, self.health_checks = name, True, 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path.split("?")[0] in ("/version", "/livez"):
                    outer.health_checks += 1
                code = 200 if outer.healthy else 500
                body = outer.name.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ask(port: int) -> str:
    ctx = ssl._create_unverified_context()
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
    try:
        conn.request("GET", "/version")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def _wait(pred, timeout=15.0):
    def settled() -> bool:
        try:
            return bool(pred())
        except OSError:  # HAProxy not accepting yet, or between backends
            return False

    return wait_for(settled, timeout=timeout)


@pytest.mark.haproxy
@needs_haproxy
def test_real_haproxy_checks_over_tls_and_fails_over_to_backup(tmp_path):
    cert, key = _self_signed(tmp_path)
    primary, backup = FakeApiserver("primary", cert, key), FakeApiserver("backup", cert, key)
    listen = _free_port()
    access = ApiServerAccess(
        listen_ip="127.0.0.1", listen_port=listen,
        backends=(Backend("127.0.0.1", backup.port, backup=True), Backend("localhost", primary.port)),
        health_check=HEALTH_CHECK_LIVEZ,
    )
    # Same config, faster checks (10 s x 3 in production).
    cfg = render_haproxy_cfg(access).replace("inter 10s fall 3 rise 3", "inter 200ms fall 1 rise 1")
    assert_valid(tmp_path, cfg)
    (tmp_path / "haproxy.cfg").write_text(cfg)
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(tmp_path / "haproxy.cfg")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert _wait(lambda: _ask(listen) == "primary"), "traffic never reached the primary"
        assert primary.health_checks > 0  # checks really run, over TLS, on the DNS-named primary
        assert all(_ask(listen) == "primary" for _ in range(5))  # backup idle while a primary is up
        primary.healthy = False  # /livez fails: haproxy takes the primary out
        assert _wait(lambda: _ask(listen) == "backup"), "no failover to the backup"
        primary.healthy = True
        assert _wait(lambda: _ask(listen) == "primary"), "no failback to the primary"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
        primary.stop()
        backup.stop()
    assert b"Health check" in out or b"health" in out.lower()
