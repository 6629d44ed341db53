"""Cross-checks with the real Ignition tools: what we render, `ignition-validate` accepts without
a word; what our own checks reject, it rejects (or warns about) too, where it knows the spec."""

from __future__ import annotations

import base64
import copy
import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ignition_server.render.inputs import NodePoolInputs
from ignition_server.render.payload import render_payload
from ignition_server.render.spec import SUPPORTED_VERSIONS, with_version
from testsupport import REPO
from testsupport.invalid_configs import BAD_CASES, bad
from testsupport.realtools import require_tool

VALIDATE = shutil.which("ignition-validate") or "ignition-validate"
CLIENT_MAX = "3.3.0"  # the installed Ignition 2.14 knows specs 3.0.0 … 3.3.0

pytestmark = [pytest.mark.ignition]


@pytest.fixture(autouse=True)
def _real_validate() -> None:
    require_tool("ignition-validate", "apt-get install ignition")

EXAMPLE = REPO / "examples" / "token-secret.yaml"


def ignition_validate(tmp_path: Path, body: bytes) -> tuple[int, str]:
    path = tmp_path / "config.ign"
    path.write_bytes(body)
    proc = subprocess.run([VALIDATE, str(path)], capture_output=True, text=True, timeout=60)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def example_yaml() -> str:
    secret = yaml.safe_load(EXAMPLE.read_text())
    return gzip.decompress(base64.b64decode(base64.b64decode(secret["data"]["config"]))).decode()


def mc(name: str, config: dict | None = None, **spec) -> dict:
    if config is not None:
        spec["config"] = {"ignition": {"version": "3.2.0"}, **config}
    return {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
            "metadata": {"name": name, "labels": {"machineconfiguration.openshift.io/role": "worker"}},
            "spec": spec}


def data_url(text: str, gz: bool = False) -> str:
    raw = gzip.compress(text.encode(), mtime=0) if gz else text.encode()
    return "data:;base64," + base64.b64encode(raw).decode()


def rich_machineconfigs(kernel_arguments: bool) -> str:
    kargs = {"kernelArguments": ["nosmt", "systemd.unified_cgroup_hierarchy=1"]} if kernel_arguments else {}
    mcs = [
        mc("00-worker", {
            "storage": {
                "files": [
                    {"path": "/etc/kubernetes/kubelet.conf", "mode": 0o644, "overwrite": True,
                     "contents": {"source": data_url("kind: KubeletConfiguration\n")}},
                    {"path": "/etc/haproxy/haproxy.cfg", "mode": 0o600, "overwrite": True,
                     "user": {"name": "root"}, "group": {"id": 0},
                     "contents": {"source": data_url("global\n  maxconn 100\n", gz=True), "compression": "gzip"}},
                    {"path": "/etc/motd", "mode": 0o644, "append": [{"source": "data:,hello%0A"}]},
                ],
                "directories": [{"path": "/etc/kubernetes/manifests", "mode": 0o755},
                                {"path": "/var/lib/kubelet", "mode": 0o700}],
                "links": [{"path": "/etc/localtime", "target": "/usr/share/zoneinfo/UTC", "overwrite": True},
                          {"path": "/usr/local/bin/kubectl-alias", "target": "/usr/bin/oc"}],
            },
            "systemd": {"units": [
                {"name": "kubelet.service", "enabled": True,
                 "contents": "[Unit]\nDescription=Kubelet\n[Service]\nExecStart=/usr/bin/kubelet\n"
                             "[Install]\nWantedBy=multi-user.target\n",
                 "dropins": [{"name": "10-env.conf", "contents": "[Service]\nEnvironment=A=1\n"}]},
                {"name": "zincati.service", "mask": True},
            ]},
            "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3Nza-one core@a"]}]},
        }, **kargs),
        mc("50-haproxy", {
            "storage": {"files": [{"path": "/etc/kubernetes/manifests/haproxy.yaml", "mode": 0o644,
                                   "contents": {"source": data_url("apiVersion: v1\nkind: Pod\n")}}]},
            "systemd": {"units": [
                {"name": "kubelet.service",
                 "dropins": [{"name": "10-env.conf", "contents": "[Service]\nEnvironment=A=2\n"},
                             {"name": "20-after.conf", "contents": "[Unit]\nAfter=apiserver-ip.service\n"}]},
                {"name": "apiserver-ip.service", "enabled": True,
                 "contents": "[Unit]\nBefore=kubelet.service\n[Service]\nType=oneshot\n"
                             "ExecStart=/usr/sbin/ip addr add 172.20.0.1/32 dev lo\n"
                             "[Install]\nWantedBy=multi-user.target\n"},
            ]},
        }),
        mc("99-worker-ssh", {
            "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3Nza-one core@a",
                                                                        "ssh-rsa AAAAB3Nza-two core@b"]}],
                       "groups": [{"name": "monitoring", "gid": 4242}]},
        }),
    ]
    return yaml.safe_dump_all(mcs)


