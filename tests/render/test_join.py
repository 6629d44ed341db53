"""The join files: bootstrap kubeconfig, pull secret, CA bundles; `missing` for absent inputs."""

from __future__ import annotations

import base64
import json
import subprocess
from urllib.parse import unquote

import pytest

from ignition_server.render.inputs import InvalidConfig
from ignition_server.render.join import (
    BOOTSTRAP_KUBECONFIG_PATH,
    KUBELET_CA_PATH,
    PULL_SECRET_PATH,
    USER_CA_BUNDLE_PATH,
    JoinInputs,
    merge_ca_bundles,
    render_join_fragment,
)
from testsupport.realtools import require_tool

KUBECONFIG = (
    b"apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://172.20.0.1:6443\n"
    b"    certificate-authority-data: Zm9v\nusers:\n- name: u\n  user:\n    token: bootstrap-token\n"
    b"contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
)
PULL = b'{"auths":{"quay.io":{"auth":"dXNlcjpwYXNz","email":"a@b"}}}'


def cert(n: int) -> bytes:
    body = base64.b64encode(f"certificate number {n} ".encode() * 3).decode()
    return f"-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n".encode()


def decode(source: str) -> bytes:
    if source.startswith("data:;base64,"):
        return base64.b64decode(source.split(",", 1)[1])
    assert source.startswith("data:,")
    return unquote(source.split(",", 1)[1], encoding="latin-1").encode("latin-1")


def files_of(frag: dict) -> dict[str, dict]:
    return {f["path"]: f for f in frag.get("storage", {}).get("files", [])}


def test_all_inputs():
    inputs = JoinInputs(KUBECONFIG, PULL, (cert(1) + cert(2), cert(2) + cert(3)), kubelet_ca=cert(9))
    assert inputs.missing == ()
    files = files_of(render_join_fragment(inputs))
    assert set(files) == {BOOTSTRAP_KUBECONFIG_PATH, PULL_SECRET_PATH, USER_CA_BUNDLE_PATH, KUBELET_CA_PATH}
    assert files[BOOTSTRAP_KUBECONFIG_PATH]["mode"] == 0o600
    assert files[PULL_SECRET_PATH]["mode"] == 0o600
    assert files[USER_CA_BUNDLE_PATH]["mode"] == 0o644
    assert decode(files[BOOTSTRAP_KUBECONFIG_PATH]["contents"]["source"]) == KUBECONFIG
    assert decode(files[PULL_SECRET_PATH]["contents"]["source"]) == PULL
    bundle = decode(files[USER_CA_BUNDLE_PATH]["contents"]["source"])
    assert bundle.count(b"BEGIN CERTIFICATE") == 3  # cert(2) once
    assert bundle.index(cert(1).strip()) < bundle.index(cert(2).strip()) < bundle.index(cert(3).strip())
    assert decode(files[KUBELET_CA_PATH]["contents"]["source"]) == cert(9)


def test_missing_inputs_are_named_and_left_out():
    assert JoinInputs().missing == ("bootstrap-kubeconfig", "pull-secret", "user-ca-bundle")
    assert render_join_fragment(JoinInputs()) == {}
    only_pull = JoinInputs(pull_secret=PULL, ca_bundles=(b"",))
    assert only_pull.missing == ("bootstrap-kubeconfig", "user-ca-bundle")
    assert set(files_of(render_join_fragment(only_pull))) == {PULL_SECRET_PATH}


@pytest.mark.parametrize(
    "inputs, match",
    [
        (JoinInputs(bootstrap_kubeconfig=b"clusters: [\n"), "not YAML"),
        (JoinInputs(bootstrap_kubeconfig=b"kind: Config\nclusters: []\n"), "no clusters"),
        (JoinInputs(bootstrap_kubeconfig=KUBECONFIG.replace(b"kind: Config", b"kind: Secret")), "kind"),
        (JoinInputs(pull_secret=b"{not json"), "not JSON"),
        (JoinInputs(pull_secret=b'{"registry": {}}'), "auths"),
        (JoinInputs(ca_bundles=(b"hello",)), "no PEM certificate"),
    ],
)
def test_malformed_inputs_are_invalid_config(inputs, match):
    with pytest.raises(InvalidConfig, match=match):
        render_join_fragment(inputs)


def test_merge_ca_bundles_normalises_crlf():
    crlf = cert(1).replace(b"\n", b"\r\n")
    assert merge_ca_bundles((crlf, cert(1))) == cert(1)


def test_join_fragment_is_valid_ignition(tmp_path):
    exe = require_tool("ignition-validate", "apt-get install ignition")
    frag = render_join_fragment(JoinInputs(KUBECONFIG, PULL, (cert(1),), kubelet_ca=cert(2)))
    path = tmp_path / "join.ign"
    path.write_text(json.dumps({"ignition": {"version": "3.2.0"}, **frag}))
    res = subprocess.run([exe, str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
