"""Pointer configs (both request shapes), user-data size limits, the user-data Secret."""

from __future__ import annotations

import base64
import json
import subprocess
from urllib.parse import parse_qs, urlsplit

import pytest

from ignition_server.render.userdata import (
    USER_DATA_LIMITS,
    fits,
    pointer_config,
    pointer_user_data,
    user_data_secret,
)
from testsupport.realtools import require_tool

CA = (
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBszCCAVmgAwIBAgIUQ2FmZmVpbmF0ZWRUZXN0Q0EwCgYIKoZIzj0EAwIwFDES\n"
    "-----END CERTIFICATE-----\n"
)
TOKEN = "3f0c2a9e-6d6b-4b7e-9a53-0e0b1f9f1c2d"


def _validate(tmp_path, config: dict | bytes) -> subprocess.CompletedProcess:
    exe = require_tool("ignition-validate", "apt-get install ignition")
    path = tmp_path / "pointer.ign"
    path.write_bytes(config if isinstance(config, bytes) else json.dumps(config).encode())
    return subprocess.run([exe, str(path)], capture_output=True, text=True, timeout=30)


def _decode_data_url(url: str) -> bytes:
    assert url.startswith("data:;base64,")
    return base64.b64decode(url.split(",", 1)[1])


def test_hypershift_shape_headers_and_ca():
    cfg = pointer_config(source_url="https://ign.example:9090/", token=TOKEN, ca_pem=CA, nodepool="clusters/np1")
    ign = cfg["ignition"]
    assert ign["version"] == "3.2.0"
    (merge,) = ign["config"]["merge"]
    assert merge["source"] == "https://ign.example:9090/ignition"
    headers = {h["name"]: h["value"] for h in merge["httpHeaders"]}
    assert headers["Authorization"] == "Bearer " + base64.b64encode(TOKEN.encode()).decode()
    assert headers["NodePool"] == "clusters/np1"
    (ca,) = ign["security"]["tls"]["certificateAuthorities"]
    assert _decode_data_url(ca["source"]) == CA.encode()


def test_hypershift_shape_without_nodepool_has_only_authorization():
    cfg = pointer_config(source_url="https://h:443", token=TOKEN, ca_pem=CA.encode())
    (merge,) = cfg["ignition"]["config"]["merge"]
    assert [h["name"] for h in merge["httpHeaders"]] == ["Authorization"]


def test_hypershift_target_config_version_hash_header():
    cfg = pointer_config(source_url="https://h", token=TOKEN, ca_pem=CA, target_config_version_hash="abc123")
    headers = {h["name"]: h["value"] for h in cfg["ignition"]["config"]["merge"][0]["httpHeaders"]}
    assert headers["TargetConfigVersionHash"] == "abc123"


def test_mcs_shape_token_in_url_no_headers():
    token = "a+b/c=d&e f"
    cfg = pointer_config(source_url="https://h:9090", token=token, ca_pem=CA, shape="mcs", nodepool="clusters/np-1")
    (merge,) = cfg["ignition"]["config"]["merge"]
    assert "httpHeaders" not in merge
    url = urlsplit(merge["source"])
    assert url.path == "/config/np-1"
    assert parse_qs(url.query) == {"token": [token]}
    assert "+" not in url.query and "&e" not in url.query and " " not in url.query


def test_mcs_shape_needs_nodepool():
    with pytest.raises(ValueError, match="nodepool"):
        pointer_config(source_url="https://h", token=TOKEN, ca_pem=CA, shape="mcs")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"shape": "bogus"}, "shape"),
        ({"token": ""}, "token"),
        ({"version": "2.2.0"}, "version"),
        ({"source_url": "http://h"}, "https"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"source_url": "https://h", "token": TOKEN, "ca_pem": CA, **kwargs}
    with pytest.raises(ValueError, match=match):
        pointer_config(**args)


@pytest.mark.parametrize("shape", ["hypershift", "mcs"])
@pytest.mark.parametrize("version", ["3.2.0", "3.3.0"])
def test_both_shapes_pass_ignition_validate(tmp_path, shape, version):
    data = pointer_user_data(
        source_url="https://ign.example:9090", token=TOKEN, ca_pem=CA, shape=shape,
        nodepool="clusters/np1", version=version,
    )
    res = _validate(tmp_path, data)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ignition_validate_rejects_broken_pointer(tmp_path):
    """The validation step above can fail: a merge entry without a source is invalid."""
    cfg = pointer_config(source_url="https://h", token=TOKEN, ca_pem=CA)
    cfg["ignition"]["config"]["merge"][0]["source"] = "not a url at all ::"
    cfg["ignition"]["version"] = "9.9.9"
    res = _validate(tmp_path, cfg)
    assert res.returncode != 0


def test_user_data_is_compact_json_with_version_first():
    data = pointer_user_data(source_url="https://h", token=TOKEN, ca_pem=CA)
    assert data.startswith(b'{"ignition":{"version":"3.2.0"')
    assert b", " not in data and b": " not in data and b"\n" not in data
    assert json.loads(data) == pointer_config(source_url="https://h", token=TOKEN, ca_pem=CA)


