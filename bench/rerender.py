"""Re-render of a shared input: one ConfigMap shared by 1,000 of 5,280 NodePools changes.

    python -m bench.rerender [--clusters 440 --pools 12 --shared 1000 --payload-kib 32] [--json]

The fleet is testsupport/fleet.py's (token Secrets with two MachineConfigs each), and `--shared` of the
NodePools (a seeded random choice) carry the annotation
`ignition-server.openshift.io/input-user-ca-bundle: ignition-server/ca`, which points their user CA bundle
at the ConfigMap `ignition-server/ca` (key `ca-bundle.crt`, a PEM-looking bundle of `--ca-kib`). The other
NodePools read no CA bundle (their namespace has none).

1. Start the server on a fresh cache dir and wait until every NodePool is rendered and the server
   is idle (no render queued, < 0.5 core for 2 s).
2. idle: `--requests` GETs /ignition (`--concurrency` in flight, random NodePools with their
   current tokens, `Authorization: Bearer base64(token)`, TLS with the server's CA): latencies.
3. re-render: rewrite `ignition-server/ca` (temp + rename) with a new bundle, and at once fire the same
   load, which runs until the re-render is over (capped at 10 x `--requests`). The metrics are
   polled until the render counter rose by `--shared` and the render queue is empty (or no render
   happened for `--stall` s), then for `--settle` s more to catch any extra render. Reports the
   renders delta (must equal
   `--shared`), the re-render wall time (file write -> the last "payload ready" log line of the
   server), the serving p50/p99/max during the re-render beside the idle ones, and every non-200
   (there must be none: the last good payload keeps serving).
4. after: every shared NodePool must serve the new CA bundle, a sample of the others none.

The server's log also names each NodePool it rendered: the set rendered after the write must be
exactly the shared set. Plain lines with PASS/FAIL; `--json` adds a JSON summary line at the end.
Traffic goes to 127.0.0.1 only; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import calendar
import json
import random
import shutil
import signal
import ssl
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from ignition_server.render.join import USER_CA_BUNDLE_PATH, merge_ca_bundles
from testsupport import fleet as fleetgen
from testsupport.harness import ServerProcess
from testsupport.shared_input_fleet import (
    SHARED_ANNOTATION,
    SHARED_REF,
    fleet_reusable,
    generate,
    read_configmap_variant,
    write_configmap,
)

from . import run as runner

_REPO = Path(__file__).resolve().parents[1]

ACCEPT = runner.ACCEPT

_quiet = False


def say(line: str) -> None:
    if not _quiet:
        print(line, flush=True)


verdict = runner.verdict


# -- the load client ------------------------------------------------------------------------


@dataclass
class Load:
    """Per request: (start, latency) in seconds on the monotonic clock, status, NodePool."""
    starts: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    nodepools: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # non-200 and transport errors, first few
    corrupt: list[str] = field(default_factory=list)
    bytes: int = 0

    def add(self, start: float, latency: float, status: int, nodepool: str) -> None:
        self.starts.append(start)
        self.latencies.append(latency)
        self.statuses.append(status)
        self.nodepools.append(nodepool)


def auth_headers(nodepool: str, token: str) -> dict[str, str]:
    return {"Authorization": "Bearer " + base64.b64encode(token.encode()).decode(),
            "NodePool": nodepool, "Accept": ACCEPT}


async def fire(session: aiohttp.ClientSession, url: str, tokens: dict[str, str], nodepools: list[str], *,
               requests: int, concurrency: int, rng: random.Random, deadline: float,
               stop: asyncio.Event | None = None, check: bool = True) -> Load:
    """`requests` GETs of random NodePools, `concurrency` in flight; ends early when `stop` is set
    or at `deadline` (monotonic)."""
    load = Load()
    picks = [rng.choice(nodepools) for _ in range(requests)]
    position = 0

    async def worker() -> None:
        nonlocal position
        while position < len(picks) and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            nodepool = picks[position]
            position += 1
            t = time.monotonic()
            try:
                async with session.get(url + "/ignition", headers=auth_headers(nodepool, tokens[nodepool])) as response:
                    body = await response.read()
                    status = response.status
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                status, body = 0, f"{type(exc).__name__}: {exc}".encode()
            load.add(t, time.monotonic() - t, status, nodepool)
            if status == 200:
                load.bytes += len(body)
                problem = runner.check_body(body, nodepool) if check else None
                if problem and len(load.corrupt) < 20:
                    load.corrupt.append(problem)
            elif len(load.errors) < 20:
                load.errors.append(f"{nodepool}: HTTP {status} {body[:200]!r}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return load


def session_for(ca_file: Path, concurrency: int) -> aiohttp.ClientSession:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=concurrency),
                                 timeout=aiohttp.ClientTimeout(total=60))


def stats(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"n": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {"n": len(latencies),
            "p50_ms": round(runner.percentile(latencies, 0.50) * 1000, 1),
            "p99_ms": round(runner.percentile(latencies, 0.99) * 1000, 1),
            "max_ms": round(max(latencies) * 1000, 1)}


def fmt(s: dict[str, float]) -> str:
    return f"p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms, max {s['max_ms']:.1f} ms over {s['n']} requests"


def status_counts(statuses: list[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    return dict(sorted(counts.items()))


# -- the server's view ----------------------------------------------------------------------


async def scrape(session: aiohttp.ClientSession, metrics_port: int) -> dict[str, float]:
    async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
        text = await response.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and (line.startswith("ign_server_payload") or line.startswith("ign_server_render")):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


RENDERS = "ign_server_payload_cache_miss_total"
QUEUE = "ign_server_render_queue_depth"
FAILURES = "ign_server_render_failures_total"
GEN_SUM, GEN_COUNT = "ign_server_payload_generation_seconds_sum", "ign_server_payload_generation_seconds_count"


def _log_time(stamp: str) -> float:
    # "2026-11-22T06:20:01.123Z" (UTC, ms)
    main, _, ms = stamp.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S")) + int(ms or 0) / 1000


def renders_in_log(log_path: Path, since_offset: int) -> list[tuple[float, str]]:
    """(wall time, NodePool) of every "payload ready" line the server logged after byte `since_offset`."""
    out: list[tuple[float, str]] = []
    with open(log_path, "rb") as f:
        f.seek(since_offset)
        for raw in f:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            msg = str(entry.get("msg", ""))
            if msg.startswith("payload ready for "):
                out.append((_log_time(entry["time"]), msg.removeprefix("payload ready for ").split(" ", 1)[0]))
    return out


def served_in_log(log_path: Path, start: int, end: int | None = None) -> list[float]:
    """Server-side durations (s) of the GET /ignition lines the server logged between two byte offsets."""
    out: list[float] = []
    with open(log_path, "rb") as f:
        f.seek(start)
        data = f.read() if end is None else f.read(max(0, end - start))
    for raw in data.splitlines():
        if b'"GET /ignition' not in raw:
            continue
        try:
            out.append(float(json.loads(raw)["duration_ms"]) / 1000)
        except (ValueError, KeyError, TypeError):
            continue
    return out


def file_source(config: dict[str, Any], path: str) -> bytes | None:
    for f in config.get("storage", {}).get("files", []):
        if f.get("path") == path:
            url = f.get("contents", {}).get("source", "")
            head, _, data = url.partition(",")
            return base64.b64decode(data) if head.endswith(";base64") else urllib.parse.unquote_to_bytes(data)
    return None


# -- the scenario ---------------------------------------------------------------------------


async def _rerender_phase(server: ServerProcess, meta: dict[str, Any], tokens: dict[str, str], args: argparse.Namespace,
                          new_variant: int, expected: int) -> dict[str, Any]:
    source = Path(meta["source"])
    nodepools = sorted(tokens)
    shared = set(meta["shared"])
    rng = random.Random(f"{meta['seed']}/load")
    out: dict[str, Any] = {}
    async with session_for(server.ca_file, args.concurrency) as session, aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30)) as metrics_session:
        # A short warm-up (connections, TLS sessions), not counted.
        await fire(session, server.url, tokens, nodepools, requests=min(200, args.requests), concurrency=args.concurrency,
                   rng=rng, deadline=time.monotonic() + 60)
        before_idle = await scrape(metrics_session, server.metrics_port)
        assert server.log_path is not None
        idle_offset = server.log_path.stat().st_size
        idle = await fire(session, server.url, tokens, nodepools, requests=args.requests, concurrency=args.concurrency,
                          rng=rng, deadline=time.monotonic() + args.load_timeout)
        before = await scrape(metrics_session, server.metrics_port)
        out["idle"] = {**stats(idle.latencies), "server_side": stats(served_in_log(server.log_path, idle_offset)),
                       "statuses": status_counts(idle.statuses), "corrupt": len(idle.corrupt),
                       "renders": int(before[RENDERS] - before_idle[RENDERS]), "errors": idle.errors[:5]}

        # The change: ignition-server/ca, atomically. The log offset marks where the re-render's lines begin.
        log_offset = server.log_path.stat().st_size
        t_write_wall = time.time()
        t_write = time.monotonic()
        bundle = write_configmap(source, meta["seed"], new_variant, meta["ca_kib"])
        done = asyncio.Event()
        load_task = asyncio.create_task(fire(
            session, server.url, tokens, nodepools, requests=args.requests * 10, concurrency=args.concurrency,
            rng=rng, deadline=t_write + args.rerender_timeout, stop=done))
        # Poll until the counter rose by `expected` and the queue is empty (or the server stays
        # idle that long without getting there), all bounded by --rerender-timeout.
        first_render_seen: float | None = None
        last_change, last_delta = t_write, 0.0
        reached: float | None = None
        polls = 0
        now_metrics = before
        while time.monotonic() - t_write < args.rerender_timeout:
            await asyncio.sleep(args.poll)
            polls += 1
            now_metrics = await scrape(metrics_session, server.metrics_port)
            delta = now_metrics[RENDERS] - before[RENDERS]
            now = time.monotonic()
            if delta != last_delta:
                last_change, last_delta = now, delta
                first_render_seen = first_render_seen or now
            if now_metrics.get(QUEUE, 0) == 0 and delta >= expected:
                reached = now
                break
            if now_metrics.get(QUEUE, 0) == 0 and now - last_change > args.stall:
                break  # no render for --stall s and short of the expected count: report what happened
        done.set()
        during = await load_task
        during_end_offset = server.log_path.stat().st_size
        t_reached = reached or time.monotonic()
        # Settle: an extra render after the counter reached `expected` would show up now.
        await asyncio.sleep(args.settle)
        after = await scrape(metrics_session, server.metrics_port)
        renders_delta = int(after[RENDERS] - before[RENDERS])
        logged = renders_in_log(server.log_path, log_offset)
        logged_set = {np for _, np in logged}
        last_render_wall = max((t for t, _ in logged), default=float("nan"))
        first_render_wall = min((t for t, _ in logged), default=float("nan"))
        gen_n = after.get(GEN_COUNT, 0) - before.get(GEN_COUNT, 0)
        gen_s = after.get(GEN_SUM, 0) - before.get(GEN_SUM, 0)
        window_end = t_write + (last_render_wall - t_write_wall) if logged else t_reached
        in_window = [i for i, s in enumerate(during.starts) if s <= window_end]
        lat_window = [during.latencies[i] for i in in_window]
        lat_shared = [during.latencies[i] for i in in_window if during.nodepools[i] in shared]
        non200 = sum(1 for s in during.statuses if s != 200)
        out["rerender"] = {
            "expected_renders": expected,
            "renders_delta": renders_delta,
            "renders_logged": len(logged),
            "rendered_exactly_the_shared_set": logged_set == shared,
            "rendered_outside_shared": sorted(logged_set - shared)[:10],
            "shared_not_rendered": len(shared - logged_set),
            "render_failures_delta": int(after.get(FAILURES, 0) - before.get(FAILURES, 0)),
            "wall_s": round(last_render_wall - t_write_wall, 2) if logged else None,
            "first_render_after_s": round(first_render_wall - t_write_wall, 2) if logged else None,
            "observed_by_polling_s": round(t_reached - t_write, 2),
            "reached": reached is not None,
            "polls": polls,
            "render_mean_ms": round(gen_s / gen_n * 1000, 1) if gen_n else None,
            "render_seconds_sum": round(gen_s, 1),
        }
        out["during"] = {**stats(lat_window), "shared_nodepools": stats(lat_shared),
                         "server_side": stats(served_in_log(server.log_path, log_offset, during_end_offset)),
                         "requests_total": len(during.latencies), "all_requests": stats(during.latencies),
                         "statuses": status_counts(during.statuses), "non_200": non200,
                         "corrupt": len(during.corrupt), "errors": during.errors[:5] + during.corrupt[:5]}

        # After: every shared NodePool serves the new bundle; a sample of the others has none.
        want = merge_ca_bundles((bundle.encode(),))
        stale, wrong, checked, others_with_ca = [], [], 0, 0
        others = sorted(set(nodepools) - shared)
        sample_others = random.Random(1).sample(others, min(len(others), 100))
        sem = asyncio.Semaphore(args.concurrency)

        async def verify(nodepool: str) -> None:
            nonlocal checked, others_with_ca
            async with sem:
                async with session.get(server.url + "/ignition", headers=auth_headers(nodepool, tokens[nodepool])) as r:
                    body, status = await r.read(), r.status
            checked += 1
            if status != 200:
                wrong.append(f"{nodepool}: HTTP {status}")
                return
            got = file_source(json.loads(body), USER_CA_BUNDLE_PATH)
            if nodepool in shared:
                if got != want:
                    stale.append(nodepool)
            elif got is not None:
                others_with_ca += 1

        await asyncio.gather(*(verify(np) for np in sorted(shared) + sample_others))
        out["after"] = {"checked": checked, "shared_with_new_ca": len(shared) - len(stale), "shared": len(shared),
                        "stale": stale[:10], "not_200": wrong[:10], "others_with_a_ca": others_with_ca,
                        "others_checked": len(sample_others)}
    return out


def scenario(args: argparse.Namespace) -> dict[str, Any]:
    fleet_dir: Path = args.fleet
    n_total = args.clusters * args.pools
    meta, why = (None, "--regenerate") if args.regenerate else fleet_reusable(
        fleet_dir, args.clusters, args.pools, args.payload_kib, args.shared, args.ca_kib, args.seed)
    if meta is None:
        started = time.monotonic()
        say(f"fleet: generating {args.clusters} x {args.pools} ({why}) -> {fleet_dir}")
        meta = generate(fleet_dir, args.clusters, args.pools, args.payload_kib, args.shared, args.ca_kib, args.seed)
        say(f"fleet: generated in {time.monotonic() - started:.1f}s")
    else:
        say(f"fleet: {why} ({fleet_dir})")
    source = Path(meta["source"])
    variant = read_configmap_variant(source)
    summary: dict[str, Any] = {"server_tree": str(args.server_tree or "working tree"), "fleet": {"clusters": args.clusters, "pools": args.pools, "nodepools": n_total,
                                         "payload_kib": args.payload_kib, "shared": args.shared,
                                         "shared_configmap": SHARED_REF, "ca_kib": args.ca_kib, "dir": str(fleet_dir)}}
    say(f"fleet: {args.clusters} clusters x {args.pools} NodePools = {n_total}, ~{args.payload_kib} KiB payloads "
        f"(+ the {args.ca_kib} KiB CA bundle for the shared ones); {args.shared} read ConfigMap {SHARED_REF} "
        f"through {SHARED_ANNOTATION}")
    work: Path = args.work
    cache_dir = work / "cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    Path(str(cache_dir) + ".key").unlink(missing_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(source=source, cache_dir=cache_dir, token_ttl="11h")
    try:
        t0, ready = runner.start_timed(server)
        say(f"cold: ready in {ready:.2f}s; rendering {n_total} payloads ...")
        deadline = t0 + args.cold_timeout
        while time.monotonic() < deadline:
            if (runner.metric(server, "ign_server_payload_cache_total") >= n_total
                    and runner.metric(server, QUEUE) == 0):
                break
            time.sleep(0.5)
        cold_s = time.monotonic() - t0
        cached = int(runner.metric(server, "ign_server_payload_cache_total"))
        settle = runner.wait_quiescent(server, idle_cpu=args.idle_cpu, timeout=max(60.0, deadline - time.monotonic()))
        summary["cold"] = {"render_all_s": round(cold_s, 1), "payloads": cached,
                           "renders": int(runner.metric(server, RENDERS)), "pass": cached >= n_total}
        say(f"cold: {cached}/{n_total} payloads in {cold_s:.1f}s, idle {settle:.1f}s later  {verdict(cached >= n_total)}")
        if cached < n_total:
            return summary
        tokens = runner.current_tokens(meta)
        missing = n_total - len(tokens)
        if missing:
            say(f"warning: {missing} NodePools have no token in the source")
        with open("/proc/loadavg") as f:
            summary["loadavg_before"] = f.read().split()[:3]
        result = asyncio.run(_rerender_phase(server, meta, tokens, args, variant + 1, args.shared))
        summary.update(result)
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
    summary["server_log"] = str(server.log_path)

    idle, during, rr, after = summary["idle"], summary["during"], summary["rerender"], summary["after"]
    ok_renders = rr["renders_delta"] == args.shared and rr["rendered_exactly_the_shared_set"]
    ok_errors = during["non_200"] == 0 and during["corrupt"] == 0 and idle["statuses"] == {200: idle["n"]}
    ok_after = after["shared_with_new_ca"] == after["shared"] and not after["not_200"] and after["others_with_a_ca"] == 0
    p99_bound = max(args.p99_factor * idle["p99_ms"], args.p99_floor_ms)
    ok_p99 = during["p99_ms"] <= p99_bound if during["n"] else True
    say(f"idle: {fmt(idle)}; statuses {idle['statuses']}; {idle['renders']} renders while serving")
    say(f"rerender: renders delta {rr['renders_delta']} (expected exactly {args.shared}); the server logged "
        f"{rr['renders_logged']} renders, {'exactly the shared set' if rr['rendered_exactly_the_shared_set'] else 'NOT the shared set'}"
        f" ({rr['shared_not_rendered']} shared not rendered, outside: {rr['rendered_outside_shared']}); "
        f"{rr['render_failures_delta']} render failures  {verdict(ok_renders)}")
    wall = rr["wall_s"]
    say(f"rerender: {wall if wall is not None else 'n/a'} s from the ConfigMap write to the last render done "
        f"(first render after {rr['first_render_after_s']} s; polling saw it done after {rr['observed_by_polling_s']} s); "
        f"{rr['render_mean_ms']} ms per render on average")
    say(f"during: {fmt(during)} started within the re-render (shared NodePools: {fmt(during['shared_nodepools'])}); "
        f"{during['requests_total']} requests in all, statuses {during['statuses']}, {during['non_200']} non-200, "
        f"{during['corrupt']} corrupt  {verdict(ok_errors)}")
    ratio = during["p99_ms"] / idle["p99_ms"] if idle["p99_ms"] else float("nan")
    say(f"compare: p50 {idle['p50_ms']:.1f} -> {during['p50_ms']:.1f} ms, p99 {idle['p99_ms']:.1f} -> "
        f"{during['p99_ms']:.1f} ms ({ratio:.1f}x), max {idle['max_ms']:.1f} -> {during['max_ms']:.1f} ms "
        f"(bench bound: during p99 <= max({args.p99_factor:g} x idle p99, {args.p99_floor_ms:g} ms) = {p99_bound:.0f} ms)"
        f"  {verdict(ok_p99)}")
    say(f"after: {after['shared_with_new_ca']}/{after['shared']} shared NodePools serve the new CA bundle, "
        f"{after['others_with_a_ca']}/{after['others_checked']} others carry a CA bundle, not 200: {after['not_200']}"
        f"  {verdict(ok_after)}")
    say(f"server handler time (access log duration_ms: handler start to response built; no event-loop queueing, "
        f"no send): idle {fmt(idle['server_side'])}; "
        f"during the load of the re-render {fmt(during['server_side'])}")
    for line in during["errors"] + idle["errors"]:
        say(f"error: {line}")
    summary["pass"] = {"renders": ok_renders, "no_errors": ok_errors, "after": ok_after, "p99": ok_p99}
    summary["rerender"]["pass"] = ok_renders
    summary["during"]["pass"] = ok_errors and ok_p99
    summary["after"]["pass"] = ok_after
    return summary


def main(argv: list[str] | None = None) -> int:
    global _quiet
    parser = argparse.ArgumentParser(prog="python -m bench.rerender", description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=440)
    parser.add_argument("--pools", type=int, default=12, help="NodePools per cluster")
    parser.add_argument("--shared", type=int, default=1000, help="NodePools that read ignition-server/ca")
    parser.add_argument("--payload-kib", type=int, default=32, help="approximate MachineConfig payload per NodePool")
    parser.add_argument("--ca-kib", type=int, default=16, help="size of the shared CA bundle")
    parser.add_argument("--seed", default=fleetgen.DEFAULT_SEED)
    parser.add_argument("--fleet", type=Path, help="fleet dir (reused when its parameters match and it is < 5 h old); "
                        "default bench/out/rerender-fleet-<clusters>x<pools>-<kib>k")
    parser.add_argument("--regenerate", action="store_true", help="regenerate the fleet even if it could be reused")
    parser.add_argument("--work", type=Path, default=_REPO / "bench" / "out" / "rerender", help="cache dir and log")
    parser.add_argument("--requests", type=int, default=3000, help="requests of the idle load (the re-render load "
                        "runs until the re-render is over, at most 10 x this)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--poll", type=float, default=0.25, help="metrics poll interval during the re-render")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds to watch for extra renders after the count is reached")
    parser.add_argument("--stall", type=float, default=60.0,
                        help="give up when no render happened for this long (queue empty) short of the expected count")
    parser.add_argument("--cold-timeout", type=float, default=3600.0)
    parser.add_argument("--rerender-timeout", type=float, default=900.0)
    parser.add_argument("--load-timeout", type=float, default=600.0)
    parser.add_argument("--idle-cpu", type=float, default=0.5)
    parser.add_argument("--p99-factor", type=float, default=10.0)
    parser.add_argument("--p99-floor-ms", type=float, default=250.0)
    parser.add_argument("--json", action="store_true", help="print a final JSON summary line")
    parser.add_argument("--quiet", action="store_true", help="only the JSON summary (with --json)")
    runner.add_server_tree_argument(parser)
    args = parser.parse_args(argv)
    _quiet = args.quiet and args.json
    runner.use_server_tree(parser, args.server_tree)
    if args.fleet is None:
        args.fleet = _REPO / "bench" / "out" / f"rerender-fleet-{args.clusters}x{args.pools}-{args.payload_kib}k"
    if not 0 < args.shared <= args.clusters * args.pools:
        parser.error("--shared must be between 1 and clusters x pools")
    summary = scenario(args)
    checks = summary.get("pass") or {"cold": False}
    passed = all(checks.values())
    say(f"overall: {verdict(passed)}")
    if args.json:
        print(json.dumps(summary, sort_keys=True, default=str), flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
