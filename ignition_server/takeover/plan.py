"""What to write for one HostedControlPlane, given what its namespace holds: the CPO's
createOrUpdate over the ConfigMaps of `mcs_config` and `core_ignition`, decided without I/O.

`plan(hcp, named, existing)` says which ConfigMaps to create or update (each the object to PUT,
carrying the resourceVersion it was decided from) and which to delete (the mirrors' once the HCP
has none); an unchanged input plans nothing, so a re-list writes nothing. Updates merge as the CPO's do: the HCP's owner reference
ensured, our labels added to whatever labels are there, `data` replaced whole.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping

from ignition_server.takeover import core_ignition, mcs_config
from ignition_server.takeover.owned import Named, taken_over

MANAGED = (mcs_config.NAME, *core_ignition.CORE_NAMES)  # the ConfigMaps a plan reads, writes or deletes


@dataclass(frozen=True)
class Plan:
    writes: list[dict[str, Any]] = field(default_factory=list)  # with metadata.resourceVersion: update; without: create
    deletes: list[dict[str, Any]] = field(default_factory=list)  # the objects as read (delete with their uid/resourceVersion)
    error: str | None = None  # why the machine-config-server ConfigMap is not written (the core ones still are)


def desired(hcp: dict[str, Any], named: Named, managed_service: str = "") -> tuple[dict[str, dict[str, Any]], str | None]:
    """name -> the ConfigMap the CPO would write for `hcp`, in the CPO's order: the core ConfigMaps
    (MissingInput, NotSerializable: nothing at all), then machine-config-server (if its inputs
    fail, the core ConfigMaps alone, and why)."""
    wanted = core_ignition.core_config_maps(hcp, named)
    try:
        wanted[mcs_config.NAME] = mcs_config.mcs_config_map(hcp, named, managed_service)
    except ValueError as exc:  # MissingInput, NotSerializable, an HCP Go would not decode
        return wanted, str(exc)
    return wanted, None


def _same_owner(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """k8sutil.EnsureOwnerRef's match: the kind and name, and the apiVersion or the uid."""
    return a.get("kind") == b.get("kind") and a.get("name") == b.get("name") and (
        a.get("apiVersion") == b.get("apiVersion") or a.get("uid") == b.get("uid"))


def merged(existing: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """`existing` after the CPO's mutate: owner ensured, labels added, data replaced."""
    out = copy.deepcopy(existing)
    meta = out.setdefault("metadata", {})
    owner = wanted["metadata"]["ownerReferences"][0]
    refs = list(meta.get("ownerReferences") or [])
    at = next((i for i, ref in enumerate(refs) if _same_owner(ref, owner)), None)
    if at is None:
        refs.append(dict(owner))
    else:
        refs[at] = dict(owner)
    meta["ownerReferences"] = refs
    labels = wanted["metadata"].get("labels")
    if labels:
        meta["labels"] = {**(meta.get("labels") or {}), **labels}
    out["data"] = dict(wanted["data"])
    return out


def update_for(existing: dict[str, Any] | None, wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The object to write so that `existing` becomes what the CPO would leave, or None when it already is."""
    if existing is None:
        return copy.deepcopy(wanted)
    after = merged(existing, wanted)
    return None if after == existing else after


def plan(hcp: dict[str, Any], named: Named, existing: Mapping[str, dict[str, Any]], managed_service: str = "") -> Plan:
    """`existing`: the ConfigMaps of the HCP's namespace named in MANAGED, as read. Nothing for an
    HCP without the annotation: the CPO writes those itself. `managed_service`: the CPO's
    MANAGED_SERVICE (`serve --managed-service`)."""
    if not taken_over(hcp):
        return Plan()
    wanted, error = desired(hcp, named, managed_service)
    writes = [w for name, cm in wanted.items() if (w := update_for(existing.get(name), cm)) is not None]
    stale = set(core_ignition.CORE_NAMES) - set(core_ignition.names(hcp))
    deletes = [existing[name] for name in core_ignition.CORE_NAMES if name in stale and name in existing]
    return Plan(writes, deletes, error)
