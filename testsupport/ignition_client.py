"""The real Ignition client, as a test runs it: its fetch stage on a pointer config (what a
booting node does first), its files stage writing a config under a scratch root, and what a
fetched config or a served payload holds."""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

IGNITION = "/usr/lib/dracut/modules.d/30ignition/ignition"

# Ignition's retry of a 5xx (coreos/ignition internal/resource/http.go): the wait doubles before
# each use, from 100 ms, up to 5 s (0.2, 0.4, 0.8, 1.6, 3.2, 5, 5 ...), whatever Retry-After says.
IGNITION_INITIAL_BACKOFF_S, IGNITION_MAX_BACKOFF_S = 0.1, 5.0


def next_retry_wait(previous: float, retry_after: str | None, honour_retry_after: bool) -> tuple[float, float]:
    """(Ignition's next back-off, the pause before the next attempt): the back-off itself, or
    with `honour_retry_after` (a client that reads the header) at least what the server asked."""
    backoff = min(previous * 2, IGNITION_MAX_BACKOFF_S)
    asked = float(retry_after) if honour_retry_after and retry_after and retry_after.isdigit() else 0.0
    return backoff, max(backoff, asked)


@dataclass
class IgnitionRun:
    returncode: int | None
    output: str
    config: dict[str, Any] | None


def ignition_fetch(pointer: dict[str, Any], workdir: Path, *, timeout: float = 30.0, background: bool = False) -> IgnitionRun | subprocess.Popen[str]:
    """Run the real client's fetch stage with `pointer` as the platform config."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "root").mkdir(exist_ok=True)
    pointer_file = workdir / "pointer.ign"
    pointer_file.write_text(json.dumps(pointer))
    cache = workdir / "config-cache.json"
    if cache.exists():
        cache.unlink()
    command = [
        IGNITION, "-platform", "file", "-stage", "fetch", "-log-to-stdout",
        "-config-cache", str(cache), "-state-file", str(workdir / "state"),
        "-neednet", str(workdir / "neednet"), "-root", str(workdir / "root"),
        "-fetch-timeout", "60s",
    ]
    env = {**os.environ, "IGNITION_CONFIG_FILE": str(pointer_file)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if background:
        return proc
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        return IgnitionRun(None, output, None)
    return finish_fetch(proc, output, workdir)


def finish_fetch(proc: subprocess.Popen[str], output: str, workdir: Path) -> IgnitionRun:
    cache = workdir / "config-cache.json"
    config = json.loads(cache.read_text()) if cache.exists() else None
    return IgnitionRun(proc.returncode, output, config)


def files_in(config: dict[str, Any]) -> dict[str, str]:
    """path -> source of every file in a fetched config."""
    return {f["path"]: f.get("contents", {}).get("source", "") for f in config.get("storage", {}).get("files", [])}


def payload_text(body: bytes) -> str:
    """Every file's contents of a served payload (data URLs decoded, gunzipped), as one text to search in."""
    texts = []
    for entry in json.loads(body)["storage"]["files"]:
        header, _, data = entry["contents"]["source"].partition(",")
        raw = base64.b64decode(data) if header.endswith(";base64") else unquote(data).encode()
        if entry["contents"].get("compression") == "gzip":
            raw = gzip.decompress(raw)
        texts.append(raw.decode(errors="replace"))
    return "\n".join(texts)


def require_ignition() -> None:
    from testsupport.realtools import require_tool

    require_tool(IGNITION, "apt-get install ignition")
    require_tool("ignition-validate", "apt-get install ignition")


def core_user(root: Path) -> None:
    """A `core` user that exists already, as on RHCOS, so the client adds SSH keys to it.

    Its uid is 0 here: the client writes keys with the user's own uid, which could not
    reach into the test's private temp dir.
    """
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\ncore:x:0:0:CoreOS Admin:/home/core:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "etc/shadow").write_text("root:*:19000:0:99999:7:::\ncore:*:19000:0:99999:7:::\n")
    (root / "etc/gshadow").write_text("root:*::\n")
    (root / "home/core").mkdir(parents=True)


def ignition_files_stage(
    tmp_path: Path, config: dict[str, Any], *, shim_setfiles: bool = True, prepare: Any = None,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the real client's files stage on `config`, writing under `tmp_path/root`.

    `prepare(root)` lays out what the node's image would already hold (users, say)."""
    import pytest

    from testsupport.realtools import require_tool

    require_tool(IGNITION, "apt-get install ignition")
    if os.geteuid() != 0:
        pytest.skip("the Ignition files stage needs root")
    root = tmp_path / "root"
    root.mkdir()
    if prepare is not None:
        prepare(root)
    cache = tmp_path / "config.json"
    cache.write_text(json.dumps(config))
    env = dict(os.environ)
    if shim_setfiles:
        # Everything is written before the SELinux relabel; a no-op setfiles lets the stage
        # finish, so a zero exit proves every step before it succeeded.
        (root / "etc/selinux").mkdir(parents=True, exist_ok=True)
        (root / "etc/selinux/config").write_text("SELINUX=disabled\nSELINUXTYPE=targeted\n")
        shim = tmp_path / "shim"
        shim.mkdir()
        (shim / "setfiles").write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n")
        (shim / "setfiles").chmod(0o755)
        env["PATH"] = f"{shim}:{env.get('PATH', '/usr/bin:/bin')}"
    res = subprocess.run(
        [IGNITION, "-platform", "file", "-stage", "files", "-root", str(root), "-config-cache", str(cache),
         "-state-file", str(tmp_path / "state"), "-log-to-stdout"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )
    return res, root
