"""What one NodePool's render costs on a real-size MCO base, with and without a RenderReuse.

    python -m bench.render_cost [--clusters 10] [--pools 12] [--before /work/main] [--repeat N] [--work DIR]

Each cluster's base is HyperShift's real payload for it (434 KB: its own CA, kubeconfig and pull
secret), made by the real MCO binaries (testsupport/real_base.py, ../shared/real) and imported as
`ignition-server base import` does; each NodePool has a small MachineConfig of its own (the
fleet of issue 33). The renders run in a fresh process per measure, one at a time (the reconciler
renders two at a time in threads; the GIL makes that no faster, `--threads 2` shows it), in two
orders: the work queue's round robin over namespaces (one NodePool of each cluster in turn: with
more clusters than the reuse keeps bases, every render meets a base it does not hold, as 440
clusters would) and cluster by cluster (a cluster's NodePools in a burst: the base is held).

`--before TREE` renders the same inputs with another checkout's code (e.g. main), in the same
sitting, and checks that its bytes are ours. Prints ms a render: the rendering thread's CPU time
(median, mean: renders per CPU-second; the first NodePool of each cluster, which parses its base)
and wall time (what a shared machine also shows), and what the reuse holds in memory
(tracemalloc, after the run).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TREE = Path(__file__).resolve().parent.parent


def measure(tree: Path, mode: str, inputs_file: Path, threads: int = 1) -> dict[str, Any]:
    """The renders of `inputs_file` with `tree`'s renderer, in a fresh process: `_measure`'s
    source run with `python -c` in `tree` (its first import path), so `ignition_server` is that
    checkout's whichever code is installed."""
    code = (f"from __future__ import annotations\n{inspect.getsource(_measure)}\nimport json, sys\nfrom pathlib import Path\n"
            "print(json.dumps(_measure(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code, mode, str(inputs_file), str(threads)],
                          env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"measuring {mode} with {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _measure(mode: str, inputs_file: Path, threads: int) -> dict[str, Any]:
    """Runs in the measuring process, on its own (imports inside): only `ignition_server.render`
    of the tree measured."""
    import gc
    import hashlib
    import pickle
    import statistics
    import time
    import tracemalloc
    from concurrent.futures import ThreadPoolExecutor

    from ignition_server.render import payload

    all_inputs = pickle.loads(inputs_file.read_bytes())
    reuse = None
    if mode == "reuse":
        reuse = payload.RenderReuse()
        render = payload.renderer(reuse)
    else:
        render = payload.render_payload
    render(all_inputs[0])  # imports, schemas, templates: not a render's cost
    if reuse is not None:
        reuse = payload.RenderReuse()
        render = payload.renderer(reuse)

    def timed(inputs: Any) -> tuple[float, bytes, float]:
        started, cpu = time.perf_counter(), time.thread_time()
        body = render(inputs).body
        return time.perf_counter() - started, hashlib.sha256(body).digest(), time.thread_time() - cpu

    started = time.perf_counter()
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(timed, all_inputs))
    else:
        results = [timed(inputs) for inputs in all_inputs]
    wall = time.perf_counter() - started
    out: dict[str, Any] = {
        "renders": len(results), "wall_s": round(wall, 3), "renders_per_s": round(len(results) / wall, 1),
        "median_ms": round(statistics.median(t for t, _, _ in results) * 1000, 2),
        "mean_ms": round(statistics.fmean(t for t, _, _ in results) * 1000, 2),
        # CPU time of the rendering thread: what a render costs, less what other processes took.
        "cpu_median_ms": round(statistics.median(c for _, _, c in results) * 1000, 2),
        "cpu_mean_ms": round(statistics.fmean(c for _, _, c in results) * 1000, 2),
        "first_of_each_cluster_median_ms": None,
        "bodies_sha256": hashlib.sha256(b"".join(d for _, d, _ in results)).hexdigest(),
    }
    out["renders_per_cpu_s"] = round(1000 / out["cpu_mean_ms"], 1)
    if reuse is not None:
        out["base_hits"], out["base_unpacked"], out["base_misses"] = reuse.base_hits, reuse.base_unpacked, reuse.base_misses
        out["checked_items"] = len(reuse.checked)
        # What the reuse holds: allocated with it alive, less after it is gone (bodies discarded).
        gc.collect()
        tracemalloc.start()
        reuse = payload.RenderReuse()
        render = payload.renderer(reuse)
        for inputs in all_inputs:
            render(inputs)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        del reuse, render
        gc.collect()
        out["reuse_holds_mib"] = round((held - tracemalloc.get_traced_memory()[0]) / 2**20, 2)
        tracemalloc.stop()
    seen: set[str] = set()
    firsts = []
    for inputs, (_, _, cpu) in zip(all_inputs, results):
        if inputs.mco_base_yaml not in seen:
            seen.add(inputs.mco_base_yaml)
            firsts.append(cpu)
    out["first_of_each_cluster_median_ms"] = round(statistics.median(firsts) * 1000, 2)
    return out


