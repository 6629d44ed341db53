"""The bootstrap steps' input: the files each step reads and the flags HyperShift passes.

Pure file preparation in a run's temp dir (generator.py runs the steps): the cluster
configuration and the pull secret (`config/`), the FeatureGate render's manifests dir, the
operator's and the controller's flags, and the controller's input dir (`mcc/`), as HyperShift's
ignition server lays them out (local_ignitionprovider.go; ../shared/real/README.md, steps 2-6).
"""

from __future__ import annotations

import base64
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from .. import bounded_yaml

MCO_IMAGE = "machine-config-operator"
IMAGE_PATHS = ("usr/bin/machine-config-operator", "usr/bin/machine-config-controller", "etc/mcc/templates")
CONFIG_API_IMAGE = "cluster-config-api"
RENDER_PATHS = ("usr/bin/render",)
# HyperShift's deployment mounts this FeatureGate (`spec: {}`: the release's defaults for the profile).
FEATURE_GATE = "apiVersion: config.openshift.io/v1\nkind: FeatureGate\nmetadata:\n  name: cluster\nspec: {}\n"
# A pool of our own in the controller's input: it selects only the MachineConfigs the controller
# generates for it (97-/98-/99-<pool>-generated-*), which are the worker's generated ones.
PROBE_POOL = "ignition-server-generated"


@dataclass(frozen=True)
class BaseJob:
    """Everything a run reads; `key` names the (cluster configuration, release digest) pair."""

    key: str
    namespace: str
    release: str
    release_digest: str
    version: str
    images: Mapping[str, str]
    cluster_files: Mapping[str, str]
    pull_secret: str | None
    ca_bundle: str | None = None
    os_stream: str = ""  # the token Secret's `os-stream`: part of the key
    cloud_config: Mapping[str, Any] | None = None  # Azure/OpenStack: the cloud provider's ConfigMap
    # `render`'s input: a taken-over HCP's spec.configuration.featureGate (takeover/feature_gate.py),
    # which the configuration-hash in `cluster_files` (and so the key) covers.
    feature_gate: str = FEATURE_GATE
    # What the MCO's bootstrap consumes of the NodePool's config (ImageDigestMirrorSets, KubeletConfigs...;
    # model/bootstrap_objects.py), YAML: `mcc/custom.yaml`, as HyperShift writes its whole config; in the key.
    bootstrap_objects: str = ""


def platform(cluster_files: Mapping[str, str]) -> str:
    """The Infrastructure's platform type (`status.platformStatus.type`), "" when it says none."""
    try:
        infra = bounded_yaml.load(cluster_files.get("cluster-infrastructure-02-config.yaml") or "")
    except ValueError:
        return ""
    status = (infra or {}).get("status") if isinstance(infra, dict) else None
    if not isinstance(status, dict):
        return ""
    kind = (status.get("platformStatus") or {}).get("type") if isinstance(status.get("platformStatus"), dict) else None
    return str(kind or status.get("platform") or "")


def write_config(config: Path, mco: Path, job: BaseJob) -> None:
    for name, text in job.cluster_files.items():
        if not name or "/" in name or name.startswith(".") or name == "configuration-hash":
            continue
        (config / name).write_text(text)
    # Under `data` (base64), as HyperShift serializes it: the controller reads only `data`.
    secret = (job.pull_secret or '{"auths":{}}').encode()
    pull_secret = {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "pull-secret", "namespace": "openshift-config"},
        "data": {".dockerconfigjson": base64.b64encode(secret).decode()},
    }
    (config / "pull-secret.yaml").write_text(yaml.safe_dump(pull_secret))
    (config / "pull-secret.yaml").chmod(0o600)
    stream = {"kind": "ImageStream", "apiVersion": "image.openshift.io/v1", "metadata": {"name": job.version},
              "spec": {"tags": [{"name": n, "from": {"kind": "DockerImage", "name": i}} for n, i in sorted(job.images.items())]}}
    (config / "release-manifests").mkdir()
    (config / "release-manifests" / "image-references").write_text(json.dumps(stream, indent=2))
    if job.cloud_config is not None:
        (mco / "cloud.conf.configmap.yaml").write_text(yaml.safe_dump(dict(job.cloud_config)))


def prepare_feature_gate(gates: Path, job: BaseJob) -> None:
    for name in ("input", "output", "manifests"):
        (gates / name).mkdir()
    (gates / "manifests" / "99_feature-gate.yaml").write_text(job.feature_gate)


