"""Replicas under rotation with their writer killed: does any node get a 4xx for the token the
API holds? Against the tests' strict API server (no real kube-apiserver runs here).

    python -m bench replicas [--minutes 10 --ttl 8s --kill-every 120 --replicas 3]

Three replicas (`serve --kubernetes`) share one token Secret rotating every TTL/2. A client
reads the Secret's current token from the API and fetches with it from every replica in
turn, for the whole run. Every `--kill-every` seconds the Lease holder (the writer) is killed
with SIGKILL and started again on its cache dir, as a StatefulSet restarts its pod. Counted:
fetches, answers by status (a 4xx is the failure: the Ignition client gives up on one), fetches
to a replica not listening (the killed one, until it is back), rotations seen.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import sys
import tempfile
import time
import urllib.error
from pathlib import Path

from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess
from testsupport.kubeapi import KubeAPI
from testsupport.manifests import build_token_secret

_REPO = Path(__file__).resolve().parent.parent

NAMESPACE = "clusters-bench"


def current_token(api: KubeAPI, name: str) -> str:
    secret = api.get("secrets", NAMESPACE, name)
    assert secret is not None
    return base64.b64decode(secret["data"]["token"]).decode()


def fetch(proc: ServerProcess, token: str) -> tuple[int, str]:
    """Status and (for a refusal) the reason; 0 when nothing answers."""
    headers = {"Authorization": "Bearer " + base64.b64encode(token.encode()).decode()}
    try:
        status, _, body = proc.get("/ignition", headers)
    except (OSError, urllib.error.URLError):
        return 0, "not listening"
    return status, "" if status == 200 else body[:80].decode(errors="replace").strip()


def is_leader(proc: ServerProcess) -> bool:
    try:
        return proc.metrics().get("ign_server_leader", 0) == 1
    except (OSError, urllib.error.URLError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench replicas", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--ttl", default="8s", help="token TTL: rotation every half of it")
    parser.add_argument("--kill-every", type=float, default=120, help="seconds between SIGKILLs of the writer")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--lease-duration", default="15s", help="the shipped default")
    args = parser.parse_args(argv)
    statuses: collections.Counter[int] = collections.Counter()
    refusals: list[dict[str, object]] = []
    tokens: list[str] = []
    kills: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as scratch, KubeAPI(Path(scratch) / "api", bookmark_interval=0.5) as api:
        work = Path(scratch)
        (work / "empty").mkdir()
        api.namespace("ignition")
        secret = build_token_secret(namespace=NAMESPACE, nodepool="clusters/workers", token="tok-start",
                                    machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="workers"),
                                    generation_time=time.time())
        name = api.create(secret)["metadata"]["name"]

        def replica(number: int) -> ServerProcess:
            return ServerProcess(work / "empty", work / f"r{number}" / "cache", token_ttl=args.ttl, extra=[
                "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition",
                "--replica-id", f"r{number}", "--lease-duration", args.lease_duration, "--workers", "1"])

        procs = [replica(i).start() for i in range(args.replicas)]
        started = time.monotonic()
        next_kill = started + args.kill_every
        end = started + args.minutes * 60
        try:
            while time.monotonic() < end:
                for number in range(len(procs)):
                    token = current_token(api, name)
                    if not tokens or tokens[-1] != token:
                        tokens.append(token)
                    status, reason = fetch(procs[number], token)
                    statuses[status] += 1
                    if 400 <= status < 500:
                        refusals.append({"at_s": round(time.monotonic() - started, 1), "replica": f"r{number}",
                                         "status": status, "reason": reason})
                if time.monotonic() >= next_kill:
                    next_kill += args.kill_every
                    writers = [i for i, proc in enumerate(procs) if is_leader(proc)]
                    if writers:
                        number = writers[0]
                        procs[number].kill()  # SIGKILL
                        procs[number] = replica(number).start(wait=False)
                        kills.append({"at_s": round(time.monotonic() - started, 1), "replica": f"r{number}"})
                        print(f"{time.monotonic() - started:5.0f}s killed the writer r{number}", flush=True)
        finally:
            for proc in procs:
                proc.kill()
        fetches = sum(count for status, count in statuses.items() if status)
        results = {
            "minutes": args.minutes, "ttl": args.ttl, "replicas": args.replicas, "lease_duration": args.lease_duration,
            "kills": kills, "rotations_seen": len(tokens) - 1, "fetches_answered": fetches,
            "not_listening": statuses.get(0, 0), "by_status": {str(k): v for k, v in sorted(statuses.items()) if k},
            "4xx": sum(v for k, v in statuses.items() if 400 <= k < 500), "refusals": refusals[:50],
            "api_refusals": dict(api.server.refusals),
        }
    print(json.dumps(results, indent=1))
    out = _REPO / "bench" / "results" / "replicas.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
