"""Releases from a real registry at the seeds' scale: a cold start of 5,280 NodePools over
10 releases must read each release from the registry exactly once.

    python -m bench releases [--clusters 440 --pools 12 --releases 10 --layer-mib 4]

A local `docker-registry` (TLS, htpasswd) holds 10 synthetic release images (an OCI index
over amd64 and arm64, a layer of `--layer-mib` with the release manifests in it). The fleet's
NodePools each run the node HAProxy, so each needs its release's haproxy-router image. The
server starts on an empty cache dir with `--release-resolve`; the figures: release fetches
(the server's metric and the registry's access log), registry requests and bytes, time to
every release resolved, to every NodePool served, and the resolution time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.run import fetch_all
from testsupport.fleet import fleet_token, manifest_path, nodepool_of, pools, token_secret, write_manifest
from testsupport.harness import ServerProcess, write_manifests
from testsupport.manifests import join_objects
from testsupport.registry_world import Registry

SEED = "bench-releases"
ART = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def metric_sum(server: ServerProcess, prefix: str) -> float:
    return sum(v for k, v in server.metrics().items() if k.startswith(prefix))


def run(work: Path, clusters: int, per_cluster: int, releases: int, layer_mib: float) -> dict[str, object]:
    registry = Registry(work / "registry").start()
    server: ServerProcess | None = None
    try:
        started = time.monotonic()
        specs = []
        for r in range(releases):
            images = {"haproxy-router": ART + f"{r:064x}", "cli": ART + f"{r + 1000:064x}"}
            digests = registry.push_release("ocp/release", {"amd64": images, "arm64": images}, f"4.17.{r}",
                                            filler=int(layer_mib * 2**20))
            specs.append(f"{registry.host}/ocp/release@{digests['index']}")
        say(f"registry: {releases} releases pushed in {time.monotonic() - started:.1f}s")
        source = work / "source"
        tokens: dict[str, str] = {}
        ca = registry.ca_file.read_text()
        for c in range(clusters):
            (source / f"clusters-c{c}").mkdir(parents=True, exist_ok=True)
            write_manifests(source / f"clusters-c{c}" / "cluster.yaml", *join_objects(f"clusters-c{c}", registry.pull_secret(), ca))
        now = time.time()
        for n, (c, p) in enumerate(pools(clusters, per_cluster)):
            secret = token_secret(SEED, c, p, 2, generation_time=now, release=specs[n % releases])
            write_manifest(manifest_path(source, c, p), secret)
            tokens[nodepool_of(c, p)] = fleet_token(SEED, c, p)
        say(f"fleet: {clusters * per_cluster} NodePools over {releases} releases")
        requests_before = sum(1 for line in registry.log.read_text(errors="replace").splitlines() if '"GET /v2/' in line)
        server = ServerProcess(source, work / "cache", extra=["--release-resolve", "--render-concurrency", "2",
                                                            "--registry-allow", registry.host])
        t0 = time.monotonic()
        server.start()
        ready = time.monotonic() - t0
        result = fetch_all(server, tokens, sorted(tokens), t0, timeout=1800)
        served = max(result.first_200.values()) if result.first_200 else float("nan")
        metrics = server.metrics()
        summary: dict[str, object] = {
            "nodepools": clusters * per_cluster,
            "releases": releases,
            "layer_mib": layer_mib,
            "release_fetches_metric": metrics.get("ign_server_release_fetches_total", 0),
            "release_fetches_registry_log": _index_fetches(registry, requests_before, [s.split("@")[1] for s in specs]),
            "registry_requests": metric_sum(server, "ign_server_registry_requests_total"),
            "registry_mib": round(metrics.get("ign_server_registry_bytes_total", 0) / 2**20, 1),
            "resolution_seconds_sum": round(metrics.get("ign_server_release_resolution_seconds_sum", 0), 2),
            "resolutions": metrics.get("ign_server_release_resolution_seconds_count", 0),
            "ready_seconds": round(ready, 2),
            "all_served_seconds": round(served, 1),
            "served": len(result.first_200),
            "failed": len(result.failed),
        }
        return summary
    finally:
        if server is not None:
            server.kill()
        registry.stop()


def _index_fetches(registry: Registry, skip: int, index_digests: list[str]) -> int:
    """Release index manifests the registry served after `skip` requests (one per release read)."""
    lines = [line for line in registry.log.read_text(errors="replace").splitlines() if '"GET /v2/' in line][skip:]
    return sum(1 for line in lines for digest in index_digests if f"/manifests/{digest} " in line and '" 200 ' in line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench releases", description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=440)
    parser.add_argument("--pools", type=int, default=12, help="NodePools per cluster")
    parser.add_argument("--releases", type=int, default=10)
    parser.add_argument("--layer-mib", type=float, default=4.0, help="size of each release image's layer")
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-releases-") as tmp:
        summary = run(args.work or Path(tmp), args.clusters, args.pools, args.releases, args.layer_mib)
    print(json.dumps(summary, indent=1))
    ok = summary["release_fetches_metric"] == args.releases and summary["served"] == summary["nodepools"]
    say("OK: each release read once" if ok else "FAILED: see the figures above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
