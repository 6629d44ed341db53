"""The Kubernetes source's writes: write-backs, creates, replaces, deletes and Events.

Write-back is a JSON merge patch of what the mutation changed, with the resourceVersion it
was made from as a precondition: a 409 (another writer came first) reads the object again
and applies the mutation to that, so two replicas never hand out two different new tokens.
What the API server answers is kept and handed over at once; the watch's echo of it is then
a version already seen. A watch event for an object while our write of it is in flight is
not fetched (`in_flight`): the write's answer is about to say it, and a newer version seen
meanwhile (someone else's write) is fetched once ours is done.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from ...model.objects import ObjectKey, object_key
from ..events import Change, Mutation
from .client import MERGE_PATCH, KubeClient, KubeError, collection_path, item_path
from .kept import KeptObjects, version

WRITE_ATTEMPTS = 10


def merge_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`."""
    patch: dict[str, Any] = {}
    for key in set(old) | set(new):
        if key not in new:
            patch[key] = None
        elif key not in old:
            patch[key] = copy.deepcopy(new[key])
        elif isinstance(old[key], dict) and isinstance(new[key], dict):
            inner = merge_diff(old[key], new[key])
            if inner:
                patch[key] = inner
        elif old[key] != new[key]:
            patch[key] = copy.deepcopy(new[key])
    return patch


@dataclass
class KubeWrites:
    client: KubeClient
    kept: KeptObjects
    fetch: Callable[[ObjectKey], Awaitable[dict[str, Any] | None]]  # a GET, trimmed; None: gone
    hand_over: Callable[[list[Change]], Awaitable[None]]  # after the changes kept before
    trim: Callable[[dict[str, Any]], dict[str, Any]]
    # Our own write in flight: its watch event can overtake its response; a GET for it would
    # only fetch what the response is about to say. Newer versions seen meanwhile, by key.
    _writing: dict[ObjectKey, int] = field(default_factory=dict)

    def in_flight(self, key: ObjectKey, obj: Mapping[str, Any]) -> bool:
        """Whether a write of `key` is in flight; if so, `obj` (a watch event's) is noted for after it."""
        if key not in self._writing:
            return False
        self._writing[key] = max(self._writing[key], version(obj))
        return True

    async def _keep_and_hand_over(self, key: ObjectKey, obj: dict[str, Any]) -> None:
        change = self.kept.keep(key, obj)
        if change is not None:
            await self.hand_over([change])

    async def write_back(self, key: ObjectKey, mutate: Mutation) -> dict[str, Any] | None:
        """Apply `mutate` to the object and patch what it changed, with the version it was
        made from as a precondition; on a conflict, read it again and start over."""
        self._writing[key] = 0
        try:
            return await self._write_back(key, mutate)
        finally:
            # Someone else's write seen while ours was in flight (not our own echo): catch up.
            seen = self._writing.pop(key, 0)
            if seen > self.kept.versions.get(key, 0):
                newer = await self.fetch(key)
                if newer is not None:
                    await self._keep_and_hand_over(key, {**newer, "kind": key.kind})

    async def _write_back(self, key: ObjectKey, mutate: Mutation) -> dict[str, Any] | None:
        current = self.kept.objects.get(key)
        for _ in range(WRITE_ATTEMPTS):
            fetched = current is None
            if current is None:
                current = await self.fetch(key)
                if current is None:
                    raise KeyError(f"{key} is not in the API server")
                current = {**current, "kind": key.kind}
            changed = copy.deepcopy(current)
            if not mutate(changed):
                if fetched:
                    await self._learn(key, current)
                return None
            patch = merge_diff(current, changed)
            patch.setdefault("metadata", {})["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
            try:
                written = await self.client.request(
                    "patch", "PATCH", item_path(key.kind, key.namespace, key.name), body=patch, content_type=MERGE_PATCH)
            except KubeError as exc:
                if exc.status == 409:
                    current = None  # someone else wrote first: read theirs, decide again
                    continue
                if exc.status == 404:
                    raise KeyError(f"{key} is gone from the API server") from None
                raise
            await self._keep_and_hand_over(key, {**written, "kind": key.kind})
            return written
        raise RuntimeError(f"{key} kept changing while writing it back")

    async def _learn(self, key: ObjectKey, obj: dict[str, Any]) -> None:
        """A version read while writing (after a conflict) is the newest this replica knows:
        hand it over now rather than decide again from the older one until the watch brings it."""
        if version(obj) > self.kept.versions.get(key, 0):
            await self._keep_and_hand_over(key, obj)

    async def put(self, obj: dict[str, Any], *, beside: ObjectKey) -> None:
        """Create an object, or bring an existing one in line with it."""
        key = object_key(obj)
        if key is None:
            raise ValueError("an object needs kind and metadata.name")

        def replace(current: dict[str, Any]) -> bool:
            wanted = {k: v for k, v in obj.items() if k != "metadata"}
            if all(current.get(k) == v for k, v in wanted.items()):
                return False
            current.update(copy.deepcopy(wanted))
            return True

        if key in self.kept.objects:  # kept already (user-data is): one patch, no create that fails first
            await self.write_back(key, replace)
            return
        try:
            created = await self.client.request("create", "POST", collection_path(key.kind, key.namespace), body=obj)
        except KubeError as exc:
            if exc.status != 409:
                raise
        else:
            self.kept.keep(key, {**created, "kind": key.kind})
            return
        await self.write_back(key, replace)

    async def record_event(self, about: ObjectKey, reason: str, message: str, *, warning: bool = True) -> None:
        """A core/v1 Event on the object (what `kubectl describe` shows)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        kept = self.kept.objects.get(about, {})
        involved = kept.get("metadata") or {}
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{about.name}.", "namespace": about.namespace},
            "involvedObject": {"apiVersion": kept.get("apiVersion", "v1"), "kind": about.kind, "namespace": about.namespace, "name": about.name,
                               "uid": involved.get("uid"), "resourceVersion": involved.get("resourceVersion")},
            "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
            "source": {"component": "ignition-server"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        await self.client.request("create", "POST", collection_path("Event", about.namespace), body=body)

    async def delete(self, key: ObjectKey, *, resource_version: str | None = None) -> bool:
        """Delete an object (only at `resource_version`, when given). False when already gone."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if resource_version:
            body["preconditions"] = {"resourceVersion": resource_version}
        try:
            await self.client.request("delete", "DELETE", item_path(key.kind, key.namespace, key.name), body=body)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object as it is (a KubeError 409 when one of its name exists); kept and
        handed over as the API server answered."""
        key = object_key(obj)
        if key is None:
            raise ValueError("an object needs kind and metadata.name")
        created = await self.client.request("create", "POST", collection_path(key.kind, key.namespace), body=obj)
        await self._wrote(key, created)
        return created

    async def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace an object whole (PUT) at the resourceVersion it carries: a KubeError 409 when
        someone wrote since, 404 when it is gone. Kept and handed over as the API server answered."""
        key = object_key(obj)
        if key is None:
            raise ValueError("an object needs kind and metadata.name")
        written = await self.client.request("update", "PUT", item_path(key.kind, key.namespace, key.name), body=obj)
        await self._wrote(key, written)
        return written

    async def _wrote(self, key: ObjectKey, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            if key in self.kept.objects:  # its last finalizer went: gone
                await self.hand_over([self.kept.forget(key)])
        else:
            await self._keep_and_hand_over(key, {**self.trim(obj), "kind": key.kind})