def build(work: Path, clusters: int, pools: int) -> tuple[list[Any], list[Any]]:
    """The NodePools' inputs in the work queue's round-robin order and cluster by cluster."""
    from testsupport.real_base import nodepool_inputs, real_cluster, real_mco_tree
    from testsupport.real_release import require_real_dir, unpack_tree

    real = real_mco_tree(unpack_tree(require_real_dir(), work / "mco"))
    made = []
    for c in range(clusters):
        started = time.perf_counter()
        made.append(real_cluster(real, work / f"c{c}", f"c{c}"))
        print(f"cluster c{c}: HyperShift's payload {len(made[-1].payload):,} bytes, base {len(made[-1].base_yaml):,} "
              f"bytes of YAML ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    by_cluster = [[nodepool_inputs(cluster, p) for p in range(1, pools + 1)] for cluster in made]
    round_robin = [row[p] for p in range(pools) for row in by_cluster]
    return round_robin, [inputs for row in by_cluster for inputs in row]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.render_cost")
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--pools", type=int, default=12)
    parser.add_argument("--before", type=Path, help="another checkout whose renderer to measure too (e.g. /work/main)")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--repeat", type=int, default=1, help="run every measure this many times, in turn (a shared machine)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="render-cost-") as scratch:
        work = args.work or Path(scratch)
        round_robin, by_cluster = build(work, args.clusters, args.pools)
        files: dict[str, Path] = {}
        for name, ordered in (("round-robin", round_robin), ("by-cluster", by_cluster)):
            files[name] = work / f"{name}.pickle"
            files[name].write_bytes(pickle.dumps(ordered))
        runs: list[tuple[str, Path, str, str, int]] = []
        if args.before:
            runs += [("before: render_payload", args.before, "plain", order, 1) for order in files]
        runs += [("after: render_payload, no reuse", TREE, "plain", "round-robin", 1)]
        runs += [("after: with RenderReuse", TREE, "reuse", order, 1) for order in files]
        runs += [("after: with RenderReuse, 2 threads", TREE, "reuse", "round-robin", 2)]
        results = []
        for label, tree, mode, order, threads in runs * args.repeat:
            result = measure(tree, mode, files[order], threads)
            results.append({"what": label, "order": order, "threads": threads, **result})
            print(f"{label:36s} {order:11s} CPU median {result['cpu_median_ms']:6.2f} ms, mean {result['cpu_mean_ms']:6.2f} ms "
                  f"({result['renders_per_cpu_s']:5.1f} renders/CPU-s; first of a cluster {result['first_of_each_cluster_median_ms']:6.2f} ms)  "
                  f"wall median {result['median_ms']:6.2f} ms, {result['renders_per_s']:5.1f} renders/s"
                  + (f"  reuse holds {result['reuse_holds_mib']} MiB (bases held {result['base_hits']}, unpacked "
                     f"{result['base_unpacked']}, parsed {result['base_misses']}; {result['checked_items']} items)"
                     if "reuse_holds_mib" in result else ""),
                  flush=True)
        digests: dict[str, set[str]] = {r["order"]: set() for r in results}
        for r in results:
            digests[r["order"]].add(r["bodies_sha256"])
        same = all(len(d) == 1 for d in digests.values())
        print(json.dumps({"clusters": args.clusters, "pools": args.pools, "same_bytes": same, "runs": results}, indent=1))
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
