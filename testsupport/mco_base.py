"""A worker base configuration in the shape `machine-config-operator bootstrap` writes it.

Written here, not pulled (no release image can be pulled in the tests): the MachineConfigs
MCO renders for the worker pool from its templates (templates/worker/00-worker,
01-worker-container-runtime, 01-worker-kubelet), cut down to the parts a node needs to
become one: `machine-config-daemon-firstboot.service`, CRI-O's configuration, the kubelet
config and `kubelet.service` with a drop-in, and MCO's empty proxy environment file.
Contents follow MCO's templates; they are not run here, only laid down and checked.
"""

from __future__ import annotations

from urllib.parse import quote

import yaml

RELEASE = "quay.io/openshift-release-dev/ocp-release@sha256:" + "a" * 64
RELEASE_VERSION = "4.17.3"
RHCOS = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "c" * 64
RHCOS_EXTENSIONS = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "e" * 64
GENERATED = {"machineconfiguration.openshift.io/generated-by-controller-version": "1e2c3a4b"}
LABELS = {"machineconfiguration.openshift.io/role": "worker"}

FIRSTBOOT_UNIT = """[Unit]
Description=Machine Config Daemon Firstboot
# Make sure it runs only on OSTree booted system
ConditionPathExists=/run/ostree-booted
# Removal of this file signals firstboot completion
ConditionPathExists=/etc/ignition-machine-config-encapsulated.json
After=machine-config-daemon-pull.service
Before=kubelet-dependencies.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/run/bin/machine-config-daemon firstboot-complete-machineconfig --persist-nics
MountFlags=slave

[Install]
RequiredBy=kubelet-dependencies.target
"""

KUBELET_UNIT = """[Unit]
Description=Kubernetes Kubelet
Requires=crio.service kubelet-dependencies.target
After=kubelet-dependencies.target
After=ostree-finalize-staged.service

[Service]
Type=notify
ExecStartPre=/bin/mkdir --parents /etc/kubernetes/manifests
EnvironmentFile=/etc/os-release
EnvironmentFile=-/etc/kubernetes/kubelet-workaround
EnvironmentFile=-/etc/kubernetes/kubelet-env
ExecStart=/usr/local/bin/kubenswrapper /usr/bin/kubelet \\
    --config=/etc/kubernetes/kubelet.conf \\
    --bootstrap-kubeconfig=/etc/kubernetes/kubeconfig \\
    --kubeconfig=/var/lib/kubelet/kubeconfig \\
    --container-runtime-endpoint=/var/run/crio/crio.sock \\
    --node-labels=node-role.kubernetes.io/worker,node.openshift.io/os_id=${ID} \\
    --v=${KUBELET_LOG_LEVEL}
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
"""

KUBELET_DROPIN = """[Service]
Environment="KUBELET_LOG_LEVEL=2"
"""

CRIO_CONF = """[crio]
internal_wipe = true
storage_driver = "overlay"

[crio.api]
listen = "/var/run/crio/crio.sock"

[crio.runtime]
selinux = true
conmon = ""
default_runtime = "crun"

[crio.image]
global_auth_file = "/var/lib/kubelet/config.json"
pause_image = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:%s"
pause_image_auth_file = "/var/lib/kubelet/config.json"
pause_command = "/usr/bin/pod"

[crio.network]
network_dir = "/etc/kubernetes/cni/net.d/"
plugin_dirs = ["/var/lib/cni/bin"]
""" % ("b" * 64)

KUBELET_CONF = """{
  "kind": "KubeletConfiguration",
  "apiVersion": "kubelet.config.k8s.io/v1beta1",
  "authentication": {"x509": {"clientCAFile": "/etc/kubernetes/kubelet-ca.crt"}, "anonymous": {"enabled": false}},
  "cgroupDriver": "systemd",
  "clusterDNS": ["172.30.0.10"],
  "clusterDomain": "cluster.local",
  "rotateCertificates": true,
  "serverTLSBootstrap": true
}
"""

MCO_PROXY_ENV = """# Proxy environment variables will be populated in this file. Properly
# url encoded passwords with special characters will use '%<HEX><HEX>'.
# Systemd requires that any % used in a password be represented as
# %% in a unit file since % is a prefix for macros; this restriction does not
# apply for environment files. Templates that need the proxy set should use
# 'EnvironmentFile=/etc/mco/proxy.env'.
"""

# path -> (mode, contents): what the base lays down, for the tests to check on disk.
BASE_FILES = {
    "/etc/crio/crio.conf.d/00-default": (0o644, CRIO_CONF),
    "/etc/kubernetes/kubelet.conf": (0o644, KUBELET_CONF),
    "/etc/mco/proxy.env": (0o644, MCO_PROXY_ENV),
    "/usr/local/bin/kubenswrapper": (0o755, "#!/bin/bash\nexec \"$@\"\n"),
}


def _file(path: str, mode: int, text: str) -> dict:
    return {"path": path, "mode": mode, "contents": {"source": "data:," + quote(text, safe="")}}


def _mc(name: str, config: dict, **spec: object) -> dict:
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfig",
        "metadata": {"name": name, "labels": dict(LABELS), "annotations": dict(GENERATED)},
        "spec": {"config": {"ignition": {"version": "3.5.0"}, **config}, "osImageURL": "", **spec},
    }


def base_machineconfigs(*, kubelet_log_level: str = "2") -> list[dict]:
    files = {p: _file(p, mode, text) for p, (mode, text) in BASE_FILES.items()}
    empty_proxy = [{"name": "10-mco-default-env.conf", "contents": ""}]
    return [
        _mc("00-worker", {
            "storage": {"files": [files["/etc/mco/proxy.env"], files["/usr/local/bin/kubenswrapper"]]},
            "systemd": {"units": [
                {"name": "machine-config-daemon-firstboot.service", "enabled": True, "contents": FIRSTBOOT_UNIT},
                {"name": "crio.service", "dropins": empty_proxy},
            ]},
        }),
        _mc("01-worker-container-runtime", {"storage": {"files": [files["/etc/crio/crio.conf.d/00-default"]]}}),
        _mc("01-worker-kubelet", {
            "storage": {"files": [files["/etc/kubernetes/kubelet.conf"]]},
            "systemd": {"units": [{
                "name": "kubelet.service", "enabled": True, "contents": KUBELET_UNIT,
                "dropins": empty_proxy + [{
                    "name": "20-logging.conf",
                    "contents": KUBELET_DROPIN.replace('=2"', f'={kubelet_log_level}"'),
                }],
            }]},
        }),
        _mc("99-worker-ssh", {"passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3Nza test"]}]}}),
    ]


def base_yaml(**kwargs: str) -> str:
    return yaml.safe_dump_all(base_machineconfigs(**kwargs), sort_keys=False)


def base_configmap(namespace: str, *, release: str = RELEASE, version: str = RELEASE_VERSION,
                   name: str = "mco-base-4-17-3", **kwargs: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace,
                     "annotations": {"ignition-server.openshift.io/mco-base": "true"}},
        "data": {"release": release, "releaseVersion": version, "machineconfigs.yaml": base_yaml(**kwargs)},
    }
