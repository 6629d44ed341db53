"""Restart scenarios against the real server process (one `ignition-server serve`).

    python -m bench.run --fleet DIR [--scenarios cold,warm,memory,crash] [--json]

  cold    fresh cache dir: time from process start until every NodePool is rendered, renders
  warm    SIGKILL, restart: time to /readyz 200 and to a first 200 for EVERY NodePool, renders
          after the restart (target 0, ready <= 2 s)
  memory  RSS summed over the server and its children once every NodePool was served (<= 300 MiB)
  crash   50 x (start, run 0.2-3 s with 4 s token TTL and config edits, kill -9), then restart
          and check every NodePool serves its current config, no corrupt payload, cache verify
          clean; on its own (smaller by default) fleet

Figures are printed as plain lines, with PASS/FAIL against the targets; `--json` adds a final
JSON summary line. The server and the load client talk over 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import aiohttp

from ignition_server.model.token_secret import parse_token_secret
from testsupport import fleet as fleetgen
from testsupport.harness import ServerProcess
from testsupport.ignition_client import IGNITION_INITIAL_BACKOFF_S, next_retry_wait
from testsupport.manifests import encode_config

_REPO = Path(__file__).resolve().parents[1]

READY_TARGET_S = 2.0
RSS_TARGET_MIB = 300.0
ACCEPT = "application/vnd.coreos.ignition+json;version=3.4.0, */*;q=0.1"
_TOKEN_LINE = re.compile(r"(?m)^  token: ([A-Za-z0-9+/=]+)[ \t]*$")

_quiet = False


def say(line: str) -> None:
    if not _quiet:
        print(line, flush=True)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# -- the fleet as the source holds it now ------------------------------------------------


def read_token(path: Path) -> str | None:
    """The current token of a manifest; a regex first (fast at 5,280 files), YAML if unsure."""
    text = path.read_text()
    found = _TOKEN_LINE.findall(text)
    if len(found) == 1:
        return base64.b64decode(found[0]).decode().strip() or None
    return parse_token_secret(fleetgen.read_secret(path)).token


def manifest_of(source: Path, nodepool: str) -> Path:
    namespace, _, name = nodepool.partition("/")
    return source / namespace / f"{name}.yaml"


def current_tokens(meta: dict[str, Any]) -> dict[str, str]:
    source = Path(meta["source"])
    tokens: dict[str, str] = {}
    for cluster, pool in fleetgen.pools(meta["clusters"], meta["pools"]):
        token = read_token(fleetgen.manifest_path(source, cluster, pool))
        if token:
            tokens[fleetgen.nodepool_of(cluster, pool)] = token
    return tokens


def all_nodepools(meta: dict[str, Any]) -> list[str]:
    return [fleetgen.nodepool_of(c, p) for c, p in fleetgen.pools(meta["clusters"], meta["pools"])]


# -- the server process -----------------------------------------------------------------


def rss_kib_tree(pid: int) -> tuple[int, int]:
    """(VmRSS summed over `pid` and all its descendants in KiB, number of processes)."""
    per_process = memory_tree(pid)
    return sum(rss for rss, _pss in per_process.values()), len(per_process)


def memory_tree(pid: int) -> dict[int, tuple[int, int]]:
    """pid -> (VmRSS, Pss) in KiB for `pid` and all its descendants. Summed RSS counts the
    shared library pages once per process; summed PSS splits them among the sharers."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: dict[int, tuple[int, int]] = {}
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            rss = next(int(line.split()[1]) for line in Path(f"/proc/{current}/status").read_text().splitlines()
                       if line.startswith("VmRSS:"))
            pss = next((int(line.split()[1]) for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines()
                        if line.startswith("Pss:")), rss)
        except (OSError, StopIteration):
            continue
        found[current] = (rss, pss)
        todo.extend(children.get(current, []))
    return found


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric(server: ServerProcess, name: str) -> float:
    try:
        return server.metrics().get(name, 0.0)
    except (OSError, urllib.error.URLError):
        return float("nan")


def start_timed(server: ServerProcess, timeout: float = 60.0) -> tuple[float, float]:
    """Start the server; returns (process start monotonic time, seconds to /readyz 200)."""
    t0 = time.monotonic()
    server.start(wait=False)
    server.wait_ready(timeout, interval=0.02)
    return t0, time.monotonic() - t0


