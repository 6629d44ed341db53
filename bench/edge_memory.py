"""Memory a hostile client costs the server (issue 23), measured, not run in CI.

    python -m bench.edge_memory [--server-tree DIR]

1. A token Secret of 5 KiB whose gzipped `config` is a flat YAML list: the owner's peak RSS
   (VmHWM) once the Secret has been refused, against an idle owner's.
2. 60 TLS connections from one address whose first request's headers never end (127 fields of
   8000 bytes each, as many as aiohttp takes by default): the serving process's RSS while they
   are held, against before. One serving process (`--workers 0`).
`--server-tree` runs another checkout's server (e.g. `git archive <commit> | tar -x -C DIR`).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tree: Path, source: Path, cache: Path, *flags: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ignition_server", "serve", "--source", str(source),
                             "--cache-dir", str(cache), "--listen", f"127.0.0.1:{port}", "--metrics-listen", "off",
                             "--log-format", "json", *flags], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


def flat_list_secret(path: Path) -> None:
    from testsupport.manifests import build_token_secret

    secret = build_token_secret(namespace="clusters-a", nodepool="clusters/flat", token="tok-flat",
                                machineconfigs_yaml="", generation_time=time.time())
    secret["data"]["config"] = base64.b64encode(base64.b64encode(gzip.compress(b"- a\n" * 2_000_000, 9))).decode()
    path.write_text(yaml.safe_dump(secret))
    print(f"flat-list Secret: {path.stat().st_size / 1024:.1f} KiB")


def flat_list(tree: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        source.mkdir()
        proc, _ = start(tree, source, Path(tmp) / "cache", "--workers", "0")
        try:
            time.sleep(3)
            idle = rss_kib(proc.pid, "VmHWM")
            flat_list_secret(source / "flat.yaml")
            time.sleep(20)  # listing, render attempt, refusal
            print(f"owner peak RSS: idle {idle // 1024} MiB, after the flat-list Secret {rss_kib(proc.pid, 'VmHWM') // 1024} MiB")
        finally:
            proc.kill()
            proc.wait()


def incomplete_headers(tree: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        source.mkdir()
        cache = Path(tmp) / "cache"
        proc, port = start(tree, source, cache, "--workers", "0", "--header-timeout", "60s",
                           "--connections-per-source", "1000")
        held = []
        try:
            time.sleep(2)
            before = rss_kib(proc.pid)
            context = ssl.create_default_context(cafile=str(cache / "tls" / "ca.crt"))
            for _ in range(60):
                conn = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                           server_hostname="127.0.0.1")
                try:
                    conn.sendall(b"GET /ignition HTTP/1.1\r\nHost: x\r\n")
                    for n in range(127):
                        conn.sendall(b"X-Filler-%d: %s\r\n" % (n, b"a" * 8000))
                except OSError:
                    pass
                held.append(conn)
            time.sleep(2)
            print(f"serving process RSS: before {before // 1024} MiB, with 60 incomplete requests {rss_kib(proc.pid) // 1024} MiB")
        finally:
            for conn in held:
                conn.close()
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server-tree", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    flat_list(args.server_tree)
    incomplete_headers(args.server_tree)


if __name__ == "__main__":
    main()
