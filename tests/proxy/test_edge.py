"""The HAProxy edge: rendered config accepted by `haproxy -c`, then a real HAProxy in front
of a real aiohttp backend, real tokens over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ignition_server.auth.claims import LEGACY_ISSUER, JwtRefused
from ignition_server.auth.jwks import PrivateKeyRefused, kube_key_id, public_key_pem
from ignition_server.auth.jwt import ServiceAccountVerifier
from proxy.jwt_frontend import EdgeKey, write_key_files
from testsupport.edge_config import render_edge_config
from testsupport.harness import raw_status
from testsupport.realtools import require_tool

HAPROXY = shutil.which("haproxy") or "haproxy"
pytestmark = [pytest.mark.haproxy]


@pytest.fixture(autouse=True)
def _real_haproxy() -> None:
    require_tool("haproxy", "apt-get install haproxy")
BOUND_ISSUER = "https://kubernetes.default.svc"
CLUSTER = "clusters-foo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def legacy(ns="openshift-infra", sa="node-bootstrapper", **extra) -> dict:
    claims = {
        "iss": LEGACY_ISSUER,
        "sub": f"system:serviceaccount:{ns}:{sa}",
        "kubernetes.io/serviceaccount/namespace": ns,
        "kubernetes.io/serviceaccount/secret.name": f"{sa}-token-g96rw",
        "kubernetes.io/serviceaccount/service-account.name": sa,
        "kubernetes.io/serviceaccount/service-account.uid": "4fdfc693-f184-4409-a523-6e6c6c886071",
    }
    claims.update(extra)
    return claims


def bound(ns="openshift-machine-config-operator", sa="node-bootstrapper", **extra) -> dict:
    now = int(time.time())
    claims = {
        "aud": ["https://kubernetes.default.svc"],
        "exp": now + 3600,
        "iat": now - 60,
        "nbf": now - 60,
        "iss": BOUND_ISSUER,
        "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": sa, "uid": "0b8e1b5c"}},
        "sub": f"system:serviceaccount:{ns}:{sa}",
    }
    claims.update(extra)
    return claims


def sign(claims: dict, key) -> str:
    return sign_as(claims, key, kube_key_id(key.public_key()))


def sign_as(claims: dict, key, kid: str | None) -> str:
    alg = "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
    return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid} if kid else None)


@pytest.fixture(scope="module")
def keys():
    return {
        "current": ec.generate_private_key(ec.SECP256R1()),
        "previous": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "stranger": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    }


class Backend:
    """A tiny aiohttp server in its own thread and loop; counts the requests it sees."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append(request.path_qs)
        return web.Response(text=f"payload for {request.path}", headers={"Cache-Control": "no-store"})

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def start(self) -> Backend:
        self._thread.start()
        assert self._ready.wait(10), "backend did not start"
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"haproxy exited: {proc.stderr.read().decode(errors='replace')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("haproxy did not start listening")


