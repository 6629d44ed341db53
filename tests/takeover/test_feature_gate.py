"""The FeatureGate a taken-over HCP's ignition-server Deployment would carry (takeover/feature_gate.py),
against what the CPO's code prints (api.YamlSerializer of FeatureGate{name: cluster, spec}): the
asset's default as HyperShift's deployment.yaml holds it, and the HCP's spec, keys sorted."""

from __future__ import annotations

from ignition_server.takeover import feature_gate

# v2/assets/ignition-server/deployment.yaml, the init container's FEATURE_GATE_YAML (HyperShift 3ee96155).
ASSET = """\
apiVersion: config.openshift.io/v1
kind: FeatureGate
metadata:
  creationTimestamp: null
  name: cluster
spec: {}
status:
  featureGates: null
"""


def hcp(gate: object) -> dict:
    return {"spec": {"configuration": {"featureGate": gate}}}


def test_without_a_feature_gate_the_assets_default() -> None:
    assert feature_gate.manifest({"spec": {}}) == ASSET
    assert feature_gate.manifest(hcp(None)) == feature_gate.DEFAULT


def test_the_hcps_feature_gate_as_the_cpo_prints_it() -> None:
    assert feature_gate.manifest(hcp({"featureSet": "TechPreviewNoUpgrade"})) == (
        "apiVersion: config.openshift.io/v1\nkind: FeatureGate\nmetadata:\n  creationTimestamp: null\n  name: cluster\n"
        "spec:\n  featureSet: TechPreviewNoUpgrade\nstatus:\n  featureGates: null\n")
    custom = feature_gate.manifest(hcp({"featureSet": "CustomNoUpgrade",
                                        "customNoUpgrade": {"enabled": ["B", "A"], "disabled": None}}))
    assert "spec:\n  customNoUpgrade:\n    enabled:\n    - B\n    - A\n  featureSet: CustomNoUpgrade\n" in custom
    assert feature_gate.manifest(hcp({})) == feature_gate.DEFAULT  # an empty spec prints as `spec: {}`
