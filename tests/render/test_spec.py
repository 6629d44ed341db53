"""Spec versions: minimum version, canonical bytes, version splice, Accept negotiation, checks."""

from __future__ import annotations

import json

import pytest

from ignition_server.render.inputs import InvalidConfig
from ignition_server.render.spec import (
    SUPPORTED_VERSIONS,
    UnsatisfiableVersion,
    body_version,
    client_maximum,
    encode,
    minimum_version,
    minimum_version_reason,
    negotiate,
    with_version,
)
from ignition_server.render.validation import validate
from testsupport.invalid_configs import BAD_CASES, GOOD, bad

SHA256 = "sha256-" + "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
REAL_CLIENT_ACCEPT = "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0.1"  # Ignition 2.14


def cfg(**sections) -> dict:
    return {"ignition": {"version": "3.0.0"}, **sections}


def files(*entries) -> dict:
    return {"files": list(entries)}


# --------------------------------------------------------------------------------- versions


def test_supported_versions_ascending():
    assert SUPPORTED_VERSIONS == ("3.0.0", "3.1.0", "3.2.0", "3.3.0", "3.4.0", "3.5.0", "3.6.0")


@pytest.mark.parametrize(
    "config, expected, reason",
    [
        (cfg(), "3.0.0", ""),
        (cfg(storage=files({"path": "/a", "contents": {"source": "data:,x", "compression": "gzip"}})), "3.0.0", ""),
        (cfg(systemd={"units": [{"name": "a.service", "dropins": [{"name": "x.conf", "contents": "[Unit]\n"}]}]}),
         "3.0.0", ""),
        (cfg(passwd={"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"]}]}), "3.0.0", ""),
        (cfg(storage=files({"path": "/a", "contents": {"source": "data:,x", "verification": {"hash": SHA256}}})),
         "3.1.0", "sha256 hash"),
        (cfg(storage=files({"path": "/a", "contents": {"source": "https://h/x",
                                                       "httpHeaders": [{"name": "A", "value": "b"}]}})),
         "3.1.0", "storage.files[0].contents.httpHeaders"),
        (cfg(ignition={"version": "3.0.0", "proxy": {"httpsProxy": "http://p:3128"}}),
         "3.1.0", "ignition.proxy"),
        (cfg(ignition={"version": "3.0.0", "config": {"merge": [{"source": "https://h/c", "compression": "gzip"}]}}),
         "3.1.0", "ignition.config.merge[0].compression"),
        (cfg(storage={"filesystems": [{"device": "/dev/vdb", "mountOptions": ["ro"]}]}),
         "3.1.0", "storage.filesystems[0].mountOptions"),
        (cfg(storage=files({"path": "/a", "contents": {"source": "gs://bucket/obj"}})), "3.2.0", "gs:// source"),
        (cfg(passwd={"users": [{"name": "old", "shouldExist": False}]}), "3.2.0", "passwd.users[0].shouldExist"),
        (cfg(storage={"luks": [{"name": "v", "device": "/dev/vdb", "clevis": {"tpm2": True}}]}),
         "3.2.0", "storage.luks"),
        (cfg(kernelArguments={"shouldExist": ["nosmt"]}), "3.3.0", "kernelArguments"),
        (cfg(storage={"filesystems": [{"device": "/dev/vdb", "format": "none", "wipeFilesystem": True}]}),
         "3.3.0", 'filesystem format "none"'),
        (cfg(storage={"links": [{"path": "/l", "overwrite": True}]}), "3.3.0", "storage.links[0]"),
        (cfg(storage=files({"path": "/a", "contents": {
            "source": "arn:aws:s3:us-west-2:123456789012:accesspoint/test/object/some/path"}})),
         "3.4.0", "arn: source"),
        (cfg(storage={"luks": [{"name": "v", "device": "/dev/vdb", "discard": True}]}),
         "3.4.0", "storage.luks[0].discard"),
        (cfg(storage={"luks": [{"name": "v", "device": "/dev/vdb", "cex": {"enabled": True}}]}),
         "3.5.0", "storage.luks[0].cex"),
        (cfg(storage=files({"path": "/usr/local/bin/x", "mode": 0o4755})), "3.6.0", "setuid/setgid/sticky mode bits"),
    ],
)
def test_minimum_version(config, expected, reason):
    assert minimum_version(config) == expected
    assert minimum_version_reason(config) == (expected, reason)
    # ... and it really is valid there and, for those above 3.0.0, not one version below
    config = {**config, "ignition": {**config["ignition"], "version": expected}}
    validate(config, expected)
    i = SUPPORTED_VERSIONS.index(expected)
    if i:
        below = SUPPORTED_VERSIONS[i - 1]
        with pytest.raises(InvalidConfig):
            validate({**config, "ignition": {**config["ignition"], "version": below}}, below)


def test_minimum_version_ignores_the_claimed_version():
    assert minimum_version({"ignition": {"version": "3.5.0"}}) == "3.0.0"


def test_a_key_that_is_not_a_string_is_an_unknown_key_not_a_crash():
    with pytest.raises(InvalidConfig, match=r"storage\.files\[0\]\[1\]: unknown key"):
        minimum_version(cfg(storage={"files": [{"path": "/a", 1: "x", "mode": 420}]}))


def test_minimum_version_when_nothing_can_express_it():
    with pytest.raises(InvalidConfig, match=r"storage\.nope: unknown key"):
        minimum_version(cfg(storage={"nope": 1}))


# --------------------------------------------------------------------------------- bytes


