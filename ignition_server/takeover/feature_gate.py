"""The FeatureGate HyperShift's ignition-server Deployment would carry for a HostedControlPlane.

The CPO (control-plane-operator/controllers/hostedcontrolplane/v2/ignitionserver/deployment.go)
puts `FeatureGate{TypeMeta, ObjectMeta{Name: "cluster"}, Spec: *spec.configuration.featureGate}`,
printed by api.YamlSerializer, into the `fetch-feature-gate` init container's FEATURE_GATE_YAML
when the HCP sets one; otherwise the asset's `spec: {}` stays. The ignition server hands that file
to the release's `render`, whose FeatureGate the MCO's bootstrap reads (kubelet's featureGates,
the templates a gate selects). Without a takeover, the server runs the asset's default.
"""

from __future__ import annotations

from typing import Any

from . import go_json, go_yaml

# The ignition-server asset's FEATURE_GATE_YAML (v2/assets/ignition-server/deployment.yaml).
DEFAULT = "apiVersion: config.openshift.io/v1\nkind: FeatureGate\nmetadata:\n  creationTimestamp: null\n" \
          "  name: cluster\nspec: {}\nstatus:\n  featureGates: null\n"
_SPEC = "github.com/openshift/api/config/v1.FeatureGateSpec"


def manifest(hcp: dict[str, Any]) -> str:
    """The FeatureGate YAML the CPO would give HyperShift's ignition server for this HCP."""
    spec = (((hcp.get("spec") or {}).get("configuration")) or {}).get("featureGate")
    if spec is None:
        return DEFAULT
    gate = {"apiVersion": "config.openshift.io/v1", "kind": "FeatureGate",
            "metadata": {"creationTimestamp": None, "name": "cluster"},
            "spec": go_json.GoValue.of(spec, {"struct": _SPEC}).out,
            "status": {"featureGates": None}}
    return go_yaml.dump(gate)
