"""What the Kubernetes source keeps, and when keeping an object is a change to hand over: a new
version whose content is the same (only resourceVersion and managedFields moved) is none, and
neither is a re-list of what is kept (kept.py's `fingerprint` says why). Against the test API
server, in this process: the source's real informers, fetches and hand-overs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable

from ignition_server.model.objects import ObjectKey
from ignition_server.sources.events import Change
from ignition_server.sources.kube import KubeClient, KubeSource
from ignition_server.sources.kube.kept import KeptObjects
from testsupport.kubeapi import KubeAPI
from testsupport.manifests import kube_object

NS = "clusters-a"
KEY = ObjectKey("ConfigMap", NS, "user-ca-bundle")
MANAGER = {"manager": "kubectl", "operation": "Apply", "apiVersion": "v1", "time": "2026-11-27T10:00:00Z",
           "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:ca-bundle.crt": {}}}}


def config_map(version: str, **meta: object) -> dict:
    obj = kube_object("ConfigMap", NS, KEY.name, {"ca-bundle.crt": "PEM"})
    obj["metadata"].update({"resourceVersion": version, **meta})
    return obj


def test_a_version_that_moves_only_resource_version_and_managed_fields_is_no_change() -> None:
    kept = KeptObjects(references=lambda _obj: ())
    assert kept.keep(KEY, config_map("5")) == Change("ADDED", KEY, config_map("5"))
    assert kept.keep(KEY, config_map("9", managedFields=[MANAGER])) is None
    assert kept.versions[KEY] == 9  # kept all the same: the replay of version 9 is skipped by version
    relabelled = config_map("10", managedFields=[MANAGER], labels={"a": "b"})
    assert kept.keep(KEY, relabelled) == Change("MODIFIED", KEY, relabelled)


async def until(condition: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_a_bookkeeping_update_and_a_re_list_hand_nothing_over(tmp_path: Path) -> None:
    with KubeAPI(tmp_path / "api", bookmark_interval=0.2) as api:
        api.create(kube_object("ConfigMap", NS, KEY.name, {"ca-bundle.crt": "PEM"}))
        client = await KubeClient.connect(api.kubeconfig)
        handed: list[Change] = []

        async def handler(changes: list[Change]) -> None:
            handed.extend(changes)

        source = KubeSource(client, wanted=lambda _meta: True, namespaces=(NS,))
        running = asyncio.create_task(source.run(handler))
        try:
            await until(lambda: handed, "the listing")
            assert [(c.type, c.key) for c in handed] == [("ADDED", KEY)]
            handed.clear()

            # Another field manager applies the same values: a new resourceVersion, fetched and kept.
            fetched = api.server.requests[("get", "configmaps")]
            moved = api.patch("configmaps", NS, KEY.name, {"metadata": {"managedFields": [MANAGER]}})
            await until(lambda: (source.get(KEY) or {}).get("metadata", {}).get("resourceVersion")
                        == moved["metadata"]["resourceVersion"], "the new version kept")
            assert api.server.requests[("get", "configmaps")] > fetched

            # The watches break and the versions they resume from are gone: every kind is listed again.
            listed = api.server.requests[("list", "configmaps")]
            api.server.faults.gone_next_watches = 2
            api.stop()
            api.start()
            await until(lambda: api.server.requests[("list", "configmaps")] > listed, "a re-list")
            await asyncio.sleep(0.5)  # what the re-list kept is handed over at once: none came
            assert handed == []

            api.patch("configmaps", NS, KEY.name, {"data": {"ca-bundle.crt": "PEM2"}})
            await until(lambda: handed, "the data change")
            assert [(c.type, c.key) for c in handed] == [("MODIFIED", KEY)]
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            await client.close()
