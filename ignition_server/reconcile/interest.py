"""Which objects the reconciler reads: what a source that sees only metadata (the Kubernetes
source, for Secrets and ConfigMaps alike) fetches in full, and no others. A namespace also holds
keys this server has no business keeping (a service-account signing key), and a tenant may fill
its namespace with ConfigMaps and Secrets of any size: only what a NodePool reads is kept whole,
so memory is bounded by the inputs, not by what a tenant creates."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..model.objects import ManifestError, ObjectKey, annotations_of
from ..model.token_secret import is_token_secret, parse_token_secret
from .bases import is_base
from .claims import is_claims_object
from .generated_bases import CLOUD_CONFIGS, CLUSTER_CONFIG, is_generated_base
from .inputs import JOIN_INPUTS, MCS_INPUTS, SETTINGS_INPUTS, input_key
from .releases import is_catalog
from .tenancy import OutsideTenancy, Tenancy
from .trust import is_trust_object

USER_DATA_PREFIX = "user-data-"  # the pointer configs this server writes (HyperShift's naming)
# Every input a NodePool may read, by convention or named by annotation (gather.py, generated_bases.py).
_INPUTS = JOIN_INPUTS + SETTINGS_INPUTS + MCS_INPUTS + (CLUSTER_CONFIG, *CLOUD_CONFIGS.values())
_INPUT_SECRET_NAMES = frozenset(i.name for i in _INPUTS if i.kind == "Secret")
_INPUT_CONFIG_MAP_NAMES = frozenset(i.name for i in _INPUTS if i.kind == "ConfigMap")


def object_wanted(obj: Mapping[str, Any]) -> bool:
    """Whether to fetch and keep the object whole, judged on its metadata (kind, name, annotations)."""
    kind = obj.get("kind")
    if kind == "Secret":
        return secret_wanted(obj)
    if kind == "ConfigMap":
        return config_map_wanted(obj)
    return True


def config_map_wanted(obj: Mapping[str, Any]) -> bool:
    """Judged on metadata alone: an input by its conventional name, or an object annotated as
    one the reconciler reads (release catalog, MCO base, published generated base, keys)."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    return name in _INPUT_CONFIG_MAP_NAMES or is_catalog(obj) or is_base(obj) or is_generated_base(obj) \
        or is_trust_object(obj)


def secret_wanted(obj: Mapping[str, Any]) -> bool:
    """Judged on metadata alone (kind, name, annotations)."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    return (
        is_token_secret(obj) or is_trust_object(obj) or is_claims_object(obj) or name in _INPUT_SECRET_NAMES
        or name.startswith(USER_DATA_PREFIX)
    )


def inputs_referenced(obj: Mapping[str, Any], tenancy: Tenancy | None = None) -> Iterable[ObjectKey]:
    """The inputs (Secrets and ConfigMaps) a token Secret names by annotation (in a shared namespace, say).

    A reference the tenancy refuses is left out: never fetched (the watcher refuses the NodePool)."""
    if not is_token_secret(obj):
        return ()
    try:
        secret = parse_token_secret(obj)
        notes = annotations_of(obj)
    except (ManifestError, ValueError, KeyError):
        return ()
    keys = []
    for wanted in _INPUTS:
        try:
            keys.append(input_key(secret, wanted, notes, tenancy))
        except (OutsideTenancy, ManifestError):
            continue
    return keys
