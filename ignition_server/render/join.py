"""What a node needs to join its cluster: bootstrap kubeconfig, pull secret, CA bundles.

From the same objects the reference reads (DESIGN §4): ``bootstrap-kubeconfig``,
``pull-secret``, ``user-ca-bundle``. Paths are where RHCOS/MCO expect them:

- ``/etc/kubernetes/kubeconfig`` (0600): the kubelet's ``--bootstrap-kubeconfig``;
- ``/var/lib/kubelet/config.json`` (0600): the pull secret CRI-O and the kubelet use;
- ``/etc/pki/ca-trust/source/anchors/openshift-config-user-ca-bundle.crt`` (0644): the
  additional trust bundle (RHCOS runs ``update-ca-trust`` at boot);
- ``/etc/kubernetes/kubelet-ca.crt`` (0644), only when given: the CA the kubelet trusts
  for client certificates (the kube-apiserver's kubelet client CA).

Inputs that are absent are left out and named in ``missing`` (for ``data.message``);
inputs that are present but malformed raise :class:`InvalidConfig`. Pure; no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import yaml

from .. import bounded_yaml
from .fragments import file_entry, fragment
from .inputs import InvalidConfig, refusal

__all__ = [
    "JoinInputs",
    "BOOTSTRAP_KUBECONFIG_PATH",
    "PULL_SECRET_PATH",
    "USER_CA_BUNDLE_PATH",
    "KUBELET_CA_PATH",
    "merge_ca_bundles",
    "render_join_fragment",
]

BOOTSTRAP_KUBECONFIG_PATH = "/etc/kubernetes/kubeconfig"
PULL_SECRET_PATH = "/var/lib/kubelet/config.json"
USER_CA_BUNDLE_PATH = "/etc/pki/ca-trust/source/anchors/openshift-config-user-ca-bundle.crt"
KUBELET_CA_PATH = "/etc/kubernetes/kubelet-ca.crt"

_PEM_CERT_RE = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+?-----END CERTIFICATE-----"
)


@dataclass(frozen=True)
class JoinInputs:
    bootstrap_kubeconfig: bytes | None = None
    pull_secret: bytes | None = None  # .dockerconfigjson
    ca_bundles: tuple[bytes, ...] = field(default_factory=tuple)  # user-ca-bundle(s), PEM
    kubelet_ca: bytes | None = None  # optional: /etc/kubernetes/kubelet-ca.crt

    def __post_init__(self) -> None:
        object.__setattr__(self, "ca_bundles", tuple(bytes(b) for b in self.ca_bundles if b))

    @property
    def missing(self) -> tuple[str, ...]:
        """Names (as the source objects are called) of the inputs that were not given."""
        out = []
        if not self.bootstrap_kubeconfig:
            out.append("bootstrap-kubeconfig")
        if not self.pull_secret:
            out.append("pull-secret")
        if not self.ca_bundles:
            out.append("user-ca-bundle")
        return tuple(out)


def _check_kubeconfig(data: bytes) -> None:
    try:
        doc = bounded_yaml.load(data)
    except yaml.YAMLError as e:
        raise refusal(e, f"bootstrap kubeconfig is not YAML: {e}") from None
    if not isinstance(doc, dict) or not doc.get("clusters") or not doc.get("users"):
        raise InvalidConfig("bootstrap kubeconfig has no clusters or no users")
    if doc.get("kind", "Config") != "Config":
        raise InvalidConfig(f"bootstrap kubeconfig has kind {doc.get('kind')!r}, expected Config")


def _check_pull_secret(data: bytes) -> None:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidConfig(f"pull secret is not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("auths"), dict):
        raise InvalidConfig("pull secret has no 'auths' object (expected a .dockerconfigjson)")


def merge_ca_bundles(bundles: tuple[bytes, ...] | list[bytes], what: str = "CA bundle") -> bytes:
    """Concatenate PEM bundles, keeping each certificate once (first occurrence wins)."""
    seen: set[bytes] = set()
    out: list[bytes] = []
    for i, bundle in enumerate(bundles):
        certs = _PEM_CERT_RE.findall(bundle)
        if not certs:
            raise InvalidConfig(f"{what} #{i + 1} holds no PEM certificate")
        for cert in certs:
            cert = cert.replace(b"\r\n", b"\n")
            if cert not in seen:
                seen.add(cert)
                out.append(cert)
    return b"\n".join(out) + b"\n"


def render_join_fragment(inputs: JoinInputs) -> dict:
    """Ignition fragment with the join files that are present (see ``inputs.missing``)."""
    files = []
    if inputs.bootstrap_kubeconfig:
        _check_kubeconfig(inputs.bootstrap_kubeconfig)
        files.append(file_entry(BOOTSTRAP_KUBECONFIG_PATH, inputs.bootstrap_kubeconfig, 0o600))
    if inputs.pull_secret:
        _check_pull_secret(inputs.pull_secret)
        files.append(file_entry(PULL_SECRET_PATH, inputs.pull_secret, 0o600))
    if inputs.ca_bundles:
        files.append(file_entry(USER_CA_BUNDLE_PATH, merge_ca_bundles(inputs.ca_bundles, "user-ca-bundle"), 0o644))
    if inputs.kubelet_ca:
        files.append(file_entry(KUBELET_CA_PATH, merge_ca_bundles((inputs.kubelet_ca,), "kubelet CA"), 0o644))
    return fragment(files)
