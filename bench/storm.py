"""Boot storms with something going wrong in the middle: `python -m bench storm`.

    python -m bench storm [--seconds 12] [--connections 32] [--scenarios steady,rotation,...]
                          [--targets server,edge,nginx]

Every scenario starts this server (with its default worker processes) on a warm cache and
runs bench/loadclient.c in `boot` mode: each request is a node booting, on a new TLS
connection, retrying a 5xx or a failed connection on the real client's schedule (0.2 s
doubling to 5 s) and giving up on a 4xx. It counts what a fleet would live through: boots,
retries, permanent failures. Scenarios, each with a one-line verdict:

  steady       the storm alone (its p99 is the yardstick of the others), on each of `--targets`
               in turn, the same storm side by side: the server direct (`steady`), behind its
               in-pod TLS edge (`steady-edge`, HAProxy; skipped without haproxy) and nginx serving
               the same bytes as a static file (`steady-nginx`; skipped without nginx), with the
               CPU per boot of every process of each (`bench compare` says what each target is);
               `nstream` and `nhttp` (nginx as that edge) when named
  rotation     the NodePool's token rotates in the middle (the storm keeps its token)
  kill-worker  a worker process is killed (SIGKILL) in the middle; the owner starts it again
  kill-owner   the owner process is killed (SIGKILL) in the middle and started again at once
  flood        a failed-auth flood from 127.0.0.2 beside a storm at ~30% of capacity from 127.0.0.1
The re-render scenario (serving p99 while 1,000 NodePools re-render) is `python -m bench rerender`.
Writes bench/results/storm.json and storm.png (latency over time, events marked).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from testsupport.harness import ServerProcess

from . import compare
from .compare import Setup, build_client, prepare, say

_REPO = Path(__file__).resolve().parents[1]

SCENARIOS = ("steady", "rotation", "kill-worker", "kill-owner", "flood")
TARGETS = ("server", "edge", "nginx")  # the steady storm's, side by side
MORE_TARGETS = compare.NGINX_EDGES  # nginx as the pod's edge: only when named in --targets


def storm(client: Path, port: int, setup: Setup, seconds: float, connections: int, *, headers: list[str] | None = None,
          rate: float | None = None, source: str | None = None, mode: str = "boot", sni: str | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    if rate:
        env["LOADCLIENT_RATE"] = str(rate)
    if source:
        env["LOADCLIENT_SOURCE"] = source
    if sni:
        env["LOADCLIENT_SNI"] = sni
    argv = [str(client), "127.0.0.1", str(port), "-", str(seconds), str(connections), mode, "/ignition",
            *(headers if headers is not None else setup.headers)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 180, check=True, env=env)
    return json.loads(done.stdout)


def start_server(setup: Setup, extra: Sequence[str] = ()) -> ServerProcess:
    server = ServerProcess(source=setup.source, cache_dir=setup.cache_dir, extra=[*setup.server_args, *extra])
    server.start(wait=True)
    return server


def worker_pid(server: ServerProcess) -> int:
    found = re.findall(r"worker \d+ \(pid (\d+)\) is serving", server.logs())
    if not found:
        raise SystemExit("no worker processes in the server's log: the storm scenarios need --workers >= 1")
    return int(found[-1])


def generation_time(setup: Setup) -> float:
    from ignition_server.model.token_secret import is_token_secret, parse_token_secret

    for path in setup.source.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and is_token_secret(doc):
                value = parse_token_secret(doc).generation_time
                if value:
                    return value
    raise SystemExit("the fleet's token Secret has no generation time")


def at(delay: float, action: Any) -> threading.Timer:
    timer = threading.Timer(delay, action)
    timer.start()
    return timer


def recovery_seconds(result: dict[str, Any], event_second: float, normal_p99: float) -> float | None:
    """Seconds from the event to the end of the first whole second whose boots' p99 is back
    within 1.5x of normal (boots are counted in the second they end in)."""
    for second, ok, _err, _p50, p99 in result["timeline"]:
        if second > event_second and ok > 0 and p99 <= 1.5 * normal_p99:
            return second + 1 - event_second
    return None


def verdict(name: str, result: dict[str, Any], ok: bool, detail: str) -> dict[str, Any]:
    line = (f"{name:12s} {'PASS' if ok else 'FAIL'}  boots {result['requests']}, retries {result['retries']}, "
            f"permanent failures {result['permanent_failures']}, p50 {result['p50_ms']:.0f} ms, "
            f"p99 {result['p99_ms']:.0f} ms; {detail}")
    say(line)
    return {"scenario": name, "pass": ok, "verdict": line, "result": result}


def steady_side_by_side(setup: Setup, client: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The steady storm on each target in turn (compare's targets: the same payload, certificate
    and processes), each with the CPU per boot of all its processes; one line puts them side by side."""
    targets = compare.make_targets(setup)
    outcomes: list[dict[str, Any]] = []
    for name in args.targets:
        if name not in targets or (name == "nginx" and shutil.which("nginx") is None):
            say(f"steady on {name}: skipped ({'haproxy' if name == 'edge' else 'nginx or its stream module'} is not installed)")
            continue
        target = targets[name]
        port = target.start()
        try:
            cpu0 = compare.cpu_seconds_tree(target.procs)
            result = storm(client, port, setup, args.seconds, args.connections,
                           sni=compare.EDGE_HOST if name == "edge" else None)
            cpu = compare.cpu_seconds_tree(target.procs) - cpu0
        finally:
            target.stop()
        result["target"] = name
        result["target_cpu_share"] = round(cpu / result["elapsed_s"], 3)
        result["cpu_ms_per_boot"] = round(1000 * cpu / result["requests"], 4) if result["requests"] else 0.0
        scenario = "steady" if name == "server" else f"steady-{name}"
        outcomes.append(verdict(scenario, result, result["permanent_failures"] == 0 and result["unfinished"] == 0,
                                f"{result['rps']:.0f} boots/s, CPU {result['cpu_ms_per_boot']:.3f} ms a boot "
                                f"(client {result['client_cpu_share']:.2f} cores)"))
    by_target = {o["result"]["target"]: o["result"] for o in outcomes}
    nginx = by_target.get("nginx")

    def against_nginx(result: dict[str, Any]) -> str:
        if nginx is None or result is nginx or not nginx["rps"] or not result["cpu_ms_per_boot"]:
            return ""
        return (f" = {result['rps'] / nginx['rps']:.2f}x nginx"
                f" ({nginx['cpu_ms_per_boot'] / result['cpu_ms_per_boot']:.2f}x per core)")
    if len(by_target) > 1:
        say("steady side by side: " + "; ".join(
            f"{name} {r['rps']:.0f} boots/s, p50 {r['p50_ms']:.0f} / p99 {r['p99_ms']:.0f} ms, "
            f"{r['cpu_ms_per_boot']:.3f} ms CPU a boot{against_nginx(r)}" for name, r in by_target.items()))
    return outcomes


