"""Which Secrets the reconciler reads: what a source that sees only Secrets' metadata (the
Kubernetes source) fetches in full, and no others (a namespace also holds keys this server
has no business keeping, such as a service-account signing key)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..model.objects import ManifestError, ObjectKey, annotations_of
from ..model.token_secret import is_token_secret, parse_token_secret
from .inputs import JOIN_INPUTS, SETTINGS_INPUTS, input_key
from .tenancy import OutsideTenancy, Tenancy
from .trust import is_trust_object

USER_DATA_PREFIX = "user-data-"  # the pointer configs this server writes (HyperShift's naming)
_INPUT_SECRET_NAMES = frozenset(i.name for i in JOIN_INPUTS + SETTINGS_INPUTS if i.kind == "Secret")


def secret_wanted(obj: Mapping[str, Any]) -> bool:
    """Judged on metadata alone (kind, name, annotations)."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    return (
        is_token_secret(obj) or is_trust_object(obj) or name in _INPUT_SECRET_NAMES or name.startswith(USER_DATA_PREFIX)
    )


def secrets_referenced(obj: Mapping[str, Any], tenancy: Tenancy | None = None) -> Iterable[ObjectKey]:
    """The input Secrets a token Secret names by annotation (in a shared namespace, say).

    A reference the tenancy refuses is left out: never fetched (the reconciler refuses the NodePool)."""
    if not is_token_secret(obj):
        return ()
    try:
        secret = parse_token_secret(obj)
        notes = annotations_of(obj)
    except (ManifestError, ValueError, KeyError):
        return ()
    keys = []
    for wanted in JOIN_INPUTS + SETTINGS_INPUTS:
        if wanted.kind != "Secret":
            continue
        try:
            keys.append(input_key(secret, wanted, notes, tenancy))
        except (OutsideTenancy, ManifestError):
            continue
    return keys
