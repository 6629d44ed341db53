"""What the wall between tenants costs at reconcile time, at the seeds' scale (issue 21).

The checks run when objects change, never per request: this times each one over 5,280 token
Secrets (440 clusters x 12 NodePools, testsupport/fleet.py's names) on this machine, in isolation:
ordering a first listing by creation time, the namespace check of every input reference, and
the duplicate-token lookup (two keyed hashes and two index lookups per Secret).

    python -m bench.tenancy_cost [--clusters 440 --pools 12]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ignition_server.model.objects import ObjectKey
from ignition_server.model.token_secret import parse_token_secret
from ignition_server.reconcile.inputs import JOIN_INPUTS, MCS_INPUTS, SETTINGS_INPUTS, input_key
from ignition_server.reconcile.tenancy import Tenancy, oldest_first
from ignition_server.sources.events import Change
from payload_cache import CacheConfig, PayloadCache, TokenRecord, TokenState
from testsupport.manifests import build_token_secret


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=440)
    parser.add_argument("--pools", type=int, default=12)
    args = parser.parse_args()
    objs = []
    for c in range(args.clusters):
        for p in range(args.pools):
            obj = build_token_secret(namespace=f"clusters-c{c}", nodepool=f"clusters-c{c}/np-{p}", token=f"tok-{c}-{p}")
            obj["metadata"]["creationTimestamp"] = f"2026-01-{1 + (c * 7 + p) % 28:02d}T00:00:00Z"
            objs.append(obj)
    secrets = [parse_token_secret(o) for o in objs]
    changes = [Change("ADDED", ObjectKey("Secret", o["metadata"]["namespace"], o["metadata"]["name"]), o) for o in objs]
    tenancy = Tenancy(frozenset({"ignition-server"}))
    with tempfile.TemporaryDirectory() as tmp:
        cache = PayloadCache.open(CacheConfig(cache_dir=Path(tmp) / "cache"))
        for s in secrets:
            assert s.token is not None  # build_token_secret gave each one
            cache.put_token_key(cache.token_key(s.token), TokenRecord(s.nodepool, s.ref, TokenState.CURRENT, None))
        timings = {}
        started = time.perf_counter()
        oldest_first(changes)
        timings["order a first listing"] = time.perf_counter() - started
        for name, wall in (("every input's key, no wall (before)", None), ("every input's key, with the wall", tenancy)):
            started = time.perf_counter()
            for s in secrets:
                for wanted in JOIN_INPUTS + SETTINGS_INPUTS + MCS_INPUTS:
                    input_key(s, wanted, s.annotations, wall)
            timings[name] = time.perf_counter() - started
        started = time.perf_counter()
        for s in secrets:  # what TokenSecrets.holds_anothers_token does per Secret
            for token in (s.token, s.old_token):
                record = cache.lookup_token_key(cache.token_key(token)) if token else None
                assert record is None or record.secret == s.ref
        timings["duplicate-token lookup"] = time.perf_counter() - started
    n = len(secrets)
    for what, seconds in timings.items():
        print(f"{what:34s} {seconds * 1000:8.1f} ms for {n} Secrets ({seconds / n * 1e6:.2f} µs each)")


if __name__ == "__main__":
    main()
