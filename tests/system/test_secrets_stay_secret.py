"""Secrets stay secret: after good, bad and forged requests of both shapes, rotations and a
render failure, no token and no payload text is in any log line, metric, error body or file of
the cache dir, and the cache's files and folders are private."""

from __future__ import annotations

import base64
import stat
import time
from pathlib import Path

import yaml

from ignition_server.model.token_secret import parse_token_secret
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, bearer, wait_for, write_manifests
from testsupport.manifests import build_token_secret

PAYLOAD_MARKER = "payload-marker-5c1f"


def test_no_token_or_payload_text_leaks(tmp_path: Path) -> None:
    source = tmp_path / "source"
    machineconfig = EXAMPLE_MACHINECONFIG.format(name="workers").replace("hello%20from%20workers", PAYLOAD_MARKER)
    write_manifests(source / "good.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters/workers", token="tok-marker-good-0a1b",
        machineconfigs_yaml=machineconfig, generation_time=time.time()))
    write_manifests(source / "bad.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters/bad", token="tok-marker-bad-2c3d",
        machineconfigs_yaml="kind: [broken", generation_time=time.time()))
    # 12 s: the first token must still be listed when the payload is first served (two
    # rotations, 6 s with a 6 s TTL, could pass while a loaded machine starts the server).
    proc = ServerProcess(source, tmp_path / "cache", token_ttl="12s").start()
    tokens = {"tok-marker-good-0a1b", "tok-marker-bad-2c3d", "tok-marker-forged-4e5f"}
    bodies: list[bytes] = []
    try:
        wait_for(lambda: proc.get("/ignition", bearer("tok-marker-good-0a1b"))[0] == 200, timeout=30, what="served")
        for token in sorted(tokens):
            for path, headers in ((f"/config/workers?token={token}", {}), ("/ignition", bearer(token)),
                                  ("/ignition", {**bearer(token), "NodePool": "clusters/other"}),
                                  ("/ignition", {**bearer(token), "Accept": "application/vnd.coreos.ignition+json;version=3.0.0"})):
                status, _, body = proc.get(path, headers)
                if status != 200:
                    bodies.append(body)
        assert proc.get("/ignition", {"Authorization": "Bearer not-base64-tok-marker-forged-4e5f"})[0] == 401
        # Rotations (every 6 s here): the new tokens must not leak either.
        wait_for(lambda: parse_token_secret(next(d for d in yaml.safe_load_all((source / "good.yaml").read_text()) if d))
                 .token != "tok-marker-good-0a1b", timeout=30, what="a rotation")
        for name in ("good.yaml", "bad.yaml"):
            secret = parse_token_secret(next(d for d in yaml.safe_load_all((source / name).read_text()) if d))
            tokens |= set(secret.tokens())
        metrics = proc.get_metrics_text()
    finally:
        proc.stop()
    needles = {t.encode() for t in tokens} | {base64.b64encode(t.encode()) for t in tokens} | {PAYLOAD_MARKER.encode()}
    logs = proc.logs().encode()
    for needle in needles:
        assert needle not in logs, f"{needle!r} in the log"
        assert needle not in metrics, f"{needle!r} in the metrics"
        for body in bodies:
            assert needle not in body, f"{needle!r} in an error body"
        for file in proc.cache_dir.rglob("*"):
            if file.is_file():
                assert needle not in file.read_bytes(), f"{needle!r} in {file}"
    for path in [proc.cache_dir, *proc.cache_dir.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.is_dir():
            assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
        elif path.parent.name != "tls" or path.suffix == ".key":  # the CA certificate is public
            assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    # Manifests the server wrote hold tokens: user-data Secrets it made are its own (0600), token
    # Secrets it rotated (written 0644 here) keep their group's access but lose the world's.
    user_data = [manifest for manifest in source.rglob("*.yaml") if manifest.name.startswith("user-data")]
    assert user_data and all(stat.S_IMODE(m.stat().st_mode) == 0o600 for m in user_data)
    for name in ("good.yaml", "bad.yaml"):
        assert stat.S_IMODE((source / name).stat().st_mode) == 0o640, name
    key_file = proc.cache_dir.parent / "cache.key"
    assert key_file.exists() and stat.S_IMODE(key_file.stat().st_mode) == 0o600  # outside the dir it protects


def test_log_lines_are_redacted_whatever_logs_them() -> None:
    import logging

    from ignition_server.logs import JsonFormatter, TextFormatter

    # As aiohttp logs a request line that is too long: the token inside must not reach the log.
    record = logging.makeLogRecord({"name": "aiohttp.server", "levelno": logging.ERROR, "levelname": "ERROR",
                                    "msg": "Error handling request: %s",
                                    "args": ("bytearray(b'/config/w?token=tok-marker-9z HTTP/1.1') Authorization: Bearer dG9rLW1h",)})
    for formatter in (JsonFormatter(), TextFormatter()):
        line = formatter.format(record)
        assert "tok-marker-9z" not in line and "dG9rLW1h" not in line and "<redacted>" in line
