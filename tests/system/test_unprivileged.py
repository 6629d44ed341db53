"""The server as the container runs it: an unprivileged user, the code and the manifests
read-only, only its state directory (cache and key) writable."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from testsupport import REPO
from testsupport.harness import EXAMPLE_MACHINECONFIG, free_port, wait_for, write_manifests
from testsupport.manifests import build_token_secret
from testsupport.realtools import require_tool

NOBODY = 65534


def test_the_server_runs_unprivileged_with_only_its_state_dir_writable() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged user")
    setpriv = require_tool("setpriv", "apt-get install util-linux")
    # The test's own interpreter may live where an unprivileged user cannot reach (a pyenv under
    # /root): the system's Python of the same version runs the same code and packages.
    python = require_tool(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}", "apt-get install python3")
    root = Path(tempfile.mkdtemp(prefix="ignition-unprivileged-", dir="/tmp"))
    proc = None
    try:
        root.chmod(0o755)
        code = root / "code"
        for package in ("ignition_server", "payload_cache", "proxy"):
            shutil.copytree(REPO / package, code / package, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(sysconfig.get_paths()["purelib"], root / "site", ignore=shutil.ignore_patterns("__pycache__"),
                        symlinks=True)
        write_manifests(root / "source" / "pool.yaml", build_token_secret(
            namespace="clusters-a", nodepool="clusters/workers", token="tok-unprivileged",
            machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="workers"), generation_time=time.time()))
        for path in [root, *root.rglob("*")]:  # root-owned and read-only for the server's user
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
        state = root / "state"
        state.mkdir(mode=0o700)
        os.chown(state, NOBODY, NOBODY)
        port = free_port()
        log = open(root / "server.log", "wb")
        proc = subprocess.Popen(
            [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-m", "ignition_server", "serve",
             "--source", str(root / "source"), "--source-read-only", "--cache-dir", str(state / "cache"),
             "--listen", f"127.0.0.1:{port}", "--metrics-listen", "off", "--log-format", "json"],
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{code}:{root / 'site'}", "HOME": "/nonexistent",
                 "PYTHONDONTWRITEBYTECODE": "1"},
            stdout=log, stderr=subprocess.STDOUT, cwd="/",
        )
        ca = state / "cache" / "tls" / "ca.crt"

        def fetch() -> int | None:
            import base64
            import ssl
            import urllib.error
            import urllib.request

            if proc.poll() is not None:
                raise AssertionError((root / "server.log").read_text())
            if not ca.exists():
                return None
            request = urllib.request.Request(f"https://127.0.0.1:{port}/ignition", headers={
                "Authorization": "Bearer " + base64.b64encode(b"tok-unprivileged").decode()})
            try:
                with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(ca)), timeout=5) as r:
                    return r.status
            except urllib.error.HTTPError as error:
                return error.code
            except OSError:
                return None

        wait_for(lambda: fetch() == 200, timeout=60, interval=0.2, what="the payload served by the unprivileged server")
        uid_line = next(line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == [str(NOBODY)] * 4
        # Core dumps off in every process of the server (a dump held the cache keys and tokens):
        # RLIMIT_CORE 0, and not dumpable, which makes its /proc files root's, not its user's.
        processes = [proc.pid, *children_of(proc.pid)]
        assert len(processes) >= 2  # the owner and its workers
        for pid in processes:
            core = next(line for line in Path(f"/proc/{pid}/limits").read_text().splitlines()
                        if line.startswith("Max core file size"))
            assert core.split()[4:6] == ["0", "0"], (pid, core)
            assert Path(f"/proc/{pid}/status").stat().st_uid == 0, f"process {pid} is dumpable"
        # It wrote only under its state dir: everything else is as it was made, owned by root.
        assert all(p.stat().st_uid == 0 for p in root.rglob("*") if state not in p.parents and p != state
                   and not p.is_symlink())
        assert (state / "cache.key").stat().st_uid == NOBODY  # the key outside the cache dir it protects
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found
