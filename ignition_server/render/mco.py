"""The rendered worker MachineConfig as MCO builds it, and what the machine-config-server appends.

Pure: MachineConfig dicts in, a rendered MachineConfig and Ignition files out.

MCO (pkg/controller/common/helpers.go `MergeMachineConfigs`): the pool's MachineConfigs in
name order; the Ignition configs folded with Ignition's merge (files without `overwrite` get
`overwrite: true`); `kernelArguments` and `extensions` concatenated in that order; `fips` if
any says so; `kernelType` the last `realtime`/`64k-pages`, else `default`; `osImageURL`
(and `baseOSExtensionsContainerImage`) the release's, unless a MachineConfig not generated
by the controller names another (a layered OS image, MCO-1173).

The name (pkg/controller/render/hash.go): `rendered-<pool>-<md5(salt + yaml(spec))>`,
where yaml(spec) is ghodss/yaml of the spec: Go's JSON of the MachineConfigSpec, then YAML
with sorted keys. The spec here is the one this server renders (its Ignition config as this
server merges it), so the name is stable and changes exactly when the spec does; it equals
MCO's own name only when the Ignition JSON is byte-for-byte Go's (Go also emits the empty
structs of its Ignition types).

The machine-config-server's appenders (pkg/server/server.go) add, each mode 0644 (420),
overwrite true: the node annotations (`/etc/machine-config-daemon/node-annotations.json`:
current, desired and first-pivot config = the rendered name, state Done, and the OS image
as current/desired image), the rendered MachineConfig with its Ignition config emptied
(`/etc/ignition-machine-config-encapsulated.json`) and in full
(`/etc/mcs-machine-config-content.json`). The machine-config-daemon's first boot reads
them to rebase onto `osImageURL`, switch the kernel type, install extensions, enable FIPS
and apply kernel arguments before the kubelet starts.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass

import yaml

from .fragments import file_entry

POOL = "worker"
ENCAPSULATED_PATH = "/etc/ignition-machine-config-encapsulated.json"
NODE_ANNOTATIONS_PATH = "/etc/machine-config-daemon/node-annotations.json"
CONTENT_PATH = "/etc/mcs-machine-config-content.json"
# The machine-config-server's CA files (pkg/server/cluster_server.go): the kube-apiserver's
# serving CA the kubelet trusts for clients, and the cloud provider's CA.
KUBELET_CA_PATH = "/etc/kubernetes/kubelet-ca.crt"
CLOUD_CA_PATH = "/etc/kubernetes/static-pod-resources/configmaps/cloud-config/ca-bundle.pem"
GENERATED_BY_CONTROLLER = "machineconfiguration.openshift.io/generated-by-controller-version"
RELEASE_IMAGE_VERSION = "machineconfiguration.openshift.io/release-image-version"
OS_IMAGE_OVERRIDDEN = "machineconfiguration.openshift.io/os-image-url-overridden"
ROLE_LABEL = "machineconfiguration.openshift.io/role"
_SPECIAL_KERNELS = ("realtime", "64k-pages")

# MCO's salt for rendered names (pkg/controller/render/hash.go: "Do not change it").
_SALT = bytes((
    16, 124, 206, 228, 139, 56, 175, 175, 79, 229, 134, 118, 157, 154, 211, 110,
    25, 93, 47, 253, 172, 106, 37, 7, 174, 13, 160, 185, 110, 17, 87, 52,
    219, 131, 12, 206, 218, 141, 116, 135, 188, 181, 192, 151, 233, 62, 126, 165,
    64, 83, 179, 119, 15, 168, 208, 197, 146, 107, 58, 227, 133, 188, 238, 26,
    33, 26, 235, 202, 32, 173, 31, 234, 41, 144, 148, 79, 6, 206, 23, 22,
))


class _GoYAMLDumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """As close to go-yaml v2 (MCO's ghodss/yaml) as PyYAML gets: go-yaml is a port of libyaml's
    emitter (so libyaml's when PyYAML has it) and writes a string holding a newline as a
    literal block."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_GoYAMLDumper.add_representer(str, _represent_str)


@dataclass(frozen=True)
class ReleaseImages:
    """What the release gives every node unless a MachineConfig overrides it."""

    os_image_url: str = ""  # the release's `rhel-coreos` image
    extensions_image: str = ""  # `rhel-coreos-extensions`
    version: str = ""


def spec_fields(mcs: list[dict], release: ReleaseImages) -> dict:
    """The rendered spec's fields besides `config`, folded as MCO folds them (MCs in name order)."""
    ordered = sorted(mcs, key=lambda mc: mc["metadata"]["name"])
    kargs: list[str] = []
    extensions: list[str] = []
    fips = False
    kernel_type = "default"
    os_image = release.os_image_url
    extensions_image = release.extensions_image
    for mc in ordered:
        spec = mc.get("spec") or {}
        kargs += [str(a) for a in spec.get("kernelArguments") or []]
        extensions += [str(e) for e in spec.get("extensions") or []]
        fips = fips or bool(spec.get("fips"))
        if spec.get("kernelType") in _SPECIAL_KERNELS:
            kernel_type = spec["kernelType"]
        if ((mc.get("metadata") or {}).get("annotations") or {}).get(GENERATED_BY_CONTROLLER):
            continue  # a base config carries the OS image of the bootstrap run, not an override
        os_image = spec.get("osImageURL") or os_image
        extensions_image = spec.get("baseOSExtensionsContainerImage") or extensions_image
    return {
        "osImageURL": os_image,
        "baseOSExtensionsContainerImage": extensions_image,
        "kernelArguments": kargs,
        "extensions": extensions,
        "fips": fips,
        "kernelType": kernel_type,
    }


def check_spec(spec: dict) -> str | None:
    """Why MCO would refuse this rendered spec (None: it would not)."""
    if spec["kernelType"] != "default" and "kernel-devel" in spec["extensions"]:
        return f"installing the kernel-devel extension is not supported with kernelType {spec['kernelType']}"
    return None


def default_overwrite(config: dict) -> dict:
    """MCO sets `overwrite: true` on every merged file that does not say."""
    out = copy.deepcopy(config)
    for f in (out.get("storage") or {}).get("files") or []:
        if isinstance(f, dict) and f.get("overwrite") is None:
            f["overwrite"] = True
    return out


def _go_spec(spec: dict) -> dict:
    # MachineConfigSpec's JSON field order (ghodss/yaml sorts the keys anyway).
    return {
        "osImageURL": spec["osImageURL"],
        "baseOSExtensionsContainerImage": spec["baseOSExtensionsContainerImage"],
        "config": spec["config"],
        "kernelArguments": spec["kernelArguments"],
        "extensions": spec["extensions"],
        "fips": spec["fips"],
        "kernelType": spec["kernelType"],
    }


def rendered_name(spec: dict, pool: str = POOL) -> str:
    """`rendered-<pool>-<hex md5(salt + yaml(spec))>`, as MCO names a rendered config."""
    document = json.loads(json.dumps(_go_spec(spec)))  # JSON first, as ghodss/yaml does
    text = yaml.dump(document, Dumper=_GoYAMLDumper, sort_keys=True, default_flow_style=False, allow_unicode=True, width=80)
    digest = hashlib.md5(_SALT + text.encode(), usedforsecurity=False).hexdigest()
    return f"rendered-{pool}-{digest}"


def rendered_machineconfig(config: dict, mcs: list[dict], release: ReleaseImages) -> dict:
    """The rendered MachineConfig of the worker pool: merged `config` plus the folded spec fields."""
    spec = {**spec_fields(mcs, release), "config": default_overwrite(config)}
    annotations = {GENERATED_BY_CONTROLLER: "ignition-server"}
    if release.version:
        annotations[RELEASE_IMAGE_VERSION] = release.version
    if spec["osImageURL"] != release.os_image_url:
        annotations[OS_IMAGE_OVERRIDDEN] = "true"
    return {
        "kind": "MachineConfig",
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "metadata": {
            "name": rendered_name(spec),
            "labels": {ROLE_LABEL: POOL},
            "annotations": annotations,
        },
        "spec": _go_spec(spec),
    }


def migrate_kernel_arguments(rendered: dict) -> dict:
    """MCS `MigrateKernelArgsIfNecessary`: kernel arguments the Ignition config asks for move to
    the MachineConfig's `kernelArguments` (the daemon applies them at first boot), so the payload
    needs no spec 3.3. `shouldNotExist` cannot move: it stays (and needs 3.3)."""
    out = copy.deepcopy(rendered)
    config = out["spec"]["config"]
    kargs = config.get("kernelArguments") or {}
    should = kargs.pop("shouldExist", None) or []
    out["spec"]["kernelArguments"] = out["spec"]["kernelArguments"] + [a for a in should if a not in out["spec"]["kernelArguments"]]
    if not kargs:
        config.pop("kernelArguments", None)
    return out


def set_file(config: dict, path: str, data: str | bytes) -> dict:
    """MCS `addDataAndMaybeAppendToIgnition`: the file at `path` gets these contents (mode and
    the rest kept), or is added (0644) when the config has none."""
    out = copy.deepcopy(config)
    files = out.setdefault("storage", {}).setdefault("files", [])
    entry = file_entry(path, data, 0o644)
    for f in files:
        if f.get("path") == path:
            f["contents"] = entry["contents"]
            return out
    files.append(entry)
    return out


def appender_files(rendered: dict, ignition_version: str) -> list[dict]:
    """The files the machine-config-server appends to the served config (all 0644, overwrite)."""
    name = rendered["metadata"]["name"]
    annotations = {
        "machineconfiguration.openshift.io/currentConfig": name,
        "machineconfiguration.openshift.io/desiredConfig": name,
        "machineconfiguration.openshift.io/firstPivotConfig": name,
        "machineconfiguration.openshift.io/state": "Done",
    }
    image = rendered["spec"]["osImageURL"]
    if image:
        annotations["machineconfiguration.openshift.io/currentImage"] = image
        annotations["machineconfiguration.openshift.io/desiredImage"] = image
    encapsulated = copy.deepcopy(rendered)
    encapsulated["spec"]["config"] = {"ignition": {"version": ignition_version}}
    return [
        file_entry(NODE_ANNOTATIONS_PATH, json.dumps(annotations, sort_keys=True, separators=(",", ":")), 0o644),
        file_entry(CONTENT_PATH, json.dumps(rendered, indent=4, sort_keys=True), 0o644),
        file_entry(ENCAPSULATED_PATH, json.dumps(encapsulated, sort_keys=True, separators=(",", ":")), 0o644),
    ]