def test_encode_is_canonical_and_versioned():
    config = {
        "systemd": {"units": [{"name": "a.service", "enabled": True}]},
        "ignition": {"timeouts": {"httpTotal": 10}, "version": "3.6.0"},
        "kernelArguments": {"shouldExist": ["nosmt"]},
    }
    body = encode(config)
    assert body.startswith(b'{"ignition":{"version":"3.3.0"')
    assert body == (b'{"ignition":{"version":"3.3.0","timeouts":{"httpTotal":10}},'
                    b'"kernelArguments":{"shouldExist":["nosmt"]},'
                    b'"systemd":{"units":[{"enabled":true,"name":"a.service"}]}}')
    # key order of the input does not matter
    shuffled = json.loads(json.dumps(config, sort_keys=True))
    assert encode(dict(reversed(list(shuffled.items())))) == body
    assert body_version(body) == "3.3.0"


def test_encode_minimal_and_explicit_version():
    assert encode({"ignition": {}}) == b'{"ignition":{"version":"3.0.0"}}'
    assert encode({"ignition": {}}, "3.4.0") == b'{"ignition":{"version":"3.4.0"}}'
    with pytest.raises(InvalidConfig):
        encode({"ignition": {}}, "3.9.0")


def test_encode_non_ascii_is_stable():
    body = encode(cfg(passwd={"users": [{"name": "core", "gecos": "Zoë ☃"}]}))
    assert json.loads(body)["passwd"]["users"][0]["gecos"] == "Zoë ☃"
    assert body == encode(cfg(passwd={"users": [{"name": "core", "gecos": "Zoë ☃"}]}))


@pytest.mark.parametrize("target", SUPPORTED_VERSIONS[3:])
def test_with_version_round_trip(target):
    config = cfg(kernelArguments={"shouldExist": ["a"]},
                 storage=files({"path": "/etc/x", "contents": {"source": "data:,%22version%22"}}))
    body = encode(config)
    out = with_version(body, target)
    parsed, original = json.loads(out), json.loads(body)
    assert parsed["ignition"]["version"] == target
    parsed["ignition"]["version"] = original["ignition"]["version"]
    assert parsed == original
    assert out.startswith(b'{"ignition":{"version":"%s"' % target.encode())
    assert with_version(body, "3.3.0") == body


def test_with_version_refuses_below_minimum_and_unknown():
    body = encode(cfg(kernelArguments={"shouldExist": ["a"]}))
    with pytest.raises(ValueError, match="needs spec 3.3.0"):
        with_version(body, "3.2.0")
    with pytest.raises(ValueError):
        with_version(body, "4.0.0")
    with pytest.raises(ValueError):
        with_version(b'{"storage":{}}', "3.3.0")


# --------------------------------------------------------------------------------- negotiation


def test_real_client_accept_header():
    assert client_maximum(REAL_CLIENT_ACCEPT) == (3, 3, 0)
    assert negotiate(REAL_CLIENT_ACCEPT, "3.0.0") == "3.3.0"  # highest ≤ the client's maximum
    assert negotiate(REAL_CLIENT_ACCEPT, "3.3.0") == "3.3.0"


@pytest.mark.parametrize("accept", [None, "", "*/*", "application/json", "*/*;q=0.8, text/html",
                                    "application/vnd.coreos.ignition+json"])
def test_unversioned_clients_get_the_default(accept):
    assert negotiate(accept, "3.0.0") == "3.2.0"
    assert negotiate(accept, "3.4.0") == "3.4.0"


def test_accept_variants():
    t = "application/vnd.coreos.ignition+json"
    assert negotiate(f"{t}; version=3.1.0", "3.0.0") == "3.1.0"
    assert negotiate(f"{t};version=3.9.0", "3.0.0") == "3.6.0"  # a newer client: our newest
    assert negotiate(f"{t};version=3.4.0;q=0.9, {t};version=3.1.0", "3.0.0") == "3.4.0"
    assert negotiate(f"{t};version=3.5.0;q=0, {t};version=3.1.0", "3.0.0") == "3.1.0"  # q=0: refused
    assert negotiate(f"*/*, {t};version=3.1.0", "3.0.0") == "3.1.0"  # */* does not raise it
    assert negotiate(f'{t};version="3.2.0"', "3.0.0") == "3.2.0"
    # Ignition 0.x / spec 2 clients
    old = f"{t}; version=2.4.0, {t}; version=1; q=0.5, */*; q=0.1"
    with pytest.raises(UnsatisfiableVersion, match="at most 2.4.0"):
        negotiate(old, "3.0.0")


def test_unsatisfiable_says_why():
    accept = "application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1"
    with pytest.raises(UnsatisfiableVersion) as e:
        negotiate(accept, "3.3.0", "kernelArguments")
    assert str(e.value) == "payload needs spec 3.3.0 (kernelArguments) but the client accepts at most 3.2.0"
    assert e.value.reason == str(e.value)


# --------------------------------------------------------------------------------- validation

def test_good_config_validates():
    validate(GOOD, "3.3.0")


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_validation_rejects(case):
    mutate, message = BAD_CASES[case]
    config = bad(mutate)
    with pytest.raises(InvalidConfig, match=message):
        claimed = config["ignition"]["version"]
        validate(config, claimed if claimed in SUPPORTED_VERSIONS else "3.3.0")


def test_validate_unsupported_version():
    with pytest.raises(InvalidConfig, match="unsupported spec version"):
        validate({"ignition": {"version": "3.7.0"}}, "3.7.0")


def test_sha256_needs_3_1():
    c = cfg(storage=files({"path": "/a", "contents": {"source": "data:,x", "verification": {"hash": SHA256}}}))
    with pytest.raises(InvalidConfig, match="sha256"):
        validate(c, "3.0.0")
    c["ignition"]["version"] = "3.1.0"
    validate(c, "3.1.0")