CASES = {
    "example": (example_yaml, "3.0.0"),
    "rich": (lambda: rich_machineconfigs(kernel_arguments=False), "3.0.0"),
    "rich+kargs": (lambda: rich_machineconfigs(kernel_arguments=True), "3.3.0"),
}


def served_versions(min_version: str) -> list[str]:
    return [v for v in SUPPORTED_VERSIONS if min_version <= v <= CLIENT_MAX]


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_payloads_pass_ignition_validate(case, tmp_path):
    make_yaml, expected_min = CASES[case]
    payload = render_payload(NodePoolInputs("clusters/np", "clusters-x/token-np", make_yaml()))
    assert payload.min_version == expected_min
    versions = served_versions(payload.min_version)
    assert versions
    for version in versions:
        body = with_version(payload.body, version)
        rc, out = ignition_validate(tmp_path, body)
        assert (rc, out) == (0, ""), f"{case} as {version}: {out}"


def test_rich_payload_content(tmp_path):
    payload = render_payload(NodePoolInputs("clusters/np", "clusters-x/token-np", rich_machineconfigs(True)))
    config = json.loads(payload.body)
    units = {u["name"]: u for u in config["systemd"]["units"]}
    assert [d["name"] for d in units["kubelet.service"]["dropins"]] == ["10-env.conf", "20-after.conf"]
    assert units["kubelet.service"]["dropins"][0]["contents"].endswith("A=2\n")
    assert config["passwd"]["users"][0]["sshAuthorizedKeys"] == ["ssh-ed25519 AAAAC3Nza-one core@a",
                                                                  "ssh-rsa AAAAB3Nza-two core@b"]
    assert config["kernelArguments"]["shouldExist"] == ["nosmt", "systemd.unified_cgroup_hierarchy=1"]


def test_below_minimum_the_client_complains(tmp_path):
    """What minimum_version says a version cannot express, the client also refuses there."""
    payload = render_payload(NodePoolInputs("clusters/np", "clusters-x/token-np", rich_machineconfigs(True)))
    forced = payload.body.replace(b'"version":"3.3.0"', b'"version":"3.2.0"', 1)
    rc, out = ignition_validate(tmp_path, forced)
    assert "kernelArguments" in out  # "Unused key kernelArguments"


def _bad_configs():
    for name in sorted(BAD_CASES):
        mutate, _ = BAD_CASES[name]
        config = bad(mutate)
        yield name, config


@pytest.mark.parametrize("name, config", list(_bad_configs()))
def test_own_checks_match_the_client(name, config, tmp_path):
    from ignition_server.render.inputs import InvalidConfig
    from ignition_server.render.validation import validate

    claimed = config["ignition"]["version"]
    with pytest.raises(InvalidConfig):
        validate(copy.deepcopy(config), claimed if claimed in SUPPORTED_VERSIONS else "3.3.0")
    rc, out = ignition_validate(tmp_path, json.dumps(config).encode())
    if name in WARNED_ONLY:
        # the client boots, but drops the field (unused key, or the special mode bits)
        assert rc == 0 and out.startswith("warning at"), out
    else:
        assert rc != 0, f"ignition-validate accepted {name!r}: {out}"


# Checks where Ignition 2.14 only warns, and drops what it warns about: we refuse instead.
WARNED_ONLY = {"unknown key", "unknown nested key", "special bits below 3.6"}
