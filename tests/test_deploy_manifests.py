"""The deployment manifests (deploy/): what an admin applies is consistent with the code."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from ignition_server.metrics import ServerMetrics
from payload_cache.stats import CacheStats
from realtools import require_tool

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
README = Path(__file__).resolve().parent.parent / "README.md"


def documents() -> list[dict]:
    return [d for path in sorted(DEPLOY.glob("*.yaml")) if path.name != "kustomization.yaml"
            for d in yaml.safe_load_all(path.read_text()) if d]


def one(kind: str) -> dict:
    found = [d for d in documents() if d["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def rbac_rules() -> set[tuple[str, str, str]]:
    """(api group, resource, verb) the ServiceAccount may use."""
    allowed = set()
    for kind in ("ClusterRole", "Role"):
        for rule in one(kind)["rules"]:
            allowed |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return allowed


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml"}


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


def test_pods_run_unprivileged_with_probes_and_a_cache_per_replica() -> None:
    sts = one("StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert sts["spec"]["replicas"] == 3
    container = check_unprivileged_pod(pod)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "--kubernetes" in container["args"]
    cache_dir, key_file = env["IGNITION_SERVER_CACHE_DIR"], env["IGNITION_SERVER_CACHE_KEY_FILE"]
    assert not key_file.startswith(cache_dir)  # the key is not on the disk it protects
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "cache"
    assert one("PodDisruptionBudget")["spec"]["minAvailable"] == 2
    assert any(s["spec"].get("type") == "NodePort" for s in documents() if s["kind"] == "Service")


def readme_rbac_table(heading: str) -> set[tuple[str, str, str]]:
    """(api group, resource, verb) rows of the verb|resource table in the README's section `heading`."""
    text = README.read_text()
    section = text[text.index(heading):]
    section = section[: re.search(r"\n##+ ", section).start()]  # the next heading (a code block's `# ...` is not one)
    table = set()
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] not in ("verb", "---") and not set(cells[0]) <= {"-"}:
            group, _, resource = cells[1].rpartition("/")
            table |= {(group, resource, verb.strip()) for verb in cells[0].split(",")}
    return table


def test_the_readme_rbac_table_is_the_role() -> None:
    assert readme_rbac_table("### RBAC") == rbac_rules()


def _metric_names() -> set[str]:
    metrics = ServerMetrics()
    metrics.watch_cache(lambda: CacheStats())
    names = set()
    for family in metrics.registry.collect():
        names.add(family.name)
        if family.type == "counter":  # a labelled counter has no sample before its first use
            names.add(family.name + "_total")
        names |= {sample.name for sample in family.samples}
    return names


def _rules() -> list[dict]:
    return one("PrometheusRule")["spec"]["groups"]


def test_every_alert_names_metrics_the_server_exports() -> None:
    exported = _metric_names()
    for group in _rules():
        for rule in group["rules"]:
            used = set(re.findall(r"\b(ign_server_[a-z_]+)", rule["expr"]))
            assert used and used <= exported, (rule["alert"], used - exported)


def test_promtool_checks_the_rules_and_the_alerts_fire(tmp_path: Path) -> None:
    promtool = require_tool("promtool", "apt-get install prometheus")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": _rules()}))
    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = tmp_path / "tests.yaml"
    pod = {"namespace": "ignition-server", "pod": "ignition-server-0"}
    labels = ",".join(f'{k}="{v}"' for k, v in pod.items())
    tests.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": [
            {"series": "ign_server_leader{%s}" % labels, "values": "0x20"},
            {"series": 'ign_server_source_watch_up{%s,kind="Secret"}' % labels, "values": "1 1 0x20"},
            {"series": 'ign_server_source_watch_up{%s,kind="ConfigMap"}' % labels, "values": "1x22"},
            {"series": 'ign_server_responses_total{%s,code="200"}' % labels, "values": "0+100x30"},
            {"series": 'ign_server_responses_total{%s,code="403"}' % labels, "values": "0+20x30"},
        ], "alert_rule_test": [
            {"eval_time": "10m", "alertname": "IgnitionServerNoLeader", "exp_alerts": [{"exp_labels": {"severity": "critical"},
             "exp_annotations": {"summary": "No ignition-server replica holds the Lease",
                                 "description": "Nothing rotates tokens or writes status and user-data."}}]},
            {"eval_time": "15m", "alertname": "IgnitionServerWatchBehind", "exp_alerts": [
                {"exp_labels": {**pod, "kind": "Secret", "severity": "warning"}, "exp_annotations": {
                    "summary": "The Secret watch of ignition-server-0 has been reconnecting for 10 minutes",
                    "description": "It serves from its cache; new NodePools and rotations are not seen by this replica "
                                   "(nodes get 511 and retry)."}}]},
            {"eval_time": "25m", "alertname": "IgnitionServerErrors4xx", "exp_alerts": [{"exp_labels": {"severity": "critical"},
             "exp_annotations": {"summary": "Payload requests refused with a 4xx",
                                 "description": "A node that gets a 4xx stops booting for good (forged or retired "
                                                "tokens, or a user-data older than its token's overlap)."}}]},
            # Healthy series do not page.
            {"eval_time": "25m", "alertname": "IgnitionServerErrors5xx", "exp_alerts": []},
            {"eval_time": "5m", "alertname": "IgnitionServerWatchBehind", "exp_alerts": []},
        ]}]}))
    run = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
