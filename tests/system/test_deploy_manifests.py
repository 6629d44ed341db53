"""The deployment manifests (deploy/): what an admin applies is consistent with the code."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from ignition_server.metrics import ServerMetrics
from payload_cache.stats import CacheStats
from testsupport.deploy import DEPLOY, check_unprivileged_pod, documents, kustomize, one, rbac_rules, readme_rbac_table
from testsupport.realtools import require_tool


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml"}


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


def policy_for(docs: list[dict], labels: dict) -> dict:
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["spec"]["podSelector"]["matchLabels"] == labels]
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    return policy


def open_ports(policy: dict) -> set[int]:
    """Ports any source may reach (an ingress rule without `from`)."""
    return {p["port"] for rule in policy["spec"]["ingress"] if not rule.get("from") for p in rule["ports"]}


def test_network_policies_open_only_the_serving_ports_and_keep_egress_to_the_api_dns_and_registries() -> None:
    server_docs, proxy_docs = kustomize(DEPLOY), kustomize(DEPLOY / "proxy")
    server = policy_for(server_docs, one("StatefulSet")["spec"]["template"]["metadata"]["labels"])
    proxy = policy_for(proxy_docs, next(d for d in proxy_docs if d["kind"] == "Deployment")["spec"]["template"]["metadata"]["labels"])
    # Nodes reach the payload port from anywhere; metrics only from Prometheus, never every pod.
    assert open_ports(server) == {9090} and open_ports(proxy) == {8443}
    for policy, metrics in ((server, {8080}), (proxy, {9101, 8405})):
        scraped = [r for r in policy["spec"]["ingress"] if r.get("from")]
        assert {p["port"] for r in scraped for p in r["ports"]} == metrics
        assert all(f.get("namespaceSelector") and f.get("podSelector") for r in scraped for f in r["from"])
    # Out: the API server and registries over TLS, DNS; the proxy also to the servers' port only.
    egress = {p["port"] for rule in server["spec"]["egress"] for p in rule["ports"]}
    assert egress == {443, 6443, 53, 5353}
    to_servers = [r for r in proxy["spec"]["egress"] if r.get("to")]
    assert [p["port"] for r in to_servers for p in r["ports"]] == [9090]
    # The ports it opens are the ones the pods listen on.
    container = one("StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    assert {p["containerPort"] for p in container["ports"]} == {9090, 8080}


def watched_namespaces(docs: list[dict]) -> set[str] | None:
    """The namespaces the StatefulSet tells the server to watch, or None for every one."""
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    listed = env.get("IGNITION_SERVER_NAMESPACE")
    return set(listed.split(",")) if listed else None


def test_rbac_is_one_role_per_feature_bound_in_the_watched_namespaces_or_cluster_wide_as_an_option() -> None:
    docs = kustomize(DEPLOY)
    features = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"}
    assert features == {"ignition-server-read", "ignition-server-write", "ignition-server-prune", "ignition-server-takeover"}
    # Reading never comes with writing: a replica that is not the writer needs only the first.
    read = rbac_rules([d for d in docs if d["metadata"]["name"] == "ignition-server-read"])
    assert {v for _g, _r, v in read} == {"get", "list", "watch"}
    # By default nothing is granted cluster-wide: Secrets' get, patch, create and delete only in
    # the namespaces the server watches, each feature bound in exactly those.
    assert not [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    watched = watched_namespaces(docs)
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert watched is not None and sts["metadata"]["namespace"] in watched  # its own: the shared namespace
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"]
    assert sorted((b["metadata"]["namespace"], b["roleRef"]["name"]) for b in bindings) \
        == sorted((n, f) for n in watched for f in features)
    # The documented option: the same objects and rules, bound cluster-wide, every namespace watched.
    overlay = DEPLOY / "cluster-wide"
    listed = yaml.safe_load((overlay / "kustomization.yaml").read_text())["resources"]
    base = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert [r.removeprefix("../") for r in listed if r.startswith("../")] == [r for r in base if r != "rolebindings.yaml"]
    wide = kustomize(overlay, "--load-restrictor", "LoadRestrictionsNone")
    assert {d["roleRef"]["name"] for d in wide if d["kind"] == "ClusterRoleBinding"} == features
    assert not [d for d in wide if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"]
    assert watched_namespaces(wide) is None
    assert rbac_rules(wide) == rbac_rules(docs)


def test_the_in_pod_edge_option_runs_beside_the_server_and_takes_its_port() -> None:
    """deploy/edge (issue 32): the edge container terminates TLS on the port the Services
    target and hands requests to the server over its unix socket; both sides name the same
    socket, publication and volumes, and every container keeps its probes and requests."""
    docs = kustomize(DEPLOY / "edge", "--load-restrictor", "LoadRestrictionsNone")
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    server, edge = containers["ignition-server"], containers["edge"]
    env = {e["name"]: e.get("value") for e in server["env"]}
    table = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ignition-edge")
                           ["data"]["table.yaml"])
    route = table["routes"][0]
    assert table["in_pod"] and route["mode"] == "terminate"
    assert route["backends"] == [f"unix@{env['IGNITION_SERVER_EDGE_SOCKET']}"]
    assert route["publication"] == env["IGNITION_SERVER_EDGE_DIR"]

    def mounted(container: dict, path: str) -> str:
        """The volume holding `path` in `container`."""
        best = max((m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")),
                   key=lambda m: len(m["mountPath"]))
        return best["name"]

    for path in (env["IGNITION_SERVER_EDGE_SOCKET"], env["IGNITION_SERVER_EDGE_DIR"] + "/publication.json"):
        assert mounted(server, path) == mounted(edge, path), path  # the same volume at the same path
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounted(edge, env["IGNITION_SERVER_EDGE_SOCKET"])]["emptyDir"]["medium"] == "Memory"
    # The Services' `ignition` port is the edge's; the server's own port keeps its probes.
    assert {p["name"]: p["containerPort"] for p in edge["ports"]}["ignition"] == table["listen"]
    assert "ignition" not in {p["name"] for p in server["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"]["port"] == "direct"
    assert edge["readinessProbe"] and edge["livenessProbe"]
    for container in (server, edge):
        assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
        assert container["securityContext"]["readOnlyRootFilesystem"]
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "ignition-server")
    assert {"protocol": "TCP", "port": table["listen"]} in policy["spec"]["ingress"][0]["ports"]
    for service in (d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].startswith("ignition-server")):
        assert any(p["targetPort"] == "ignition" for p in service["spec"]["ports"])
