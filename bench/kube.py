"""Kubernetes mode at the seeds' scale, against the tests' strict API server (no real
kube-apiserver can run here): what a new replica with an empty disk costs, the API load per
1,000 boots and per 1,000 rotations, and the memory of the watches.

    python -m bench kube [--clusters 440 --pools 12 --payload-kib 8]

Phases (each a figure): the fleet's token Secrets created in the API server; a replica with
an empty cache dir started (`serve --kubernetes`): process start -> /readyz, -> first listing
applied, -> every NodePool served (all rendered); RSS then. Boots: every NodePool fetched twice
(first boots set `ignition-reached` once, repeat boots cost nothing), API requests counted by
the server's own metric. Rotations: the replica restarted on its warm cache with a TTL that
makes every token due, API requests per rotation counted the same way.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.run import fetch_all, rss_kib_tree
from testsupport.fleet import nodepool_of, pools, token_secret
from testsupport.harness import ServerProcess
from testsupport.kubeapi import KubeAPI

_REPO = Path(__file__).resolve().parent.parent


def api_requests(server: ServerProcess) -> dict[str, float]:
    return {k.split('verb="')[1].rstrip('"}'): v for k, v in server.metrics().items()
            if k.startswith("ign_server_api_requests_total")}


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def settle(server: ServerProcess, timeout: float) -> None:
    """Until the writes that follow a listing (status, user-data) are done: no create or patch for 3 s."""
    def writes() -> tuple[float, float]:
        now = api_requests(server)
        return now.get("create", 0), now.get("patch", 0)

    last, since, started = writes(), time.monotonic(), time.monotonic()
    while time.monotonic() - since < 3 and time.monotonic() - started < timeout:
        time.sleep(0.5)
        current = writes()
        if current != last:
            last, since = current, time.monotonic()


def wait(predicate, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise TimeoutError(what)
        time.sleep(0.2)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench kube", description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=440)
    parser.add_argument("--pools", type=int, default=12)
    parser.add_argument("--payload-kib", type=int, default=8, help="small payloads: the renders are not what is measured")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    total = args.clusters * args.pools
    results: dict[str, object] = {"nodepools": total, "payload_kib": args.payload_kib}
    with tempfile.TemporaryDirectory() as scratch, KubeAPI(Path(scratch) / "api") as api:
        work = Path(scratch)
        api.namespace("ignition")
        started = time.monotonic()
        first_created = time.time()
        tokens: dict[str, str] = {}
        for cluster, pool in pools(args.clusters, args.pools):
            secret = token_secret("kube-bench", cluster, pool, args.payload_kib, generation_time=time.time())
            api.create(secret)
            tokens[nodepool_of(cluster, pool)] = base64.b64decode(secret["data"]["token"]).decode()
        print(f"created {total} token Secrets in the API server in {time.monotonic() - started:.0f}s")

        def server(ttl: str) -> ServerProcess:
            (work / "empty").mkdir(exist_ok=True)
            return ServerProcess(work / "empty", work / "replica" / "cache", token_ttl=ttl, extra=[
                "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition",
                "--replica-id", "bench", "--render-concurrency", "2"])

        proc = server("11h")
        proc.start(wait=False)
        ready = proc.wait_ready(timeout=args.timeout)
        listed = wait(lambda: "listed Kubernetes API" in proc.logs(), args.timeout, "first listing") + ready
        rendered = wait(lambda: proc.metrics().get("ign_server_payload_cache_total", 0) >= total, args.timeout,
                        "every payload rendered") + listed
        rss, processes = rss_kib_tree(proc.proc.pid)  # type: ignore[union-attr]
        startup = api_requests(proc)
        results["empty_disk"] = {"ready_s": round(ready, 2), "first_listing_s": round(listed, 1),
                                 "all_rendered_s": round(rendered, 1), "rss_mib": round(rss / 1024, 1),
                                 "api_requests": startup}
        print(f"empty disk: /readyz {ready:.2f}s, first listing {listed:.1f}s, all {total} rendered {rendered:.1f}s, "
              f"RSS {rss / 1024:.0f} MiB; API requests {startup}")
        nodepools = sorted(tokens)
        settle(proc, args.timeout)  # user-data for every NodePool written: not a boot's cost
        for label in ("first", "repeat"):
            before = api_requests(proc)
            fetched = fetch_all(proc, tokens, nodepools, time.monotonic(), timeout=args.timeout)
            time.sleep(2)  # the ignition-reached patches are queued off the request path
            used = delta(api_requests(proc), before)
            per_1000 = {k: round(v * 1000 / max(1, len(fetched.first_200)), 1) for k, v in used.items()}
            results[f"{label}_boots"] = {"boots": len(fetched.first_200), "api_requests_per_1000": per_1000}
            print(f"{label} boots: {len(fetched.first_200)} served; API requests per 1,000 boots: {per_1000 or 0}")
        proc.stop()
        # Every token falls due 30 s after this restart, once its listing has settled: the
        # requests counted below are the rotations' alone.
        ttl = 2 * (time.time() - first_created) + 60
        proc = server(f"{ttl:.0f}s")
        proc.start()
        wait(lambda: "listed Kubernetes API" in proc.logs(), args.timeout, "first listing")
        settle(proc, 25)
        before = api_requests(proc)
        wait(lambda: proc.metrics().get("ign_server_token_rotation_total", 0) >= total, args.timeout, "every rotation")
        time.sleep(3)  # user-data writes follow the rotation
        used = delta(api_requests(proc), before)
        rotations = proc.metrics().get("ign_server_token_rotation_total", 0)
        per_1000 = {k: round(v * 1000 / rotations, 1) for k, v in used.items()}
        results["rotations"] = {"rotations": rotations, "api_requests_per_1000": per_1000}
        print(f"rotations: {rotations:.0f}; API requests per 1,000 rotations (with user-data): {per_1000}")
        print(f"test API server saw: {dict(api.server.requests)}; refusals by code: {dict(api.server.refusals)}")
        proc.stop()
    out = _REPO / "bench" / "results" / "kube.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
