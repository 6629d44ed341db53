"""`ignition-server cache stats|verify|gc|rekey|add-key|prune-keys`: the payload cache's upkeep
(payload_cache/upkeep.py) and its key rotation (payload_cache/keys.py), as JSON."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from payload_cache import CacheConfig, PayloadCache, add_key, prune_keys, stats_report


def run(args: argparse.Namespace) -> int:
    config = CacheConfig(cache_dir=Path(args.cache_dir), key_file=Path(args.cache_key_file) if args.cache_key_file else None)
    # The key file alone: a running server re-reads it on its next write, so these need no
    # cache opened.
    if args.action == "add-key":
        print(json.dumps({"added": add_key(config.resolved_key_file)}, indent=2))
        return 0
    if args.action == "prune-keys":
        print(json.dumps({"dropped": prune_keys(config.resolved_key_file)}, indent=2))
        return 0
    cache = PayloadCache.open(config)
    if args.action == "stats":
        result: Any = stats_report(cache)
    elif args.action == "verify":
        progress = None
        if sys.stderr.isatty():
            def progress(done: int, total: int) -> None:
                print(f"\rverified {done}/{total}", end="", file=sys.stderr, flush=True)
        result = cache.verify(progress=progress)
    elif args.action == "gc":
        result = cache.gc()
    else:
        result = {"reencrypted": cache.rekey()}
    cache.flush()
    print(json.dumps(_plain(result), indent=2, sort_keys=True))
    # A script running `verify` after a restore must learn from the exit code that blobs were
    # bad, not by parsing the report: quarantined or missing blobs are a failed verification.
    if args.action == "verify" and (result.quarantined or result.missing):
        return 1
    return 0


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value
