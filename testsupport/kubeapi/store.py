"""The objects of the test API server: one resourceVersion counter, a bounded event history.

As in etcd behind a real API server, every write takes the next resourceVersion, and
watches replay the history after a given version; versions older than the history (it is
compacted) are gone: a watch from there answers 410 Gone.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = (
    Resource("", "v1", "secrets", "Secret"),
    Resource("", "v1", "configmaps", "ConfigMap"),
    Resource("", "v1", "events", "Event"),
    Resource("", "v1", "services", "Service"),
    Resource("", "v1", "namespaces", "Namespace", namespaced=False),
    Resource("coordination.k8s.io", "v1", "leases", "Lease"),
    Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
    Resource("hypershift.openshift.io", "v1beta1", "hostedcontrolplanes", "HostedControlPlane"),
)


class ApiError(Exception):
    """A v1 Status answer."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


def not_found(resource: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource.plural} "{name}" not found')


def conflict(resource: Resource, name: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource.plural} "{name}": '
                    "the object has been modified; please apply your changes to the latest version and try again")


@dataclass
class WatchEvent:
    rv: int
    type: str
    resource: Resource
    obj: dict[str, Any]


@dataclass
class Store:
    history_limit: int = 10_000
    rv: int = 1
    objects: dict[tuple[Resource, str, str], dict[str, Any]] = field(default_factory=dict)
    history: list[WatchEvent] = field(default_factory=list)
    compacted: int = 0  # watches from a version at or below this one are 410 Gone
    changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self.changed is None:
            self.changed = asyncio.Condition()
        return self.changed

    async def _record(self, type_: str, resource: Resource, obj: dict[str, Any]) -> None:
        self.history.append(WatchEvent(self.rv, type_, resource, copy.deepcopy(obj)))
        if len(self.history) > self.history_limit:
            dropped = self.history[: len(self.history) - self.history_limit]
            self.compacted = dropped[-1].rv
            del self.history[: len(dropped)]
        async with self._condition():
            self._condition().notify_all()

    def compact(self) -> None:
        """Forget the whole history (as etcd compaction does): older watches get 410."""
        self.compacted = self.rv
        self.history.clear()

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any]:
        found = self.objects.get((resource, namespace, name))
        if found is None:
            raise not_found(resource, name)
        return found

    def list(self, resource: Resource, namespace: str | None) -> list[dict[str, Any]]:
        return [obj for (res, ns, _), obj in sorted(self.objects.items(), key=lambda kv: (kv[0][1], kv[0][2]))
                if res == resource and (namespace is None or ns == namespace)]

    def _check_namespace(self, resource: Resource, namespace: str) -> None:
        namespaces = next(r for r in RESOURCES if r.plural == "namespaces")
        if resource.namespaced and (namespaces, "", namespace) not in self.objects:
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found')

    async def create(self, resource: Resource, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not name:
            raise ApiError(422, "Invalid", f"{resource.kind} is invalid: metadata.name: Required value")
        if resource.namespaced:
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the request")
            self._check_namespace(resource, namespace)
            meta["namespace"] = namespace
        else:
            namespace = ""
        if meta.get("resourceVersion"):
            raise ApiError(422, "Invalid", "resourceVersion should not be set on objects to be created")
        if (resource, namespace, name) in self.objects:
            raise ApiError(409, "AlreadyExists", f'{resource.plural} "{name}" already exists')
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        meta.pop("deletionTimestamp", None)  # rest.BeforeCreate clears what only a deletion sets
        meta.pop("deletionGracePeriodSeconds", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta["resourceVersion"] = self._next_rv()
        self.objects[(resource, namespace, name)] = obj
        await self._record("ADDED", resource, obj)
        return obj

    async def replace(self, resource: Resource, namespace: str, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        current = self.get(resource, namespace, name)
        meta = obj.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name in the URL")
        wanted = meta.get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise conflict(resource, name)
        if meta.get("uid") and meta["uid"] != current["metadata"]["uid"]:
            raise conflict(resource, name)
        for kept in ("uid", "creationTimestamp"):
            meta[kept] = current["metadata"][kept]
        meta["name"] = name
        if resource.namespaced:
            meta["namespace"] = namespace
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        _deletion_unchanged(resource, name, current["metadata"], meta)
        if _without_rv(obj) == _without_rv(current):
            return current  # a no-op write takes no new version and sends no event
        meta["resourceVersion"] = self._next_rv()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # The last finalizer removed from an object being deleted: it goes (the registry's
            # ShouldDeleteDuringUpdate).
            del self.objects[(resource, namespace, name)]
            await self._record("DELETED", resource, obj)
            return obj
        self.objects[(resource, namespace, name)] = obj
        await self._record("MODIFIED", resource, obj)
        return obj

    async def delete(self, resource: Resource, namespace: str, name: str, preconditions: dict[str, Any]) -> dict[str, Any]:
        current = self.get(resource, namespace, name)
        if preconditions.get("resourceVersion") and preconditions["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise conflict(resource, name)
        if preconditions.get("uid") and preconditions["uid"] != current["metadata"]["uid"]:
            raise conflict(resource, name)
        if current["metadata"].get("finalizers"):
            # Graceful deletion: the object stays, readable, with a deletionTimestamp, until its
            # finalizers are removed (a second DELETE changes nothing).
            if current["metadata"].get("deletionTimestamp"):
                return current
            deleting = copy.deepcopy(current)
            deleting["metadata"]["deletionTimestamp"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            deleting["metadata"]["deletionGracePeriodSeconds"] = 0
            deleting["metadata"]["resourceVersion"] = self._next_rv()
            self.objects[(resource, namespace, name)] = deleting
            await self._record("MODIFIED", resource, deleting)
            return deleting
        del self.objects[(resource, namespace, name)]
        gone = copy.deepcopy(current)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        await self._record("DELETED", resource, gone)
        return gone

    async def wait_beyond(self, rv: int, timeout: float) -> None:
        condition = self._condition()
        async with condition:
            try:
                await asyncio.wait_for(condition.wait_for(lambda: self.rv > rv), timeout)
            except asyncio.TimeoutError:
                pass


def _deletion_unchanged(resource: Resource, name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """What an update may not do to a deletion (rest.BeforeUpdate, ValidateObjectMetaUpdate): the
    deletionTimestamp is kept as it was (only a DELETE sets it), and an object being deleted takes
    no new finalizer."""
    for field_name in ("deletionTimestamp", "deletionGracePeriodSeconds"):
        if field_name in old:
            new[field_name] = old[field_name]
        elif new.get(field_name) is not None:
            raise ApiError(422, "Invalid", f'{resource.kind} "{name}" is invalid: metadata.{field_name}: '
                           "Invalid value: field is immutable; may only be changed via deletion")
        else:
            new.pop(field_name, None)
    if old.get("deletionTimestamp"):
        added = [f for f in new.get("finalizers") or [] if f not in (old.get("finalizers") or [])]
        if added:
            listed = ", ".join(f'"{f}"' for f in added)
            raise ApiError(422, "Invalid", f'{resource.kind} "{name}" is invalid: metadata.finalizers: Forbidden: '
                           f"no new finalizers can be added if the object is being deleted, found new finalizers []string{{{listed}}}")


def _without_rv(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out.get("metadata", {}).pop("resourceVersion", None)
    return out
