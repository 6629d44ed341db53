"""The container images, checked statically (no Docker engine runs here): the server (the last
stage, the default target) and the front proxy (`--target proxy`) each run as a non-root numeric
user, without compilers, from a pinned base image, with no secrets baked in, writing only their
state directory."""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

DOCKERFILE = Path(__file__).resolve().parent.parent / "Dockerfile"


def _lines() -> list[str]:
    return [line.strip() for line in DOCKERFILE.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]


def final_stage() -> list[str]:
    lines = _lines()
    starts = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")]
    return lines[starts[-1]:]


def named_stage(name: str) -> list[str]:
    """The lines of `FROM ... AS <name>` up to the next FROM."""
    lines = _lines()
    starts = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")] + [len(lines)]
    for begin, end in pairwise(starts):
        if lines[begin].split()[-1] == name and lines[begin].upper().split()[-2] == "AS":
            return lines[begin:end]
    raise AssertionError(f"no stage {name!r} in the Dockerfile")


# The images users run: the server (final stage) and the proxy.
SHIPPED = {"server": final_stage, "proxy": lambda: named_stage("proxy")}


@pytest.mark.parametrize("image", sorted(SHIPPED))
def test_the_image_runs_as_a_numeric_non_root_user(image: str) -> None:
    users = [line.split(None, 1)[1] for line in SHIPPED[image]() if line.upper().startswith("USER ")]
    assert users, f"no USER in the {image} stage"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric: runAsNonRoot can check it


@pytest.mark.parametrize("image", sorted(SHIPPED))
def test_the_image_has_no_compilers_and_its_command(image: str) -> None:
    stage = "\n".join(SHIPPED[image]())
    assert not re.search(r"\b(gcc|g\+\+|clang|build-essential|libc6-dev|make)\b", stage), stage
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", stage, re.MULTILINE)
    assert entry and yaml.safe_load(entry.group(1)) == [f"ignition-{image}"]


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


def test_the_proxy_writes_only_its_state_dir_and_has_haproxy() -> None:
    stage = "\n".join(named_stage("proxy"))
    assert re.search(r"apt-get install .*\bhaproxy\b", stage)
    table = re.search(r"IGNITION_PROXY_CONFIG=(\S+)", stage)
    deployment = yaml.safe_load((DOCKERFILE.parent / "deploy" / "proxy" / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The table is read from a read-only mount; the state dir (the table's state_dir) is the one written.
    assert table and mounts[str(Path(table.group(1)).parent)].get("readOnly") is True
    assert "/var/lib/ignition-proxy" in mounts and not mounts["/var/lib/ignition-proxy"].get("readOnly")
