"""The Secret `ignition-server-ca-cert` of a taken-over HostedControlPlane, and what the
Kubernetes source keeps of the Secrets the takeover reads. Pure, as `plan` is.

HyperShift's NodePool controller GETs this Secret in the control-plane namespace and puts its
`tls.crt` in every pointer config it makes (NotFound: IgnitionCACertMissing, no token Secret);
it reads nothing else of it. Ours carries this server's CA bundle there, the type the CPO gives
it (`kubernetes.io/tls`, immutable: the CPO can take it back) and an empty `tls.key`: the CA's
key never goes into the cluster's namespace.

Under the annotation the CPO deletes the Secret on every reconcile, but skips one that already
has a deletionTimestamp. So ours carries a finalizer from its creation: the CPO's DELETE only
marks it, and it stays readable by GET. A finalizer cannot be added to an object already being
deleted: one being deleted without ours is left to go, and made again once gone. The finalizer
is removed (and the Secret deleted) when the HCP loses the annotation or is deleted, so that the
CPO makes its own again and a namespace deletion never hangs on it (`release`).
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ignition_server.model.objects import ObjectKey
from ignition_server.takeover import core_ignition, mcs_config
from ignition_server.takeover.owned import Named, owner_reference, ssh_key_secret_name, taken_over

NAME = "ignition-server-ca-cert"
TYPE = "kubernetes.io/tls"
CERT_KEY, KEY_KEY = "tls.crt", "tls.key"
FINALIZER = "ignition-server.openshift.io/ca-cert"
LABEL = "ignition-server.openshift.io/ca-cert"  # ours: the source keeps it whatever the HCP says
ROOT_CA_KEY = "ca.key"


def is_ours(obj: Mapping[str, Any]) -> bool:
    """A CA Secret this server made (judged on metadata alone)."""
    meta = obj.get("metadata") or {}
    return meta.get("name") == NAME and (
        LABEL in (meta.get("labels") or {}) or FINALIZER in (meta.get("finalizers") or []))


# The ConfigMaps a takeover reads (its inputs) and keeps (what `plan` writes or deletes).
_CONFIG_MAPS = (Named.KUBELET_CLIENT_CA, Named.TRUSTED_CA_BUNDLE, mcs_config.NAME, *core_ignition.CORE_NAMES)


def references(obj: Mapping[str, Any]) -> Iterable[ObjectKey]:
    """The Secrets and ConfigMaps an annotated HCP's takeover reads, in its namespace, for the source
    to fetch (none for any other object: a namespace whose HCP is not taken over has none fetched
    for the takeover)."""
    if obj.get("kind") != "HostedControlPlane" or not taken_over(dict(obj)):
        return ()
    namespace = str((obj.get("metadata") or {}).get("namespace") or "")
    secrets = [Named.ROOT_CA, Named.PULL_SECRET, NAME, ssh_key_secret_name(dict(obj))]
    return [*(ObjectKey("Secret", namespace, name) for name in secrets if name),
            *(ObjectKey("ConfigMap", namespace, name) for name in _CONFIG_MAPS)]


def trim_secret(obj: dict[str, Any]) -> dict[str, Any]:
    """What the source keeps of a fetched Secret: `root-ca` without `ca.key` (the hosted
    cluster's root CA key: the takeover reads only `ca.crt`), and `ignition-server-ca-cert`
    without a non-empty `tls.key` (the CPO's own CA key, on a cluster switching over). Dropped
    here, before the object is kept anywhere, so the server never holds those keys."""
    name = (obj.get("metadata") or {}).get("name")
    data = obj.get("data") or {}
    if name == Named.ROOT_CA and ROOT_CA_KEY in data:
        return {**obj, "data": {k: v for k, v in data.items() if k != ROOT_CA_KEY}}
    if name == NAME and data.get(KEY_KEY):
        # Absent rather than empty: ours has it empty, so the CPO's reads as one to replace.
        return {**obj, "data": {k: v for k, v in data.items() if k != KEY_KEY}}
    return obj


def wanted(hcp: dict[str, Any], ca_pem: bytes) -> dict[str, Any]:
    """The CA Secret to keep for `hcp`."""
    meta = hcp["metadata"]
    return {"apiVersion": "v1", "kind": "Secret", "type": TYPE,
            "metadata": {"name": NAME, "namespace": meta["namespace"], "labels": {LABEL: "true"},
                         "finalizers": [FINALIZER], "ownerReferences": [owner_reference(hcp)]},
            "data": {CERT_KEY: base64.b64encode(ca_pem).decode(), KEY_KEY: ""}}


@dataclass(frozen=True)
class Step:
    """One write: `create` (object), `replace` (object, with the resourceVersion read), `delete`
    (object as read), or `wait` (nothing can be done until the object changes: `why`)."""

    action: str
    obj: dict[str, Any]
    why: str = ""


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def keep(existing: dict[str, Any] | None, want: dict[str, Any]) -> Step | None:
    """The step that brings `existing` (as the source keeps it, trimmed) to `want`; None when it is."""
    if existing is None:
        return Step("create", copy.deepcopy(want))
    meta = existing.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if existing.get("type") != TYPE:
        if deleting(existing):
            return Step("wait", existing, f"Secret {NAME} of type {existing.get('type')} is being deleted; made again once gone")
        return Step("delete", existing)  # the type is immutable: made again with ours
    if deleting(existing) and FINALIZER not in finalizers:
        return Step("wait", existing, f"Secret {NAME} is being deleted without our finalizer (it takes no new one); "
                                      "made again once gone")
    out = copy.deepcopy(existing)
    out_meta = out.setdefault("metadata", {})
    out_meta["labels"] = {**(meta.get("labels") or {}), LABEL: "true"}
    if FINALIZER not in finalizers:
        out_meta["finalizers"] = [*finalizers, FINALIZER]
    owner = want["metadata"]["ownerReferences"][0]
    refs = list(meta.get("ownerReferences") or [])
    if not any(r.get("kind") == owner["kind"] and r.get("name") == owner["name"] for r in refs):
        out_meta["ownerReferences"] = [*refs, owner]
    out["data"] = dict(want["data"])
    return None if out == existing else Step("replace", out)


def release(existing: dict[str, Any] | None) -> list[Step]:
    """Our CA Secret let go: finalizer removed (the API server then deletes it, if it is being
    deleted), and deleted (so that the CPO makes its own). Nothing for a Secret not ours."""
    if existing is None or not is_ours(existing):
        return []
    meta = existing.get("metadata") or {}
    steps = []
    if FINALIZER in (meta.get("finalizers") or []):
        out = copy.deepcopy(existing)
        out["metadata"]["finalizers"] = [f for f in meta["finalizers"] if f != FINALIZER]
        # The data as the API holds it: what the source kept lacks nothing of ours (tls.key is empty).
        steps.append(Step("replace", out))
    if not deleting(existing):
        steps.append(Step("delete", existing))
    return steps
