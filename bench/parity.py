"""Time to payload with the real MCO binaries: HyperShift's real ignition server against ours,
on the same machine, the same objects, the same release.

    python -m bench parity [--pools 4] [--work DIR]

One hosted cluster (HyperShift's objects, testsupport/parity_world.py) with --pools NodePools on one
release (the real MCO and render images in a local docker-registry, testsupport/real_release.py),
all in the tests' Kubernetes API server before a server starts. Each server starts cold (a
fresh work or cache dir) and every NodePool's token is asked for every 0.1 s; then one more
NodePool of the same cluster and release is added to the running server. Figures: seconds
from the process start to the first payload, to the last, the mean per further NodePool in
that batch, and the added NodePool's seconds from its creation. The reference (one per
control-plane namespace, as HyperShift deploys it) generates one NodePool at a time, every
step for each; ours runs MCO once per (cluster configuration, release).
Needs ../shared/real (or IGNITION_TEST_REAL_DIR); results in bench/results/parity.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from testsupport.harness import ServerProcess, bearer
from testsupport.kubeapi import KubeAPI
from testsupport.parity_world import (
    CLUSTER_A,
    NodePool,
    cluster_inputs,
    cluster_objects,
    token_secret,
    token_secret_name,
)
from testsupport.real_release import push_real_release, real_dir, unpack, unpack_binary
from testsupport.reference_server import ReferenceServer
from testsupport.registry_world import Registry

_REPO = Path(__file__).resolve().parent.parent

POLL = 0.1


def served_times(get_status: Callable[[str], int], pools: list[NodePool], started: float, timeout: float) -> dict[str, float]:
    """Seconds from `started` until each pool's token is first answered 200."""
    times: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(times) < len(pools):
        if time.monotonic() > deadline:
            raise TimeoutError(f"served {sorted(times)} of {[p.key for p in pools]} within {timeout}s")
        for pool in pools:
            if pool.key not in times and get_status(pool.token_value) == 200:
                times[pool.key] = time.monotonic() - started
        time.sleep(POLL)
    return times


def figures(batch: dict[str, float], added: float) -> dict[str, float]:
    ordered = sorted(batch.values())
    per_further = (ordered[-1] - ordered[0]) / (len(ordered) - 1) if len(ordered) > 1 else 0.0
    return {"first_payload_s": round(ordered[0], 2), "all_payloads_s": round(ordered[-1], 2),
            "per_further_nodepool_s": round(per_further, 2), "added_nodepool_s": round(added, 2)}


def run(work: Path, pool_count: int, reference_binary: Path, real_root: Path) -> dict[str, dict[str, float]]:
    registry = Registry(work / "registry").start()
    api = KubeAPI(work / "kubeapi", bookmark_interval=1.0)
    results: dict[str, dict[str, float]] = {}
    try:
        release = push_real_release(registry, unpack(real_root, work / "real"))
        inputs = cluster_inputs(CLUSTER_A, registry)
        for obj in cluster_objects(CLUSTER_A, inputs):
            api.create(obj)
        namespace = CLUSTER_A.namespace

        def measure(label: str, start: Callable[[], Callable[[str], int]], stop: Callable[[], None]) -> None:
            pools = [NodePool(CLUSTER_A, f"{label}-{i}") for i in range(pool_count)]
            for pool in pools:
                api.create(token_secret(pool, release.pullspec, release.version, inputs))
            started = time.monotonic()
            get_status = start()
            try:
                batch = served_times(get_status, pools, started, timeout=600)
                extra = NodePool(CLUSTER_A, f"{label}-added")
                created = time.monotonic()
                api.create(token_secret(extra, release.pullspec, release.version, inputs))
                added = served_times(get_status, [extra], created, timeout=600)[extra.key]
            finally:
                stop()
                for pool in [*pools, NodePool(CLUSTER_A, f"{label}-added")]:  # the next server starts on its own NodePools only
                    if api.get("secrets", namespace, token_secret_name(pool)):
                        api.delete("secrets", namespace, token_secret_name(pool))
            results[label] = figures(batch, added)
            print(f"{label:9} first payload {results[label]['first_payload_s']:6.2f} s  all {pool_count} "
                  f"{results[label]['all_payloads_s']:6.2f} s  per further NodePool {results[label]['per_further_nodepool_s']:5.2f} s  "
                  f"one added later {results[label]['added_nodepool_s']:5.2f} s", flush=True)

        reference = ReferenceServer(reference_binary, work / "reference", api, namespace, ca_files=[registry.ca_file])

        def start_reference() -> Callable[[str], int]:
            reference.start()
            return lambda token: reference.get("/ignition", bearer(token))[0]

        measure("reference", start_reference, reference.kill)
        (work / "empty").mkdir()
        ours = ServerProcess(work / "empty", work / "ours" / "cache", extra=[
            "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition-server",
            "--namespace", namespace, "--release-resolve", "--generate-bases", "--registry-ca-file", str(registry.ca_file),
            "--registry-allow", registry.host])
        api.namespace("ignition-server")

        def start_ours() -> Callable[[str], int]:
            ours.start(wait=False)
            return lambda token: _status(ours, token)

        measure("ours", start_ours, ours.kill)
    finally:
        api.close()
        registry.stop()
    return results


def _status(proc: ServerProcess, token: str) -> int:
    try:
        return proc.get("/ignition", bearer(token))[0]
    except OSError:  # not listening yet
        return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench parity", description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=4, help="NodePools of the cluster present at start (default 4)")
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    root = real_dir()
    if root is None or not (root / "hypershift-ignition-server.xz").is_file():
        print("the real binaries are missing: set IGNITION_TEST_REAL_DIR (see ../shared/real/README.md)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-parity-") as temporary:
        work = args.work or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        binary = unpack_binary(root / "hypershift-ignition-server.xz", work)
        results = run(work, args.pools, binary, root)
    out = _REPO / "bench" / "results" / "parity.json"
    out.write_text(json.dumps({"pools": args.pools, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "results": results}, indent=2) + "\n")
    print(f"written {out.relative_to(_REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
