"""Property tests (hypothesis): whatever a client or a manifest sends, the answer is a 4xx, a
5xx or a clear InvalidConfig: never a crash, a traceback in a body, or another exception."""

from __future__ import annotations

import base64
import socket
import ssl
import time
from urllib.parse import quote

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from ignition_server.auth.tokens import Refusal, credential
from ignition_server.bounded_yaml import load_all
from ignition_server.render.inputs import InvalidConfig
from ignition_server.render.machineconfig import parse_machineconfigs
from ignition_server.render.spec import SUPPORTED_VERSIONS, UnsatisfiableVersion, negotiate
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, write_manifests
from testsupport.manifests import build_token_secret

QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NASTY = st.one_of(
    st.text(max_size=200),
    st.sampled_from(["../../etc/passwd", "%2e%2e%2fetc%2fpasswd", "\x00", "a" * 10_000, "clusters/../x", "é\u202e"]),
)


@QUICK
@given(header=st.one_of(NASTY, NASTY.map(lambda t: "Bearer " + t),
                        NASTY.map(lambda t: "Bearer " + base64.b64encode(t.encode()).decode())))
def test_any_authorization_header_is_a_token_or_a_4xx(header: str) -> None:
    try:
        token, _is_jwt = credential(header=header)
    except Refusal as refusal:
        assert 400 <= refusal.status < 500
    else:
        assert isinstance(token, str)


@QUICK
@given(value=NASTY)
def test_any_token_parameter_is_a_token_or_a_4xx(value: str) -> None:
    try:
        credential(query_value=value)
    except Refusal as refusal:
        assert 400 <= refusal.status < 500


@QUICK
@given(accept=st.one_of(st.text(max_size=200), st.builds(
    lambda v, q: f"application/vnd.coreos.ignition+json;version={v};q={q}", st.text(max_size=12), st.text(max_size=5))))
def test_any_accept_header_negotiates_or_says_why(accept: str) -> None:
    try:
        assert negotiate(accept, "3.2.0") in SUPPORTED_VERSIONS
    except UnsatisfiableVersion as exc:
        assert "3.2.0" in str(exc)


_yaml_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
                            lambda children: st.one_of(st.lists(children, max_size=4),
                                                       st.dictionaries(st.text(max_size=10), children, max_size=4)),
                            max_leaves=20)


@QUICK
@given(spec=st.dictionaries(st.sampled_from(["config", "kernelArguments", "osImageURL", "extensions", "x"]),
                            _yaml_values, max_size=4),
       config=_yaml_values)
def test_any_machineconfig_parses_or_is_invalid_config(spec: dict, config: object) -> None:
    if isinstance(spec.get("config"), dict):
        spec["config"] = {"ignition": {"version": "3.2.0"}, **spec["config"]} if config else spec["config"]
    text = yaml.safe_dump({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
                           "metadata": {"name": "99-fuzz"}, "spec": spec})
    try:
        parse_machineconfigs(text)
    except InvalidConfig:
        pass


@QUICK
@given(text=st.text(max_size=300))
def test_any_text_loads_or_is_a_yaml_error(text: str) -> None:
    try:
        load_all(text)
    except yaml.YAMLError:
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fuzz")
    write_manifests(root / "source" / "pool.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters/workers", token="tok-fuzz",
        machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="workers"), generation_time=time.time()))
    proc = ServerProcess(root / "source", root / "cache",
                         extra=["--auth-failure-burst", "100000"]).start()  # the fuzzer is one address
    yield proc
    proc.kill()


def raw_request(proc: ServerProcess, head: bytes) -> bytes:
    context = ssl.create_default_context(cafile=str(proc.ca_file))
    with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            conn.sendall(head)
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(path=NASTY, name=NASTY, token=NASTY, header=NASTY)
def test_any_request_gets_a_status_and_no_traceback(server: ServerProcess, path: str, name: str, token: str, header: str) -> None:
    target = "/" + quote(path, safe="/?=&%") if path else f"/config/{quote(name, safe='')}?token={quote(token, safe='')}"
    value = header.encode("utf-8", "replace").replace(b"\r", b"").replace(b"\n", b"")
    answer = raw_request(server, b"GET " + target.encode()[:9000] + b" HTTP/1.1\r\nHost: x\r\nNodePool: " + value[:9000]
                         + b"\r\nConnection: close\r\n\r\n")
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1."), answer[:200]  # aiohttp's parser answers 400s as HTTP/1.0
    status = int(status_line.split()[1])
    assert 400 <= status < 600, status_line  # nothing but a token of this NodePool opens it
    assert b"Traceback" not in answer and b"tok-fuzz" not in answer
    assert server.proc.poll() is None  # type: ignore[union-attr]
