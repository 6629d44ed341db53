"""The real tools the tests drive (Ignition, HAProxy, kubectl, a registry, nginx, and the
reference binaries of ../shared/real: HyperShift's ignition server, MCO).

Under CI (`CI=true`) a missing tool fails the test: a skip would let CI pass without
running the real thing. Locally a missing tool skips, saying what to install.
"""

from __future__ import annotations

import lzma
import os
import shutil
from pathlib import Path

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_tool(name: str, install: str) -> str:
    """The tool's path (a command on PATH, or an absolute path that must be executable)."""
    path = name if os.path.isabs(name) and os.access(name, os.X_OK) else shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed ({install})"
    if in_ci():
        pytest.fail(f"CI needs the real tool: {message}", pytrace=False)
    pytest.skip(message)


REAL_DIR_ENV = "IGNITION_TEST_REAL_DIR"


def real_dir() -> Path:
    """The directory of the real reference binaries (`../shared/real/README.md` says what is
    there): `$IGNITION_TEST_REAL_DIR`, else `<repo>/../shared/real` (where CI puts them)."""
    configured = os.environ.get(REAL_DIR_ENV)
    path = Path(configured) if configured else Path(__file__).resolve().parents[2] / "shared" / "real"
    if (path / "hypershift-ignition-server.xz").is_file():
        return path
    message = (f"the real reference binaries are not at {path} (set {REAL_DIR_ENV} to a directory "
               "holding hypershift-ignition-server.xz and the MCO binaries; see README, Tests)")
    if in_ci():
        pytest.fail(f"CI needs the real binaries: {message}", pytrace=False)
    pytest.skip(message)


def unpack_real(name: str, into: Path) -> Path:
    """`<real_dir>/<name>.xz` decompressed into `into` (once: an unpacked copy is reused),
    executable. A partial copy never stays behind: it is written aside and renamed."""
    target = into / name
    if target.is_file():
        return target
    into.mkdir(parents=True, exist_ok=True)
    partial = into / f".{name}.partial"
    with lzma.open(real_dir() / f"{name}.xz") as packed, open(partial, "wb") as out:
        shutil.copyfileobj(packed, out, 1 << 20)
    partial.chmod(0o755)
    partial.rename(target)
    return target
