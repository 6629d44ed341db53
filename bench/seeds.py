"""The seeds' fleet at real size (issue 33): a warm restart, a cold start, memory and disk.

    python -m bench seeds [--clusters 440 --pools 12] [--scenarios warm,cold,disk] [--cold-client [--honour-retry-after]]

The fleet (testsupport/seeds_fleet.py, deterministic in --seed): --clusters hosted clusters,
each an MCO base imported from a machine-config-server answer of HyperShift's real shape (its
own CAs, kubeconfig and pull secret), one release catalog, --pools NodePools per cluster of a
small MachineConfig each; served payloads ~416 KB, 52 files, 27 units. File source, `serve`'s
defaults (owner + 2 workers), the fetching client on the same machine (aiohttp, 64 in flight).

  warm   (a cache holding the fleet is made first, once) SIGKILL, restart: process start to
         /readyz, to a 200 for every NodePool; renders after the restart once the listing
         settled; RSS of the owner and each worker sampled every 0.25 s during, and after
  cold   an empty cache: every payload stored (renders, renders a second, the server's CPU); with
         --cold-client the client fetches every NodePool meanwhile, retrying 503s as the Ignition
         client does (0.2 s doubling to 5 s, Retry-After ignored; --honour-retry-after: waiting
         at least what it says), and how far the first Retry-After each NodePool was told was
         from when it was served
  disk   the cache's bytes on disk, and what storing each cluster's shared base once would save
         (content-defined chunks shared between one cluster's payloads, measured on a sample)

Results: --results DIR/seeds.json and, with matplotlib (the bench extra), seeds.png: the warm
restart's timeline (NodePools served, renders queued, RSS per process).
"""

from __future__ import annotations

import argparse
import base64
import json
import resource
import shutil
import signal
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from bench.run import (
    add_server_tree_argument,
    all_nodepools,
    cpu_seconds,
    current_tokens,
    fetch_all,
    manifest_of,
    memory_tree,
    metric,
    read_token,
    start_timed,
    use_server_tree,
    wait_quiescent,
)
from testsupport import fleet as fleetgen, seeds_fleet
from testsupport.harness import ServerProcess, free_port

_REPO = Path(__file__).resolve().parents[1]
GOALS = {"ready_s": 1.0, "all_served_s": 10.0, "renders_after_restart": 0, "rss_mib": 300.0, "cold_s": 300.0}
FLEET_MAX_AGE_S = 5 * 3600  # tokens older than TTL/2 (5.5 h at 11 h) are rotated on start
RETRY_AFTER_BOUND_S = 60  # the longest Retry-After the server tells (ignition_server/workers/render_wait.py)


def say(line: str) -> None:
    print(line, flush=True)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def fleet(out: Path, clusters: int, pools: int, seed: str) -> dict[str, Any]:
    """The fleet under `out`, generated unless a young enough one of these parameters is there."""
    try:
        meta = fleetgen.load_fleet(out)
        if (meta.get("kind"), meta["clusters"], meta["pools"], meta["seed"]) == ("seeds", clusters, pools, seed) \
                and time.time() - meta["generated_at"] < FLEET_MAX_AGE_S:
            say(f"fleet: reusing {out} ({(time.time() - meta['generated_at']) / 60:.0f} min old)")
            return meta
    except (OSError, ValueError, KeyError):
        pass
    shutil.rmtree(out / "source", ignore_errors=True)
    shutil.rmtree(out / "cache", ignore_errors=True)
    Path(str(out / "cache") + ".key").unlink(missing_ok=True)
    started = time.monotonic()
    meta = seeds_fleet.generate(out, clusters, pools, seed)
    size = sum(p.stat().st_size for p in Path(meta["source"]).rglob("*.yaml"))
    say(f"fleet: {clusters} x {pools} = {clusters * pools} NodePools, {size / 2**20:.0f} MiB of manifests, "
        f"generated in {time.monotonic() - started:.0f}s")
    return meta


