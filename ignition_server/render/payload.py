"""NodePoolInputs → RenderedPayload: the NodePool's MachineConfigs merged into one Ignition
config, validated as the client would read it, encoded canonically. Pure and deterministic.
"""

from __future__ import annotations

from .inputs import InvalidConfig, NodePoolInputs, RenderedPayload
from .machineconfig import merge_machineconfigs, parse_machineconfigs
from .spec import encode, minimum_version_reason, validate


def render_payload(inputs: NodePoolInputs) -> RenderedPayload:
    """Render the payload of one NodePool generation; raises InvalidConfig saying why not.

    Notes: one line per input the source did not hold, then what the merge left out, then
    (when above 3.0.0) which feature sets the minimum spec version.
    """
    config, merge_notes = merge_machineconfigs(parse_machineconfigs(inputs.machineconfigs_yaml))
    version, reason = minimum_version_reason(config)
    config["ignition"]["version"] = version
    validate(config, version)
    body = encode(config, version)
    notes = [f"{name} not in the source: left out of the payload" for name in inputs.missing]
    notes += merge_notes
    if reason:
        notes.append(f"payload needs Ignition spec {version} ({reason})")
    return RenderedPayload(body=body, min_version=version, notes=tuple(notes))


__all__ = ["InvalidConfig", "render_payload"]
