"""testsupport/payload_diff.py, on small configs: what is a difference, what is not, and how it reads."""

from __future__ import annotations

import base64
import gzip
import json
from urllib.parse import quote

from testsupport.payload_diff import Difference, decode_source, diff_payloads, item_counts, report


def data_url(text: str) -> str:
    return "data:," + quote(text)


def gzip_url(text: str) -> str:
    return "data:;base64," + base64.b64encode(gzip.compress(text.encode())).decode()


def config(version: str = "3.2.0", files=(), units=(), **extra) -> dict:
    return {"ignition": {"version": version}, "storage": {"files": list(files)}, "systemd": {"units": list(units)}, **extra}


KUBELET = {"name": "kubelet.service", "enabled": True, "contents": "[Service]\nExecStart=/usr/bin/kubelet\n",
           "dropins": [{"name": "10-mco-default-env.conf", "contents": "[Service]\nEnvironment=A=1\n"}]}
CRIO = {"path": "/etc/crio/crio.conf.d/00-default", "mode": 420, "overwrite": True,
        "contents": {"source": data_url("[crio]\nlog_level = \"info\"\n")}}


def test_the_same_outcome_spelled_differently_is_equal() -> None:
    # gzip+base64 against percent-encoding; overwrite unset against false; mode 420 against
    # unset (Ignition's default 0644); another spec version; units listed in another order.
    ref = config("3.2.0", [CRIO, {"path": "/etc/a", "contents": {"source": data_url("a\n")}}],
                 [KUBELET, {"name": "crio.service", "enabled": True}])
    ours = config("3.4.0", [{**CRIO, "contents": {"source": gzip_url("[crio]\nlog_level = \"info\"\n"), "compression": "gzip"}},
                            {"path": "/etc/a", "mode": 420, "overwrite": False, "contents": {"source": "data:;base64,YQo="}}],
                  [{"name": "crio.service", "enabled": True}, KUBELET])
    assert diff_payloads(ref, json.dumps(ours).encode()) == []
    assert item_counts(ref, ours) == (5, 5)  # two files, two units, the ignition section
    assert [d.aspect for d in diff_payloads(ref, ours, compare_version=True)] == ["version"]


def test_file_differences_name_the_item_and_the_field() -> None:
    ref = config(files=[CRIO, {"path": "/etc/kubernetes/kubeconfig", "mode": 0o644, "contents": {"source": data_url("x")}},
                        {"path": "/etc/kubernetes/kubelet-ca.crt", "mode": 420, "contents": {"source": data_url("CA")}}])
    ours = config(files=[{**CRIO, "contents": {"source": data_url("[crio]\nlog_level = \"debug\"\n")}},
                         {"path": "/etc/kubernetes/kubeconfig", "mode": 0o600, "contents": {"source": data_url("x")},
                          "user": {"name": "core"}},
                         {"path": "/etc/extra", "contents": {"source": data_url("e")}}])
    found = {(d.item, d.aspect): d for d in diff_payloads(ref, ours)}
    assert set(found) == {
        ("file /etc/crio/crio.conf.d/00-default", "contents"),
        ("file /etc/kubernetes/kubeconfig", "mode"), ("file /etc/kubernetes/kubeconfig", "user"),
        ("file /etc/kubernetes/kubelet-ca.crt", "missing"), ("file /etc/extra", "extra")}
    mode = found[("file /etc/kubernetes/kubeconfig", "mode")]
    assert (mode.reference, mode.ours) == ("0644", "0600")
    text = str(found[("file /etc/crio/crio.conf.d/00-default", "contents")])
    assert '-log_level = "info"' in text and '+log_level = "debug"' in text  # a unified diff of the decoded text
    assert "mode 0644" in found[("file /etc/kubernetes/kubelet-ca.crt", "missing")].reference
    assert item_counts(ref, ours) == (1, 5)


