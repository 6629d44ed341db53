"""The container image, checked statically (no Docker engine runs here): non-root numeric user,
a pinned base image, no secrets baked in, a cache dir that is the only place written."""

from __future__ import annotations

import re
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parent.parent / "Dockerfile"


def final_stage() -> list[str]:
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]
    starts = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")]
    return lines[starts[-1]:]


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    users = [line.split(None, 1)[1] for line in final_stage() if line.upper().startswith("USER ")]
    assert users, "no USER in the final stage"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric: runAsNonRoot can check it


def test_base_images_are_pinned() -> None:
    for line in DOCKERFILE.read_text().splitlines():
        if line.upper().startswith("FROM "):
            image = line.split()[1]
            assert "@sha256:" in image or re.search(r":\d+\.\d+", image), f"{image} is not pinned"
            assert not image.endswith(":latest")


def test_no_secret_is_baked_in() -> None:
    text = DOCKERFILE.read_text()
    for line in text.splitlines():
        if line.upper().startswith(("COPY", "ADD")):
            assert not re.search(r"\.(key|pem|crt)\b|token|secret|kubeconfig", line, re.I), line
        if line.upper().startswith(("ENV", "ARG")):
            assert not re.search(r"(PASSWORD|TOKEN|SECRET|_KEY)=", line.upper().replace("CACHE_KEY_FILE", "")), line


def test_only_the_cache_dir_is_written() -> None:
    stage = "\n".join(final_stage())
    cache = re.search(r"IGNITION_SERVER_CACHE_DIR=(\S+)", stage)
    assert cache and cache.group(1).startswith("/var/lib/ignition-server")
    # The deployment mounts that path (a volume) and /tmp, and runs with a read-only root filesystem.
    statefulset = (DOCKERFILE.parent / "deploy" / "statefulset.yaml").read_text()
    assert "readOnlyRootFilesystem: true" in statefulset and "mountPath: /var/lib/ignition-server" in statefulset
