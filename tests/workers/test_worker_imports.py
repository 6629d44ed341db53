"""A serving worker's start path: what it imports before it can serve (its part of `/readyz`, issue 33)."""

from __future__ import annotations

import subprocess
import sys

# Modules a serving worker never needs to start: YAML (the owner parses the source) and PyJWT
# (only a service-account token's check, imported on first use); nor Prometheus (a worker
# reports its counts to the owner) or the JWT checks (a worker hands JWTs to its owner): ~1 MiB
# of each worker's RSS (issue 33).
NOT_ON_THE_WORKERS_START = ("yaml", "jwt", "prometheus_client", "ignition_server.metrics", "ignition_server.auth.jwt",
                            "ignition_server.auth.jwks")


def test_a_serving_worker_starts_without_yaml_pyjwt_prometheus_or_the_jwt_checks() -> None:
    code = ("import sys, ignition_server.workers.worker; "
            f"print(' '.join(m for m in {NOT_ON_THE_WORKERS_START!r} if m in sys.modules))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert found == []
