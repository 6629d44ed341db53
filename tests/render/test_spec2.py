"""Ignition spec 2.2–2.4 MachineConfigs (IBM's prototype, older clusters) translated to spec 3."""

from __future__ import annotations

import json
import stat
import subprocess

import pytest
import yaml

from ignition_server.render.inputs import InvalidConfig
from ignition_server.render.machineconfig import merge_machineconfigs, parse_machineconfigs
from ignition_server.render.spec2 import translate
from testsupport.ignition_client import core_user, ignition_files_stage
from testsupport.realtools import require_tool

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG7c3Q5c1b9YQ4Jb0v8m3hQ2m5n6o7p8q9r0s1t2u3v4 admin@example"

# As IBM's prototype and 4.x clusters carry them: spec 2.2, files on the `root` filesystem.
SPEC22 = """\
apiVersion: machineconfiguration.openshift.io/v1
kind: MachineConfig
metadata:
  name: 99-worker-ibm
  labels:
    machineconfiguration.openshift.io/role: worker
spec:
  config:
    ignition:
      version: 2.2.0
    storage:
      files:
      - filesystem: root
        path: /etc/ibm/cluster.conf
        mode: 384
        contents:
          source: data:,region%3Dus-south%0A
      - filesystem: root
        path: /etc/ibm/motd
        contents:
          source: data:,welcome%0A
      - filesystem: root
        path: /etc/ibm/motd
        append: true
        contents:
          source: data:,appended%20line%0A
      directories:
      - filesystem: root
        path: /var/lib/ibm
    systemd:
      units:
      - name: ibm-setup.service
        enable: true
        contents: |
          [Unit]
          Description=IBM setup
          [Service]
          Type=oneshot
          ExecStart=/usr/bin/true
          [Install]
          WantedBy=multi-user.target
        dropins:
        - name: 10-env.conf
          contents: |
            [Service]
            Environment=REGION=us-south
      - name: kubelet.service
        dropins:
        - name: 20-ibm-providerid.conf
          contents: |
            [Service]
            Environment=KUBELET_PROVIDERID=ibm://x
    passwd:
      users:
      - name: core
        sshAuthorizedKeys:
        - KEY
""".replace("KEY", KEY)


def render(text: str) -> dict:
    return merge_machineconfigs(parse_machineconfigs(text)).config


def test_spec22_translates_as_ign_converter_does():
    config = render(SPEC22)
    assert config["ignition"]["version"].startswith("3.")
    files = config["storage"]["files"]
    assert [f["path"] for f in files] == ["/etc/ibm/cluster.conf", "/etc/ibm/motd"]
    conf, motd = files
    assert "filesystem" not in conf and conf["mode"] == 0o600 and conf["overwrite"] is True
    # The second /etc/ibm/motd entry appends: spec 3 keeps it in `append` of the same path.
    assert motd["contents"]["source"] == "data:,welcome%0A"
    assert motd["append"] == [{"source": "data:,appended%20line%0A"}]
    assert motd["mode"] == 0o644  # 2.x's default, written out
    assert config["storage"]["directories"] == [{"path": "/var/lib/ibm", "mode": 0o755}]
    units = {u["name"]: u for u in config["systemd"]["units"]}
    assert units["ibm-setup.service"]["enabled"] is True and "enable" not in units["ibm-setup.service"]
    assert units["kubelet.service"]["dropins"][0]["name"] == "20-ibm-providerid.conf"
    assert config["passwd"]["users"] == [{"name": "core", "sshAuthorizedKeys": [KEY]}]


def test_spec2_merges_with_spec3_machineconfigs():
    spec3 = yaml.safe_dump({
        "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
        "metadata": {"name": "50-other"},
        "spec": {"config": {"ignition": {"version": "3.2.0"}, "storage": {"files": [
            {"path": "/etc/ibm/cluster.conf", "mode": 420, "overwrite": True,
             "contents": {"source": "data:,overridden"}}]}}},
    })
    config = render(SPEC22 + "---\n" + spec3)
    files = {f["path"]: f for f in config["storage"]["files"]}
    # 99-worker-ibm sorts after 50-other, so its translated file wins, as MCO merges.
    assert files["/etc/ibm/cluster.conf"]["contents"]["source"] == "data:,region%3Dus-south%0A"


@pytest.mark.parametrize("config, field", [
    ({"ignition": {"version": "2.2.0"}, "networkd": {"units": [{"name": "10-eth.network"}]}}, "networkd"),
    ({"ignition": {"version": "2.2.0"}, "storage": {"files": [
        {"filesystem": "var", "path": "/log/x", "contents": {"source": "data:,"}}]}},
     "storage.files[0].filesystem"),
    ({"ignition": {"version": "2.3.0"}, "storage": {"files": [{"path": "/etc/x"}]}}, "storage.files[0].filesystem"),
    ({"ignition": {"version": "2.2.0"}, "storage": {"filesystems": [{"name": "var"}]}}, "storage.filesystems"),
    ({"ignition": {"version": "2.2.0"}, "passwd": {"users": [{"name": "u", "create": {"uid": 1}}]}},
     "passwd.users[0].create"),
    ({"ignition": {"version": "2.1.0"}}, "ignition.version"),
])
def test_untranslatable_configs_name_the_field(config, field):
    text = yaml.safe_dump({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
                           "metadata": {"name": "99-bad"}, "spec": {"config": config}})
    with pytest.raises(InvalidConfig) as raised:
        parse_machineconfigs(text)
    assert f"MachineConfig '99-bad': spec.config.{field}" in str(raised.value)


def test_translation_leaves_its_input_alone():
    config = yaml.safe_load(SPEC22)["spec"]["config"]
    before = json.dumps(config, sort_keys=True)
    translate(config)
    assert json.dumps(config, sort_keys=True) == before


def test_translated_config_passes_ignition_validate(tmp_path):
    validate = require_tool("ignition-validate", "apt-get install ignition")
    path = tmp_path / "config.ign"
    path.write_text(json.dumps(render(SPEC22)))
    res = subprocess.run([validate, str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.ignition
def test_real_client_applies_translated_config(tmp_path):
    config = render(SPEC22)
    res, root = ignition_files_stage(tmp_path, config, prepare=core_user)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    conf = root / "etc/ibm/cluster.conf"
    assert conf.read_text() == "region=us-south\n"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    motd = root / "etc/ibm/motd"
    assert motd.read_text() == "welcome\nappended line\n"
    assert stat.S_IMODE(motd.stat().st_mode) == 0o644
    assert stat.S_IMODE((root / "var/lib/ibm").stat().st_mode) == 0o755
    units = root / "etc/systemd/system"
    assert "ExecStart=/usr/bin/true" in (units / "ibm-setup.service").read_text()
    assert "REGION=us-south" in (units / "ibm-setup.service.d/10-env.conf").read_text()
    assert "KUBELET_PROVIDERID" in (units / "kubelet.service.d/20-ibm-providerid.conf").read_text()
    assert "enable ibm-setup.service" in (root / "etc/systemd/system-preset/20-ignition.preset").read_text()
    keys = list((root / "home/core/.ssh").rglob("*"))
    assert any(k.is_file() and KEY in k.read_text() for k in keys), keys
