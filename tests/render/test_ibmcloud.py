"""IBM Cloud VPC Gen 2 fragment: settings, files, the provider-ID boot script against a fake
metadata service, and the full node config (IBM + haproxy + join) through the real
`ignition-validate` and the real Ignition client's files stage."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from ignition_server.render.haproxy import (
    HAPROXY_CFG_PATH,
    STATIC_POD_PATH,
    render_haproxy_cfg,
    render_haproxy_fragment,
)
from ignition_server.render.ibmcloud import (
    IBM_ENV_PATH,
    KUBELET_ENV_PATH,
    PROVIDERID_SCRIPT_PATH,
    PROVIDERID_UNIT,
    SECONDARY_STORAGE_UNIT,
    IBMCloudSettings,
    api_server_access,
    render_chrony_conf,
    render_ibm_env,
    render_ibmcloud_fragment,
    render_registry_conf,
)
from ignition_server.render.inputs import InvalidConfig
from ignition_server.render.join import JoinInputs, render_join_fragment
from testsupport import REPO
from testsupport.ignition_client import ignition_files_stage
from testsupport.realtools import require_tool

HAPROXY_IMAGE = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "a" * 64

PRIVATE = "c100-1.private.us-south.containers.cloud.ibm.com:32167,c100-2.private.us-south.containers.cloud.ibm.com:32167"
PUBLIC = ("c100-1.us-south.containers.cloud.ibm.com:32167", "c100-2.us-south.containers.cloud.ibm.com:32167")


def settings(**kw) -> IBMCloudSettings:
    args = dict(
        cluster_id="cl1q2w3e4r5t6y7u8i9o",
        account_id="0123456789abcdef0123456789abcdef",
        region="us-south",
        zones=("us-south-1", "us-south-2", "us-south-3"),
        private_endpoints=PRIVATE,
        public_endpoints=PUBLIC,
        public_service_endpoint=True,
        registry_host="us.icr.io",
    )
    args.update(kw)
    return IBMCloudSettings(**args)


def decode(source: str) -> bytes:
    if source.startswith("data:;base64,"):
        return base64.b64decode(source.split(",", 1)[1])
    assert source.startswith("data:,")
    return unquote(source.split(",", 1)[1]).encode()


def files_of(frag: dict) -> dict[str, dict]:
    return {f["path"]: f for f in frag.get("storage", {}).get("files", [])}


def merge(*fragments: dict, version: str = "3.2.0") -> dict:
    """Test-local merge: concatenate files; units with the same name merge their drop-ins."""
    files: list[dict] = []
    units: dict[str, dict] = {}
    for frag in fragments:
        for f in frag.get("storage", {}).get("files", []):
            assert f["path"] not in {g["path"] for g in files}, f"two fragments write {f['path']}"
            files.append(f)
        for u in frag.get("systemd", {}).get("units", []):
            if u["name"] in units:
                prev = units[u["name"]]
                merged = {**prev, **{k: v for k, v in u.items() if k != "dropins"}}
                merged["dropins"] = prev.get("dropins", []) + u.get("dropins", [])
                units[u["name"]] = merged
            else:
                units[u["name"]] = dict(u)
    return {"ignition": {"version": version}, "storage": {"files": files}, "systemd": {"units": list(units.values())}}


# --- settings ---------------------------------------------------------------------------


def test_api_server_access_private_primary_public_backup():
    access = api_server_access(settings())
    assert (access.listen_ip, access.listen_port) == ("172.20.0.1", 2040)
    assert access.health_check == "GET /livez?exclude=etcd&exclude=log"
    assert [(b.host, b.backup) for b in access.ordered_backends] == [
        ("c100-1.private.us-south.containers.cloud.ibm.com", False),
        ("c100-2.private.us-south.containers.cloud.ibm.com", False),
        ("c100-1.us-south.containers.cloud.ibm.com", True),
        ("c100-2.us-south.containers.cloud.ibm.com", True),
    ]
    cfg = render_haproxy_cfg(access)
    assert "bind 172.20.0.1:2040" in cfg
    # IBM's prototype appended backups to the primary list; here they are `backup` servers.
    assert cfg.count(" backup\n") == 2


def test_api_server_access_private_only_and_public_only():
    priv = api_server_access(settings(public_service_endpoint=False))
    assert [b.backup for b in priv.backends] == [False, False]
    pub = api_server_access(settings(private_service_endpoint=False, private_endpoints=()))
    assert [b.backup for b in pub.backends] == [False, False]  # public ones become primaries
    assert all("private" not in b.host for b in pub.backends)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"cluster_id": "bad id"}, "cluster_id"),
        ({"account_id": ""}, "account_id"),
        ({"region": "US South"}, "region"),
        ({"zones": ("us south 1",)}, "zone"),
        ({"private_service_endpoint": False, "public_service_endpoint": False}, "at least one"),
        ({"private_endpoints": ()}, "private"),
        ({"public_endpoints": ()}, "public"),
        ({"registry_host": "us.icr.io\n[[registry]]"}, "registry"),
        ({"ntp_server": "time server"}, "NTP"),
        ({"secondary_storage": "xfs"}, "secondary_storage"),
        ({"secondary_storage_mount": "/"}, "mount"),
        ({"worker_id_field": "zone"}, "worker_id_field"),
        ({"sysctls": (("net.ipv4.tcp_keepalive_time", "1\nkernel.x = 1"),)}, "sysctl"),
        ({"proxy_port": 0}, "port"),
        ({"private_endpoints": "nonsense"}, "host:port"),
    ],
)
def test_invalid_settings(kw, match):
    with pytest.raises(InvalidConfig, match=match):
        settings(**kw)


# --- files ---------------------------------------------------------------------------------


def test_fragment_files_and_units():
    s = settings(secondary_storage="luks")
    frag = render_ibmcloud_fragment(s)
    files = files_of(frag)
    assert set(files) == {
        IBM_ENV_PATH, PROVIDERID_SCRIPT_PATH, "/etc/chrony.conf", "/etc/sysctl.d/99-ibm-cloud.conf",
        "/etc/containers/registries.conf.d/99-ibm-private-registry.conf",
        "/usr/local/bin/ibm-secondary-storage.sh",
    }
    assert files[PROVIDERID_SCRIPT_PATH]["mode"] == 0o755
    env = decode(files[IBM_ENV_PATH]["contents"]["source"]).decode()
    assert "IBM_CLUSTER_ID='cl1q2w3e4r5t6y7u8i9o'" in env
    assert "IBM_SECONDARY_STORAGE='luks'" in env
    units = {u["name"]: u for u in frag["systemd"]["units"]}
    assert "Before=kubelet.service" in units[PROVIDERID_UNIT]["contents"]
    assert units[PROVIDERID_UNIT]["enabled"] is True
    (dropin,) = units["kubelet.service"]["dropins"]
    assert "contents" not in units["kubelet.service"] and "enabled" not in units["kubelet.service"]
    assert f"Requires={PROVIDERID_UNIT}" in dropin["contents"]
    assert f"After={PROVIDERID_UNIT}" in dropin["contents"]
    assert f"EnvironmentFile={KUBELET_ENV_PATH}" in dropin["contents"]
    assert SECONDARY_STORAGE_UNIT in units
    # No per-node facts in the payload: the same for every node of the cluster.
    assert "ibm://" not in json.dumps(frag)


def test_registry_conf_only_with_private_service_endpoint():
    conf = render_registry_conf(settings())
    assert 'prefix = "us.icr.io"' in conf and 'location = "private.us.icr.io"' in conf
    assert render_registry_conf(settings(private_service_endpoint=False, private_endpoints=())) is None
    assert render_registry_conf(settings(registry_host="")) is None
    frag = render_ibmcloud_fragment(settings(private_service_endpoint=False, private_endpoints=()))
    assert not any("registries.conf.d" in p for p in files_of(frag))


def test_no_secondary_storage_unit_by_default():
    frag = render_ibmcloud_fragment(settings())
    assert SECONDARY_STORAGE_UNIT not in {u["name"] for u in frag["systemd"]["units"]}


def test_chrony_and_sysctl():
    assert "server 161.26.0.6 iburst" in render_chrony_conf(settings(ntp_server="161.26.0.6"))
    s = settings(sysctls={"net.core.somaxconn": "1024"})
    sysctl = decode(files_of(render_ibmcloud_fragment(s))["/etc/sysctl.d/99-ibm-cloud.conf"]["contents"]["source"])
    assert b"net.core.somaxconn = 1024\n" in sysctl


@pytest.mark.parametrize("script", ["ibm-kubelet-providerid.sh", "ibm-secondary-storage.sh"])
def test_boot_scripts_parse(script):
    path = REPO / "ignition_server/render/templates" / script
    subprocess.run(["bash", "-n", str(path)], check=True)


# --- the provider-ID script against a fake IBM VPC instance metadata service ------------


class FakeMetadata(BaseHTTPRequestHandler):
    instance = {
        "id": "0717_1e09281b-f177-46fb-baf1-bc152b2e391a",
        "name": "kube-cl1q2w3e4r5t6y7u8i9o-default-0000012a",
        "zone": {"name": "us-south-2"},
        "primary_network_interface": {"primary_ip": {"address": "10.240.64.4"}},
    }
    failures_left = 2  # the network is not up yet: first calls fail

    def log_message(self, *args):
        pass

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        if type(self).failures_left > 0:
            type(self).failures_left -= 1
            return self._reply(503, {"errors": ["not yet"]})
        if not self.path.startswith("/identity/v1/token?version=") or self.headers.get("Metadata-Flavor") != "ibm":
            return self._reply(400, {"errors": ["bad token request"]})
        self._reply(200, {"access_token": "md-token-123", "expires_in": 300})

    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer md-token-123":
            return self._reply(401, {"errors": ["unauthorized"]})
        if not self.path.startswith("/metadata/v1/instance?version="):
            return self._reply(404, {"errors": ["not found"]})
        self._reply(200, type(self).instance)


@pytest.fixture
def metadata_server():
    FakeMetadata.failures_left = 2
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeMetadata)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _run_providerid(tmp_path, s: IBMCloudSettings) -> tuple[subprocess.CompletedProcess, Path]:
    env_file = tmp_path / "ibm-cloud.env"
    env_file.write_text(render_ibm_env(s))
    out = tmp_path / "run" / "kubelet.env"
    script = REPO / "ignition_server/render/templates/ibm-kubelet-providerid.sh"
    env = {**os.environ, "IBM_CLOUD_ENV": str(env_file), "IBM_KUBELET_ENV": str(out),
           "IBM_METADATA_RETRY_DELAY": "0.1", "IBM_METADATA_ATTEMPTS": "5"}
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    return res, out


@pytest.fixture
def jq_and_curl() -> None:
    # The boot script runs them on the node; the test runs the real ones.
    require_tool("jq", "apt-get install jq")
    require_tool("curl", "apt-get install curl")


@pytest.mark.usefixtures("jq_and_curl")
def test_providerid_script_against_fake_metadata(tmp_path, metadata_server):
    s = settings(metadata_endpoint=metadata_server)
    res, out = _run_providerid(tmp_path, s)
    assert res.returncode == 0, res.stderr
    lines = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert lines["KUBELET_PROVIDERID"] == (
        "ibm://0123456789abcdef0123456789abcdef///cl1q2w3e4r5t6y7u8i9o/kube-cl1q2w3e4r5t6y7u8i9o-default-0000012a"
    )
    assert lines["IBM_INSTANCE_ID"] == "0717_1e09281b-f177-46fb-baf1-bc152b2e391a"
    assert lines["IBM_ZONE"] == "us-south-2" and lines["IBM_PRIVATE_IP"] == "10.240.64.4"
    assert "retrying" in res.stderr  # survived the 503s of a network that was not up yet

    # worker ID from the instance ID instead of its name
    FakeMetadata.failures_left = 0
    res, out = _run_providerid(tmp_path, settings(metadata_endpoint=metadata_server, worker_id_field="id"))
    assert res.returncode == 0, res.stderr
    assert "cl1q2w3e4r5t6y7u8i9o/0717_1e09281b-f177-46fb-baf1-bc152b2e391a\n" in out.read_text()


@pytest.mark.usefixtures("jq_and_curl")
def test_providerid_script_rejects_hostile_metadata(tmp_path, metadata_server, monkeypatch):
    FakeMetadata.failures_left = 0
    monkeypatch.setattr(FakeMetadata, "instance", {**FakeMetadata.instance, "name": "x\nKUBELET_PROVIDERID=evil"})
    res, out = _run_providerid(tmp_path, settings(metadata_endpoint=metadata_server))
    assert res.returncode != 0
    assert not out.exists()


@pytest.mark.usefixtures("jq_and_curl")
def test_providerid_script_gives_up_when_metadata_never_answers(tmp_path):
    res, out = _run_providerid(tmp_path, settings(metadata_endpoint="http://127.0.0.1:9"))
    assert res.returncode != 0 and not out.exists()


# --- full node config through the real tools ---------------------------------------------

JOIN = JoinInputs(
    bootstrap_kubeconfig=b"apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://172.20.0.1:2040\n"
    b"users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
    pull_secret=b'{"auths":{"us.icr.io":{"auth":"aWFtYXBpa2V5OnNlY3JldA=="}}}',
    ca_bundles=(b"-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n",),
)


def node_config(**kw) -> dict:
    s = settings(secondary_storage="luks", **kw)
    return merge(render_ibmcloud_fragment(s), render_haproxy_fragment(api_server_access(s), HAPROXY_IMAGE),
                 render_join_fragment(JOIN))


def test_full_config_passes_ignition_validate(tmp_path):
    exe = require_tool("ignition-validate", "apt-get install ignition")
    path = tmp_path / "node.ign"
    path.write_text(json.dumps(node_config()))
    res = subprocess.run([exe, str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    # ... and the check can fail: the same config with a relative path is rejected.
    bad = node_config()
    bad["storage"]["files"][0]["path"] = "etc/relative"
    path.write_text(json.dumps(bad))
    assert subprocess.run([exe, str(path)], capture_output=True, timeout=60).returncode != 0


EXPECTED = {
    # path: mode
    HAPROXY_CFG_PATH: 0o644,
    STATIC_POD_PATH: 0o644,
    "/usr/local/bin/setup-apiserver-ip.sh": 0o755,
    "/usr/local/bin/teardown-apiserver-ip.sh": 0o755,
    IBM_ENV_PATH: 0o644,
    PROVIDERID_SCRIPT_PATH: 0o755,
    "/usr/local/bin/ibm-secondary-storage.sh": 0o755,
    "/etc/chrony.conf": 0o644,
    "/etc/sysctl.d/99-ibm-cloud.conf": 0o644,
    "/etc/containers/registries.conf.d/99-ibm-private-registry.conf": 0o644,
    "/etc/kubernetes/kubeconfig": 0o600,
    "/var/lib/kubelet/config.json": 0o600,
    "/etc/pki/ca-trust/source/anchors/openshift-config-user-ca-bundle.crt": 0o644,
    "/etc/systemd/system/apiserver-ip.service": 0o644,
    f"/etc/systemd/system/{PROVIDERID_UNIT}": 0o644,
    f"/etc/systemd/system/{SECONDARY_STORAGE_UNIT}": 0o644,
    "/etc/systemd/system/kubelet.service.d/20-ibm-providerid.conf": 0o644,
}


def _assert_landed(root: Path, config: dict) -> None:
    sources = {f["path"]: decode(f["contents"]["source"]) for f in config["storage"]["files"]}
    for path, mode in EXPECTED.items():
        p = root / path.lstrip("/")
        assert p.is_file(), f"{path} not written"
        assert stat.S_IMODE(p.stat().st_mode) == mode, f"{path}: mode {oct(stat.S_IMODE(p.stat().st_mode))}"
        if path in sources:
            assert p.read_bytes() == sources[path], path
    preset = (root / "etc/systemd/system-preset/20-ignition.preset").read_text()
    for unit in ("apiserver-ip.service", PROVIDERID_UNIT, SECONDARY_STORAGE_UNIT):
        assert f"enable {unit}" in preset
    cfg = (root / HAPROXY_CFG_PATH.lstrip("/")).read_text()
    assert "bind 172.20.0.1:2040" in cfg and "option httpchk GET /livez?exclude=etcd&exclude=log" in cfg
    # The rendered haproxy.cfg, checked by the real HAProxy.
    res = subprocess.run([require_tool("haproxy", "apt-get install haproxy"), "-c", "-f", str(root / HAPROXY_CFG_PATH.lstrip("/"))],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.ignition
def test_real_ignition_files_stage_writes_everything(tmp_path):
    config = node_config()
    res, root = ignition_files_stage(tmp_path, config, shim_setfiles=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "Ignition finished successfully" in res.stdout + res.stderr
    _assert_landed(root, config)


@pytest.mark.ignition
def test_real_ignition_files_stage_without_selinux_fails_only_at_relabel(tmp_path):
    config = node_config()
    res, root = ignition_files_stage(tmp_path, config, shim_setfiles=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "relabel" in out and "CRITICAL" in out
    _assert_landed(root, config)
