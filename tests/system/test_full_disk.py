"""A full disk (small tmpfs mounts) under the cache and under the manifests: serving goes on, the
error is reported, nothing half-written is kept, and writes resume when space returns."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from ignition_server.model.token_secret import parse_token_secret
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, bearer, wait_for, write_manifests
from testsupport.manifests import build_token_secret
from testsupport.realtools import in_ci


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        message = f"cannot mount a tmpfs here: {mounted.stderr.strip()}"
        pytest.fail(message) if in_ci() else pytest.skip(message)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path) -> Path:
    """Fill the filesystem of `directory` to the last byte."""
    filler = directory / "filler"
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def secret(pool: str, token: str) -> dict:
    return build_token_secret(namespace="clusters-a", nodepool=f"clusters/{pool}", token=token,
                              machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=pool), generation_time=time.time())


def test_a_full_disk_under_the_cache_and_the_manifests(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "cachefs", "4m") as cachefs, tmpfs(tmp_path / "sourcefs", "1m") as sourcefs:
        source = sourcefs / "source"
        write_manifests(source / "a.yaml", secret("a", "tok-a"))
        proc = ServerProcess(source, cachefs / "cache", token_ttl="8s").start()
        try:
            wait_for(lambda: proc.get("/ignition", bearer("tok-a"))[0] == 200, timeout=30, what="a served")
            # The cache's disk fills up: a new NodePool cannot be stored; what is there keeps serving.
            cache_filler = fill(cachefs)
            write_manifests(source / ".b.yaml", secret("b", "tok-b"))  # a dotfile: not read until renamed
            (source / ".b.yaml").rename(source / "b.yaml")
            source_filler = fill(sourcefs)
            wait_for(lambda: "No space left on device" in proc.logs(), timeout=30, what="the error reported")
            assert proc.get("/ignition", bearer("tok-a"))[0] == 200
            assert proc.get("/ignition", bearer("tok-b"))[0] in (503, 511)  # not yet: the node retries
            # The rotation of a (due at 4 s) cannot be written to its manifest: nothing is handed out.
            time.sleep(5)  # past the rotation's due time, on purpose
            manifest = parse_token_secret(next(d for d in yaml.safe_load_all((source / "a.yaml").read_text()) if d))
            assert manifest.token == "tok-a" and proc.get("/ignition", bearer("tok-a"))[0] == 200
            leftovers = [p for p in [*cachefs.rglob("*"), *sourcefs.rglob("*")] if p.name.endswith(".tmp")]
            assert not leftovers, leftovers  # nothing half-written kept
            # Space returns: writes resume by themselves.
            cache_filler.unlink()
            source_filler.unlink()
            wait_for(lambda: proc.get("/ignition", bearer("tok-b"))[0] == 200, timeout=60, what="b stored and served")
            wait_for(lambda: parse_token_secret(next(d for d in yaml.safe_load_all((source / "a.yaml").read_text()) if d))
                     .token != "tok-a", timeout=60, what="a's rotation written")
        finally:
            proc.kill()