@contextlib.contextmanager
def running_haproxy(config: Path, port: int) -> Iterator[None]:
    """Real HAProxy on `config` (which binds `port`), listening until the block ends."""
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_listening(port, proc)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def get(port: int, path: str, headers: dict | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def url_for(token: str | None, pool: str = "worker") -> str:
    if token is None:
        return f"/config/{pool}"
    encoded = base64.b64encode(token.encode()).decode()
    return f"/config/{pool}?token={urllib.parse.quote(encoded, safe='')}"


# ------------------------------------------------------------------ pure rendering
def test_rendered_config_passes_haproxy_check(tmp_path, keys):
    key_files = write_key_files(tmp_path / "keys", [keys["current"].public_key(), keys["previous"].public_key()])
    assert [k.alg for k in key_files] == ["ES256", "RS256"]
    for kf in key_files:
        assert open(kf.path, "rb").read().startswith(b"-----BEGIN PUBLIC KEY-----")
    variants = [
        dict(key_files=key_files),
        dict(key_files=[k.path for k in key_files], bearer=True, open_paths=["/healthz"], log_target="stdout"),
        dict(key_files=key_files[:1], issuers=[LEGACY_ISSUER, BOUND_ISSUER], leeway_seconds=0),
    ]
    for i, kw in enumerate(variants):
        cfg = render_edge_config(bind="127.0.0.1:8443", backend_servers=["127.0.0.1:1"], **kw)
        assert cfg == render_edge_config(bind="127.0.0.1:8443", backend_servers=["127.0.0.1:1"], **kw)  # pure
        assert "jwt_verify" in cfg and "http-request return status 403" in cfg
        assert cfg.count("jwt_verify(") == (4 if i == 1 else len(kw["key_files"]))
        path = tmp_path / f"edge{i}.cfg"
        path.write_text(cfg)
        res = subprocess.run([HAPROXY, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stdout + res.stderr


def test_a_key_id_or_issuer_beginning_with_a_dash_is_a_pattern_not_an_option(tmp_path, keys):
    """A kid is base64url (a thumbprint): one in 64 begins with '-', which HAProxy took for an ACL
    option and refused the whole config (the suite's edge tests failed at random for it)."""
    key_file = write_key_files(tmp_path / "keys", keys["current"].public_key())[0]
    dashed = EdgeKey(key_file.path, key_file.alg, "-PrzUoLQQif_jkNdzODMQ9WAe3HnKBMsIVdH9PFRxpU")
    cfg = render_edge_config(bind="127.0.0.1:8443", backend_servers=["127.0.0.1:1"], key_files=[dashed],
                             issuers=["-odd-issuer"])
    assert "-PrzUoLQQif" in cfg
    path = tmp_path / "edge.cfg"
    path.write_text(cfg)
    res = subprocess.run([HAPROXY, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr


def test_frontend_only_section_embeds(keys, tmp_path):
    kf = write_key_files(tmp_path, keys["current"].public_key())
    cfg = render_edge_config(bind="127.0.0.1:8443", backend_servers=["127.0.0.1:1"], key_files=kf, with_global=False)
    assert "\nglobal" not in cfg and "\ndefaults" not in cfg
    assert "frontend ignition_edge" in cfg and "backend ignition_edge_servers" in cfg
    # embedded into a bigger config of the caller's own
    whole = "global\n    nbthread 1\n\ndefaults\n    mode http\n    timeout connect 1s\n" \
        "    timeout client 1s\n    timeout server 1s\n\n" + cfg
    (tmp_path / "whole.cfg").write_text(whole)
    res = subprocess.run([HAPROXY, "-c", "-f", str(tmp_path / "whole.cfg")], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr


def test_renderer_refuses_unsafe_values(tmp_path, keys):
    kf = write_key_files(tmp_path, keys["current"].public_key())
    bad = [
        dict(bind="127.0.0.1:1 ssl", backend_servers=["127.0.0.1:1"], key_files=kf),
        dict(bind="127.0.0.1:0", backend_servers=["127.0.0.1:1"], key_files=kf),
        dict(bind="127.0.0.1:1", backend_servers=["127.0.0.1:70000"], key_files=kf),
        dict(bind="127.0.0.1:1", backend_servers=["127.0.0.1:1\n    server evil 10.0.0.1:80"], key_files=kf),
        dict(bind="127.0.0.1:1", backend_servers=["127.0.0.1:1"], key_files=['/tmp/a".pem']),
        dict(bind="127.0.0.1:1", backend_servers=["127.0.0.1:1"], key_files=["relative.pem"]),
        dict(bind="127.0.0.1:1", backend_servers=["127.0.0.1:1"], key_files=[EdgeKey("/k.pem", "HS256")]),
        dict(bind="127.0.0.1:1", backend_servers=["127.0.0.1:1"], key_files=[]),
        dict(bind="127.0.0.1:1", backend_servers=["127.0.0.1:1"], key_files=kf, issuers=["a b"]),
        dict(bind="127.0.0.1:1", backend_servers=["127.0.0.1:1"], key_files=kf, allowed_accounts=[("ns }", "x")]),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            render_edge_config(**kw)


def test_write_key_files_rotates_and_refuses_private_keys(tmp_path, keys):
    first = write_key_files(tmp_path, [keys["current"].public_key(), keys["previous"].public_key()])
    assert len(list(tmp_path.glob("sa-*.pem"))) == 2
    second = write_key_files(tmp_path, keys["current"].public_key())  # previous left its window
    assert second == first[:1]
    assert [p.name for p in tmp_path.glob("sa-*.pem")] == [first[0].path.rsplit("/", 1)[1]]
    pem = keys["previous"].private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(PrivateKeyRefused):
        write_key_files(tmp_path, pem)
    # from the verifier's view of a cluster: current + previous within the window
    v = ServiceAccountVerifier(overlap_seconds=3600)
    v.keys.set_keys(CLUSTER, keys["previous"].public_key())
    v.keys.set_keys(CLUSTER, keys["current"].public_key())
    assert [k.alg for k in write_key_files(tmp_path, v.keys.trusted_keys(CLUSTER))] == ["ES256", "RS256"]


# ------------------------------------------------------------------ real traffic
@pytest.fixture
def edge(tmp_path, keys):
    backend = Backend().start()
    port = free_port()
    key_files = write_key_files(tmp_path / "keys", [keys["current"].public_key(), keys["previous"].public_key()])
    cfg = render_edge_config(
        bind=f"127.0.0.1:{port}",
        backend_servers=[f"127.0.0.1:{backend.port}"],
        key_files=key_files,
        issuers=[LEGACY_ISSUER, BOUND_ISSUER],
        bearer=True,
        open_paths=["/healthz"],
    )
    path = tmp_path / "edge.cfg"
    path.write_text(cfg)
    try:
        with running_haproxy(path, port):
            yield port, backend
    finally:
        backend.stop()


def _alg_none() -> str:
    h = b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    return f"{h}.{b64url(json.dumps(legacy()).encode())}."


def _hs256(keys) -> str:
    h = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    p = b64url(json.dumps(legacy()).encode())
    sig = hmac.new(public_key_pem(keys["previous"].public_key()), f"{h}.{p}".encode(), hashlib.sha256).digest()
    return f"{h}.{p}.{b64url(sig)}"


def _tampered(keys) -> str:
    h, _, s = sign(legacy(), keys["previous"]).split(".")
    return f"{h}.{b64url(json.dumps(legacy(ns='kube-system')).encode())}.{s}"


GOOD = {
    "legacy RS256, previous key": lambda k: sign(legacy(), k["previous"]),
    "bound ES256, current key": lambda k: sign(bound(), k["current"]),
    "legacy ES256, mco namespace": lambda k: sign(legacy(ns="openshift-machine-config-operator"), k["current"]),
}
FORGED = {
    # name: (forged token, the edge's refusal body)
    "another key's signature under a held kid": (
        lambda k: sign_as(legacy(), k["stranger"], kube_key_id(k["previous"].public_key())),
        b"token signature not valid\n"),
    "tampered payload": (_tampered, b"token signature not valid\n"),
    "wrong namespace": (lambda k: sign(legacy(ns="kube-system"), k["current"]), b"service account not allowed\n"),
    "wrong service account": (lambda k: sign(bound(sa="default"), k["current"]), b"service account not allowed\n"),
    "expired": (lambda k: sign(bound(exp=int(time.time()) - 3600), k["current"]), b"token expired\n"),
    "not yet valid": (lambda k: sign(bound(nbf=int(time.time()) + 3600), k["current"]), b"token not valid yet\n"),
    "wrong issuer": (lambda k: sign(bound(iss="https://evil.example"), k["current"]), b"token issuer not accepted\n"),
    "expired, float exp": (lambda k: sign(bound(exp=time.time() - 3600.5), k["current"]), b"token expired\n"),
    # HAProxy's json_query int conversion turns the string into 0: refused as expired.
    "exp not a number": (lambda k: sign(bound(exp="never"), k["current"]), b"token expired\n"),
    "alg none": (lambda k: _alg_none(), b"token missing or not base64 of a JWT\n"),
    "HS256 with the public PEM": (_hs256, b"token algorithm not allowed\n"),
}


def test_edge_passes_good_and_stops_forged_tokens(edge, keys):
    port, backend = edge
    # the Python verifier, configured the same way, agrees with the edge on every token
    verifier = ServiceAccountVerifier()
    verifier.keys.configure(CLUSTER, issuers=[BOUND_ISSUER])
    verifier.keys.set_keys(CLUSTER, [keys["current"].public_key(), keys["previous"].public_key()])

    for name, make in GOOD.items():
        token = make(keys)
        before = len(backend.requests)
        status, body = get(port, url_for(token))
        assert status == 200, (name, body)
        assert body == b"payload for /config/worker"
        assert len(backend.requests) == before + 1
        assert verifier.verify(token).cluster == CLUSTER

    seen = len(backend.requests)
    for name, (make, reason) in FORGED.items():
        token = make(keys)
        status, body = get(port, url_for(token))
        assert (status, body) == (403, reason), name
        assert token.encode() not in body and base64.b64encode(token.encode()) not in body
        with pytest.raises(JwtRefused):
            verifier.verify(token)

    for path in [
        url_for(None),  # no token
        "/config/worker?token=",
        "/config/worker?token=%%%",
        "/config/worker?token=" + sign(legacy(), keys["current"]),  # not base64 of the JWT
        "/config/worker?token=" + base64.b64encode(b"not-a-jwt").decode(),
    ]:
        status, body = get(port, path)
        assert status == 403, (path, status, body)
    assert len(backend.requests) == seen, "a forged request reached the backend"


def test_edge_bearer_and_open_paths(edge, keys):
    port, backend = edge
    token = sign(bound(), keys["current"])
    status, _ = get(port, "/ignition", {"Authorization": "Bearer " + base64.b64encode(token.encode()).decode()})
    assert status == 200
    bad = sign_as(bound(), keys["stranger"], kube_key_id(keys["current"].public_key()))
    status, _ = get(port, "/ignition", {"Authorization": "Bearer " + base64.b64encode(bad.encode()).decode()})
    assert status == 403
    status, body = get(port, "/healthz")
    assert (status, body) == (200, b"payload for /healthz")
    assert backend.requests == ["/ignition", "/healthz"]
    # the token reaches the server too, so it can verify again (defense in depth)
    status, _ = get(port, url_for(token, "infra"))
    assert status == 200 and backend.requests[-1].startswith("/config/infra?token=")


def raw_get(port: int, target: str, headers: list[tuple[str, str]]) -> int:
    return raw_status(http.client.HTTPConnection("127.0.0.1", port, timeout=10), target, headers)


def test_edge_refuses_two_credentials_or_an_ambiguous_spelling(edge, keys):
    """HAProxy and the server must read the same credential: a request that presents two, or one
    spelled so that readers may disagree, is refused at the edge with 400 and never forwarded,
    even when the credential the edge would check is good."""
    port, backend = edge
    good = base64.b64encode(sign(bound(), keys["current"]).encode()).decode()
    forged = base64.b64encode(sign(bound(), keys["stranger"]).encode()).decode()
    q = urllib.parse.quote
    cases = [
        (f"/config/worker?token={q(good)}", [("Authorization", f"Bearer {forged}")]),
        (f"/ignition?token={q(good)}", [("Authorization", f"Bearer {forged}")]),
        (f"/ignition?token={q(good)}", []),
        ("/ignition", [("Authorization", f"Bearer {good}"), ("Authorization", f"Bearer {forged}")]),
        (f"/config/worker?token={q(good)}&token={q(forged)}", []),
        (f"/config/worker?token={q(good)}&tok%65n={q(forged)}", []),
        (f"/config/worker?tok%65n={q(good)}", []),
        (f"/config/worker?TOKEN={q(forged)}&token={q(good)}", []),
        (f"/config/worker?token={q(good)};token={q(forged)}", []),
        (f"/config/worker;token={q(forged)}?token={q(good)}", []),
    ]
    got = {(target, len(headers)): raw_get(port, target, headers) for target, headers in cases}
    assert got == {key: 400 for key in got}
    assert backend.requests == []
    assert raw_get(port, f"/config/worker?token={q(good)}", []) == 200  # one, plainly, passes
    assert raw_get(port, "/ignition", [("Authorization", f"Bearer {good}")]) == 200


def test_edge_answers_a_key_it_does_not_hold_yet_511_and_passes_it_once_reloaded(edge, keys, tmp_path):
    """The hosted cluster rotated its signing key before the edge was reloaded with the new one:
    a token signed by it is 511 + Retry-After (Ignition retries a 5xx, gives up on a 4xx), never
    forwarded; a kid naming a held key whose signature fails is forged: 403."""
    port, backend = edge
    new_key = keys["stranger"]
    not_yet = {
        "its own kid": sign(legacy(), new_key),
        "no kid": sign_as(legacy(), new_key, None),
    }
    for name, token in not_yet.items():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", url_for(token))
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (511, b"token signing key not known yet\n"), name
        assert resp.getheader("Retry-After") == "5" and resp.getheader("Cache-Control") == "no-store"
        conn.close()
    forged = sign_as(legacy(), new_key, kube_key_id(keys["current"].public_key()))
    assert get(port, url_for(forged)) == (403, b"token signature not valid\n")
    assert backend.requests == []

    # the edge reads the new key (a new HAProxy over the same keys directory): now it passes
    key_files = write_key_files(tmp_path / "keys", [keys["current"].public_key(), new_key.public_key()])
    assert {k.kid for k in key_files} == {kube_key_id(keys["current"].public_key()), kube_key_id(new_key.public_key())}
    port2 = free_port()
    cfg = render_edge_config(bind=f"127.0.0.1:{port2}", backend_servers=[f"127.0.0.1:{backend.port}"],
                             key_files=key_files, issuers=[LEGACY_ISSUER, BOUND_ISSUER])
    (tmp_path / "edge2.cfg").write_text(cfg)
    with running_haproxy(tmp_path / "edge2.cfg", port2):
        for name, token in not_yet.items():
            assert get(port2, url_for(token))[0] == 200, name
        # the previous key left: its kid is no longer held, so its tokens are "not known", not forged
        assert get(port2, url_for(sign(legacy(), keys["previous"])))[0] == 511
        # a held kid over a key no longer held: forged, whatever it once was
        assert get(port2, url_for(sign_as(legacy(), keys["previous"], kube_key_id(new_key.public_key()))))[0] == 403
