"""Fairness between tenants (issue 30): how long another tenant's new NodePool waits for its first
payload while one tenant floods the server, on a real server process (file source, `--workers 2`).

- flood: one tenant's N token Secrets created at once, then another tenant's one NodePool:
  seconds from the victim's Secret written to its first 200 (and every answer it got meanwhile);
- churn: one tenant's pull secret, read by its P NodePools, edited E times in a row (P x E
  re-renders asked for), then another tenant's new NodePool: the same figure, less the
  victim's own time with nothing else to do (the flood of 0).

    python -m bench.fairness [--floods 0,2000,5000,10000] [--churn 2000x30] [--server-tree DIR] [--kubernetes]

`--kubernetes`: the same against the tests' API server (testsupport.kubeapi), objects created
there one by one as fast as it takes them (the flood's watch events arrive as they are made).

Run it twice in one sitting, once with `--server-tree` of the commit before, for a before/after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

from bench.run import add_server_tree_argument, metric, say, use_server_tree
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, bearer, write_manifests
from testsupport.kubeapi import KubeAPI
from testsupport.manifests import CA_PEM, build_token_secret, join_objects

PULL = '{"auths":{"quay.io":{"auth":"dTpw"}}}'


def tenant_inputs(namespace: str, pull_secret: str = PULL) -> list[dict[str, Any]]:
    return join_objects(namespace, pull_secret, CA_PEM)[:3]  # pull secret, kubeconfig, CA bundle


def nodepool(namespace: str, name: str) -> dict[str, Any]:
    return build_token_secret(namespace=namespace, nodepool=f"{namespace}/{name}", token=f"tok-{namespace}-{name}",
                              machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=name.replace("-", "")),
                              generation_time=time.time())


# Puts objects where the server reads them: (name, objects) -> a file of them, or each
# created in the API server (Kubernetes mode).
Place = Callable[[str, list[dict[str, Any]]], None]


def file_place(source: Path) -> Place:
    """Each file written aside and renamed into place whole."""
    staging = source.parent / "staging"
    staging.mkdir(exist_ok=True)

    def place(name: str, objects: list[dict[str, Any]]) -> None:
        write_manifests(staging / f"{name}.yaml", *objects).rename(source / f"{name}.yaml")
    return place


def api_place(api: KubeAPI) -> Place:
    def place(_name: str, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            try:
                api.create(obj)
            except Exception:  # already there (an input written again): replace it
                api.replace(obj)
    return place


def write_tenant(place: Place, namespace: str, count: int, per_file: int) -> None:
    """The tenant's inputs and `count` token Secrets, `per_file` to a file (1: as `oc get -o yaml`
    prints each)."""
    place(f"{namespace}-inputs", tenant_inputs(namespace))
    for first in range(0, count, per_file):
        place(f"{namespace}-{first:05d}", [nodepool(namespace, f"np-{i}") for i in range(first, min(count, first + per_file))])


def victim_wait(server: ServerProcess, place: Place, timeout: float) -> dict[str, Any]:
    """Write the victim tenant's NodePool; poll as a node does until its payload comes."""
    place("victim-inputs", tenant_inputs("clusters-victim"))
    written = time.monotonic()
    place("victim", [nodepool("clusters-victim", "np-0")])
    answers: Counter[int] = Counter()
    headers = bearer("tok-clusters-victim-np-0")
    while time.monotonic() - written < timeout:
        status = server.get("/ignition", headers)[0]
        answers[status] += 1
        if status == 200:
            return {"seconds": round(time.monotonic() - written, 2), "answers": dict(sorted(answers.items()))}
        time.sleep(0.05)
    return {"seconds": None, "answers": dict(sorted(answers.items()))}