def stable_ports(work: Path) -> dict[str, int]:
    """The fleet's serving and metrics ports, the same for every run on it: the public URL is
    in every user-data Secret, and a new one would have each restart rewrite all 5,280."""
    path = work / "ports.json"
    try:
        return {k: int(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        ports = {"port": free_port(), "metrics_port": free_port()}
        path.write_text(json.dumps(ports))
        return ports


def per_process_mib(pid: int) -> list[float]:
    """VmRSS in MiB of the owner first, then its descendants (the workers), in pid order."""
    tree = memory_tree(pid)
    return [round(tree[p][0] / 1024, 1) for p in [pid] + sorted(p for p in tree if p != pid) if p in tree]


class Sampler(threading.Thread):
    """Every `every` s: seconds since t0, RSS per process, renders queued and done (metrics)."""

    def __init__(self, server: ServerProcess, t0: float, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.server, self.t0, self.every = server, t0, every
        self.samples: list[dict[str, Any]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        assert self.server.proc is not None
        ticks = 0
        while not self.halt.wait(self.every):
            sample: dict[str, Any] = {"t": round(time.monotonic() - self.t0, 2),
                                      "rss_mib": per_process_mib(self.server.proc.pid)}
            # /metrics only once a second: a scrape asks every worker for a report and prints
            # 5,280 NodePools' request counts, work the restart being measured would pay for.
            if ticks % round(1 / self.every) == 0:
                sample["queued"] = metric(self.server, "ign_server_render_queue_depth")
                sample["renders"] = metric(self.server, "ign_server_payload_cache_miss_total")
            ticks += 1
            self.samples.append(sample)


def wait_all_stored(server: ServerProcess, n: int, t0: float, timeout: float) -> float:
    while time.monotonic() - t0 < timeout:
        if metric(server, "ign_server_payload_cache_total") >= n:
            return time.monotonic() - t0
        time.sleep(0.25)
    raise TimeoutError(f"not every payload stored after {timeout}s")


def cold(server: ServerProcess, meta: dict[str, Any], with_client: bool, args: argparse.Namespace) -> dict[str, Any]:
    n = meta["clusters"] * meta["pools"]
    shutil.rmtree(server.cache_dir, ignore_errors=True)
    Path(str(server.cache_dir) + ".key").unlink(missing_ok=True)
    t0, ready = start_timed(server)
    assert server.proc is not None
    client: dict[str, Any] = {}
    if with_client:
        source = Path(meta["source"])
        before = resource.getrusage(resource.RUSAGE_SELF)
        got = fetch_all(server, current_tokens(meta), all_nodepools(meta), t0, concurrency=args.concurrency,
                        timeout=args.cold_timeout, token_source=lambda np: read_token(manifest_of(source, np)),
                        honour_retry_after=args.honour_retry_after)
        used = resource.getrusage(resource.RUSAGE_SELF)
        client = {"served": len(got.first_200), "requests": got.requests, "statuses": got.statuses,
                  "corrupt": len(got.corrupt), "honour_retry_after": args.honour_retry_after,
                  "cpu_s": round(used.ru_utime + used.ru_stime - before.ru_utime - before.ru_stime, 1),
                  **told_versus_served(got.first_told, got.first_200)}
    stored = wait_all_stored(server, n, t0, args.cold_timeout)
    renders = metric(server, "ign_server_payload_cache_miss_total")
    inside = metric(server, "ign_server_payload_generation_seconds_sum")
    server_cpu = [round(cpu_seconds(pid), 1) for pid in [server.proc.pid] + sorted(set(memory_tree(server.proc.pid)) - {server.proc.pid})]
    wait_quiescent(server, timeout=args.cold_timeout)
    result = {"all_stored_s": round(stored, 1), "ready_s": round(ready, 2), "renders": int(renders),
              "renders_per_s": round(renders / stored, 2), "ms_inside_a_render": round(inside / max(renders, 1) * 1000),
              "server_cpu_s": server_cpu, "with_client": with_client, **({"client": client} if client else {}),
              "extrapolated_440x12_s": round(stored * 5280 / n, 0), "pass": stored * 5280 / n <= GOALS["cold_s"]}
    say(f"cold{' (client fetching)' if with_client else ''}: {n} payloads stored in {stored:.1f}s, {int(renders)} renders, "
        f"{result['renders_per_s']} renders/s ({result['ms_inside_a_render']} ms inside each); at 5,280: "
        f"~{result['extrapolated_440x12_s']:.0f}s (goal <= {GOALS['cold_s']:.0f}s)  {verdict(result['pass'])}")
    say(f"cold: server CPU until all stored {' + '.join(map(str, server_cpu))} s (owner first)")
    if client:
        say(f"cold: client {client['served']}/{n} served, {client['requests']} requests, statuses {client['statuses']}, "
            f"{client['cpu_s']} s of the client's CPU ({'honouring' if args.honour_retry_after else 'ignoring'} Retry-After, "
            f"Ignition's back-off); first Retry-After told {client.get('told_s')}, served minus told (below the bound): "
            f"{client.get('told_error_s')}")
    return result


def told_versus_served(told: dict[str, tuple[float, int]], served: dict[str, float]) -> dict[str, Any]:
    """How honest the first 503's Retry-After was: (served) - (told at + Retry-After), in
    seconds (negative: the payload was there sooner), over the NodePools told less than the
    bound (a wait beyond it is told as the bound: come back then and ask again)."""
    errors = sorted(served[np] - (at + seconds) for np, (at, seconds) in told.items()
                    if np in served and seconds < RETRY_AFTER_BOUND_S)
    told_s = sorted(seconds for _, seconds in told.values())
    if not told_s:
        return {}
    return {"told_s": {"min": told_s[0], "median": told_s[len(told_s) // 2], "max": told_s[-1],
                       "at_the_bound": sum(s >= RETRY_AFTER_BOUND_S for s in told_s), "all": len(told_s)},
            "told_error_s": {q: round(errors[min(len(errors) - 1, int(f * len(errors)))], 1)
                             for q, f in (("p10", 0.1), ("median", 0.5), ("p90", 0.9))} if errors else None}


def warm(server: ServerProcess, meta: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    n = meta["clusters"] * meta["pools"]
    source = Path(meta["source"])
    if server.proc is None or server.proc.poll() is not None:
        start_timed(server)  # the cache holds the fleet: settle the source's write-backs first
        wait_quiescent(server, timeout=args.cold_timeout)
    # As a server that ran a while: its listing snapshot saved since its last writes (every 10 s).
    time.sleep(args.uptime)
    server.kill()
    tokens = current_tokens(meta)  # the server is down: the source cannot change now
    t0 = time.monotonic()
    server.start(wait=False)
    sampler = Sampler(server, t0)
    sampler.start()
    server.wait_ready(60, interval=0.02)
    ready = time.monotonic() - t0
    client_cpu = resource.getrusage(resource.RUSAGE_SELF)
    server_cpu = {pid: cpu_seconds(pid) for pid in memory_tree(server.proc.pid)}  # type: ignore[union-attr]
    got = fetch_all(server, tokens, all_nodepools(meta), t0, concurrency=args.concurrency, timeout=args.serve_timeout,
                    token_source=lambda np: read_token(manifest_of(source, np)))
    all_served = time.monotonic() - t0
    used = resource.getrusage(resource.RUSAGE_SELF)
    client_s = used.ru_utime + used.ru_stime - client_cpu.ru_utime - client_cpu.ru_stime
    server_s = [round(cpu_seconds(pid) - before, 1) for pid, before in sorted(server_cpu.items())]
    settle = wait_quiescent(server, timeout=args.cold_timeout)
    sampler.halt.set()
    sampler.join()
    assert server.proc is not None
    renders = int(metric(server, "ign_server_payload_cache_miss_total"))
    after = per_process_mib(server.proc.pid)
    during = max((sum(s["rss_mib"]) for s in sampler.samples), default=0.0)
    peak: list[float] = max(sampler.samples, key=lambda s: sum(s["rss_mib"]), default={"rss_mib": []})["rss_mib"]
    result = {"ready_s": round(ready, 3), "all_served_s": round(all_served, 2), "served": len(got.first_200), "nodepools": n,
              "statuses": got.statuses, "corrupt": len(got.corrupt), "renders_after_restart": renders,
              "rss_mib_during_peak": round(during, 1), "rss_mib_during_peak_per_process": peak,
              "cpu_s_while_serving": {"client": round(client_s, 1), "server_by_pid": server_s},
              "rss_mib_after": round(sum(after), 1), "rss_mib_after_per_process": after, "settled_after_s": round(settle, 1),
              "served_at": sorted(round(t, 2) for t in got.first_200.values()), "timeline": sampler.samples}
    checks = {"ready": ready <= GOALS["ready_s"], "served": len(got.first_200) == n and not got.corrupt
              and all_served <= GOALS["all_served_s"], "renders": renders == 0,
              "rss": max(during, sum(after)) <= GOALS["rss_mib"]}
    result["pass"] = all(checks.values())
    say(f"warm: start -> /readyz {ready:.2f}s (goal <= {GOALS['ready_s']:g}s)  {verdict(checks['ready'])}")
    say(f"warm: start -> all {n} served {all_served:.2f}s ({len(got.first_200)} served, {len(got.corrupt)} corrupt, "
        f"statuses {dict(sorted(got.statuses.items()))}; goal <= {GOALS['all_served_s']:g}s at 5,280)  {verdict(checks['served'])}")
    say(f"warm: CPU from ready to all served: client {client_s:.1f}s, server {' + '.join(map(str, server_s))}s "
        f"(owner first)")
    say(f"warm: renders after the restart {renders} (settled {settle:.1f}s after the load; goal 0)  {verdict(checks['renders'])}")
    say(f"warm: RSS during (peak sum) {during:.0f} MiB ({' + '.join(f'{r:.0f}' for r in peak)}), after {sum(after):.0f} MiB "
        f"({' + '.join(f'{r:.0f}' for r in after)}; owner first; goal <= {GOALS['rss_mib']:g})  {verdict(checks['rss'])}")
    return result


# -- disk ---------------------------------------------------------------------------------------


_GEAR = [int.from_bytes(zlib.crc32(bytes([b])).to_bytes(4, "big") * 2, "big") & 0xFFFFFFFF for b in range(256)]


def _chunks(data: bytes, mask: int = (1 << 12) - 1) -> list[bytes]:
    """Content-defined chunks (~4 KiB, a gear hash: each byte shifts the last 32 out), so a
    shared run of bytes is cut the same way wherever it sits in a payload."""
    cuts, rolling, last, gear = [], 0, 0, _GEAR
    for i, byte in enumerate(data):
        rolling = ((rolling << 1) + gear[byte]) & 0xFFFFFFFF
        if rolling & mask == 0 and i - last >= 64:
            cuts.append(data[last:i + 1])
            last = i + 1
    return cuts + [data[last:]]


def disk(server: ServerProcess, meta: dict[str, Any]) -> dict[str, Any]:
    cache = server.cache_dir
    blobs = [p for p in (cache / "blobs").rglob("*") if p.is_file()]
    blob_bytes = sum(p.stat().st_size for p in blobs)
    total = sum(p.stat().st_blocks * 512 for p in cache.rglob("*") if p.is_file())
    # One cluster's payloads, as served: what its NodePools share and how much zlib squeezes.
    source = Path(meta["source"])
    bodies = []
    for pool in range(meta["pools"]):
        nodepool = fleetgen.nodepool_of(0, pool)
        token = read_token(manifest_of(source, nodepool)) or ""
        status, _, body = server.get("/ignition", {"Authorization": "Bearer " + base64.b64encode(token.encode()).decode(),
                                                   "NodePool": nodepool})
        if status == 200:
            bodies.append(body)
    seen: set[bytes] = set()
    unique = 0
    for body in bodies:
        for chunk in _chunks(body):
            if chunk not in seen:
                seen.add(chunk)
                unique += len(chunk)
    raw = sum(len(b) for b in bodies)
    compressed = sum(len(zlib.compress(b, 6)) for b in bodies)
    shared_fraction = 1 - unique / raw if raw else 0.0
    result = {"cache_mib": round(total / 2**20, 1), "blobs": len(blobs), "blob_mib": round(blob_bytes / 2**20, 1),
              "blob_kib_mean": round(blob_bytes / max(len(blobs), 1) / 1024, 1),
              "sample_payloads": len(bodies), "sample_kib_mean": round(raw / max(len(bodies), 1) / 1024, 1),
              "sample_bytes": [min(map(len, bodies), default=0), max(map(len, bodies), default=0)],
              "sample_files_units": sorted({(len(c["storage"]["files"]), len(c["systemd"]["units"]))
                                            for c in map(json.loads, bodies)}),
              "zlib6_ratio": round(compressed / raw, 3) if raw else None,
              "shared_within_cluster": round(shared_fraction, 3),
              "dedup_estimate_mib": round(blob_bytes * (unique / raw) / 2**20, 1) if raw else None}
    say(f"disk: cache {result['cache_mib']:.0f} MiB on disk ({len(blobs)} blobs, {result['blob_kib_mean']:.0f} KiB each, "
        f"stored encrypted, uncompressed); one cluster's {len(bodies)} payloads share {shared_fraction:.0%} of their bytes "
        f"(~4 KiB content-defined chunks): storing the shared part once ~{result['dedup_estimate_mib']} MiB; "
        f"zlib -6 alone: x{result['zlib6_ratio']}")
    return result


def plot(timeline: dict[str, Any], out: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib not installed (pip install -e '.[bench]'): no plot")
        return False
    samples, served_at = timeline["timeline"], timeline["served_at"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    top.step(served_at, range(1, len(served_at) + 1), where="post", label="NodePools served (first 200)")
    top.axvline(timeline["ready_s"], color="green", linestyle="--", label=f"/readyz 200 ({timeline['ready_s']:.2f} s)")
    top.axvline(GOALS["all_served_s"], color="red", linestyle=":", label="goal: all served")
    twin = top.twinx()
    twin.plot([s["t"] for s in samples if "queued" in s], [s["queued"] for s in samples if "queued" in s], color="orange",
              label="renders queued")
    twin.set_ylabel("renders queued")
    top.set_ylabel("NodePools served")
    # One legend, on the twin: drawn on `top`, the twin's line ran through it (over a handle).
    handles, labels = top.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    twin.legend(handles + more, labels + more_labels, loc="center right")
    top.set_title(f"warm restart, {timeline['nodepools']} NodePools: served {timeline['all_served_s']:.1f} s after start, "
                  f"{timeline['renders_after_restart']} renders")
    processes = max((len(s["rss_mib"]) for s in samples), default=0)
    for k in range(processes):
        bottom.plot([s["t"] for s in samples if len(s["rss_mib"]) > k], [s["rss_mib"][k] for s in samples if len(s["rss_mib"]) > k],
                    label="owner" if k == 0 else f"worker {k}")
    bottom.plot([s["t"] for s in samples], [sum(s["rss_mib"]) for s in samples], color="black", label="sum")
    bottom.axhline(GOALS["rss_mib"], color="red", linestyle=":", label="goal")
    bottom.set_xlabel("seconds since the process started")
    bottom.set_ylabel("RSS (MiB)")
    bottom.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench seeds", description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=440)
    parser.add_argument("--pools", type=int, default=12, help="NodePools per cluster")
    parser.add_argument("--seed", default=seeds_fleet.DEFAULT_SEED)
    parser.add_argument("--scenarios", default="warm,cold,disk")
    parser.add_argument("--cold-client", action="store_true", help="cold: the client fetches every NodePool meanwhile")
    parser.add_argument("--honour-retry-after", action="store_true",
                        help="the client waits at least a 503's Retry-After (Ignition does not: its back-off alone)")
    parser.add_argument("--work", type=Path, help="fleet, cache and logs (default bench/out/seeds-CxP)")
    parser.add_argument("--results", type=Path, default=_REPO / "bench" / "out", help="seeds.json and seeds.png go here")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--cold-timeout", type=float, default=3600.0)
    parser.add_argument("--serve-timeout", type=float, default=600.0)
    parser.add_argument("--server-args", default="", help="more `serve` flags")
    parser.add_argument("--uptime", type=float, default=15.0,
                        help="warm: seconds the server runs settled before the kill (its snapshot saved, as after a while)")
    add_server_tree_argument(parser)
    args = parser.parse_args(argv)
    use_server_tree(parser, args.server_tree)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(scenarios) - {"warm", "cold", "disk"}
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    work = args.work or _REPO / "bench" / "out" / f"seeds-{args.clusters}x{args.pools}"
    meta = fleet(work, args.clusters, args.pools, args.seed)
    ports = stable_ports(work)
    server = ServerProcess(Path(meta["source"]), work / "cache", extra=args.server_args.split(), port=ports["port"],
                           metrics_port=ports["metrics_port"])
    summary: dict[str, Any] = {"fleet": {k: meta[k] for k in ("clusters", "pools", "seed")}}
    try:
        if "cold" in scenarios or not (work / "cache" / "index.bin").exists():
            summary["cold"] = cold(server, meta, args.cold_client, args)
        if "warm" in scenarios:
            summary["warm"] = warm(server, meta, args)
        if "disk" in scenarios:
            if server.proc is None or server.proc.poll() is not None:
                start_timed(server)
            summary["disk"] = disk(server, meta)
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "seeds.json").write_text(json.dumps(summary, indent=1))
    if "warm" in summary:
        plot(summary["warm"], args.results / "seeds.png")
    passed = all(part.get("pass", True) for part in summary.values() if isinstance(part, dict))
    say(f"overall: {verdict(passed)} (results: {args.results / 'seeds.json'})")
    return 0 if passed else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