def wait_quiescent(server: ServerProcess, *, idle_cpu: float = 0.5, settle: float = 2.0, timeout: float = 900.0) -> float:
    """Until the server has no render queued and burns < idle_cpu of a core for `settle` s.

    That is how the bench knows the first listing of the source was applied after a restart
    (the server exposes no "listed" signal): applying the listing keeps a core busy, while
    idle polling of 5,280 files costs ~20 % of one. Returns seconds waited.
    """
    assert server.proc is not None
    started = time.monotonic()
    quiet_since: float | None = None
    last_cpu, last_t = cpu_seconds(server.proc.pid), time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(0.5)
        cpu, now = cpu_seconds(server.proc.pid), time.monotonic()
        usage = (cpu - last_cpu) / (now - last_t)
        last_cpu, last_t = cpu, now
        queue = metric(server, "ign_server_render_queue_depth")
        if usage < idle_cpu and queue == 0:
            quiet_since = quiet_since or now
            if now - quiet_since >= settle:
                return now - started
        else:
            quiet_since = None
    raise TimeoutError(f"server still busy after {timeout}s")


# -- the load client ----------------------------------------------------------------------


def check_body(body: bytes, nodepool: str, variant: int | None = None) -> str | None:
    """None when `body` is an Ignition config carrying `nodepool`'s marker file, else why not."""
    try:
        config = json.loads(body)
    except ValueError as exc:
        return f"not JSON: {exc}"
    if not str(config.get("ignition", {}).get("version", "")).startswith("3."):
        return "no ignition.version 3.x"
    for f in config.get("storage", {}).get("files", []):
        if f.get("path") == fleetgen.MARKER_PATH:
            text = urllib.parse.unquote(f.get("contents", {}).get("source", "").removeprefix("data:,"))
            lines = text.splitlines()
            if not lines or lines[0] != nodepool:
                return f"marker of {lines[0] if lines else '?'} served to {nodepool}"
            if variant is not None and f"variant={variant}" not in lines:
                return f"stale config for {nodepool}: {lines[1:]} (want variant={variant})"
            return None
    return "no marker file"


@dataclass
class FetchResult:
    first_200: dict[str, float] = field(default_factory=dict)  # nodepool -> seconds since t0
    statuses: dict[int, int] = field(default_factory=dict)
    corrupt: list[str] = field(default_factory=list)  # unparseable, or another NodePool's payload
    stale: list[str] = field(default_factory=list)  # this NodePool's payload, an older config of it
    failed: dict[str, str] = field(default_factory=dict)  # nodepool -> last status / error
    # nodepool -> (seconds since t0, Retry-After) of its first 503 saying so: was it honest?
    first_told: dict[str, tuple[float, int]] = field(default_factory=dict)
    requests: int = 0
    bytes: int = 0


async def _fetch_all(url: str, ca_file: Path, tokens: dict[str, str], nodepools: list[str], t0: float,
                     concurrency: int, deadline: float, variants: dict[str, int] | None,
                     token_source: Callable[[str], str | None] | None, honour_retry_after: bool) -> FetchResult:
    result = FetchResult()
    ctx = ssl.create_default_context(cafile=str(ca_file))
    queue: asyncio.Queue[str] = asyncio.Queue()
    for nodepool in nodepools:
        queue.put_nowait(nodepool)
    connector = aiohttp.TCPConnector(ssl=ctx, limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)

    async def worker(session: aiohttp.ClientSession) -> None:
        while True:
            try:
                nodepool = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            token = tokens.get(nodepool)
            backoff = IGNITION_INITIAL_BACKOFF_S
            for _attempt in range(1000):  # bounded: as the real client, retry 5xx with back-off
                if time.monotonic() > deadline:
                    result.failed[nodepool] = "deadline"
                    break
                if token is None:
                    result.failed[nodepool] = "no token in the source"
                    break
                headers = {"Authorization": "Bearer " + base64.b64encode(token.encode()).decode(),
                           "NodePool": nodepool, "Accept": ACCEPT}
                try:
                    async with session.get(url + "/ignition", headers=headers) as response:
                        body = await response.read()
                        status = response.status
                        retry_after = response.headers.get("Retry-After")
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    status, body, retry_after = 0, str(exc).encode(), None
                result.requests += 1
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if status == 200:
                    result.bytes += len(body)
                    problem = check_body(body, nodepool, (variants or {}).get(nodepool))
                    if problem and problem.startswith("stale config"):
                        result.stale.append(problem)
                    elif problem:
                        result.corrupt.append(problem)
                    result.first_200[nodepool] = time.monotonic() - t0
                    result.failed.pop(nodepool, None)
                    break
                result.failed[nodepool] = f"HTTP {status}"
                if status == 403 and token_source is not None:
                    token = token_source(nodepool) or token  # rotated meanwhile: re-read the source
                elif 400 <= status < 500:
                    break  # the real client gives up on a 4xx
                if status == 503 and retry_after and retry_after.isdigit() and nodepool not in result.first_told:
                    result.first_told[nodepool] = (time.monotonic() - t0, int(retry_after))
                backoff, pause = next_retry_wait(backoff, retry_after, honour_retry_after)
                await asyncio.sleep(pause)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return result