def run_scenarios(setup: Setup, client: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    outcomes: list[dict[str, Any]] = []
    half = args.seconds / 2
    steady_p99 = steady_rps = None
    for name in args.scenarios:
        if name == "steady":
            side_by_side = steady_side_by_side(setup, client, args)
            outcomes += side_by_side
            direct = [o["result"] for o in side_by_side if o["result"]["target"] == "server"]
            if direct:  # the yardstick of the scenarios that follow: the server direct
                steady_p99, steady_rps = direct[0]["p99_ms"], direct[0]["rps"]
        elif name == "rotation":
            # A TTL whose half (the rotation's due time) falls in the middle of the storm.
            ttl = 2 * (time.time() - generation_time(setup) + 3 + half)
            server = start_server(setup, ["--token-ttl", f"{ttl:.0f}s"])
            try:
                result = storm(client, server.port, setup, args.seconds, args.connections)
                rotations = server.metrics().get("ign_server_token_rotation_total", 0)
            finally:
                server.stop()
            ok = rotations >= 1 and result["permanent_failures"] == 0 and result["unfinished"] == 0
            outcomes.append(verdict(name, result, ok, f"{rotations:.0f} rotation(s) during the storm"))
        elif name in ("kill-worker", "kill-owner"):
            server = start_server(setup)
            events: list[float] = []
            started = time.monotonic()

            def kill() -> None:
                events.append(time.monotonic() - started)
                if name == "kill-worker":
                    os.kill(worker_pid(server), signal.SIGKILL)
                else:
                    server.kill()
                    server.start(wait=False)  # as a supervisor would, at once

            timer = at(half, kill)
            try:
                result = storm(client, server.port, setup, args.seconds, args.connections)
            finally:
                timer.cancel()
                restarts = server.metrics().get("ign_server_worker_restarts_total", 0) if name == "kill-worker" else None
                server.stop()
            back = recovery_seconds(result, events[0] if events else half, steady_p99 or result["p99_ms"])
            ok = result["permanent_failures"] == 0 and result["unfinished"] == 0 and back is not None and back <= 3
            detail = f"p99 back to normal {back:.0f} s after the kill" if back is not None else "p99 never back to normal"
            if restarts is not None:
                detail += f"; worker restarts {restarts:.0f}"
            result["events"] = [[t, name] for t in events]
            outcomes.append(verdict(name, result, ok, detail))
        elif name == "flood":
            rate = 0.3 * (steady_rps or 300.0)
            server = start_server(setup)
            try:
                calm = storm(client, server.port, setup, args.seconds, args.connections, rate=rate)
                forged = ["Authorization: Bearer Zm9yZ2VkLXRva2Vu"]  # base64("forged-token")
                flood: dict[str, Any] = {}
                flooding = threading.Thread(target=lambda: flood.update(storm(
                    client, server.port, setup, args.seconds, 16, headers=forged, source="127.0.0.2", mode="close")))
                flooding.start()
                result = storm(client, server.port, setup, args.seconds, args.connections, rate=rate)
                flooding.join()
            finally:
                server.stop()
            ratio = result["p99_ms"] / max(calm["p99_ms"], 0.001)
            ok = ratio <= 2 and result["permanent_failures"] == 0 and result["unfinished"] == 0
            result["calm"] = calm
            result["flood"] = {k: flood.get(k) for k in ("requests", "errors", "status_200", "status_other")}
            outcomes.append(verdict(name, result, ok, f"storm at {rate:.0f} boots/s: p99 {ratio:.2f}x the same storm "
                                    f"without the flood ({calm['p99_ms']:.0f} ms); the flood got "
                                    f"{flood.get('status_other', 0)} refusals, {flood.get('status_200', 0)} payloads"))
    return outcomes


def plot(outcomes: list[dict[str, Any]], out: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib not installed (pip install -e '.[bench]'): no plot")
        return False
    steady = [o["result"] for o in outcomes if "target" in o["result"]]
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    for outcome in outcomes:
        timeline = [row for row in outcome["result"]["timeline"] if row[1] > 0]
        ax.plot([row[0] for row in timeline], [row[4] for row in timeline], label=outcome["scenario"])
        for when, what in outcome["result"].get("events", []):
            ax.axvline(when, linestyle=":", color="grey")
            ax.annotate(what, (when, ax.get_ylim()[1] * 0.9), fontsize=8, rotation=90)
    ax.set_xlabel("second of the storm")
    ax.set_ylabel("boot p99 (ms)")
    ax.set_title("Boot storms: p99 of each second, per scenario")
    ax.legend()
    # The steady storm's targets side by side: boots/s, each labelled with its CPU per boot.
    drawn = bars.bar([r["target"] for r in steady], [r["rps"] for r in steady])
    for rect, result in zip(drawn, steady):
        bars.annotate(f"{result['cpu_ms_per_boot']:.2f} ms CPU/boot", (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                      ha="center", va="bottom", fontsize=8)
    bars.set_ylabel("boots/s")
    bars.set_title("steady storm: direct, in-pod edge, nginx")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench storm", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="per scenario")
    parser.add_argument("--connections", type=int, default=32, help="nodes booting at once")
    parser.add_argument("--payload-kib", type=int, default=290)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, from: " + ", ".join(SCENARIOS))
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help="the steady storm's targets, side by side, from: " + ", ".join(TARGETS + MORE_TARGETS))
    parser.add_argument("--server-args", default="", help="more `serve` flags")
    parser.add_argument("--work", type=Path, default=_REPO / "bench" / "out" / "storm")
    parser.add_argument("--results", type=Path, default=compare.RESULTS)
    args = parser.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if set(args.targets) - set(TARGETS + MORE_TARGETS) or "server" not in args.targets:
        parser.error(f"--targets: from {', '.join(TARGETS + MORE_TARGETS)}, with server (the other scenarios' yardstick)")
    if "steady" not in args.scenarios and {"kill-worker", "kill-owner", "flood"} & set(args.scenarios):
        args.scenarios.insert(0, "steady")  # the yardstick
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    client = build_client(args.work)
    setup = prepare(args.work, args.payload_kib, args.server_args.split())
    say(f"payload {setup.payload.stat().st_size / 1024:.0f} KiB; {args.connections} nodes booting at once, "
        f"{args.seconds:.0f} s per scenario; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    outcomes = run_scenarios(setup, client, args)
    (args.results / "storm.json").write_text(json.dumps(
        {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": args.seconds,
         "connections": args.connections, "outcomes": outcomes}, indent=1) + "\n")
    plot(outcomes, args.results / "storm.png")
    failed = [o["scenario"] for o in outcomes if not o["pass"]]
    say(f"storm scenarios: {len(outcomes) - len(failed)} of {len(outcomes)} pass" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
