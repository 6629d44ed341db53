"""The real tools the tests drive (Ignition, HAProxy, kubectl, a registry, nginx).

Under CI (`CI=true`) a missing tool fails the test: a skip would let CI pass without
running the real thing. Locally a missing tool skips, saying what to install.
"""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_tool(name: str, install: str, *, executable: bool = True) -> str:
    """The tool's path (a command on PATH, or an absolute path that must be executable; with
    `executable=False`, a file that must exist: a module a tool loads)."""
    present = os.access(name, os.X_OK) if executable else os.path.isfile(name)
    path = name if os.path.isabs(name) and present else shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed ({install})"
    if in_ci():
        pytest.fail(f"CI needs the real tool: {message}", pytrace=False)
    pytest.skip(message)
