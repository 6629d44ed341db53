"""`ignition-server base import`: an MCO worker base configuration → the ConfigMap the reconciler reads.

Two forms in (pure: texts in, a ConfigMap dict out; the CLI reads the files):

- the MachineConfigs `machine-config-operator bootstrap` (or the controller's bootstrap)
  writes into a directory: every MachineConfig of the worker pool (role label `worker`, or
  none); rendered ones (`rendered-*`) only when there is nothing else, since they already
  hold the merge;
- a standalone cluster's machine-config-server answer to `/config/worker` (Ignition JSON):
  one MachineConfig `00-worker-mcs` holding that config without the files the MCS appended
  for the requesting node (kubeconfig, encapsulated config, node annotations, which this
  server appends itself); the encapsulated MachineConfig's kernel arguments, extensions,
  FIPS and kernel type come along, its OS image does not (the release catalog's
  `rhel-coreos` is the default, as MCO's controller config is).
"""

from __future__ import annotations

import json
from typing import Iterable
from urllib.parse import unquote_to_bytes

import yaml

from . import bounded_yaml
from .model.mco_base import ANNOTATION_MCO_BASE, BASE_KEY, RELEASE_KEY, VERSION_KEY
from .model.objects import config_map
from .render.machineconfig import API_VERSION, KIND, parse_machineconfigs
from .render.mco import CONTENT_PATH, ENCAPSULATED_PATH, GENERATED_BY_CONTROLLER, NODE_ANNOTATIONS_PATH, ROLE_LABEL

_MCS_APPENDED = frozenset((ENCAPSULATED_PATH, NODE_ANNOTATIONS_PATH, CONTENT_PATH, "/etc/kubernetes/kubeconfig"))
MCS_BASE_NAME = "00-worker-mcs"


def _data_url_bytes(source: str) -> bytes:
    import base64

    header, _, payload = source.partition(",")
    if not header.startswith("data:"):
        raise ValueError(f"file contents {source[:40]!r}… are not a data URL")
    return base64.b64decode(payload) if header.endswith(";base64") else unquote_to_bytes(payload)


def from_mcs_config(text: str) -> list[dict]:
    """A machine-config-server `/config/worker` answer → one base MachineConfig."""
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not Ignition JSON: {exc}") from None
    if not isinstance(config, dict) or not isinstance((config.get("ignition") or {}).get("version"), str):
        raise ValueError("not an Ignition config (no ignition.version)")
    storage = config.get("storage") or {}
    files = storage.get("files") or []
    spec: dict = {}
    for f in files:
        if f.get("path") == ENCAPSULATED_PATH:
            encapsulated = json.loads(_data_url_bytes(f["contents"]["source"]))
            carried = encapsulated.get("spec") or {}
            spec = {k: carried[k] for k in ("kernelArguments", "extensions", "fips", "kernelType") if carried.get(k)}
    kept = [f for f in files if f.get("path") not in _MCS_APPENDED]
    if kept:
        storage = {**storage, "files": kept}
        config = {**config, "storage": storage}
    else:
        storage = {k: v for k, v in storage.items() if k != "files"}
        config = {k: v for k, v in config.items() if k != "storage"} | ({"storage": storage} if storage else {})
    return [{
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": MCS_BASE_NAME, "labels": {ROLE_LABEL: "worker"},
                     "annotations": {GENERATED_BY_CONTROLLER: "machine-config-server"}},
        "spec": {"config": config, **spec},
    }]


def from_bootstrap_documents(texts: Iterable[tuple[str, str]]) -> list[dict]:
    """(file name, YAML or JSON text) of a bootstrap output directory → the worker MachineConfigs."""
    found: dict[str, dict] = {}
    for name, text in texts:
        try:
            documents = bounded_yaml.load_all(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{name}: not YAML: {exc}") from None
        for doc in documents:
            if not isinstance(doc, dict) or doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
                continue
            role = ((doc.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL, "worker")
            if role == "worker":
                found[doc["metadata"]["name"]] = doc
    sources = {n: mc for n, mc in found.items() if not n.startswith("rendered-")}
    chosen = sources or found
    if not chosen:
        raise ValueError("no MachineConfig of the worker pool found")
    return [chosen[n] for n in sorted(chosen)]


def base_configmap(machineconfigs: list[dict], *, name: str, namespace: str, release: str, version: str) -> dict:
    """The ConfigMap reconcile/bases.py reads; the MachineConfigs are checked as a render would."""
    if not release and not version:
        raise ValueError("name the release: --release (pull spec) and/or --release-version")
    text = yaml.safe_dump_all(machineconfigs, sort_keys=False)
    parse_machineconfigs(text)  # InvalidConfig (a ValueError) says what a render would refuse
    data = {BASE_KEY: text}
    if release:
        data[RELEASE_KEY] = release
    if version:
        data[VERSION_KEY] = version
    return config_map(namespace, name, data, {ANNOTATION_MCO_BASE: "true"})
