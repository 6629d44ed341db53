"""The objects a NodePool reads besides its token Secret, and where each is read from.

By namespace convention (the token Secret's namespace), unless an annotation on the token
Secret, `ignition-server.openshift.io/input-<name>: <namespace>/<object>`, points one input
elsewhere, only into a namespace the tenancy allows and, there, only at an object the operator
marked shareable (tenancy.py). gather.py reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..model.objects import ManifestError, ObjectKey
from ..model.token_secret import TokenSecret
from .tenancy import Tenancy

ANNOTATION_INPUT_PREFIX = "ignition-server.openshift.io/input-"


@dataclass(frozen=True)
class InputObject:
    kind: str
    name: str  # the conventional object name, also the input's name in messages
    key: str | None  # the data key read; None: the whole data (settings)


JOIN_INPUTS = (
    InputObject("Secret", "pull-secret", ".dockerconfigjson"),
    InputObject("Secret", "bootstrap-kubeconfig", "kubeconfig"),
    InputObject("ConfigMap", "user-ca-bundle", "ca-bundle.crt"),
)
SETTINGS_INPUTS = (
    InputObject("ConfigMap", "apiserver-proxy", None),
    InputObject("ConfigMap", "ibmcloud-vpc", None),
    InputObject("ConfigMap", "cluster-proxy", None),
)

# Only a payload with an MCO base reads these (the machine-config-server's CA files); absent
# is normal, so they are not named as missing.
MCS_INPUTS = (
    InputObject("ConfigMap", "kubelet-ca", "ca.crt"),
    InputObject("ConfigMap", "cloud-provider-ca", "ca-bundle.pem"),
)

Lookup = Callable[[ObjectKey], Mapping[str, Any] | None]


def input_key(secret: TokenSecret, wanted: InputObject, notes: Mapping[str, str],
              tenancy: Tenancy | None = None) -> ObjectKey:
    """Where the input is read. With a `tenancy`, a reference it does not allow raises
    OutsideTenancy (a ManifestError) before anyone could fetch it; None: no wall (the CLI's
    `render`, whose directory only the operator writes)."""
    ref = str(notes.get(ANNOTATION_INPUT_PREFIX + wanted.name, "")).strip()
    if ref:
        namespace, _, name = ref.partition("/")
        if not name:
            raise ManifestError(f"annotation {ANNOTATION_INPUT_PREFIX}{wanted.name} must be <namespace>/<name>, got {ref!r}")
        if tenancy is not None:
            tenancy.check(secret.key.namespace, wanted.kind, namespace, name, f"annotation {ANNOTATION_INPUT_PREFIX}{wanted.name}")
        return ObjectKey(wanted.kind, namespace, name)
    return ObjectKey(wanted.kind, secret.key.namespace, wanted.name)
