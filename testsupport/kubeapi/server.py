"""An API-level Kubernetes test server: strict where the real API server is strict.

What clients get wrong against a real API server is what this one enforces: a bearer token
on every request (401 otherwise), resourceVersion on every object and list, 409 on a stale
precondition (update, patch or delete), 404 with a v1 Status, namespaces that must exist,
watches that replay from a version and end (timeoutSeconds, or a fault), bookmarks,
410 Gone for a compacted version, protobuf request bodies (client-go's for built-in kinds), watch-lists (sendInitialEvents, the initial-events-end
bookmark), metadata-only answers (PartialObjectMetadata), the
Table answers kubectl asks for, paged lists (limit/continue), and the three patch types.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import copy
import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from . import protobuf
from .patch import PatchError, apply_patch
from .store import RESOURCES, ApiError, Resource, Store

VERSION = {"major": "1", "minor": "30", "gitVersion": "v1.30.0-kubeapi-test", "platform": "linux/amd64"}
_SHORT_NAMES = {"configmaps": ["cm"], "namespaces": ["ns"], "services": ["svc"], "events": ["ev"]}
_META_AS = re.compile(r"as=(PartialObjectMetadata(?:List)?|Table)")


@dataclass
class Faults:
    """What the tests break on purpose."""

    watch_max_seconds: float | None = None  # every watch stream ends after this long
    watch_max_events: int | None = None  # ... or after this many events
    gone_next_watches: int = 0  # the next N watches answer 410 Gone at once
    refuse_writes: bool = False  # every write answers 500 (an etcd outage)
    hold_events: bool = False  # open watches send nothing (bookmarks neither) until released: a lagging watch
    unavailable: bool = False  # every request answers 503 and open watches end (the API server down behind its load balancer)
    hold_token_writes: bool = False  # PATCHes setting a Secret's data.token wait, then apply in their order of arrival
    refuse_lease_holder: str | None = None  # Lease updates by this holder answer 500: that replica cannot renew


@dataclass
class ApiServer:
    token: str
    store: Store = field(default_factory=Store)
    faults: Faults = field(default_factory=Faults)
    bookmark_interval: float = 1.0
    requests: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    live_watches: int = 0
    refusals: collections.Counter[int] = field(default_factory=collections.Counter)  # answers by status code >= 400
    reads: list[tuple[str, str, str]] = field(default_factory=list)  # (plural, namespace, name) of every GET of one object
    watch_list: bool = True  # False: an API server with the WatchList feature gate off (sendInitialEvents refused)
    token_writes_held: int = 0  # PATCHes setting data.token that hold_token_writes held
    _token_queue: list[int] = field(default_factory=list)  # the held ones, in order of arrival

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_and_errors])
        app.router.add_get("/version", self._version)
        app.router.add_get("/api", self._api_versions)
        app.router.add_get("/apis", self._api_groups)
        app.router.add_get("/api/{version}", self._resource_list)
        app.router.add_get("/apis/{group}/{version}", self._resource_list)
        for prefix in ("/api/{version}", "/apis/{group}/{version}"):
            app.router.add_route("*", prefix + "/namespaces/{namespace}/{plural}", self._collection)
            app.router.add_route("*", prefix + "/namespaces/{namespace}/{plural}/{name}", self._item)
            app.router.add_route("*", prefix + "/{plural}", self._collection)
            app.router.add_route("*", prefix + "/{plural}/{name}", self._item)
        return app

    # --- plumbing ---------------------------------------------------------------------------

    @web.middleware
    async def _auth_and_errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(ApiError(401, "Unauthorized", "Unauthorized").status(), status=401)
        if self.faults.unavailable:
            self.refusals[503] += 1
            return web.json_response(ApiError(503, "ServiceUnavailable", "the server is currently unable to handle the request").status(),
                                     status=503, headers={"Retry-After": "1"})
        try:
            return await handler(request)
        except ApiError as exc:
            self.refusals[exc.code] += 1
            return web.json_response(exc.status(), status=exc.code)
        except PatchError as exc:
            return web.json_response(ApiError(422, "Invalid", str(exc)).status(), status=422)

    def _resource(self, request: web.Request) -> Resource:
        group = request.match_info.get("group", "")
        version = request.match_info["version"]
        plural = request.match_info["plural"]
        for resource in RESOURCES:
            if (resource.group, resource.version, resource.plural) == (group, version, plural):
                return resource
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({plural})")

    def _count(self, verb: str, resource: Resource) -> None:
        self.requests[(verb, resource.plural)] += 1

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if request.content_type == protobuf.MEDIA_TYPE:  # client-go writes built-in kinds so
            try:
                return protobuf.decode(raw)
            except protobuf.ProtobufError as exc:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {exc}") from None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"the request body is not JSON: {exc}") from None

    def _write_allowed(self) -> None:
        if self.faults.refuse_writes:
            raise ApiError(500, "InternalError", "etcdserver: request timed out")

    # --- discovery --------------------------------------------------------------------------

    async def _version(self, _request: web.Request) -> web.Response:
        return web.json_response(VERSION)

    async def _api_versions(self, _request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"],
                                  "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})

    async def _api_groups(self, _request: web.Request) -> web.Response:
        groups = sorted({(r.group, r.version) for r in RESOURCES if r.group})
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
             "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in groups]})

    async def _resource_list(self, request: web.Request) -> web.Response:
        group, version = request.match_info.get("group", ""), request.match_info["version"]
        resources = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
        if not resources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                                  "groupVersion": f"{group}/{version}" if group else version, "resources": [
            {"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced, "kind": r.kind,
             "shortNames": _SHORT_NAMES.get(r.plural, []),
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]} for r in resources]})

    # --- collections: list, watch, create ---------------------------------------------------

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        resource = self._resource(request)
        namespace = request.match_info.get("namespace")
        if namespace is not None and not resource.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if request.method == "GET":
            if _flag(request.query.get("watch")):
                self._count("watch", resource)
                return await self._watch(request, resource, namespace)
            self._count("list", resource)
            return self._list(request, resource, namespace)
        if request.method == "POST":
            self._count("create", resource)
            self._write_allowed()
            if resource.namespaced and namespace is None:
                raise ApiError(405, "MethodNotAllowed", "create needs a namespace")
            created = await self.store.create(resource, namespace or "", await self._body(request))
            return web.json_response(created, status=201)
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not allowed on a collection")

    def _selected(self, request: web.Request, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        for term in filter(None, request.query.get("labelSelector", "").split(",")):
            key, sep, value = term.partition("=")
            labels = meta.get("labels") or {}
            if sep and labels.get(key) != value.lstrip("="):
                return False
            if not sep and (term.startswith("!") and term[1:] in labels or not term.startswith("!") and term not in labels):
                return False
        for term in filter(None, request.query.get("fieldSelector", "").split(",")):
            key, _, value = term.partition("=")
            field_name = key.removeprefix("metadata.")
            if key not in ("metadata.name", "metadata.namespace"):
                raise ApiError(400, "BadRequest", f'"{key}" is not a known field selector')
            if meta.get(field_name) != value.lstrip("="):
                return False
        return True

    def _list(self, request: web.Request, resource: Resource, namespace: str | None) -> web.Response:
        items = [o for o in self.store.list(resource, namespace) if self._selected(request, o)]
        start = int(base64.b64decode(request.query["continue"]).decode()) if request.query.get("continue") else 0
        limit = int(request.query.get("limit") or 0)
        page = items[start:start + limit] if limit else items[start:]
        meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
        if limit and start + limit < len(items):
            meta["continue"] = base64.b64encode(str(start + limit).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
        shape = _shape(request)
        if shape == "Table":
            return web.json_response(_table(page, meta))
        if shape in ("PartialObjectMetadataList", "PartialObjectMetadata"):
            return web.json_response({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                                      "metadata": meta, "items": [_partial(o) for o in page]})
        # Items of a typed list carry no kind/apiVersion: clients that read them break on a real server.
        return web.json_response({"kind": f"{resource.kind}List", "apiVersion": resource.api_version, "metadata": meta,
                                  "items": [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in page]})

    def _watch_list_requested(self, request: web.Request) -> bool | None:
        """`sendInitialEvents` (a watch-list, client-go's default since 1.35), validated as the
        API server's ValidateListOptions does: 422 for what a real server refuses."""
        asked, match = request.query.get("sendInitialEvents"), request.query.get("resourceVersionMatch", "")
        problems = []
        if asked is not None:
            if match != "NotOlderThan":
                problems.append("resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan")
            if not _flag(request.query.get("allowWatchBookmarks")):
                problems.append("allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true")
            if not self.watch_list:
                problems.append("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled")
        elif match:
            problems.append("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided")
        if problems:
            raise ApiError(422, "Invalid", "ListOptions.meta.k8s.io \"\" is invalid: " + ", ".join(problems))
        return None if asked is None else _flag(asked)

    async def _watch(self, request: web.Request, resource: Resource, namespace: str | None) -> web.StreamResponse:
        since_text = request.query.get("resourceVersion", "")
        initial_events = self._watch_list_requested(request)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        shape = _shape(request)

        async def send(type_: str, obj: dict[str, Any]) -> None:
            if shape == "Table" and type_ != "ERROR":
                obj = _table([obj], {"resourceVersion": obj["metadata"]["resourceVersion"]})
            elif shape and shape.startswith("PartialObjectMetadata") and type_ not in ("ERROR", "BOOKMARK"):
                obj = _partial(obj)
            await response.write(json.dumps({"type": type_, "object": obj}).encode() + b"\n")

        gone = ApiError(410, "Expired", f"too old resource version: {since_text} ({self.store.compacted + 1})")
        if self.faults.gone_next_watches > 0:
            self.faults.gone_next_watches -= 1
            await send("ERROR", gone.status())
            return response
        if initial_events:
            # A watch-list: the state (at this version or newer, which NotOlderThan allows) as
            # ADDED events, then the bookmark that says the initial events are over.
            since = self.store.rv
            for obj in self.store.list(resource, namespace):
                if self._selected(request, obj):
                    await send("ADDED", obj)
            await send("BOOKMARK", {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": {
                "resourceVersion": str(since), "annotations": {"k8s.io/initial-events-end": "true"}}})
        elif initial_events is False and since_text == "":
            since = self.store.rv  # "start at most recent": no synthetic events
        elif since_text in ("", "0"):
            since = self.store.rv
            for obj in self.store.list(resource, namespace):
                if self._selected(request, obj):
                    await send("ADDED", obj)
        else:
            since = int(since_text)
            if since < self.store.compacted:
                await send("ERROR", gone.status())
                return response
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        if self.faults.watch_max_seconds is not None:
            timeout = min(timeout, self.faults.watch_max_seconds)
        bookmarks = _flag(request.query.get("allowWatchBookmarks"))
        loop = asyncio.get_running_loop()
        deadline, next_bookmark = loop.time() + timeout, loop.time() + self.bookmark_interval
        sent = 0
        self.live_watches += 1
        try:
            while loop.time() < deadline and not self.faults.unavailable:
                if self.faults.hold_events:
                    await asyncio.sleep(0.05)
                    continue
                for event in [e for e in self.store.history if e.rv > since]:
                    since = event.rv
                    meta = event.obj.get("metadata", {})
                    if event.resource != resource or (namespace is not None and meta.get("namespace") != namespace):
                        continue
                    if not self._selected(request, event.obj):
                        continue
                    await send(event.type, event.obj)
                    sent += 1
                    if self.faults.watch_max_events is not None and sent >= self.faults.watch_max_events:
                        return response
                if bookmarks and loop.time() >= next_bookmark:
                    await send("BOOKMARK", {"kind": resource.kind, "apiVersion": resource.api_version,
                                            "metadata": {"resourceVersion": str(since)}})
                    next_bookmark = loop.time() + self.bookmark_interval
                wait = min(deadline, next_bookmark if bookmarks else deadline) - loop.time()
                await self.store.wait_beyond(since, max(0.01, wait))
        except ConnectionResetError:  # the client went away (aiohttp's ClientConnectionResetError too)
            return response
        finally:
            self.live_watches -= 1
        return response

    # --- items: get, update, patch, delete --------------------------------------------------

    async def _item(self, request: web.Request) -> web.StreamResponse:
        resource = self._resource(request)
        namespace = request.match_info.get("namespace", "") if resource.namespaced else ""
        if resource.namespaced and "namespace" not in request.match_info:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = request.match_info["name"]
        if request.method == "GET":
            self._count("get", resource)
            self.reads.append((resource.plural, namespace, name))
            obj = self.store.get(resource, namespace, name)
            shape = _shape(request)
            if shape == "Table":
                return web.json_response(_table([obj], {"resourceVersion": obj["metadata"]["resourceVersion"]}))
            return web.json_response(_partial(obj) if shape == "PartialObjectMetadata" else obj)
        self._write_allowed()
        if request.method == "PUT":
            self._count("update", resource)
            body = await self._body(request)
            if resource.plural == "leases" and self.faults.refuse_lease_holder is not None \
                    and (body.get("spec") or {}).get("holderIdentity") == self.faults.refuse_lease_holder:
                raise ApiError(500, "InternalError", "etcdserver: request timed out")
            return web.json_response(await self.store.replace(resource, namespace, name, body))
        if request.method == "PATCH":
            self._count("patch", resource)
            body = await self._body(request)
            if resource.plural == "secrets" and isinstance(body, dict) and "token" in (body.get("data") or {}) \
                    and (self.faults.hold_token_writes or self._token_queue):  # a JSON patch is a list
                return await self._held_patch(request, resource, namespace, name, body)
            return await self._patch(request, resource, namespace, name, body)
        if request.method == "DELETE":
            self._count("delete", resource)
            body = await request.read()
            options = json.loads(body) if body else {}
            return web.json_response(await self.store.delete(resource, namespace, name, options.get("preconditions") or {}))
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not allowed")


    async def _patch(self, request: web.Request, resource: Resource, namespace: str, name: str, body: Any) -> web.Response:
        current = self.store.get(resource, namespace, name)
        patched = apply_patch(request.headers.get("Content-Type", ""), current, body)
        # A resourceVersion in the patch is a precondition: it must be the current one.
        return web.json_response(await self.store.replace(resource, namespace, name, patched))

    async def _held_patch(self, request: web.Request, resource: Resource, namespace: str, name: str, body: Any) -> web.Response:
        """A token write held by `hold_token_writes` (a slow etcd): once released, the held
        writes apply one after the other in the order they came (a later one may conflict)."""
        turn = self.token_writes_held
        self.token_writes_held += 1
        self._token_queue.append(turn)
        try:
            while self.faults.hold_token_writes or self._token_queue[0] != turn:
                await asyncio.sleep(0.02)
            return await self._patch(request, resource, namespace, name, body)
        finally:
            self._token_queue.remove(turn)

def _flag(value: str | None) -> bool:
    """A boolean query parameter as Go's strconv.ParseBool reads it (clients send 1, true, True)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _shape(request: web.Request) -> str | None:
    """The `as=` of the first media type in Accept (clients list their preference first)."""
    first = request.headers.get("Accept", "").split(",")[0]
    match = _META_AS.search(first)
    return match.group(1) if match else None


def _partial(obj: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": copy.deepcopy(obj["metadata"])}


def _age(obj: dict[str, Any]) -> str:
    created = dt.datetime.strptime(obj["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    return f"{int((dt.datetime.now(dt.timezone.utc) - created).total_seconds())}s"


def _table(objects: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
            "columnDefinitions": [
                {"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0},
                {"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0}],
            "rows": [{"cells": [o["metadata"]["name"], _age(o)], "object": _partial(o)} for o in objects]}
