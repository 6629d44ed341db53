"""What an admin applies and reads, parsed for the tests that hold it to the code: the manifests
in deploy/, the README's RBAC tables, the Dockerfile's stages."""

from __future__ import annotations

import re
import subprocess
from itertools import pairwise
from pathlib import Path

import yaml

from testsupport import REPO

DEPLOY = REPO / "deploy"
README = REPO / "README.md"
DOCKERFILE = REPO / "Dockerfile"


def documents() -> list[dict]:
    """Every object of deploy/'s manifests (kustomization.yaml aside)."""
    return [d for path in sorted(DEPLOY.glob("*.yaml")) if path.name != "kustomization.yaml"
            for d in yaml.safe_load_all(path.read_text()) if d]


def kustomize(directory: Path, *flags: str) -> list[dict]:
    """`kubectl kustomize` of an overlay: the objects an admin's `kubectl apply -k` would send."""
    from testsupport.realtools import require_tool

    kubectl = require_tool("kubectl", "apt-get install kubernetes-client")
    out = subprocess.run([kubectl, "kustomize", *flags, str(directory)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(kind: str) -> dict:
    """The one object of `kind` in deploy/."""
    found = [d for d in documents() if d["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def rbac_rules(docs: list[dict] | None = None) -> set[tuple[str, str, str]]:
    """(api group, resource, verb) the ServiceAccount may use (every role it has, one per feature)."""
    allowed = set()
    for role in (d for d in (documents() if docs is None else docs) if d["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            allowed |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return allowed


def check_unprivileged_pod(pod: dict) -> dict:
    """What the namespace's `restricted` Pod Security level and our own standard ask of every
    pod we ship: non-root numeric user, RuntimeDefault seccomp, spread over zones and nodes,
    read-only root filesystem, no capabilities, no privilege escalation, resources requested.
    Returns the pod's one container."""
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    return container


def readme_rbac_table(heading: str) -> set[tuple[str, str, str]]:
    """(api group, resource, verb) rows of the verb|resource table in the README's section `heading`."""
    text = README.read_text()
    section = text[text.index(heading):]
    next_heading = re.search(r"\n##+ ", section)  # (a code block's `# ...` is not one)
    assert next_heading is not None, f"no section after {heading!r} in the README"
    section = section[: next_heading.start()]
    table = set()
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] not in ("verb", "---") and not set(cells[0]) <= {"-"}:
            group, _, resource = cells[1].partition("/")  # `group/resource/subresource`
            table |= {(group, resource, verb.strip()) for verb in cells[0].split(",")}
    return table


def dockerfile_lines() -> list[str]:
    """The Dockerfile's instructions, without blank and comment lines."""
    return [line.strip() for line in DOCKERFILE.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]


def final_stage() -> list[str]:
    """The lines of the Dockerfile's last stage (the default target: the server's image)."""
    lines = dockerfile_lines()
    starts = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")]
    return lines[starts[-1]:]


def named_stage(name: str) -> list[str]:
    """The lines of `FROM ... AS <name>` up to the next FROM."""
    lines = dockerfile_lines()
    starts = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")] + [len(lines)]
    for begin, end in pairwise(starts):
        if lines[begin].split()[-1] == name and lines[begin].upper().split()[-2] == "AS":
            return lines[begin:end]
    raise AssertionError(f"no stage {name!r} in the Dockerfile")