def start(work: Path, workers: int, api: KubeAPI | None) -> tuple[ServerProcess, Place]:
    shutil.rmtree(work, ignore_errors=True)
    source = work / "source"
    source.mkdir(parents=True)
    extra = ["--workers", str(workers)]
    if api is not None:
        api.namespace("ignition")
        extra += ["--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition",
                  "--replica-id", "bench"]
    place = file_place(source) if api is None else api_place(api)
    place("placeholder", tenant_inputs("clusters-placeholder"))
    server = ServerProcess(source, work / "cache", extra=extra).start()
    return server, place


def flood(work: Path, count: int, workers: int, timeout: float, per_file: int, api: KubeAPI | None) -> dict[str, Any]:
    server, place = start(work, workers, api)
    try:
        write_tenant(place, "clusters-flood", count, per_file)
        result = victim_wait(server, place, timeout)
        result["flood_rendered_by_then"] = int(metric(server, "ign_server_payload_cache_miss_total"))
        return result
    finally:
        server.kill()


def churn(work: Path, pools: int, edits: int, workers: int, timeout: float, per_file: int,
          api: KubeAPI | None) -> dict[str, Any]:
    server, place = start(work, workers, api)
    try:
        write_tenant(place, "clusters-churn", pools, per_file)
        deadline = time.monotonic() + timeout
        while metric(server, "ign_server_payload_cache_total") < pools and time.monotonic() < deadline:
            time.sleep(0.5)
        for edit in range(edits):
            place("clusters-churn-inputs", tenant_inputs("clusters-churn", PULL.replace("dTpw", f"dT{edit:02d}")))
            time.sleep(0.1)
        before = metric(server, "ign_server_payload_cache_miss_total")
        result = victim_wait(server, place, timeout)
        result["churn_rerendered_by_then"] = int(metric(server, "ign_server_payload_cache_miss_total") - before)
        return result
    finally:
        server.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__.splitlines()[0])
    parser.add_argument("--floods", default="0,2000,5000,10000", help="the flooding tenant's token Secrets, per run")
    parser.add_argument("--churn", default="2000x30", help="NodePools x pull-secret edits ('' to skip)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--per-file", type=int, default=1, help="token Secrets per manifest file")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--kubernetes", action="store_true", help="against the tests' API server, not a directory")
    add_server_tree_argument(parser)
    args = parser.parse_args(argv)
    use_server_tree(parser, args.server_tree)
    summary: dict[str, Any] = {"flood": {}, "churn": None}
    with tempfile.TemporaryDirectory(prefix="bench-fairness-") as scratch:
        work = args.work or Path(scratch)
        for count in (int(c) for c in args.floods.split(",") if c.strip()):
            with _api(args.kubernetes, work / f"api-{count}") as api:
                result = flood(work / f"flood-{count}", count, args.workers, args.timeout, args.per_file, api)
            summary["flood"][count] = result
            say(f"flood of {count:>6} token Secrets: the other tenant's first payload after {result['seconds']} s "
                f"(answers {result['answers']}; {result['flood_rendered_by_then']} flood payloads rendered by then)")
        if args.churn:
            pools, edits = (int(x) for x in args.churn.split("x"))
            with _api(args.kubernetes, work / "api-churn") as api:
                result = churn(work / "churn", pools, edits, args.workers, args.timeout, args.per_file, api)
            alone = summary["flood"].get(0, {}).get("seconds")
            result["over_alone"] = None if alone is None or result["seconds"] is None else round(result["seconds"] - alone, 2)
            summary["churn"] = result
            say(f"churn of {pools} NodePools x {edits} pull-secret edits: the other tenant's first payload after "
                f"{result['seconds']} s ({result['over_alone']} s over its time alone; answers {result['answers']}; "
                f"{result['churn_rerendered_by_then']} re-renders by then)")
    print(json.dumps(summary, sort_keys=True))
    return 0


@contextlib.contextmanager
def _api(kubernetes: bool, directory: Path) -> Iterator[KubeAPI | None]:
    """A fresh API server per run (Kubernetes mode), else none."""
    if not kubernetes:
        yield None
        return
    with KubeAPI(directory) as api:
        yield api


if __name__ == "__main__":
    raise SystemExit(main())
