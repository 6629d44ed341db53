"""The fleet of `python -m bench rerender` (bench/rerender.py): testsupport/fleet.py's fleet, with
`shared` of its NodePools (a seeded choice) reading their user CA bundle from one ConfigMap,
ignition-server/ca, which the benchmark then changes."""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ignition_server.reconcile.inputs import ANNOTATION_INPUT_PREFIX
from ignition_server.reconcile.tenancy import ANNOTATION_SHAREABLE
from testsupport import fleet as fleetgen

SHARED_NAMESPACE, SHARED_NAME = "ignition-server", "ca"  # the server's own: shared by default
SHARED_REF = f"{SHARED_NAMESPACE}/{SHARED_NAME}"
SHARED_ANNOTATION = ANNOTATION_INPUT_PREFIX + "user-ca-bundle"
VARIANT_ANNOTATION = "bench.ignition-server.openshift.io/variant"
FLEET_MAX_AGE_S = 5 * 3600  # tokens older than TTL/2 (5.5 h at 11 h) are rotated on start


def ca_bundle(seed: str, variant: int, kib: int) -> str:
    return fleetgen._pem_block(random.Random(f"{seed}/shared-ca/{variant}"), kib * 1024)


def configmap_path(source: Path) -> Path:
    return source / SHARED_NAMESPACE / f"{SHARED_NAME}.yaml"


def write_configmap(source: Path, seed: str, variant: int, kib: int) -> str:
    """Write ConfigMap ignition-server/ca atomically (temp + rename); returns the bundle written."""
    bundle = ca_bundle(seed, variant, kib)
    fleetgen.write_manifest(configmap_path(source), {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": SHARED_NAME, "namespace": SHARED_NAMESPACE,
                     "annotations": {VARIANT_ANNOTATION: str(variant), ANNOTATION_SHAREABLE: "true"}},
        "data": {"ca-bundle.crt": bundle},
    })
    return bundle


def read_configmap_variant(source: Path) -> int:
    obj = fleetgen.read_secret(configmap_path(source))
    return int(((obj.get("metadata") or {}).get("annotations") or {}).get(VARIANT_ANNOTATION, "0"))


def shared_choice(seed: str, clusters: int, pools: int, shared: int) -> list[str]:
    everyone = [fleetgen.nodepool_of(c, p) for c, p in fleetgen.pools(clusters, pools)]
    if shared > len(everyone):
        raise ValueError(f"--shared {shared} > {len(everyone)} NodePools")
    return sorted(random.Random(f"{seed}/shared").sample(everyone, shared))


def generate(out: Path, clusters: int, pools: int, payload_kib: int, shared: int, ca_kib: int,
             seed: str = fleetgen.DEFAULT_SEED, progress: bool | None = None) -> dict[str, Any]:
    """testsupport/fleet.py's fleet, with `shared` NodePools pointing their CA bundle at ignition-server/ca.

    fleet.json has fleet.py's shape (so bench/run.py's helpers read it) plus the shared set;
    it is written last, so a half-written fleet is never reused.
    """
    if progress is None:
        progress = sys.stderr.isatty()
    (out / "fleet.json").unlink(missing_ok=True)
    shutil.rmtree(out / "source", ignore_errors=True)
    source = out / "source"
    chosen = set(shared_choice(seed, clusters, pools, shared))
    now = time.time()
    tokens: dict[str, str] = {}
    total = clusters * pools
    started = time.monotonic()
    for n, (cluster, pool) in enumerate(fleetgen.pools(clusters, pools), 1):
        nodepool = fleetgen.nodepool_of(cluster, pool)
        obj = fleetgen.token_secret(seed, cluster, pool, payload_kib, generation_time=now)
        if nodepool in chosen:
            obj["metadata"]["annotations"][SHARED_ANNOTATION] = SHARED_REF
        fleetgen.write_manifest(fleetgen.manifest_path(source, cluster, pool), obj)
        tokens[nodepool] = fleetgen.fleet_token(seed, cluster, pool)
        if progress and (n % 50 == 0 or n == total):
            rate = n / max(time.monotonic() - started, 1e-6)
            print(f"\rfleet: {n}/{total} NodePools ({rate:.0f}/s)", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    write_configmap(source, seed, 0, ca_kib)
    meta = {"clusters": clusters, "pools": pools, "payload_kib": payload_kib, "seed": seed,
            "source": str(source), "marker_path": fleetgen.MARKER_PATH, "tokens": tokens,
            "generated_at": now, "shared": sorted(chosen), "shared_configmap": SHARED_REF, "ca_kib": ca_kib}
    (out / "fleet.json").write_text(json.dumps(meta, indent=1))
    return meta


def fleet_reusable(out: Path, clusters: int, pools: int, payload_kib: int, shared: int, ca_kib: int,
                   seed: str) -> tuple[dict[str, Any] | None, str]:
    try:
        meta = fleetgen.load_fleet(out)
    except (OSError, ValueError):
        return None, "no fleet yet"
    want = {"clusters": clusters, "pools": pools, "payload_kib": payload_kib, "seed": seed, "ca_kib": ca_kib}
    if any(meta.get(k) != v for k, v in want.items()) or len(meta.get("shared", [])) != shared:
        return None, "fleet parameters differ"
    age = time.time() - float(meta.get("generated_at", 0))
    if age > FLEET_MAX_AGE_S:
        return None, f"fleet is {age / 3600:.1f} h old (tokens would rotate on start)"
    if not configmap_path(Path(meta["source"])).exists():
        return None, "shared ConfigMap missing"
    return meta, f"reusing the fleet generated {age / 60:.0f} min ago"
