"""MachineConfig parsing, MCO-style merging, and render_payload."""

from __future__ import annotations

import base64
import gzip
import json

import pytest
import yaml

from ignition_server.render.inputs import InvalidConfig, NodePoolInputs
from ignition_server.render.machineconfig import MergedConfig, merge_machineconfigs, parse_machineconfigs
from ignition_server.render.payload import render_payload
from testsupport import REPO

EXAMPLE = REPO / "examples" / "token-secret.yaml"


def mc(name: str, config: dict | None = None, *, raw: dict | None = None, **spec) -> dict:
    """A MachineConfig; `config` gets a 3.2.0 version, `raw` is the spec.config as given."""
    if raw is not None:
        spec["config"] = raw
    if config is not None:
        spec["config"] = {"ignition": {"version": "3.2.0"}, **config}
    return {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
            "metadata": {"name": name}, "spec": spec}


def yaml_of(*mcs: dict) -> str:
    return yaml.safe_dump_all(mcs)


def merged(*mcs: dict) -> dict:
    return merge_machineconfigs(parse_machineconfigs(yaml_of(*mcs))).config


def example_yaml() -> str:
    secret = yaml.safe_load(EXAMPLE.read_text())
    return gzip.decompress(base64.b64decode(base64.b64decode(secret["data"]["config"]))).decode()


# --------------------------------------------------------------------------------- parsing


def test_parse_empty():
    assert parse_machineconfigs("") == []
    assert parse_machineconfigs("---\n---\n") == []


def test_parse_example():
    mcs = parse_machineconfigs(example_yaml())
    assert [m["metadata"]["name"] for m in mcs] == ["50-example-motd"]


def test_parse_list_kind():
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [mc("a", {}), mc("b", {})]})
    assert [m["metadata"]["name"] for m in parse_machineconfigs(text)] == ["a", "b"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("a: [unclosed", r"MachineConfig YAML does not parse"),
        ("- just\n- a list\n", r"document 1: not a MachineConfig object"),
        (yaml_of({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
         r"document 1: 'v1' 'ConfigMap' is not a machineconfiguration.openshift.io/v1 MachineConfig"),
        (yaml_of({**mc("x", {}), "metadata": {}}), r"document 1: MachineConfig without metadata.name"),
        (yaml_of(mc("a", {}), mc("a", {})), r"MachineConfig 'a' appears twice"),
        (yaml_of(mc("a", raw={"ignition": {"version": "2.1.0"}})),
         r"MachineConfig 'a': spec.config.ignition.version: '2.1.0' cannot be translated to spec 3"),
        (yaml_of(mc("a", raw={"storage": {}})), r"MachineConfig 'a': spec.config.ignition.version is missing"),
        (yaml_of(mc("a", raw={"ignition": {"version": "3.9.0"}})), r"'3.9.0' is not supported"),
        (yaml_of(mc("a", {"storage": {"files": [{"path": "rel"}]}})),
         r"MachineConfig 'a': spec.config.storage.files\[0\].path: path 'rel' is not absolute"),
        (yaml_of(mc("a", {"kernelArguments": {"shouldExist": ["x"]}})),  # a 3.2.0 config cannot say that
         r"MachineConfig 'a': spec.config.kernelArguments: unknown key in spec 3.2.0"),
        (yaml_of(mc("a", None, kernelArguments="nosmt")), r"spec.kernelArguments must be a list"),
    ],
)
def test_parse_rejects(text, message):
    with pytest.raises(InvalidConfig, match=message):
        parse_machineconfigs(text)


def test_any_3x_input_version():
    out = merged(mc("a", raw={"ignition": {"version": "3.0.0"}, "storage": {"files": [{"path": "/a"}]}}),
                 mc("b", raw={"ignition": {"version": "3.4.0"}, "storage": {"files": [{"path": "/b"}]}}))
    assert [f["path"] for f in out["storage"]["files"]] == ["/a", "/b"]
    assert out["ignition"] == {"version": "3.0.0"}


# --------------------------------------------------------------------------------- merging


def test_sorted_by_name_later_wins_for_files():
    a = mc("10-a", {"storage": {"files": [{"path": "/etc/x", "mode": 0o600, "contents": {"source": "data:,a"}}]}})
    b = mc("20-b", {"storage": {"files": [{"path": "/etc/x", "contents": {"source": "data:,b"}}]}})
    for order in ((a, b), (b, a)):
        files = merged(*order)["storage"]["files"]
        assert files == [{"path": "/etc/x", "mode": 0o600, "contents": {"source": "data:,b"}}]


def test_directories_and_links_by_path_one_namespace():
    a = mc("a", {"storage": {"directories": [{"path": "/d", "mode": 0o700}],
                             "links": [{"path": "/l", "target": "/t1"}, {"path": "/x", "target": "/t"}]}})
    b = mc("b", {"storage": {"directories": [{"path": "/d", "mode": 0o755}],
                             "links": [{"path": "/l", "target": "/t2"}],
                             "files": [{"path": "/x"}]}})
    st = merged(a, b)["storage"]
    assert st["directories"] == [{"path": "/d", "mode": 0o755}]
    assert st["links"] == [{"path": "/l", "target": "/t2"}]  # /x is now a file
    assert st["files"] == [{"path": "/x"}]


def test_units_merge_by_name_dropins_by_name():
    a = mc("a", {"systemd": {"units": [
        {"name": "k.service", "contents": "[Unit]\n", "enabled": True,
         "dropins": [{"name": "10-a.conf", "contents": "A"}, {"name": "20-b.conf", "contents": "B"}]},
        {"name": "other.service", "mask": True}]}})
    b = mc("b", {"systemd": {"units": [
        {"name": "k.service", "enabled": False,
         "dropins": [{"name": "20-b.conf", "contents": "B2"}, {"name": "30-c.conf", "contents": "C"}]},
        {"name": "other.service", "mask": False}]}})
    units = {u["name"]: u for u in merged(a, b)["systemd"]["units"]}
    k = units["k.service"]
    assert k["contents"] == "[Unit]\n" and k["enabled"] is False
    assert k["dropins"] == [{"name": "10-a.conf", "contents": "A"}, {"name": "20-b.conf", "contents": "B2"},
                            {"name": "30-c.conf", "contents": "C"}]
    assert units["other.service"]["mask"] is False


def test_users_by_name_ssh_keys_unioned_groups_by_name():
    a = mc("99-master-ssh", {"passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["k1", "k2"]}],
                                        "groups": [{"name": "g", "gid": 1}]}})
    b = mc("99-worker-ssh", {"passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["k2", "k3"]},
                                                  {"name": "extra"}],
                                        "groups": [{"name": "g", "gid": 2}]}})
    pw = merged(a, b)["passwd"]
    assert pw["users"] == [{"name": "core", "sshAuthorizedKeys": ["k1", "k2", "k3"]}, {"name": "extra"}]
    assert pw["groups"] == [{"name": "g", "gid": 2}]