def test_unit_differences_enabled_mask_contents_dropins() -> None:
    ref = config(units=[KUBELET, {"name": "a.service", "enabled": True}, {"name": "b.service", "mask": True},
                        {"name": "c.service"}])
    ours = config(units=[{**KUBELET, "dropins": [{"name": "10-mco-default-env.conf", "contents": "[Service]\nEnvironment=A=2\n"},
                                                 {"name": "20-extra.conf", "contents": ""}]},
                         {"name": "a.service", "enabled": False}, {"name": "b.service"}, {"name": "c.service", "enabled": False}])
    found = {(d.item, d.aspect) for d in diff_payloads(ref, ours)}
    assert found == {("unit kubelet.service", "dropin 10-mco-default-env.conf"), ("unit kubelet.service", "dropin 20-extra.conf"),
                     ("unit a.service", "enabled"), ("unit b.service", "mask"),
                     ("unit c.service", "enabled")}  # unset (the preset decides) is not false


def test_users_kernel_arguments_and_the_ignition_section() -> None:
    ref = config(passwd={"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 A", "ssh-ed25519 B"]}]},
                 kernelArguments={"shouldExist": ["a=1", "b=2"]},
                 ignition={"version": "3.2.0", "config": {"merge": [{"source": data_url("{}")}]},
                           "security": {"tls": {"certificateAuthorities": [{"source": data_url("CA1")}]}}})
    same = config(passwd={"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 B", "ssh-ed25519 A"]}]},
                  kernelArguments={"shouldExist": ["a=1", "b=2"], "shouldNotExist": []},
                  ignition={"version": "3.3.0", "config": {"merge": [{"source": gzip_url("{}"), "compression": "gzip"}]},
                            "security": {"tls": {"certificateAuthorities": [{"source": data_url("CA1")}]}}})
    assert diff_payloads(ref, same) == []
    other = config(passwd={"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 A"]}]},
                   kernelArguments={"shouldExist": ["b=2", "a=1"]},  # order matters: the kernel reads them in order
                   ignition={"version": "3.2.0", "security": {"tls": {"certificateAuthorities": [{"source": data_url("CA2")}]}}})
    found = {(d.item, d.aspect) for d in diff_payloads(ref, other)}
    assert found == {("user core", "sshAuthorizedKeys"), ("kernelArguments", "shouldExist"),
                     ("ignition", "config.merge"), ("ignition", "security.tls.certificateAuthorities")}


def test_a_machineconfig_inside_a_file_is_compared_item_by_item() -> None:
    def content(kubelet_env: str, name: str) -> str:
        return json.dumps({"kind": "MachineConfig", "metadata": {"name": name},
                           "spec": {"config": config(files=[CRIO, {"path": "/etc/env", "contents": {"source": data_url(kubelet_env)}}]),
                                    "kernelArguments": ["x=1"], "osImageURL": "quay.io/os@sha256:1"}})
    ref = config(files=[{"path": "/etc/mcs-machine-config-content.json", "contents": {"source": data_url(content("A=1", "rendered-worker-1"))}}])
    ours = config(files=[{"path": "/etc/mcs-machine-config-content.json", "contents": {"source": data_url(content("A=2", "rendered-worker-2"))}}])
    [difference] = diff_payloads(ref, ours)
    assert difference.item == "file /etc/mcs-machine-config-content.json" and difference.aspect == "contents"
    assert "spec.config → file /etc/env: contents" in difference.detail
    assert 'metadata.name: "rendered-worker-1" → "rendered-worker-2"' in difference.detail
    assert "osImageURL" not in difference.detail and "crio" not in difference.detail  # what is equal is not shown
    assert "file /etc/mcs-machine-config-content.json: contents: reference" in report([difference])


def test_decoding_and_the_report() -> None:
    assert decode_source("data:text/plain;charset=utf-8;base64,aGk=") == b"hi"
    assert decode_source("data:,a%20b%0A") == b"a b\n"
    assert decode_source(gzip_url("zipped"), "gzip") == b"zipped"
    assert decode_source("https://example.com/x") == b"<remote https://example.com/x>"
    many = [Difference(f"file /f{i}", "mode", "0644", "0600") for i in range(5)]
    text = report(many, limit=3)
    assert text.count("\n") == 3 and text.endswith("… and 2 more differences")
