"""The controller's output read back: the served pool's rendered MachineConfig, split so that
MCO's merge by name still holds when a NodePool's MachineConfigs join it (split_base)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from .. import bounded_yaml
from ..render.machineconfig import parse_machineconfigs
from ..render.mco import (
    ANNOTATION_CONTROLLER_VERSION,
    ANNOTATION_KUBELET_CA,
    ANNOTATION_MERGED_FROM,
    ANNOTATION_SERVED_POOL,
    GENERATED_BY_CONTROLLER,
)
from .steps import PROBE_POOL

MAX_OUTPUT_FILE = 32 << 20
SERVED_POOL = "master"  # HyperShift's `master` pool selects the worker role; the bootstrap MCS serves only it


def _rendered(mcs: Path, pool: str) -> dict[str, Any]:
    pool_file = mcs / "machine-pools" / f"{pool}.yaml"
    if not pool_file.is_file():
        raise ValueError(f"machine-config-controller wrote no machine-pools/{pool}.yaml")
    doc: Any = _load(pool_file, mcs)
    name = (((doc or {}).get("status") or {}).get("configuration") or {}).get("name") if isinstance(doc, dict) else None
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"machine-pools/{pool}.yaml names no rendered configuration (status.configuration.name)")
    rendered = mcs / "machine-configs" / f"{name}.yaml"
    if not rendered.is_file():
        raise ValueError(f"machine-config-controller wrote no machine-configs/{name}.yaml")
    mc: Any = _load(rendered, mcs)
    if not isinstance(mc, dict) or not isinstance(mc.get("spec"), dict):
        raise ValueError(f"machine-configs/{name}.yaml is not a MachineConfig")
    sources = [str(s.get("name")) for s in (((doc.get("status") or {}).get("configuration") or {}).get("source") or [])
               if isinstance(s, dict)]
    mc["_sources"] = sources
    return mc


def _without_suffix(items: list[Any], suffix: list[Any]) -> list[Any]:
    if suffix and items[-len(suffix):] == suffix:
        return items[:-len(suffix)]
    return items


def _files(config: dict[str, Any]) -> list[Any]:
    return list((config.get("storage") or {}).get("files") or []) if isinstance(config.get("storage"), dict) else []


def _without_generated_only_files(config: dict[str, Any], generated: dict[str, Any]) -> dict[str, Any]:
    """`config` less the files only the generated MachineConfigs write (a ContainerRuntimeConfig's
    `/etc/crio/crio.conf.d/01-ctrcfg-*`): MCO's merge appends a new path where it first meets it,
    so they come last in the served config, and after a NodePool's own files in MCO's merge; `high`
    brings them back there. A file a template writes too keeps its place (it is not at the end:
    the templates' last file, kubenswrapper, is theirs alone)."""
    files, generated_paths = _files(config), {f.get("path") for f in _files(generated) if isinstance(f, dict)}
    cut = len(files)
    while cut and isinstance(files[cut - 1], dict) and files[cut - 1].get("path") in generated_paths:
        cut -= 1
    if cut == len(files):
        return config
    return {**config, "storage": {**config["storage"], "files": files[:cut]}}


def split_base(served: dict[str, Any], generated: dict[str, Any], kubelet_ca: str, controller_version: str) -> list[dict[str, Any]]:
    """The served pool's rendered MachineConfig as two MachineConfigs MCO's merge by name can place.

    MCO merges a pool's MachineConfigs in name order: the templates' (00-worker, 01-worker-*),
    then a NodePool's (50-... by convention), then the controller's generated ones
    (97-/98-/99-worker-generated-*). The controller writes only the merged result, so: `low`,
    named as the last template one, is the whole merge with the generated ones' kernel
    arguments and extensions taken off (they come back with `high`); `high`, named as the first
    generated one, is the generated ones merged (the probe pool's render). Merged again, low
    then high is the served pool's config; with a NodePool's MachineConfig between them, the
    NodePool's wins over the templates' and the generated ones win over it, as in MCO (a
    NodePool name between two template or two generated names is the one case placed
    differently: README)."""
    sources = served.pop("_sources", [])
    generated.pop("_sources", None)
    worker = sorted(n for n in sources if "worker" in n)
    templates = [n for n in worker if "-generated-" not in n] or ["00-worker"]
    generated_names = [n for n in worker if "-generated-" in n] or ["97-worker-generated-kubelet"]
    spec, gen_spec = served["spec"], generated["spec"]
    low_spec = dict(spec)
    low_spec["config"] = _without_generated_only_files(spec.get("config") or {}, gen_spec.get("config") or {})
    low_spec["kernelArguments"] = _without_suffix(list(spec.get("kernelArguments") or []), list(gen_spec.get("kernelArguments") or []))
    low_spec["extensions"] = _without_suffix(list(spec.get("extensions") or []), list(gen_spec.get("extensions") or []))
    notes = {GENERATED_BY_CONTROLLER: controller_version, ANNOTATION_SERVED_POOL: SERVED_POOL,
             ANNOTATION_CONTROLLER_VERSION: controller_version}
    low = {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
           "metadata": {"name": max(templates), "labels": {"machineconfiguration.openshift.io/role": "worker"},
                        "annotations": {**notes, ANNOTATION_KUBELET_CA: kubelet_ca, ANNOTATION_MERGED_FROM: ",".join(templates)}},
           "spec": low_spec}
    high_spec = {k: v for k, v in gen_spec.items() if k in ("config", "kernelArguments", "extensions", "fips", "kernelType")}
    high = {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
            "metadata": {"name": min(generated_names), "labels": {"machineconfiguration.openshift.io/role": "worker"},
                         "annotations": {**notes, ANNOTATION_MERGED_FROM: ",".join(generated_names)}},
            "spec": high_spec}
    return [low, high]


def read_base(mcs: Path) -> str:
    """The served pool's rendered MachineConfig, split (split_base), with what the MCS appends from the run."""
    served = _rendered(mcs, SERVED_POOL)
    generated = _rendered(mcs, PROBE_POOL)
    controller_file = mcs / "controller-config" / "machine-config-controller.yaml"
    controller: Any = _load(controller_file, mcs) if controller_file.is_file() else {}
    ca = ((controller or {}).get("spec") or {}).get("kubeAPIServerServingCAData") if isinstance(controller, dict) else None
    kubelet_ca = base64.b64decode(ca).decode() if isinstance(ca, str) and ca else ""
    version = str(((served.get("metadata") or {}).get("annotations") or {}).get(GENERATED_BY_CONTROLLER, ""))
    machineconfigs = split_base(served, generated, kubelet_ca, version)
    text = yaml.safe_dump_all(machineconfigs, sort_keys=False)
    parse_machineconfigs(text)  # what a render would refuse is a failed run, said now
    return text


def _load(path: Path, dest: Path) -> Any:
    """One file the controller wrote, as YAML; ValueError naming it (a run that failed, not a bug)."""
    try:
        return bounded_yaml.load(_read(path))
    except yaml.YAMLError as exc:
        raise ValueError(f"machine-config-controller wrote {path.relative_to(dest)}, which is not YAML: "
                         f"{str(exc).splitlines()[0]}") from None


def _read(path: Path) -> str:
    if path.stat().st_size > MAX_OUTPUT_FILE:
        raise ValueError(f"{path.name} is larger than {MAX_OUTPUT_FILE} bytes")
    return path.read_text()