def render_args(gates: Path, job: BaseJob) -> list[str]:
    """The cluster-config-api `render` flags HyperShift passes for 4.15 and later (run in `gates`)."""
    return [
        "--asset-output-dir", str(gates / "output"),
        "--image-manifests=input",
        f"--rendered-manifest-dir={gates / 'manifests'}",
        "--cluster-profile=ibm-cloud-managed",
        f"--payload-version={job.version}",
    ]


def operator_args(config: Path, dest: Path, job: BaseJob) -> list[str]:
    """`machine-config-operator bootstrap`'s flags as HyperShift passes them (4.14 and later)."""
    args = [
        "bootstrap",
        f"--root-ca={config}/root-ca.crt",
        f"--infra-config-file={config}/cluster-infrastructure-02-config.yaml",
        f"--network-config-file={config}/cluster-network-02-config.yaml",
        f"--proxy-config-file={config}/cluster-proxy-01-config.yaml",
        f"--config-file={config}/install-config.yaml",
        f"--dns-config-file={config}/cluster-dns-02-config.yaml",
        f"--pull-secret={config}/pull-secret.yaml",
        f"--dest-dir={dest}",
        f"--release-image={job.release}",
        f"--payload-version={job.version}",
        f"--image-references={config}/release-manifests/image-references",
        f"--kube-ca={config}/signer-ca.crt",
    ]
    if (job.cluster_files.get("user-ca-bundle-config.yaml") or "").strip():
        args.append(f"--additional-trust-bundle-config-file={config}/user-ca-bundle-config.yaml")
    if job.cloud_config is not None:
        args.append(f"--cloud-config-file={dest}/cloud.conf.configmap.yaml")
    return args


def controller_args(mcc: Path, image_dir: Path, dest: Path, job: BaseJob) -> list[str]:
    return [
        "bootstrap",
        f"--manifest-dir={mcc}",
        f"--templates={image_dir}/etc/mcc/templates",
        f"--pull-secret={mcc}/machineconfigcontroller-pull-secret",
        f"--dest-dir={dest}",
        f"--payload-version={job.version}",
    ]


def os_image_stream(stream: str) -> str:
    """`mcc/99_osimagestream.yaml`: the NodePool's OS stream as the cluster's default."""
    return yaml.safe_dump({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "OSImageStream",
                           "metadata": {"name": "cluster"}, "spec": {"defaultStream": stream}}, sort_keys=False)


def prepare_controller_input(config: Path, mco: Path, mcc: Path, gates: Path, job: BaseJob) -> None:
    manifests = mco / "bootstrap" / "manifests"
    if not manifests.is_dir():
        raise ValueError(f"machine-config-operator wrote no {manifests.relative_to(mco.parent)}")
    feature_gate = gates / "manifests" / "99_feature-gate.yaml"
    if "FeatureGate" not in feature_gate.read_text() or "status" not in feature_gate.read_text():
        raise ValueError("render wrote no FeatureGate status into manifests/99_feature-gate.yaml")
    # The operator's output first; the cluster's pools replace its own (as HyperShift does).
    for source in [*manifests.iterdir(), *config.glob("*.machineconfigpool.yaml"), config / "image-config.yaml",
                   config / "cluster-apiserver-config.yaml", feature_gate]:
        if source.is_file():
            shutil.copyfile(source, mcc / source.name)
    if job.os_stream:
        (mcc / "99_osimagestream.yaml").write_text(os_image_stream(job.os_stream))
    if job.bootstrap_objects:
        (mcc / "custom.yaml").write_text(job.bootstrap_objects)
    # Labelled as HyperShift's pools are: the NodePool controller points every KubeletConfig and
    # ContainerRuntimeConfig at `mco-built-in`, so their generated MachineConfigs are in the probe's too.
    probe = {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
             "metadata": {"name": PROBE_POOL, "labels": {"machineconfiguration.openshift.io/mco-built-in": ""}},
             "spec": {"machineConfigSelector": {"matchLabels": {"machineconfiguration.openshift.io/role": PROBE_POOL}},
                      "nodeSelector": {"matchLabels": {"node-role.kubernetes.io/" + PROBE_POOL: ""}}}}
    (mcc / f"{PROBE_POOL}.machineconfigpool.yaml").write_text(yaml.safe_dump(probe))
