"""What a NodePool's payload is rendered from: one immutable value per NodePool generation.

The reconciler builds these from the source; renderers only read them. `digest()` names the
inputs, so an unchanged NodePool is never rendered twice (across restarts too).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

# Bump when a renderer's output changes for the same inputs, so stored payloads re-render.
RENDERER_GENERATION = 2


class InvalidConfig(ValueError):
    """The inputs cannot make a valid payload; the message says why, for `data.message`."""


class RefusedInput(InvalidConfig):
    """An input over a size bound: the same inputs are refused again, so not retried (a
    retry loop would pay the refusal's cost again and again); a changed input is rendered."""


def refusal(exc: Exception, message: str) -> InvalidConfig:
    """`message` as an InvalidConfig, a RefusedInput when `exc` was a bound's refusal."""
    # Imported here: render.spec (a serving worker's) needs this module, not YAML (~10% of its imports).
    from ..bounded_yaml import OverBounds

    return (RefusedInput if isinstance(exc, OverBounds) else InvalidConfig)(message)


Settings = tuple[tuple[str, str], ...]  # a ConfigMap's `data`, sorted: hashable and canonical


@dataclass(frozen=True)
class NodePoolInputs:
    nodepool: str  # "<namespace>/<name>" of the NodePool object
    secret: str  # "<namespace>/<name>" of the token Secret this generation comes from
    machineconfigs_yaml: str  # decoded `config`: multi-document MachineConfig YAML, may be ""
    # Digest of the `config` value the YAML comes from. The reconciler decides whether to render
    # from inputs gathered without the YAML (it is read again only for a render).
    config_digest: str = ""
    release: str = ""  # release pull spec, carried as given
    release_version: str = ""
    # Inputs the source did not hold, named for `data.message` ("pull-secret", ...).
    missing: tuple[str, ...] = field(default_factory=tuple)
    # What a node needs to join (DESIGN §4), as the source holds them; None: not held.
    pull_secret: str | None = None  # .dockerconfigjson
    bootstrap_kubeconfig: str | None = None
    ca_bundle: str | None = None  # user-ca-bundle, PEM
    # The node-local kube-apiserver proxy and IBM Cloud VPC settings (ConfigMap data).
    apiserver_proxy: Settings | None = None
    ibmcloud_vpc: Settings | None = None
    # The release's `haproxy-router` image; None when the release catalog does not know
    # the release (only an error for payloads that need it).
    haproxy_image: str | None = None
    # MCO's base configuration for this cluster and release (multi-document MachineConfig
    # YAML, reconcile/bases.py); None: no base, the payload is the NodePool's MachineConfigs and
    # the server's additions only, without the machine-config-server's appended files.
    mco_base_yaml: str | None = None
    # The release's `rhel-coreos` and `rhel-coreos-extensions` images (release catalog).
    os_image_url: str = ""
    extensions_image: str = ""
    # The CA files the machine-config-server adds (ConfigMaps `kubelet-ca`: ca.crt and
    # `cloud-provider-ca`: ca-bundle.pem); None: not held.
    kubelet_ca: str | None = None
    cloud_ca: str | None = None
    # The cluster-wide proxy (ConfigMap `cluster-proxy` data); None: no proxy.
    cluster_proxy: Settings | None = None

    def digest(self) -> str:
        fields = asdict(self)
        yaml_text = fields.pop("machineconfigs_yaml")
        if not fields["config_digest"]:
            fields["config_digest"] = hashlib.sha256(yaml_text.encode()).hexdigest()
        canonical = json.dumps({"generation": RENDERER_GENERATION, **fields}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class RenderedPayload:
    # Canonical Ignition JSON whose first bytes are {"ignition":{"version":"3.N.0" with
    # N = min_version, so any later version is served by rewriting that one field.
    body: bytes
    min_version: str  # lowest spec version ("3.N.0") that expresses this payload
    notes: tuple[str, ...] = ()  # what `data.message` should say besides errors
