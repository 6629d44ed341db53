"""Issue 9, item 1, as the operator met it, through the real server process: a token
Secret's file broken by hand, then a newer generation for its NodePool. The expiry
write-back to the broken file fails; the reconciler must go on applying every later change."""

from __future__ import annotations

import json
from pathlib import Path

from testsupport.harness import ServerProcess, bearer, wait_for, write_manifests
from testsupport.serving import token_secret, wait_rendered

OLD = "clusters-demo/token-p-0a0a0a0a"
EXPIRY_ERRORS = 'ign_server_watch_errors_total{step="expiry"}'


def generation(pool: str, token: str, suffix: str, created: str) -> dict:
    obj = token_secret(pool, token, suffix=suffix)
    obj["metadata"]["creationTimestamp"] = created
    return obj


def test_a_manifest_broken_by_hand_stops_nothing(tmp_path: Path) -> None:
    source = tmp_path / "source"
    old_path = write_manifests(source / "p-old.yaml", generation("p", "tok-old", "0a0a0a0a", "2027-01-01T00:00:00Z"))
    proc = ServerProcess(source, tmp_path / "cache")
    try:
        proc.start()
        wait_rendered(proc, 1)
        assert proc.get("/ignition", bearer("tok-old"))[0] == 200
        broken = old_path.read_text().replace("kind: Secret", "kind: [Secret")  # a YAML syntax error
        old_path.write_text(broken)
        write_manifests(source / "p-new.yaml", generation("p", "tok-new", "1b1b1b1b", "2027-01-02T00:00:00Z"))
        wait_for(lambda: proc.get("/ignition", bearer("tok-new"))[0] == 200, timeout=30)
        # A NodePool added afterwards is applied (it answered 511 for ever before).
        write_manifests(source / "q.yaml", token_secret("q", "tok-q", suffix="2c2c2c2c"))
        wait_for(lambda: proc.get("/ignition", bearer("tok-q"))[0] == 200, timeout=30)
        # Retried with back-off, logged once, and the broken file left as the operator left it.
        wait_for(lambda: proc.metrics().get(EXPIRY_ERRORS, 0) >= 2, timeout=30)
        assert old_path.read_text() == broken
        lines = [json.loads(line) for line in proc.logs().splitlines() if line.startswith("{")]
        failed = [r for r in lines if r.get("level") in ("ERROR", "error") and OLD in r.get("message", r.get("msg", ""))]
        assert len(failed) == 1, failed
        assert "Task exception was never retrieved" not in proc.logs()
        assert proc.stop() == 0
    finally:
        proc.kill()
