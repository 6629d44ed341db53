"""Time to the first payload with the REAL MCO binaries (issue 20's measure).

    python -m bench.real_bases [--pools 4] [--clusters 2] [--work DIR]

A local `docker-registry` holds a release whose machine-config-operator and cluster-config-api
images carry the real binaries (testsupport/real_release.py, from ../shared/real or
IGNITION_TEST_REAL_DIR). The server starts on an empty cache with `--release-resolve
--generate-bases` and one NodePool of cluster 1 (cold: release, both images, render, operator,
controller, render of the payload); then each further NodePool of that cluster and release is
written one at a time and timed until served (the base is known: no run); then the first
NodePool of each further cluster on the same release (a run, the images already extracted).
Each time is from writing the token Secret's manifest to the first 200 for its token; it
includes the file source's poll (0.5 s) and the 50 ms of the timer's own polling.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from ignition_server.tls.certificates import make_ca
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, bearer, wait_for, write_manifests
from testsupport.manifests import KUBECONFIG, build_token_secret, kube_object
from testsupport.real_release import hypershift_mcs_config, push_real_release, require_real_dir, unpack
from testsupport.registry_world import Registry


def run(work: Path, clusters: int, pools: int) -> dict[str, object]:
    real = unpack(require_real_dir(), work / "real")
    registry = Registry(work / "registry").start()
    server: ServerProcess | None = None
    try:
        release = push_real_release(registry, real)
        source = work / "source"
        for c in range(clusters):
            namespace = f"clusters-c{c}"
            ca = make_ca()[0].decode()
            write_manifests(source / f"{namespace}.yaml",
                            kube_object("Secret", namespace, "pull-secret", {".dockerconfigjson": registry.pull_secret()}),
                            kube_object("Secret", namespace, "bootstrap-kubeconfig", {"kubeconfig": KUBECONFIG}),
                            kube_object("ConfigMap", namespace, "user-ca-bundle", {"ca-bundle.crt": registry.ca_file.read_text()}),
                            kube_object("ConfigMap", namespace, "machine-config-server",
                                        hypershift_mcs_config(f"c{c}", root_ca=ca, signer_ca=ca)))

        def add_pool(cluster: int, pool: int) -> float:
            assert server is not None
            namespace, name = f"clusters-c{cluster}", f"c{cluster}-p{pool}"
            started = time.monotonic()
            write_manifests(source / f"{name}.yaml", build_token_secret(
                namespace=namespace, nodepool=f"clusters/{name}", token=f"tok-{name}", release=release.pullspec,
                release_version=release.version, machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=name), generation_time=time.time()))
            wait_for(lambda: server.get("/ignition", bearer(f"tok-{name}"))[0] == 200, timeout=300, interval=0.05,
                     what=f"{name} served")
            return time.monotonic() - started

        # The timer's own polling (a 511 every 50 ms until the token is known) must not trip the
        # failed-attempt limit, which would then answer 503 for seconds.
        server = ServerProcess(source, work / "cache", extra=["--release-resolve", "--generate-bases", "--registry-allow", registry.host,
                                                              "--auth-failure-burst", "1000000"]).start()
        cold = add_pool(0, 0)
        further = [add_pool(0, p) for p in range(1, pools)]
        other_clusters = [add_pool(c, 0) for c in range(1, clusters)]
        return {
            "cold_first_payload_s": round(cold, 2),
            "further_nodepool_same_cluster_release_s": [round(t, 3) for t in further],
            "further_nodepool_median_s": round(statistics.median(further), 3) if further else None,
            "first_nodepool_of_another_cluster_s": [round(t, 2) for t in other_clusters],
            "generations": server.metrics().get('ign_server_base_generations_total{result="ok"}'),
            "payload_renders": server.metrics().get("ign_server_payload_generation_seconds_count"),
            "payload_render_mean_s": round(server.metrics().get("ign_server_payload_generation_seconds_sum", 0.0)
                                           / max(1.0, server.metrics().get("ign_server_payload_generation_seconds_count", 1.0)), 3),
        }
    finally:
        if server is not None:
            server.kill()
        registry.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_bases", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", type=int, default=4, help="NodePools of the first cluster")
    parser.add_argument("--clusters", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-real-bases-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(run(work, args.clusters, args.pools), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
