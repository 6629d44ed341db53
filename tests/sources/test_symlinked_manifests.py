"""Write-backs to symlinked manifests (issue 9, item 2): the link's final target is written,
atomically in its own directory, and the link(s) stay; a target that cannot be written
(a read-only mount) keeps its rotation state in the cache dir, as --source-read-only does."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from ignition_server.auth.tokens import TokenAuthenticator
from ignition_server.model.token_secret import parse_token_secret
from ignition_server.sources import file_writes
from testsupport.clock import T0
from testsupport.harness import write_manifests
from testsupport.reconcile_world import pool_secret, reopenable_world, settle


@pytest.fixture
def world(tmp_path: Path):
    return reopenable_world(tmp_path)


REF = "clusters-a/token-p-00000000"


def tokens_in(path: Path) -> tuple[str | None, str | None]:
    parsed = parse_token_secret(yaml.safe_load(path.read_text()))
    return parsed.token, parsed.old_token


def leftovers(*directories: Path) -> list[str]:
    return [p.name for d in directories for p in d.iterdir() if p.name.startswith(".tmp-")]


async def rotate(reconciler, source, clock, at: float) -> None:
    clock.now = at
    assert await reconciler.rotation.rotate_due() == 1
    await settle(reconciler, source)


async def test_rotation_writes_a_symlinks_target_and_keeps_the_link(world, tmp_path: Path) -> None:
    make, clock, source_dir = world
    reconciler, source, cache = make()
    target = write_manifests(tmp_path / "gitops" / "p.yaml", pool_secret("p", "tok-0"))
    link = source_dir / "p.yaml"
    link.symlink_to(Path("..") / "gitops" / "p.yaml")  # relative, as a checkout links it
    await settle(reconciler, source)
    await rotate(reconciler, source, clock, T0 + 60)
    assert link.is_symlink() and os.readlink(link) == str(Path("..") / "gitops" / "p.yaml")
    token, old = tokens_in(target)
    assert old == "tok-0" and token not in (None, "tok-0")
    assert TokenAuthenticator(cache, clock).authenticate(token).secret == REF
    assert leftovers(source_dir, target.parent) == []


async def test_rotation_writes_through_a_kubernetes_volumes_data_chain(world) -> None:
    # A ConfigMap/Secret volume: p.yaml -> ..data/p.yaml, ..data -> ..<timestamp>/, the file there.
    make, clock, source_dir = world
    reconciler, source, cache = make()
    stamped = source_dir / "..2026_11_23_05_00_00.000000001"
    real = write_manifests(stamped / "p.yaml", pool_secret("p", "tok-0"))
    (source_dir / "..data").symlink_to(stamped.name)
    (source_dir / "p.yaml").symlink_to(Path("..data") / "p.yaml")
    await settle(reconciler, source)
    await rotate(reconciler, source, clock, T0 + 60)
    assert (source_dir / "p.yaml").is_symlink() and (source_dir / "..data").is_symlink()
    assert os.readlink(source_dir / "..data") == stamped.name
    token, old = tokens_in(real)
    assert old == "tok-0" and token not in (None, "tok-0")
    assert tokens_in(source_dir / "p.yaml") == (token, old)
    assert leftovers(source_dir, stamped) == []


@pytest.fixture
def read_only_dir(tmp_path: Path, monkeypatch):
    """A directory on a read-only mount (tests run as root, which ignores chmod 0555).

    Where bind mounts are not allowed, writes into it fail with EROFS as the mount would."""
    directory = tmp_path / "ro"
    directory.mkdir()
    mounted = []

    def seal() -> None:
        bound = subprocess.run(["mount", "--bind", str(directory), str(directory)], capture_output=True)
        if bound.returncode == 0:
            if subprocess.run(["mount", "-o", "remount,ro,bind", str(directory)], capture_output=True).returncode == 0:
                mounted.append(directory)
                return
            subprocess.run(["umount", str(directory)], check=True)
        real_write = file_writes.write_exclusive

        def write_exclusive(path: Path, data: bytes, mode: int) -> None:
            if Path(path).parent == directory:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            real_write(path, data, mode)

        monkeypatch.setattr(file_writes, "write_exclusive", write_exclusive)

    yield directory, seal
    if mounted:
        subprocess.run(["umount", str(directory)], check=True)


async def test_a_read_only_target_rotates_in_the_cache_dir_and_says_so_once(world, tmp_path: Path, read_only_dir, caplog) -> None:
    caplog.set_level(logging.INFO)
    make, clock, source_dir = world
    directory, seal = read_only_dir
    target = write_manifests(directory / "p.yaml", pool_secret("p", "tok-0"))
    (source_dir / "p.yaml").symlink_to(target)
    reconciler, source, cache = make()
    await settle(reconciler, source)
    before = target.read_bytes()
    seal()
    assert source.writable  # the source directory itself is writable; only this target is not
    await rotate(reconciler, source, clock, T0 + 60)
    auth = TokenAuthenticator(cache, clock)
    first = reconciler.tokens.secrets[next(iter(reconciler.tokens.secrets))].token
    assert first != "tok-0" and auth.authenticate(first).secret == REF
    assert auth.authenticate("tok-0").secret == REF  # the outgoing token stays valid as the previous one
    await rotate(reconciler, source, clock, T0 + 120)
    second = reconciler.tokens.secrets[next(iter(reconciler.tokens.secrets))].token
    assert second not in (first, "tok-0") and auth.authenticate(second).secret == REF
    assert target.read_bytes() == before and (source_dir / "p.yaml").is_symlink()
    said = [r for r in caplog.records if "kept (encrypted) in the cache dir" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    # Across a restart the cache-dir rotation still holds.
    cache.flush()
    reconciler2, source2, cache2 = make()
    await settle(reconciler2, source2)
    assert TokenAuthenticator(cache2, clock).authenticate(second).secret == REF
