"""Token Secrets as HyperShift writes them, for the tests and the benchmarks' fleets.

The server only reads them (`ignition_server/model/token_secret.py` parses what this writes).
"""

from __future__ import annotations

import base64
from typing import Any

from ignition_server.model.token_secret import (
    ANNOTATION_IGNITION_CONFIG,
    ANNOTATION_NODEPOOL,
    ANNOTATION_TOKEN_GENERATION,
    encode_config,
    format_time,
)


def build_token_secret(
    *,
    namespace: str,
    nodepool: str,
    token: str,
    machineconfigs_yaml: str = "",
    old_token: str | None = None,
    release: str = "quay.io/openshift-release-dev/ocp-release@sha256:" + "0" * 64,
    release_version: str = "4.17.3",
    generation_time: float | None = None,
    suffix: str = "00000000",
) -> dict[str, Any]:
    """A token Secret as the reference (HyperShift) writes it."""
    pool_name = nodepool.partition("/")[2]
    data = {
        "token": base64.b64encode(token.encode()).decode(),
        "release": base64.b64encode(release.encode()).decode(),
        "release-version": base64.b64encode(release_version.encode()).decode(),
        "config": base64.b64encode(encode_config(machineconfigs_yaml) if machineconfigs_yaml else b"").decode(),
    }
    if old_token:
        data["old_token"] = base64.b64encode(old_token.encode()).decode()
    notes = {ANNOTATION_IGNITION_CONFIG: "true", ANNOTATION_NODEPOOL: nodepool}
    if generation_time is not None:
        notes[ANNOTATION_TOKEN_GENERATION] = format_time(generation_time)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"token-{pool_name}-{suffix}", "namespace": namespace, "annotations": notes},
        "type": "Opaque",
        "data": data,
    }
