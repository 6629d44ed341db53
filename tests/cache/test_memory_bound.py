"""What the server holds in memory: `--cache-memory` bounds the payload bytes of the whole
server (every serving process's memory tier and ready bodies together), and a server with a
file source never loads the Kubernetes client (~35 MiB of RSS per process that imports it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ignition_server.config import payload_memory
from testsupport import fleet
from testsupport.harness import ServerProcess, bearer, wait_for


def test_the_budget_is_split_among_the_serving_processes() -> None:
    total = 128 << 20
    for processes in (1, 2, 3, 8):
        share = payload_memory(total, processes)
        assert processes * (share.tier + share.ready) <= total
        assert share.tier > 0 and share.ready > 0
        assert total - processes * (share.tier + share.ready) < processes  # only rounding is left over
    assert payload_memory(0, 2) == payload_memory(0, 1)


@pytest.mark.parametrize("workers", [0, 2])
def test_payload_memory_of_every_serving_process_stays_within_cache_memory(tmp_path: Path, workers: int) -> None:
    # 36 NodePools of 6-10 KiB in a budget of 128 KiB: each process can keep only a few of them,
    # in its memory tier and as ready bodies. (Before the budget covered the ready bodies and
    # every process, each worker kept every payload it served ready.)
    budget = 128 * 1024
    meta = fleet.generate(tmp_path / "fleet", 3, 12, 4, progress=False)
    proc = ServerProcess(Path(meta["source"]), tmp_path / "cache",
                         extra=["--workers", str(workers), "--cache-memory", "128Ki"]).start()
    wait_for(lambda: proc.metrics().get("ign_server_payload_cache_total") == 36, what="every payload rendered")
    sizes = set()
    for _round in range(3):
        for token in meta["tokens"].values():
            status, _headers, body = proc.get("/ignition", bearer(token))  # a new connection each: both workers serve
            assert status == 200
            sizes.add(len(body))
    assert min(sizes) * 36 > budget, "the fleet must not fit in the budget, or the test proves nothing"
    assert max(sizes) < budget // 8, "a payload fits in a worker's memory tier"

    def held() -> tuple[float, float]:
        metrics = proc.metrics()
        return metrics['ign_server_cache_bytes{tier="memory"}'], metrics['ign_server_cache_bytes{tier="ready"}']

    # Workers report what they hold within a second of a change.
    wait_for(lambda: all(held()), what="both tiers reported")
    memory, ready = held()
    assert memory + ready <= budget, (memory, ready)
    assert ready >= min(sizes), "the ready bodies keep at least one payload"
    if workers:  # access lines are written in batches, a moment after their requests
        wait_for(lambda: set(re.findall(r'"request_id": "(w\d)-', proc.logs())) == {"w0", "w1"},
                 what="both workers serving")
    proc.stop()


def test_a_server_with_a_file_source_never_imports_the_kubernetes_client(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # -X importtime for the owner and, inherited through the environment, its worker: every
    # module either process imports, when it imports it, goes to stderr (the server log).
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    meta = fleet.generate(tmp_path / "fleet", 1, 1, 4, progress=False)
    proc = ServerProcess(Path(meta["source"]), tmp_path / "cache", extra=["--workers", "1"]).start()
    wait_for(lambda: proc.metrics().get("ign_server_payload_cache_total") == 1, what="the payload rendered")
    token = next(iter(meta["tokens"].values()))
    assert proc.get("/ignition", bearer(token))[0] == 200
    assert proc.stop() == 0
    imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \| *(\S+)$", proc.logs(), re.MULTILINE)
    assert imported.count("aiohttp") == 2, "the import log covers the owner and the worker (each imports aiohttp once)"
    kube = sorted({name for name in imported if name.startswith("kubernetes")})
    assert kube == [], kube