def fetch_all(server: ServerProcess, tokens: dict[str, str], nodepools: list[str], t0: float, *,
              concurrency: int = 64, timeout: float = 600.0, variants: dict[str, int] | None = None,
              token_source: Callable[[str], str | None] | None = None, honour_retry_after: bool = False) -> FetchResult:
    return asyncio.run(_fetch_all(server.url, server.ca_file, tokens, nodepools, t0, concurrency,
                                  time.monotonic() + timeout, variants, token_source, honour_retry_after))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- scenarios ------------------------------------------------------------------------------


def scenario_cold_warm_memory(fleet_dir: Path, work: Path, scenarios: set[str], args: argparse.Namespace) -> dict[str, Any]:
    meta = fleetgen.load_fleet(fleet_dir)
    nodepools = all_nodepools(meta)
    n = len(nodepools)
    source = Path(meta["source"])
    summary: dict[str, Any] = {"fleet": {"clusters": meta["clusters"], "pools": meta["pools"],
                                         "nodepools": n, "payload_kib": meta["payload_kib"]}}
    say(f"fleet: {meta['clusters']} clusters x {meta['pools']} NodePools = {n} NodePools, "
        f"~{meta['payload_kib']} KiB payloads, source {source}")
    cache_dir = work / "cache"
    if "cold" in scenarios:
        shutil.rmtree(cache_dir, ignore_errors=True)
        Path(str(cache_dir) + ".key").unlink(missing_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(source=source, cache_dir=cache_dir, token_ttl=args.token_ttl,
                           extra=shlex.split(args.server_args))
    try:
        if "cold" in scenarios:
            t0, ready = start_timed(server)
            say(f"cold: ready (empty cache) in {ready:.2f}s; rendering {n} payloads ...")
            deadline = t0 + args.cold_timeout
            last_report = 0.0
            all_cached: float | None = None  # every payload stored (status write-backs may still be queued)
            while time.monotonic() < deadline:
                cached = metric(server, "ign_server_payload_cache_total")
                if cached >= n and all_cached is None:
                    all_cached = time.monotonic() - t0
                if cached >= n and metric(server, "ign_server_render_queue_depth") == 0:
                    break
                if sys.stdout.isatty() and not _quiet and time.monotonic() - last_report > 5:
                    last_report = time.monotonic()
                    print(f"\rcold: {cached:.0f}/{n} rendered after {last_report - t0:.0f}s", end="", flush=True)
                time.sleep(0.25)
            render_all = time.monotonic() - t0
            if sys.stdout.isatty() and not _quiet:
                print()
            cached = metric(server, "ign_server_payload_cache_total")
            renders = metric(server, "ign_server_payload_cache_miss_total")
            gen_sum = metric(server, "ign_server_payload_generation_seconds_sum")
            time.sleep(2.0)  # the index flush follows the last render by ~50 ms; leave margin
            rss_cold, procs = rss_kib_tree(server.proc.pid)  # type: ignore[union-attr]
            summary["cold"] = {"render_all_s": round(render_all, 2), "ready_s": round(ready, 3),
                               "all_payloads_stored_s": round(all_cached, 2) if all_cached is not None else None,
                               "payloads": int(cached), "renders": int(renders),
                               "render_seconds_sum": round(gen_sum, 1), "rss_mib_after_render_all": round(rss_cold / 1024, 1)}
            ok = cached >= n
            if all_cached is not None:
                say(f"cold: every payload stored after {all_cached:.1f}s; every render done and its status "
                    f"written back (render queue empty) after {render_all:.1f}s")
            say(f"cold: render-all {render_all:.1f}s for {int(cached)}/{n} payloads, {int(renders)} renders "
                f"({gen_sum:.0f}s inside renders, {gen_sum / max(renders, 1) * 1000:.0f} ms each); "
                f"RSS {rss_cold / 1024:.0f} MiB ({procs} processes)  {verdict(ok)}")
            if not ok:
                summary["cold"]["pass"] = False
                return summary
            summary["cold"]["pass"] = True
        if "warm" in scenarios or "memory" in scenarios:
            if server.proc is None:
                # No cold phase in this run: the cache dir must already hold the fleet.
                t0, _ = start_timed(server)
                wait_quiescent(server, idle_cpu=args.idle_cpu, timeout=args.cold_timeout)
            server.kill()  # SIGKILL: no drain, no final flush
            tokens = current_tokens(meta)  # the server is down: the source cannot change now
            t0, ready = start_timed(server)
            got = fetch_all(server, tokens, nodepools, t0, concurrency=args.concurrency, timeout=args.serve_timeout,
                            token_source=lambda np: read_token(manifest_of(source, np)))
            all_served = time.monotonic() - t0
            served = len(got.first_200)
            times = list(got.first_200.values())
            settle = wait_quiescent(server, idle_cpu=args.idle_cpu, timeout=args.cold_timeout)
            renders = metric(server, "ign_server_payload_cache_miss_total")
            tree = memory_tree(server.proc.pid)  # type: ignore[union-attr]
            rss, procs = sum(r for r, _ in tree.values()), len(tree)
            pss = sum(p for _, p in tree.values())
            peak = peak_rss_kib(server.proc.pid)  # type: ignore[union-attr]
            ok_ready = ready <= READY_TARGET_S
            ok_all = served == n and not got.corrupt
            ok_renders = renders == 0
            summary["warm"] = {
                "ready_s": round(ready, 3), "every_nodepool_200_s": round(all_served, 2),
                "first_200_p50_s": round(percentile(times, 0.5), 3), "first_200_p99_s": round(percentile(times, 0.99), 3),
                "served": served, "nodepools": n, "corrupt": len(got.corrupt), "statuses": got.statuses,
                "requests": got.requests, "mib_served": round(got.bytes / 2**20, 1),
                "renders_after_restart": int(renders),
                "pass": ok_ready and ok_all and ok_renders,
            }
            say(f"warm: /readyz 200 {ready:.3f}s after process start (target <= {READY_TARGET_S:g}s)  {verdict(ok_ready)}")
            say(f"warm: every NodePool 200 after {all_served:.2f}s: {served}/{n} served, {len(got.corrupt)} corrupt, "
                f"first 200 p50 {percentile(times, 0.5):.2f}s p99 {percentile(times, 0.99):.2f}s, "
                f"statuses {dict(sorted(got.statuses.items()))}  {verdict(ok_all)}")
            say(f"warm: renders after restart {int(renders)} (target 0; counted once the source listing settled, "
                f"{settle:.1f}s after the load)  {verdict(ok_renders)}")
            if got.failed:
                say(f"warm: not served: {dict(list(got.failed.items())[:5])} ...")
            if got.corrupt:
                say(f"warm: corrupt: {got.corrupt[:5]}")
            if "cold" in summary:
                ratio = summary["cold"]["render_all_s"] / max(all_served, 1e-3)
                summary["warm"]["cold_over_warm"] = round(ratio, 1)
                say(f"compare: cold render-all {summary['cold']['render_all_s']:.1f}s vs warm restart to every "
                    f"NodePool 200 {all_served:.2f}s: {ratio:.0f}x faster")
            if "memory" in scenarios:
                ok_rss = rss / 1024 <= RSS_TARGET_MIB
                summary["memory"] = {"rss_mib": round(rss / 1024, 1), "pss_mib": round(pss / 1024, 1),
                                     "per_process_rss_mib": [round(r / 1024, 1) for r, _ in tree.values()],
                                     "per_process_pss_mib": [round(p / 1024, 1) for _, p in tree.values()],
                                     "peak_rss_mib_main": round(peak / 1024, 1), "processes": procs, "pass": ok_rss}
                say(f"memory: RSS {rss / 1024:.0f} MiB summed over {procs} server process(es) "
                    f"({' + '.join(f'{r / 1024:.0f}' for r, _ in tree.values())}; PSS {pss / 1024:.0f} MiB: "
                    f"{' + '.join(f'{p / 1024:.0f}' for _, p in tree.values())}) after every "
                    f"NodePool was served once (target <= {RSS_TARGET_MIB:g} MiB; peak {peak / 1024:.0f} MiB)  {verdict(ok_rss)}")
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
    summary["server_log"] = str(server.log_path)
    return summary


def _edit_config(path: Path, meta: dict[str, Any], cluster: int, pool: int, variant: int) -> None:
    """Change one NodePool's config in place (token and annotations kept), atomically."""
    obj = fleetgen.read_secret(path)
    config = fleetgen.machineconfigs_for(meta["seed"], cluster, pool, meta["payload_kib"], variant)
    obj["data"]["config"] = base64.b64encode(encode_config(config)).decode()
    fleetgen.write_manifest(path, obj)


def scenario_crash(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    fleet_dir = work / "crash-fleet"
    shutil.rmtree(work / "crash-fleet", ignore_errors=True)
    meta = fleetgen.generate(fleet_dir, args.crash_clusters, args.crash_pools, args.crash_payload_kib, progress=False)
    source = Path(meta["source"])
    nodepools = all_nodepools(meta)
    n = len(nodepools)
    scale = "full fleet" if n >= 5280 else "smaller fleet than the full 440 x 12 (use --crash-full for it)"
    say(f"crash: {args.crash_iterations} kill -9 cycles on {args.crash_clusters} x {args.crash_pools} = {n} NodePools "
        f"({scale}), ~{meta['payload_kib']} KiB payloads, token TTL {args.crash_ttl} (rotation every half)")
    cache_dir = work / "crash-cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    Path(str(cache_dir) + ".key").unlink(missing_ok=True)
    rng = random.Random(args.crash_seed)
    variants = {np: 0 for np in nodepools}
    server = ServerProcess(source=source, cache_dir=cache_dir, token_ttl=args.crash_ttl)
    served_in_loop = corrupt_in_loop = 0
    loop_problems: list[str] = []
    rotations = renders_in_loop = 0
    initial_tokens = current_tokens(meta)
    started = time.monotonic()
    def edit_some() -> None:
        # Config changes while the server is down: each must be re-rendered and served.
        for _ in range(args.crash_edits):
            cluster, pool = rng.randrange(meta["clusters"]), rng.randrange(meta["pools"])
            nodepool = fleetgen.nodepool_of(cluster, pool)
            variants[nodepool] += 1
            _edit_config(fleetgen.manifest_path(source, cluster, pool), meta, cluster, pool, variants[nodepool])

    for i in range(args.crash_iterations):
        edit_some()
        life = rng.uniform(0.2, 3.0)
        t0 = time.monotonic()
        server.start(wait=False)
        # Probe a few NodePools while it lives: every 200 must be that NodePool's payload.
        sample = rng.sample(nodepools, min(8, n))
        try:
            tokens = {np: read_token(manifest_of(source, np)) or "" for np in sample}
        except (OSError, ValueError):
            tokens = {}
        while time.monotonic() - t0 < life:
            try:
                if server.get("/readyz")[0] == 200 and tokens:
                    got = fetch_all(server, tokens, sample, t0, concurrency=4, timeout=max(0.05, life - (time.monotonic() - t0)))
                    served_in_loop += len(got.first_200)
                    corrupt_in_loop += len(got.corrupt)
                    loop_problems += got.corrupt
                    tokens = {}
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        remaining = life - (time.monotonic() - t0)
        if remaining > 0:
            time.sleep(remaining)
        # Counters restart with each process: sum what each life did (nan: it never got that far).
        value = metric(server, "ign_server_payload_cache_miss_total")
        if value == value:
            renders_in_loop += int(value)
        server.kill()
        if sys.stdout.isatty() and not _quiet:
            print(f"\rcrash: {i + 1}/{args.crash_iterations} kills", end="", flush=True)
    if sys.stdout.isatty() and not _quiet:
        print()
    loop_s = time.monotonic() - started
    # Every life appends to one log (same port): count the rotations it reports.
    rotations = server.logs().count("rotated the token")
    # Final restart: long TTL so tokens read from the source stay current while we check.
    final = ServerProcess(source=source, cache_dir=cache_dir, token_ttl="11h", port=server.port,
                          metrics_port=server.metrics_port)
    edit_some()  # so the final restart has re-renders to do whatever the last life finished
    pending_before = sum(1 for np in nodepools if variants[np] > 0)
    tokens = current_tokens(meta)
    rotated_pools = sum(1 for np, token in tokens.items() if initial_tokens.get(np) != token)
    try:
        t0, ready = start_timed(final)
        got = fetch_all(final, tokens, nodepools, t0, concurrency=args.concurrency, timeout=args.serve_timeout,
                        variants=variants,
                        token_source=lambda np: read_token(manifest_of(source, np)))
        wait_quiescent(final, idle_cpu=args.idle_cpu, timeout=600)
        renders = int(metric(final, "ign_server_payload_cache_miss_total"))
        cached = int(metric(final, "ign_server_payload_cache_total"))
        # Once the listing is applied and re-renders are done, every NodePool must serve its
        # latest config (a stale payload right after the restart is the design's trade: serve
        # the index at once, apply the source right after).
        settled = fetch_all(final, current_tokens(meta), nodepools, time.monotonic(), concurrency=args.concurrency,
                            timeout=args.serve_timeout, variants=variants,
                            token_source=lambda np: read_token(manifest_of(source, np)))
    finally:
        final.stop()
    verify = subprocess.run([sys.executable, "-m", "ignition_server", "cache", "verify", "--cache-dir", str(cache_dir)],
                            capture_output=True, text=True, timeout=600)
    try:
        report = json.loads(verify.stdout)
    except ValueError:
        report = {"error": verify.stderr[-2000:]}
    bad = len(report.get("quarantined", [])) + len(report.get("missing", [])) if "error" not in report else -1
    lost = n - len(settled.first_200)
    ok = (lost == 0 and not got.corrupt and corrupt_in_loop == 0 and bad == 0
          and not settled.corrupt and not settled.stale)
    summary = {
        "nodepools": n, "iterations": args.crash_iterations, "loop_s": round(loop_s, 1),
        "served_during_loop": served_in_loop, "corrupt_during_loop": corrupt_in_loop,
        "final_ready_s": round(ready, 3), "final_served": len(got.first_200), "lost": lost,
        "corrupt_final": len(got.corrupt), "final_statuses": got.statuses,
        "stale_right_after_restart": len(got.stale), "settled_served": len(settled.first_200),
        "settled_stale": len(settled.stale), "settled_corrupt": len(settled.corrupt),
        "final_rerenders": renders, "payloads": cached, "edited_nodepools": pending_before,
        "rotations_during_loop": rotations, "renders_during_loop": renders_in_loop,
        "nodepools_with_rotated_token": rotated_pools,
        "verify": {k: (len(v) if isinstance(v, (list, tuple)) else v) for k, v in report.items() if k != "by_key"},
        "pass": ok,
    }
    say(f"crash: {args.crash_iterations} kills in {loop_s:.0f}s; {rotations} token rotations logged, {renders_in_loop} renders "
        f"counted before the kills; {rotated_pools}/{n} NodePools hold a rotated token; {served_in_loop} payloads served "
        f"during the loop, {corrupt_in_loop} corrupt")
    say(f"crash: final restart ready {ready:.2f}s; right after it {len(got.first_200)}/{n} NodePools got a 200 "
        f"({len(got.corrupt)} corrupt, {len(got.stale)} the previous config of an edited NodePool, before its re-render); "
        f"statuses {dict(sorted(got.statuses.items()))}")
    say(f"crash: once the listing settled: {len(settled.first_200)}/{n} NodePools serve their latest config, "
        f"{lost} lost, {len(settled.stale)} stale, {len(settled.corrupt)} corrupt; "
        f"statuses {dict(sorted(settled.statuses.items()))}")
    say(f"crash: final restart re-rendered {renders} payloads ({pending_before} NodePools had config edits in all, "
        f"{args.crash_edits} edits made just before this restart)")
    say(f"crash: cache verify: {summary['verify']}  {verdict(ok)}")
    for problem in (loop_problems + got.corrupt + settled.corrupt + settled.stale)[:5]:
        say(f"crash: corrupt: {problem}")
    if settled.failed:
        say(f"crash: not served: {dict(list(settled.failed.items())[:5])}")
    summary["server_log"] = str(final.log_path)
    return summary


def add_server_tree_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server-tree", type=Path,
                        help="run the server from this copy of the code (e.g. `git archive HEAD ignition_server "
                             "payload_cache proxy | tar -x -C DIR`), so edits in the working tree during a long run "
                             "do not change the server between scenarios")


def use_server_tree(parser: argparse.ArgumentParser, tree: Path | None) -> None:
    if tree is None:
        return
    tree = tree.resolve()
    if not (tree / "ignition_server" / "__init__.py").exists():
        parser.error(f"--server-tree {tree} holds no ignition_server package")
    # Server subprocesses (and `cache verify`) inherit the environment: PYTHONPATH wins over
    # the editable install. And `python -m` puts the current directory first on sys.path (the
    # working tree, when run from the repository's root) unless PYTHONSAFEPATH is set: without
    # it the owner and its workers ran the working tree's code, not the tree given here.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    os.environ["PYTHONSAFEPATH"] = "1"
    say(f"server code: {tree}")


def main(argv: list[str] | None = None) -> int:
    global _quiet
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", type=Path, help="a directory written by `python -m bench fleet` (cold/warm/memory)")
    parser.add_argument("--work", type=Path, default=_REPO / "bench" / "out" / "run", help="cache dirs and logs")
    parser.add_argument("--scenarios", default="cold,warm,memory,crash")
    parser.add_argument("--json", action="store_true", help="print a final JSON summary line")
    parser.add_argument("--quiet", action="store_true", help="only the JSON summary (with --json)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--token-ttl", default="11h")
    parser.add_argument("--cold-timeout", type=float, default=3600.0)
    parser.add_argument("--server-args", default="", help="more `serve` flags for cold/warm/memory, e.g. '--cache-memory 32Mi'")
    parser.add_argument("--idle-cpu", type=float, default=0.5,
                        help="fraction of a core below which the server counts as settled (listing applied)")
    parser.add_argument("--serve-timeout", type=float, default=600.0)
    parser.add_argument("--crash-iterations", type=int, default=50)
    parser.add_argument("--crash-clusters", type=int, default=20)
    parser.add_argument("--crash-pools", type=int, default=12)
    parser.add_argument("--crash-payload-kib", type=int, default=300)
    parser.add_argument("--crash-full", action="store_true", help="crash loop on 440 x 12")
    parser.add_argument("--crash-ttl", default="4s")
    parser.add_argument("--crash-edits", type=int, default=3, help="config edits between kills")
    parser.add_argument("--crash-seed", type=int, default=1)
    add_server_tree_argument(parser)
    args = parser.parse_args(argv)
    _quiet = args.quiet and args.json
    use_server_tree(parser, args.server_tree)
    if args.crash_full:
        args.crash_clusters, args.crash_pools = 440, 12
    scenarios = {s.strip() for s in args.scenarios.split(",") if s.strip()}
    unknown = scenarios - {"cold", "warm", "memory", "crash"}
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    if scenarios & {"cold", "warm", "memory"} and args.fleet is None:
        parser.error("--fleet DIR is needed for cold/warm/memory (make one with python -m bench fleet)")
    args.work.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    if scenarios & {"cold", "warm", "memory"}:
        summary.update(scenario_cold_warm_memory(args.fleet, args.work, scenarios, args))
    if "crash" in scenarios:
        summary["crash"] = scenario_crash(args.work, args)
    passed = all(v.get("pass", True) for v in summary.values() if isinstance(v, dict))
    say(f"overall: {verdict(passed)}")
    if args.json:
        print(json.dumps(summary, sort_keys=True), flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
