"""Token Secrets as HyperShift writes them, and the other objects of a hosted cluster the server
reads (Secrets, ConfigMaps), for the tests and the benchmarks' fleets.

The server only reads them (`ignition_server/model/token_secret.py` parses what this writes).
"""

from __future__ import annotations

import base64
import gzip
from pathlib import Path
from typing import Any

import yaml

from ignition_server.model.token_secret import (
    ANNOTATION_IGNITION_CONFIG,
    ANNOTATION_NODEPOOL,
    ANNOTATION_TOKEN_GENERATION,
    TokenSecret,
    format_time,
    is_token_secret,
    parse_token_secret,
)


def encode_config(yaml_text: str) -> bytes:
    """Inverse of decode_config: the Secret value the reference writes (mtime 0 keeps it deterministic)."""
    return base64.b64encode(gzip.compress(yaml_text.encode(), mtime=0))


# A hosted cluster's bootstrap kubeconfig and additional trust bundle, as its Secret and ConfigMap hold them.
KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://172.20.0.1:6443", certificate-authority-data: ""}
users:
- name: u
  user: {token: bootstrap}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""
CA_PEM = """-----BEGIN CERTIFICATE-----
MIIBdzCCAR2gAwIBAgIUB0bUe3wtt0lJbq9Lh1vKkEfhi6kwCgYIKoZIzj0EAwIw
ETEPMA0GA1UEAwwGdGVzdGNhMB4XDTI0MDEwMTAwMDAwMFoXDTM0MDEwMTAwMDAw
MFowETEPMA0GA1UEAwwGdGVzdGNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE
-----END CERTIFICATE-----
"""


def kube_object(kind: str, namespace: str, name: str, data: dict[str, str], annotations: dict | None = None,
                created: str | None = None) -> dict[str, Any]:
    """A Secret (its data base64-encoded here) or a ConfigMap, as the API returns it."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = annotations
    if created:
        meta["creationTimestamp"] = created
    if kind == "Secret":
        return {"apiVersion": "v1", "kind": "Secret", "metadata": meta,
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def join_objects(namespace: str, pull_secret: str, ca_pem: str) -> list[dict[str, Any]]:
    """What a cluster's nodes need to join it: the pull secret, the bootstrap kubeconfig, the
    additional trust bundle (a registry's CA reaches the server only through it) and the
    node-local API server proxy's backends."""
    return [
        kube_object("Secret", namespace, "pull-secret", {".dockerconfigjson": pull_secret}),
        kube_object("Secret", namespace, "bootstrap-kubeconfig", {"kubeconfig": KUBECONFIG}),
        kube_object("ConfigMap", namespace, "user-ca-bundle", {"ca-bundle.crt": ca_pem}),
        kube_object("ConfigMap", namespace, "apiserver-proxy", {"listenIP": "172.20.0.1", "listenPort": "6443",
                                                                 "backends": "c1.example.com:32167"}),
    ]


def token_status(path: Path) -> TokenSecret:
    """The token Secret in a manifest file, as the server wrote it back (rotation, status)."""
    return parse_token_secret(next(d for d in yaml.safe_load_all(path.read_text()) if d and is_token_secret(d)))


def build_token_secret(
    *,
    namespace: str,
    nodepool: str,
    token: str,
    machineconfigs_yaml: str = "",
    old_token: str | None = None,
    release: str = "quay.io/openshift-release-dev/ocp-release@sha256:" + "0" * 64,
    release_version: str = "4.17.3",
    generation_time: float | None = None,
    suffix: str = "00000000",
) -> dict[str, Any]:
    """A token Secret as the reference (HyperShift) writes it."""
    pool_name = nodepool.partition("/")[2]
    data = {
        "token": base64.b64encode(token.encode()).decode(),
        "release": base64.b64encode(release.encode()).decode(),
        "release-version": base64.b64encode(release_version.encode()).decode(),
        "config": base64.b64encode(encode_config(machineconfigs_yaml) if machineconfigs_yaml else b"").decode(),
    }
    if old_token:
        data["old_token"] = base64.b64encode(old_token.encode()).decode()
    notes = {ANNOTATION_IGNITION_CONFIG: "true", ANNOTATION_NODEPOOL: nodepool}
    if generation_time is not None:
        notes[ANNOTATION_TOKEN_GENERATION] = format_time(generation_time)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"token-{pool_name}-{suffix}", "namespace": namespace, "annotations": notes},
        "type": "Opaque",
        "data": data,
    }


def secret_volume(directory: Path, files: dict[str, bytes], version: str) -> None:
    """`directory` as the kubelet writes a Secret volume: the keys are links through `..data`
    to a versioned directory, and an update swaps `..data` to a new one (renamed into place)."""
    versioned = directory / f"..{version}"
    versioned.mkdir(parents=True)
    for name, data in files.items():
        (versioned / name).write_bytes(data)
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
    (directory / "..data_tmp").symlink_to(versioned.name)
    (directory / "..data_tmp").rename(directory / "..data")
