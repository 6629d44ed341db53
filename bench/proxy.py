"""Through the front proxy vs the server alone, in one run: `python -m bench proxy`.

    python -m bench proxy [--seconds 6] [--rounds 2] [--connections 32] [--payload-kib 290] [--send-proxy]

One server (`serve --edge-dir`) and one `ignition-proxy run` (the real HAProxy) with two routes
to that server on one port: `localhost` in *terminate* mode (HAProxy ends TLS, checks the
token in its map, re-encrypts) and the host name in *passthrough* mode (routed on SNI only).
Targets, interleaved over `--rounds`: `server` (direct), `passthrough`, `terminate`; modes
`storm` (a full TLS handshake per request, as booting nodes) and `keepalive`. The load client
is bench/loadclient.c with the SNI name set. All of it shares the machine's cores, so read the
ratios (proxy / server, same run) and the added p50/p99 milliseconds, not absolute req/s.
Writes bench/results/proxy.json; the last lines print the ratios. `--send-proxy` runs both
routes as deploy/proxy ships its route: PROXY v2 to a server that trusts it (`--proxy-protocol-from`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from testsupport.harness import ProxyProcess, ServerProcess, wait_for

from .compare import _REPO, MODES, RESULTS, build_client, cpu_seconds_tree, prepare, run_client, say

TARGETS = ("server", "passthrough", "terminate")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="per target, mode and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--payload-kib", type=int, default=290)
    parser.add_argument("--work", type=Path, default=_REPO / "bench" / "out" / "proxy")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--send-proxy", action="store_true", help="PROXY v2 to the server, as deploy/proxy ships its route")
    args = parser.parse_args(argv)
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        parser.error("haproxy is needed (apt-get install haproxy)")
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    client = build_client(args.work)
    setup = prepare(args.work, args.payload_kib, [])
    edge = args.work / "edge"
    trust = ["--proxy-protocol-from", "127.0.0.1/32"] if args.send_proxy else []
    server = ServerProcess(setup.source, setup.cache_dir, extra=["--edge-dir", str(edge), *trust]).start()
    shutil.rmtree(args.work / "proxy", ignore_errors=True)
    proxy = ProxyProcess(args.work / "proxy" / "state")
    passthrough_host = socket.gethostname()
    try:
        wait_for(lambda: (edge / "publication.json").exists(), what="the publication")
        wait_for(lambda: server.get("/ignition", dict(h.split(": ", 1) for h in setup.headers))[0] == 200, timeout=120,
                 what="the payload")
        backend = [f"127.0.0.1:{server.port}"]
        proxy.write_table([
            {"host": "localhost", "mode": "terminate", "publication": str(edge), "backends": backend,
             "send_proxy": args.send_proxy},
            {"host": passthrough_host, "mode": "passthrough", "publication": str(edge), "backends": backend,
             "send_proxy": args.send_proxy},
        ], check_interval="1s")
        proxy.start(haproxy)
        wait_for(proxy.servers_up, what="the backend healthy")
        targets = {"server": (server.port, None), "passthrough": (proxy.port, passthrough_host),
                   "terminate": (proxy.port, "localhost")}
        procs = [p for p in (server.proc, proxy.proc) if p is not None]
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {m: [] for m in MODES} for t in TARGETS}
        say(f"payload {setup.payload.stat().st_size / 1024:.0f} KiB; {args.connections} connections, "
            f"{args.seconds:.0f} s per target and mode, {args.rounds} rounds; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        for round_ in range(1, args.rounds + 1):
            for name in TARGETS:
                port, sni = targets[name]
                for mode in MODES:
                    cpu0 = cpu_seconds_tree(procs)
                    got = run_client(client, port, None, args.seconds, args.connections, mode, setup.headers, sni=sni)
                    got["server_cpu_share"] = round((cpu_seconds_tree(procs) - cpu0) / got["elapsed_s"], 3)
                    runs[name][mode].append(got)
                    say(f"round {round_} {name:11s} {mode:9s} {got['rps']:8.1f} req/s  p50 {got['p50_ms']:7.1f} ms  "
                        f"p99 {got['p99_ms']:7.1f} ms  errors {got['errors']}")
    finally:
        proxy.stop()
        server.stop()
    best: dict[str, dict[str, Any]] = {}
    for name in TARGETS:
        best[name] = {}
        for mode in MODES:
            top = max(runs[name][mode], key=lambda r: r["rps"])
            best[name][mode] = {"rps": top["rps"], "p50_ms": top["p50_ms"], "p99_ms": top["p99_ms"],
                                "errors": sum(r["errors"] for r in runs[name][mode]),
                                "rounds_rps": [r["rps"] for r in runs[name][mode]]}
    for name in ("passthrough", "terminate"):
        for mode in MODES:
            entry, base = best[name][mode], best["server"][mode]
            entry["rps_vs_server"] = round(entry["rps"] / base["rps"], 3)
            entry["added_p50_ms"] = round(entry["p50_ms"] - base["p50_ms"], 2)
            entry["added_p99_ms"] = round(entry["p99_ms"] - base["p99_ms"], 2)
            entry["p50_vs_server"] = round(entry["p50_ms"] / base["p50_ms"], 3) if base["p50_ms"] else None
            entry["p99_vs_server"] = round(entry["p99_ms"] / base["p99_ms"], 3) if base["p99_ms"] else None
    summary = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_average": os.getloadavg(),
               "cpus": len(os.sched_getaffinity(0)), "payload_bytes": setup.payload.stat().st_size,
               "connections": args.connections, "seconds": args.seconds, "rounds": args.rounds, "send_proxy": args.send_proxy,
               "best": best, "runs": runs}
    (args.results / "proxy.json").write_text(json.dumps(summary, indent=1) + "\n")
    for mode in MODES:
        b = best["server"][mode]
        say(f"best {mode:9s} server      {b['rps']:8.1f} req/s  p50 {b['p50_ms']:.1f} ms  p99 {b['p99_ms']:.1f} ms")
        for name in ("passthrough", "terminate"):
            e = best[name][mode]
            say(f"best {mode:9s} {name:11s} {e['rps']:8.1f} req/s  {e['rps_vs_server']:.2f}x server  "
                f"p50 {e['added_p50_ms']:+.1f} ms ({e['p50_vs_server']}x)  p99 {e['added_p99_ms']:+.1f} ms ({e['p99_vs_server']}x)  "
                f"errors {e['errors']}")
    return 0
