"""Fleet generator: N hosted clusters x M NodePools of HyperShift token Secret manifests.

    python -m bench fleet --clusters 440 --pools 12 --payload-kib 300 --out DIR

Writes, under DIR:
  source/clusters-c<i>/np-<j>.yaml   one token Secret per NodePool (namespace `clusters-c<i>`,
                                     NodePool `clusters-c<i>/np-<j>`), what `serve --source` reads
  fleet.json                         the parameters (seed, sizes), and the initial token of every
                                     NodePool (outside the source dir, so the server never sees it)

Tokens are deterministic: `fleet_token(seed, i, j)` (a UUID derived from sha256 of the seed and
the indices). The server rotates tokens by rewriting the manifests, so load generators read the
*current* token from the manifest (`current_tokens`), and use fleet.json/`fleet_token` only as the
initial value.

Every NodePool's MachineConfigs differ (seeded RNG per NodePool, and a marker file
`/etc/ignition-bench/nodepool` holding the NodePool's name), with content that gzip cannot
squeeze to nothing (PEM-like random base64, scripts with random data), so the config stored in
the Secret and the rendered payload have realistic sizes: `--payload-kib` is the approximate
size of the file contents in the payload (data URLs), split as a CA bundle (~50 %), a script
(~20 %) and many small files, plus systemd units.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import random
import sys
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any, Iterator

import yaml

from ignition_server.model.token_secret import parse_token_secret
from testsupport.manifests import build_token_secret

MARKER_PATH = "/etc/ignition-bench/nodepool"
DEFAULT_SEED = "ignition-bench"
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def namespace_of(cluster: int) -> str:
    return f"clusters-c{cluster}"


def nodepool_of(cluster: int, pool: int) -> str:
    return f"{namespace_of(cluster)}/np-{pool}"


def fleet_token(seed: str, cluster: int, pool: int, generation: int = 0) -> str:
    """The initial token of NodePool (cluster, pool): a UUID from sha256(seed/cluster/pool/generation)."""
    digest = hashlib.sha256(f"{seed}/{cluster}/{pool}/{generation}".encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


def manifest_path(source: Path, cluster: int, pool: int) -> Path:
    return source / namespace_of(cluster) / f"np-{pool}.yaml"


def _pem_block(rng: random.Random, approx_bytes: int, label: str = "CERTIFICATE") -> str:
    """PEM-looking text of random base64 lines (~approx_bytes)."""
    out: list[str] = []
    size = 0
    while size < approx_bytes:
        der = rng.randbytes(rng.randint(900, 1400))
        body = base64.b64encode(der).decode()
        lines = [body[k:k + 64] for k in range(0, len(body), 64)]
        block = f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----\n"
        out.append(block)
        size += len(block)
    return "".join(out)


def _script(rng: random.Random, approx_bytes: int, nodepool: str) -> str:
    lines = ["#!/bin/bash", "set -euo pipefail", f"# generated for {nodepool}", ""]
    size = sum(len(x) + 1 for x in lines)
    n = 0
    while size < approx_bytes:
        n += 1
        blob = base64.b64encode(rng.randbytes(rng.randint(30, 60))).decode()
        line = rng.choice([
            f'echo "step {n}: {blob}" >> /var/log/bench-{n % 7}.log',
            f'if [ -e /etc/bench/{blob[:12]} ]; then systemctl restart svc-{n % 13}.service; fi',
            f'export BENCH_{n}="{blob}"',
            f'curl -fsS --retry 3 https://mirror.example/{blob[:20]} -o /tmp/f{n} || true',
        ])
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


def _data_url_b64(content: str) -> str:
    return "data:;base64," + base64.b64encode(content.encode()).decode()


def _data_url_text(content: str) -> str:
    return "data:," + urllib.parse.quote(content, safe="")


def _unit(rng: random.Random, name: str, nodepool: str) -> dict[str, Any]:
    return {
        "name": name,
        "enabled": True,
        "contents": (
            "[Unit]\n"
            f"Description=bench unit {name} for {nodepool}\n"
            "After=network-online.target\nWants=network-online.target\n"
            "[Service]\nType=oneshot\nRemainAfterExit=yes\n"
            f"Environment=BENCH_ID={rng.getrandbits(64):016x}\n"
            f"ExecStart=/usr/local/bin/{name.removesuffix('.service')}.sh\n"
            "[Install]\nWantedBy=multi-user.target\n"
        ),
    }


def machineconfigs_for(seed: str, cluster: int, pool: int, payload_kib: int, variant: int = 0) -> str:
    """The multi-document MachineConfig YAML of one NodePool (deterministic in its arguments).

    `variant` changes the content (a "config change" for re-render scenarios) while keeping
    the marker file, so a served payload can still be checked against its NodePool.
    """
    nodepool = nodepool_of(cluster, pool)
    rng = random.Random(f"{seed}/{cluster}/{pool}/{variant}")
    budget = payload_kib * 1024 * 3 // 4  # data URLs are base64: content ~3/4 of the payload
    ca_size, script_size = budget * 50 // 100, budget * 20 // 100
    small_budget = budget - ca_size - script_size
    files: list[dict[str, Any]] = [
        {"path": MARKER_PATH, "mode": 0o644, "overwrite": True,
         "contents": {"source": _data_url_text(f"{nodepool}\nvariant={variant}\n")}},
        {"path": "/etc/pki/ca-trust/source/anchors/bench-bundle.pem", "mode": 0o644, "overwrite": True,
         "contents": {"source": _data_url_b64(_pem_block(rng, ca_size))}},
        {"path": "/usr/local/bin/bench-setup.sh", "mode": 0o755, "overwrite": True,
         "contents": {"source": _data_url_b64(_script(rng, script_size, nodepool))}},
    ]
    used, k = 0, 0
    while used < small_budget:
        k += 1
        size = rng.randint(300, 3000)
        if rng.random() < 0.5:
            text = f"# {nodepool} file {k}\n" + "\n".join(
                f"key{m}={base64.b64encode(rng.randbytes(24)).decode()}" for m in range(size // 44)
            ) + "\n"
            source = _data_url_text(text)
        else:
            text = _pem_block(rng, size, "PUBLIC KEY")
            source = _data_url_b64(text)
        files.append({"path": f"/etc/bench/conf.d/{k:03d}-{rng.getrandbits(32):08x}.conf",
                      "mode": 0o644, "overwrite": True, "contents": {"source": source}})
        used += len(text)
    units = [_unit(rng, f"bench-{u}.service", nodepool) for u in range(8)]
    units.append({"name": "kubelet.service", "dropins": [{
        "name": "20-bench.conf",
        "contents": f"[Service]\nEnvironment=KUBELET_NODE_LABELS=hypershift.openshift.io/nodePool={pool}\n",
    }]})
    # Two MachineConfigs, as a NodePool usually has several (merged by name).
    half = len(files) // 2
    docs = []
    for index, (chunk, chunk_units) in enumerate(((files[:half], units[:4]), (files[half:], units[4:]))):
        docs.append({
            "apiVersion": "machineconfiguration.openshift.io/v1",
            "kind": "MachineConfig",
            "metadata": {"name": f"{50 + index * 10}-bench-np-{pool}",
                         "labels": {"machineconfiguration.openshift.io/role": "worker"}},
            "spec": {"config": {"ignition": {"version": "3.2.0"},
                                "storage": {"files": chunk},
                                "systemd": {"units": chunk_units}}},
        })
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=1 << 30)


def token_secret(seed: str, cluster: int, pool: int, payload_kib: int, *, variant: int = 0,
                 generation_time: float | None = None, release: str | None = None) -> dict[str, Any]:
    # generation_time = now: the server rotates a Secret without one at once (HyperShift's policy).
    return build_token_secret(
        namespace=namespace_of(cluster),
        nodepool=nodepool_of(cluster, pool),
        token=fleet_token(seed, cluster, pool),
        machineconfigs_yaml=machineconfigs_for(seed, cluster, pool, payload_kib, variant),
        generation_time=time.time() if generation_time is None else generation_time,
        suffix=hashlib.sha256(f"{seed}/{cluster}/{pool}".encode()).hexdigest()[:8],
        **({"release": release} if release else {}),
    )


def write_manifest(path: Path, obj: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # not .yaml: the server never reads a half-written file
    tmp.write_text(yaml.dump(obj, Dumper=_Dumper, sort_keys=False))
    tmp.replace(path)


def pools(clusters: int, per_cluster: int) -> Iterator[tuple[int, int]]:
    for cluster in range(clusters):
        for pool in range(per_cluster):
            yield cluster, pool


def generate(out: Path, clusters: int, per_cluster: int, payload_kib: int, seed: str = DEFAULT_SEED,
             progress: bool | None = None) -> dict[str, Any]:
    """Write the fleet under `out` (see the module docstring); returns what fleet.json holds."""
    if progress is None:
        progress = sys.stderr.isatty()
    source = out / "source"
    total = clusters * per_cluster
    now = time.time()
    tokens: dict[str, str] = {}
    started = time.monotonic()
    for n, (cluster, pool) in enumerate(pools(clusters, per_cluster), 1):
        write_manifest(manifest_path(source, cluster, pool),
                       token_secret(seed, cluster, pool, payload_kib, generation_time=now))
        tokens[nodepool_of(cluster, pool)] = fleet_token(seed, cluster, pool)
        if progress and (n % 20 == 0 or n == total):
            rate = n / max(time.monotonic() - started, 1e-6)
            print(f"\rfleet: {n}/{total} NodePools ({rate:.0f}/s)", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    meta = {"clusters": clusters, "pools": per_cluster, "payload_kib": payload_kib, "seed": seed,
            "source": str(source), "marker_path": MARKER_PATH, "tokens": tokens}
    (out / "fleet.json").write_text(json.dumps(meta, indent=1))
    return meta


def load_fleet(out: Path) -> dict[str, Any]:
    return json.loads((out / "fleet.json").read_text())


def read_secret(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=_Loader)


def current_tokens(out: Path, meta: dict[str, Any] | None = None) -> dict[str, str]:
    """NodePool -> its current token, read from the manifests (rotation rewrites them)."""
    meta = meta or load_fleet(out)
    source = Path(meta["source"])
    result: dict[str, str] = {}
    for cluster, pool in pools(meta["clusters"], meta["pools"]):
        secret = parse_token_secret(read_secret(manifest_path(source, cluster, pool)))
        if secret.token:
            result[nodepool_of(cluster, pool)] = secret.token
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=440)
    parser.add_argument("--pools", type=int, default=12, help="NodePools per cluster")
    parser.add_argument("--payload-kib", type=int, default=300, help="approximate payload size per NodePool")
    parser.add_argument("--seed", default=DEFAULT_SEED)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    if (args.out / "source").exists():
        print(f"{args.out}/source exists: choose an empty --out", file=sys.stderr)
        return 2
    started = time.monotonic()
    meta = generate(args.out, args.clusters, args.pools, args.payload_kib, args.seed)
    size = sum(p.stat().st_size for p in Path(meta["source"]).rglob("*.yaml"))
    print(f"fleet: {args.clusters * args.pools} NodePools ({args.clusters} x {args.pools}), "
          f"{size / 2**20:.1f} MiB of manifests in {time.monotonic() - started:.1f}s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