def test_fits_reports_each_cloud():
    assert USER_DATA_LIMITS == {"ibmcloud-vpc": 65536, "aws": 16384}
    assert fits(b"x" * 16384) == {"ibmcloud-vpc": True, "aws": True}
    assert fits(b"x" * 16385) == {"ibmcloud-vpc": True, "aws": False}
    assert fits(b"x" * 65537) == {"ibmcloud-vpc": False, "aws": False}


def test_large_ca_bundle_fits_ibm_not_aws():
    big_ca = CA * 200  # ~28 KiB of PEM, ~37 KiB as base64
    data = pointer_user_data(source_url="https://h", token=TOKEN, ca_pem=big_ca)
    assert fits(data) == {"ibmcloud-vpc": True, "aws": False}
    with pytest.raises(ValueError, match="aws limit of 16384"):
        pointer_user_data(source_url="https://h", token=TOKEN, ca_pem=big_ca, limit_cloud="aws")


def test_too_large_raises_clear_error():
    huge_ca = CA * 500
    with pytest.raises(ValueError) as exc:
        pointer_user_data(source_url="https://h", token=TOKEN, ca_pem=huge_ca)
    msg = str(exc.value)
    assert "ibmcloud-vpc limit of 65536 bytes" in msg
    assert "CA bundle" in msg and "aws does not fit" in msg


def test_user_data_secret_takes_hash_from_token_secret():
    data = pointer_user_data(source_url="https://h", token=TOKEN, ca_pem=CA, nodepool="clusters/np1")
    secret = user_data_secret(
        nodepool_name="np1", namespace="clusters-hc1", token_secret_name="token-np1-5d1c7a3b",
        user_data=data, nodepool_namespace="clusters",
    )
    assert secret["apiVersion"] == "v1" and secret["kind"] == "Secret"
    meta = secret["metadata"]
    assert meta["name"] == "user-data-np1-5d1c7a3b"
    assert meta["namespace"] == "clusters-hc1"
    assert meta["annotations"]["hypershift.openshift.io/nodePool"] == "clusters/np1"
    assert base64.b64decode(secret["data"]["value"]) == data
    assert base64.b64decode(secret["data"]["disableTemplating"]) == b"true"


def test_user_data_secret_hashes_the_token_secret_name_otherwise():
    a = user_data_secret(nodepool_name="np1", namespace="ns", token_secret_name="other", user_data=b"A")
    b = user_data_secret(nodepool_name="np1", namespace="ns", token_secret_name="other", user_data=b"B")
    # A token Secret of another NodePool does not lend its hash either.
    c = user_data_secret(nodepool_name="np1", namespace="ns", token_secret_name="token-np2-abcd", user_data=b"A")
    assert a["metadata"]["name"].startswith("user-data-np1-")
    # Stable across rotations (the user data changes, the Secret is the same one) ...
    assert a["metadata"]["name"] == b["metadata"]["name"]
    # ... and distinct per token Secret.
    assert c["metadata"]["name"] != a["metadata"]["name"]
    assert a["metadata"]["annotations"]["hypershift.openshift.io/nodePool"] == "ns/np1"


JWT = (
    "eyJhbGciOiJSUzI1NiIsImtpZCI6ImFiYyJ9."
    "eyJpc3MiOiJrdWJlcm5ldGVzL3NlcnZpY2VhY2NvdW50Iiwic3ViIjoic3lzdGVtOnNlcnZpY2VhY2NvdW50Om9wZW5zaGlmdC1pbmZyYTpub2RlLWJvb3RzdHJhcHBlciJ9."
    "c2lnbmF0dXJl"
)


def test_mcs_shape_sends_a_jwt_as_base64():
    cfg = pointer_config(source_url="https://h", token=JWT, ca_pem=CA, shape="mcs", nodepool="ns/np")
    (sent,) = parse_qs(urlsplit(cfg["ignition"]["config"]["merge"][0]["source"]).query)["token"]
    assert base64.b64decode(sent).decode() == JWT
    # forced either way
    cfg = pointer_config(source_url="https://h", token=JWT, ca_pem=CA, shape="mcs", nodepool="ns/np", token_kind="opaque")
    assert parse_qs(urlsplit(cfg["ignition"]["config"]["merge"][0]["source"]).query)["token"] == [JWT]
    cfg = pointer_config(source_url="https://h", token="opaque", ca_pem=CA, shape="mcs", nodepool="ns/np", token_kind="jwt")
    assert parse_qs(urlsplit(cfg["ignition"]["config"]["merge"][0]["source"]).query)["token"] == [
        base64.b64encode(b"opaque").decode()
    ]
    # the header shape is base64 of the token, whatever it is
    cfg = pointer_config(source_url="https://h", token=JWT, ca_pem=CA)
    bearer = cfg["ignition"]["config"]["merge"][0]["httpHeaders"][0]["value"]
    assert base64.b64decode(bearer.removeprefix("Bearer ")).decode() == JWT


def test_uuid_token_is_not_taken_for_a_jwt():
    cfg = pointer_config(source_url="https://h", token=TOKEN, ca_pem=CA, shape="mcs", nodepool="ns/np")
    assert parse_qs(urlsplit(cfg["ignition"]["config"]["merge"][0]["source"]).query)["token"] == [TOKEN]
