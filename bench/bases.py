"""Generated MCO bases at the seeds' scale: a cold start of 5,280 NodePools over 440 clusters
runs the release's MCO exactly once per (cluster, release) pair present, none per NodePool.

    python -m bench bases [--clusters 440 --pools 12 --releases 1]

A local `docker-registry` (TLS, htpasswd) holds the releases and one machine-config-operator
image whose binaries are the tests' STAND-INS (testsupport/mco_image.py: MCO's command line and
output layout, python3 scripts that log each run with the cluster it ran for). Each cluster
has its `machine-config-server` ConfigMap (its own infrastructure name); NodePool j of a
cluster is on release j mod --releases. The server starts on an empty cache dir with
`--release-resolve --generate-bases`; the figures: runs per pair (from the stand-ins' log),
the server's generation metric, registry requests, time to every NodePool served.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.releases import metric_sum, say
from bench.run import fetch_all
from testsupport.fleet import fleet_token, manifest_path, namespace_of, nodepool_of, pools, token_secret, write_manifest
from testsupport.harness import ServerProcess, write_manifests
from testsupport.manifests import join_objects, kube_object
from testsupport.mco_image import cluster_config, push_mco_image, runs
from testsupport.registry_world import Registry

SEED = "bench-bases"
ART = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:"


def run(work: Path, clusters: int, per_cluster: int, releases: int, concurrency: int) -> dict[str, object]:
    registry = Registry(work / "registry").start()
    server: ServerProcess | None = None
    counter = work / "mco-runs.log"
    try:
        mco = push_mco_image(registry, "ocp/mco", counter)
        specs = []
        for r in range(releases):
            images = {"haproxy-router": ART + f"{r:064x}", "rhel-coreos": ART + f"{r + 1000:064x}", "machine-config-operator": mco,
                      "cluster-config-api": mco}
            digests = registry.push_release("ocp/release", {"amd64": images}, f"4.17.{r}")
            specs.append(f"{registry.host}/ocp/release@{digests['index']}")
        source = work / "source"
        ca = registry.ca_file.read_text()
        for c in range(clusters):
            namespace = namespace_of(c)
            (source / namespace).mkdir(parents=True, exist_ok=True)
            write_manifests(source / namespace / "cluster.yaml", *join_objects(namespace, registry.pull_secret(), ca),
                            kube_object("ConfigMap", namespace, "machine-config-server", cluster_config("infra-" + namespace)))
        tokens: dict[str, str] = {}
        pairs: set[tuple[str, str]] = set()
        now = time.time()
        for c, p in pools(clusters, per_cluster):
            secret = token_secret(SEED, c, p, 2, generation_time=now, release=specs[p % releases])
            write_manifest(manifest_path(source, c, p), secret)
            tokens[nodepool_of(c, p)] = fleet_token(SEED, c, p)
            pairs.add((f"4.17.{p % releases}", "infra-" + namespace_of(c)))
        say(f"fleet: {clusters * per_cluster} NodePools over {clusters} clusters, {releases} release(s): {len(pairs)} pairs")
        server = ServerProcess(source, work / "cache", extra=[
            "--release-resolve", "--generate-bases", "--render-concurrency", str(concurrency),
            "--registry-allow", registry.host,
            "--base-sandbox", "none"])  # the stand-ins count runs in a file the sandbox would hide
        t0 = time.monotonic()
        server.start()
        ready = time.monotonic() - t0
        result = fetch_all(server, tokens, sorted(tokens), t0, timeout=3600)
        served = max(result.first_200.values()) if result.first_200 else float("nan")
        metrics = server.metrics()
        per_pair = collections.Counter((version, infra) for _pid, step, version, infra in runs(counter) if step == "operator")
        controller = collections.Counter((version, infra) for _pid, step, version, infra in runs(counter) if step == "controller")
        return {
            "nodepools": clusters * per_cluster,
            "clusters": clusters,
            "releases": releases,
            "pairs": len(pairs),
            "operator_runs": sum(per_pair.values()),
            "controller_runs": sum(controller.values()),
            "pairs_run_exactly_once": set(per_pair) == pairs and set(per_pair.values()) == {1} and controller == per_pair,
            "generations_metric": metrics.get('ign_server_base_generations_total{result="ok"}', 0),
            "generation_failures": metrics.get('ign_server_base_generations_total{result="failed"}', 0),
            "renders": metrics.get("ign_server_payload_cache_miss_total", 0),
            "registry_requests": metric_sum(server, "ign_server_registry_requests_total"),
            "ready_seconds": round(ready, 2),
            "all_served_seconds": round(served, 1),
            "served": len(result.first_200),
            "failed": len(result.failed),
        }
    finally:
        if server is not None:
            server.kill()
        registry.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench bases", description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=440)
    parser.add_argument("--pools", type=int, default=12, help="NodePools per cluster")
    parser.add_argument("--releases", type=int, default=1, help="releases; NodePool j of a cluster is on release j mod this")
    parser.add_argument("--render-concurrency", type=int, default=2)
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-bases-") as tmp:
        summary = run(args.work or Path(tmp), args.clusters, args.pools, args.releases, args.render_concurrency)
    print(json.dumps(summary, indent=1))
    ok = summary["pairs_run_exactly_once"] and summary["served"] == summary["nodepools"] and not summary["generation_failures"]
    say("OK: one MCO run per (cluster, release) pair" if ok else "FAILED: see the figures above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
