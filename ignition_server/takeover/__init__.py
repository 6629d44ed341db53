"""Taking over from HyperShift's ignition server: what the control-plane-operator stops writing
for a HostedControlPlane annotated `hypershift.openshift.io/disable-ignition-server`, computed
from the HCP and the objects it names, as the CPO's own code computes it. Pure: objects in,
objects out; the Kubernetes side (watching HCPs, writing these) is wired elsewhere.

- `mcs_config.py`: the `machine-config-server` ConfigMap and its `configuration-hash`;
- `core_ignition.py`: the core ignition ConfigMaps the NodePool controller counts;
- `plan.py`: what to create, update or delete for one HCP given its namespace's ConfigMaps
  (the CPO's createOrUpdate merge; nothing when nothing changed);
- `cluster_config.py`: the config.openshift.io objects the CPO derives from the HCP;
- `owned.py`: the HCP as owner, the annotation, the named inputs;
- `go_json.py`, `go_yaml.py`, `go_emitter.py`: Go's encoding/json through the Go types' shape,
  and the YAML HyperShift's serializer prints (go-yaml's scalar rules on PyYAML's emitter), so
  that every key is byte for byte the CPO's; what the CPO's serializer refuses, we refuse
  (`go_yaml.NotSerializable`: the CPO then writes nothing).
  `go_types.json` is that shape, printed by `go_types.go` run inside a HyperShift checkout
  (its header says how); regenerate it when HyperShift's vendored openshift/api moves.
"""