def test_kernel_arguments():
    out = merged(mc("b", None, kernelArguments=["nosmt", "a=1"]),
                 mc("a", None, kernelArguments=["a=1", "mitigations=off"]),
                 mc("c", {"storage": {"files": [{"path": "/f"}]}}, kernelArguments=["nosmt"]))
    assert out["kernelArguments"] == {"shouldExist": ["a=1", "mitigations=off", "nosmt"]}
    assert out["ignition"]["version"] == "3.3.0"


def test_embedded_kernel_arguments_come_first():
    a = mc("a", raw={"ignition": {"version": "3.3.0"}, "kernelArguments": {"shouldExist": ["x"]}},
           kernelArguments=["y", "x"])
    assert merged(a)["kernelArguments"] == {"shouldExist": ["x", "y"]}


def test_ignored_fields_are_noted():
    mcs = parse_machineconfigs(yaml_of(
        mc("a", {}, extensions=["usbguard"], fips=True, kernelType="realtime", osImageURL="quay.io/x@sha256:0"),
        mc("b", {}, fips=False, kernelType="default", extensions=[]),
        mc("c", {}, somethingNew=1)))
    result = merge_machineconfigs(mcs)
    assert isinstance(result, MergedConfig)
    config, notes = result
    assert notes == (
        "MachineConfig 'a': spec.extensions is not applied by the Ignition payload (ignored)",
        "MachineConfig 'a': spec.fips is not applied by the Ignition payload (ignored)",
        "MachineConfig 'a': spec.kernelType is not applied by the Ignition payload (ignored)",
        "MachineConfig 'a': spec.osImageURL is not applied by the Ignition payload (ignored)",
        "MachineConfig 'c': unknown field spec.somethingNew ignored",
    )
    assert config == {"ignition": {"version": "3.0.0"}}


def test_http_header_without_value_removes_parent_header():
    src = {"source": "https://h/x"}
    a = mc("a", {"storage": {"files": [{"path": "/f", "contents": {**src, "httpHeaders": [
        {"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}}]}})
    b = mc("b", {"storage": {"files": [{"path": "/f", "contents": {**src, "httpHeaders": [{"name": "A"}]}}]}})
    assert merged(a, b)["storage"]["files"][0]["contents"]["httpHeaders"] == [{"name": "B", "value": "2"}]


# --------------------------------------------------------------------------------- payload


def inputs(text: str, missing=()) -> NodePoolInputs:
    return NodePoolInputs(nodepool="clusters/np", secret="clusters-x/token-np-1", machineconfigs_yaml=text,
                          missing=tuple(missing))


def test_render_example():
    p = render_payload(inputs(example_yaml(), missing=("pull-secret", "bootstrap-kubeconfig")))
    assert p.min_version == "3.0.0"
    assert p.body.startswith(b'{"ignition":{"version":"3.0.0"}')
    cfg = json.loads(p.body)
    assert cfg["storage"]["files"][0]["path"] == "/etc/motd"
    assert cfg["systemd"]["units"][0]["name"] == "example-hello.service"
    assert p.notes == ("pull-secret not in the source: left out of the payload",
                       "bootstrap-kubeconfig not in the source: left out of the payload")


def test_render_empty():
    p = render_payload(inputs(""))
    assert p.body == b'{"ignition":{"version":"3.0.0"}}' and p.min_version == "3.0.0" and p.notes == ()


def test_render_is_deterministic():
    a = mc("10-a", {"storage": {"files": [{"path": "/a", "contents": {"source": "data:,a"}}]},
                    "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["k"]}]}}, kernelArguments=["x"])
    b = mc("20-b", {"systemd": {"units": [{"name": "b.service", "enabled": True}]}}, fips=True)
    one = render_payload(inputs(yaml_of(a, b)))
    two = render_payload(inputs(yaml_of(b, a)))
    assert one == two
    assert one.min_version == "3.3.0"
    assert "payload needs Ignition spec 3.3.0 (kernelArguments)" in one.notes


def test_render_rejects_conflicts_after_merge():
    a = mc("a", kernelArguments=["nosmt"])
    b = mc("b", raw={"ignition": {"version": "3.3.0"}, "kernelArguments": {"shouldNotExist": ["nosmt"]}})
    with pytest.raises(InvalidConfig, match=r"kernelArguments.shouldNotExist\[0\]: kernel argument 'nosmt' is also"):
        render_payload(inputs(yaml_of(a, b)))


def test_render_rejects_bad_yaml():
    with pytest.raises(InvalidConfig, match="does not parse"):
        render_payload(inputs("{"))
