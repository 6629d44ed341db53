"""`python -m bench <command> [flags]`: one entry point for the benchmarks.

  compare   this server against nginx and bare aiohttp, both modes, one run (bench/compare.py)
  storm     boot storms with a rotation, a killed worker or owner, a failed-auth flood (bench/storm.py)
  run       restart scenarios: cold, warm, memory, crash (bench/run.py)
  fleet     generate a fleet of token Secrets (testsupport/fleet.py)
  rerender  serving while NodePools re-render (bench/rerender.py)
  hotpath   what one request costs, step by step (bench/hotpath.py)
  timing    token checks: near miss vs far miss (bench/timing.py)
  proxy     through ignition-proxy's HAProxy (passthrough, terminate) vs the server alone (bench/proxy.py)
  kube      Kubernetes mode at scale: empty-disk replica, API load per boot and rotation (bench/kube.py)
  replicas  3 replicas, 4 s rotations, the writer SIGKILLed every 2 min: 4xx for the API's token (bench/replicas.py)
  releases  5,280 NodePools over 10 releases from a real registry: each release read once (bench/releases.py)
  bases     5,280 NodePools over 440 clusters, generated MCO bases: one run per (cluster, release) (bench/bases.py)
  parity    time to payload with the real MCO binaries: HyperShift's real ignition server vs ours (bench/parity.py)
  fairness  one tenant's flood or churn vs another tenant's first payload (bench/fairness.py)
  seeds     the seeds' fleet at real size (416 KB payloads on MCO bases): warm restart, cold, RSS, disk (bench/seeds.py)
"""

from __future__ import annotations

import importlib
import signal
import sys

COMMANDS = {"compare": "bench.compare", "releases": "bench.releases", "run": "bench.run", "fleet": "testsupport.fleet",
            "rerender": "bench.rerender", "kube": "bench.kube", "timing": "bench.timing", "storm": "bench.storm",
            "hotpath": "bench.hotpath", "proxy": "bench.proxy", "bases": "bench.bases",
            "parity": "bench.parity", "fairness": "bench.fairness",
            "replicas": "bench.replicas", "seeds": "bench.seeds"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main(sys.argv[1:]))
