"""The command line: cache maintenance, userdata, flags from the environment, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, wait_for, write_manifests
from testsupport.manifests import build_token_secret


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ignition_server", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def served_cache(tmp_path: Path) -> None:
    """A cache at tmp_path/cache holding one rendered payload, its server stopped."""
    source = tmp_path / "source"
    write_manifests(source / "p.yaml", build_token_secret(
        namespace="ns", nodepool="ns/p", token="tok", machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="p"),
        generation_time=time.time()))
    proc = ServerProcess(source, tmp_path / "cache").start()
    wait_for(lambda: proc.metrics().get("ign_server_payload_cache_total") == 1, what="the payload rendered")
    assert proc.stop() == 0


def test_cache_commands_on_a_served_cache(tmp_path: Path) -> None:
    served_cache(tmp_path)
    stats = json.loads(run("cache", "stats", "--cache-dir", str(tmp_path / "cache")).stdout)
    assert stats["blob_count"] == 1 and stats["renders"] == 1
    assert len(stats["key_ids"]) == 1 and stats["format"] == "ignition-server-cache 1"  # the whole report, not only the counters
    verify = run("cache", "verify", "--cache-dir", str(tmp_path / "cache"))
    assert verify.returncode == 0 and json.loads(verify.stdout)["ok"] == 1
    # Tamper with the blob: verify finds it and quarantines it.
    blob = next(p for p in (tmp_path / "cache" / "blobs").rglob("*") if p.is_file())
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    tampered = run("cache", "verify", "--cache-dir", str(tmp_path / "cache"))
    report = json.loads(tampered.stdout)
    assert report["ok"] == 0 and len(report["quarantined"]) == 1
    assert tampered.returncode == 1  # a failed verification says so in its exit code
    gc = run("cache", "gc", "--cache-dir", str(tmp_path / "cache"))
    assert gc.returncode == 0 and "deleted" in json.loads(gc.stdout)


def test_cache_key_rotation_through_the_cli(tmp_path: Path) -> None:
    """add-key, rekey, prune-keys: the blob ends under the new key only, and still verifies."""
    served_cache(tmp_path)
    cache_dir = ("--cache-dir", str(tmp_path / "cache"))
    old_keys = json.loads(run("cache", "stats", *cache_dir).stdout)["key_ids"]
    added = run("cache", "add-key", *cache_dir)
    assert added.returncode == 0, added.stderr
    new_key = json.loads(added.stdout)["added"]
    assert new_key not in old_keys
    assert json.loads(run("cache", "rekey", *cache_dir).stdout)["reencrypted"] == 1
    pruned = json.loads(run("cache", "prune-keys", *cache_dir).stdout)["dropped"]
    assert sorted(pruned) == sorted(old_keys)
    report = json.loads(run("cache", "verify", *cache_dir).stdout)
    assert report["ok"] == 1 and report["by_key"] == {new_key: 1}


def test_userdata_command_and_environment_flags(tmp_path: Path) -> None:
    write_manifests(tmp_path / "p.yaml", build_token_secret(namespace="ns", nodepool="ns/p", token="tok-u"))
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    result = run("userdata", "--nodepool", "ns/p", "--shape", "mcs", "--ca-file", str(ca),
                 env={"IGNITION_SERVER_SOURCE": str(tmp_path), "IGNITION_SERVER_PUBLIC_URL": "https://ign.example.com:9090"})
    assert result.returncode == 0, result.stderr
    pointer = json.loads(result.stdout)
    assert pointer["ignition"]["config"]["merge"][0]["source"] == "https://ign.example.com:9090/config/p?token=tok-u"
    assert "fits ibmcloud-vpc: yes" in result.stderr
    assert run("userdata", "--source", str(tmp_path), "--nodepool", "ns/none", "--public-url", "https://x:1",
               "--ca-file", str(ca)).returncode == 1
    bad = run("serve", "--source", str(tmp_path), "--cache-dir", str(tmp_path / "c"), "--token-ttl", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    assert run("--version").stdout.startswith("ignition-server ")
