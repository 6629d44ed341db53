"""Token checks take the same time for a near miss and a far miss (no timing oracle).

    python -m bench timing [--tokens 10560 --rounds 200000]

A near miss differs from a real token in its last character, a far miss in every one; a hit is
timed too. Each is looked up `--rounds` times, interleaved, through the same
`TokenAuthenticator` the server uses (keyed hash, then an index lookup: no string compare).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ignition_server.auth.tokens import Refusal, TokenAuthenticator
from payload_cache import CacheConfig, PayloadCache, TokenRecord, TokenState


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench timing", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=10_560, help="tokens in the index (5,280 NodePools x 2)")
    parser.add_argument("--rounds", type=int, default=200_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        cache = PayloadCache.open(CacheConfig(cache_dir=Path(scratch) / "cache"))
        tokens = [str(uuid.uuid4()) for _ in range(args.tokens)]
        for i, token in enumerate(tokens):
            cache.put_token(token, TokenRecord(f"ns/p{i}", f"ns/token-p{i}", TokenState.CURRENT, None))
        auth = TokenAuthenticator(cache)
        target = tokens[len(tokens) // 2]
        cases = {"hit": target, "near miss": target[:-1] + ("0" if target[-1] != "0" else "1"),
                 "far miss": str(uuid.uuid4())}
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, token in cases.items():
                started = time.perf_counter_ns()
                try:
                    auth.authenticate(token)
                except Refusal:
                    pass
                samples[name].append(time.perf_counter_ns() - started)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name, median in medians.items():
        print(f"{name:10s} median {median / 1000:.2f} µs  p90 {statistics.quantiles(samples[name], n=10)[-1] / 1000:.2f} µs")
    ratio = medians["near miss"] / medians["far miss"]
    print(f"near miss / far miss: {ratio:.3f} (1.0 = no difference)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
