"""The HTTP contract of DESIGN §2: both request shapes, the 4xx/5xx rules, health endpoints.

The app only reads: the token index and the payload cache. 5xx means "retry" to the real
Ignition client and 4xx means "give up", so every refusal is chosen with that in mind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable

from aiohttp import web
from aiohttp.payload import Payload
from multidict import CIMultiDict

from payload_cache import PayloadCache, RenderRecord

from ..auth.presented import Presented, admit, ambiguity
from ..auth.tokens import Grant, Refusal, TokenAuthenticator
from ..render.spec import UnsatisfiableVersion, negotiate, unsatisfiable_reason
from ..tallies import ServingCounts
from ..workers.render_wait import IDLE_S
from .access_log import AccessLog
from .limits import FailedAuthLimiter
from .ready import (
    DEFAULT_READY_BYTES,
    DEFAULT_SENDING_BYTES,
    HEAD_JOIN,
    WHOLE_WRITES_BYTES,
    WRITE_PIECE,
    PiecewiseBody,
    ReadyBodies,
    ReadyBody,
    Sending,
    piece_for,
)

if TYPE_CHECKING:  # the owner's; a serving worker counts in tallies.ServingTallies and never imports Prometheus
    from ..metrics import ServerMetrics

IGNITION_MEDIA_TYPE = "application/vnd.coreos.ignition+json"
# Payload reads a process has under way or done and not yet taken up by their request: each ends
# as a decrypted body (~416 KB at the seeds' fleet). The reader threads decrypt faster than a
# busy event loop writes responses: unbounded, the requests in flight all had their bodies
# decrypted and waiting on the loop (25 of them in a serving worker during the seeds' warm
# restart, ~10 MiB, issue 33). Twice the reader threads keeps them busy while the loop catches up.
PAYLOAD_READERS = 4
READS_AHEAD = 2 * PAYLOAD_READERS
_REASONS = {511: "Network Authentication Required"}
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+-]{1,64}")


@dataclass
class ServingState:
    """What /readyz reports: ready once the persisted index is loaded (no render needed)."""

    ready: bool = False
    draining: bool = False
    # What is behind while serving goes on from the cache (a Kubernetes watch reconnecting).
    behind: Callable[[], list[str]] = lambda: []
    # A 503's Retry-After while a NodePool's payload (its token Secret's ref) renders: the
    # owner's estimate from its place in the render queue (workers/render_wait.py).
    render_wait: Callable[[str], Awaitable[int]] = lambda _secret: _idle()


async def _idle() -> int:
    return IDLE_S


class IgnitionHandlers:
    def __init__(
        self,
        *,
        cache: PayloadCache,
        authenticator: TokenAuthenticator,
        metrics: ServingCounts,
        state: ServingState,
        on_served: Callable[[str], None] = lambda _secret: None,
        on_missing: Callable[[str], None] = lambda _secret: None,
        max_in_flight: int = 1024,
        limiter: FailedAuthLimiter | None = None,
        second_opinion: Callable[[Presented, str | None], Awaitable[Grant]] | None = None,
        request_id_prefix: str = "",
        access: AccessLog | None = None,
        write_piece: int = WRITE_PIECE,
        ready_bytes: int = DEFAULT_READY_BYTES,
        max_sending_bytes: int = DEFAULT_SENDING_BYTES,
        open_connections: Callable[[], int] | None = None,
        whole_writes_bytes: int = WHOLE_WRITES_BYTES,
    ) -> None:
        self._cache = cache
        self._auth = authenticator
        self._metrics = metrics
        self._state = state
        self._on_served = on_served
        self._on_missing = on_missing
        self._max_in_flight = max_in_flight
        self._limiter = limiter or FailedAuthLimiter()
        self._second_opinion = second_opinion
        self._access = access or AccessLog("auto")
        self._write_piece = write_piece  # below the process's mmap threshold (memory.py)
        # This process's open connections: bodies go out whole while few are open (ready.py's
        # WHOLE_WRITES_BYTES). None: always in pieces (a process whose mmap threshold is below a body).
        self._open_connections = open_connections
        self._whole_writes = whole_writes_bytes
        self._versions: dict[tuple[str | None, str], str] = {}
        self._payload_headers: dict[str, CIMultiDict[str]] = {}
        self._in_flight = 0  # payload requests being answered now (one event loop: no lock)
        self._ids = itertools.count(1)
        self._id_prefix = request_id_prefix  # request ids stay unique across worker processes
        self._sending = Sending()  # payload bytes being written now, bounded by max_sending_bytes
        self._max_sending = max_sending_bytes
        self._ready = ReadyBodies(ready_bytes)  # its share of --cache-memory (config.payload_memory)
        # Payload reads get threads of their own: behind renders, listings and write-backs
        # in the shared default pool, a disk read would wait for background work.
        self._readers = concurrent.futures.ThreadPoolExecutor(max_workers=PAYLOAD_READERS, thread_name_prefix="payload-read")
        self._reads_ahead = asyncio.Semaphore(READS_AHEAD)  # reads not yet taken up (READS_AHEAD)

    def _negotiate(self, accept: str | None, min_version: str) -> str | None:
        """The spec version to answer at, or None when the client accepts none we can serve."""
        # A fleet sends a handful of Accept headers; parsing one costs more than the lookup.
        key = (accept, min_version)
        version = self._versions.get(key)
        if version is None:
            try:
                version = negotiate(accept, min_version)
            except UnsatisfiableVersion:
                return None  # answered with a 406 that says which feature needs the newer spec; not kept
            if len(self._versions) >= 256:
                self._versions.clear()
            self._versions[key] = version
        return version

    def ready_held(self) -> int:
        """Bytes of bodies kept ready now (counted against --cache-memory)."""
        return self._ready.held()

    def close(self) -> None:
        self._access.flush()
        self._readers.shutdown(wait=False, cancel_futures=True)

    # Not coroutines themselves: a request's one coroutine is `_serve`'s (each level of await
    # is a frame made and resumed per request, on the path every kept-alive request takes).
    def hypershift(self, request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        headers = request.headers
        raw_target = request.raw_path
        authorizations = len(headers.getall("Authorization", ()))
        return self._serve(request, Presented(
            authorization=headers.get("Authorization"), nodepool_header=headers.get("NodePool"),
            # Checked only when there is something to check: the common request has neither.
            ambiguity=ambiguity(raw_target, authorizations, url_shape=False)
            if raw_target != "/ignition" or authorizations > 1 else None))

    def mcs(self, request: web.BaseRequest, nodepool: str) -> Awaitable[web.StreamResponse]:
        headers = request.headers
        return self._serve(request, Presented(
            path_pool=nodepool, query_token=request.query.get("token", ""),
            ambiguity=ambiguity(request.raw_path, len(headers.getall("Authorization", ())),
                                url_shape=True)))

    async def _serve(self, request: web.BaseRequest, presented: Presented) -> web.StreamResponse:
        started = time.perf_counter()
        asked, method = request.headers, request.method  # properties: each a call, read once
        supplied = asked.get("X-Request-Id", "")
        # A client's id is kept only in a plain shape: spaces and `=` in it could forge fields.
        request_id = supplied if supplied and _REQUEST_ID.fullmatch(supplied) else f"{self._id_prefix}{next(self._ids):x}"
        nodepool = "-"
        size = -1  # the body's, where known before the response is made
        remote = request.remote
        admitted = False
        try:
            if not self._state.ready:
                raise Refusal(503, "warming up", retry_after=1)
            if self._in_flight >= self._max_in_flight or self._sending.bytes > self._max_sending:
                # Overload is "try again", never 429: the Ignition client gives up on any 4xx.
                raise Refusal(503, "overloaded", retry_after=1)
            self._in_flight += 1
            admitted = True
            try:
                try:
                    grant = admit(presented, self._auth)
                except Refusal:
                    if self._second_opinion is None:
                        raise
                    # A serving worker's view of the tokens trails the owner's by a moment: before
                    # refusing, ask the owner, so no node is turned away for a token it already accepts.
                    grant = await self._second_opinion(presented, remote)
            except Refusal as refusal:
                # Throttled only once it failed: a held address's valid token is still served.
                raise self._limiter.answer_failed(refusal, remote) from None
            nodepool = grant.nodepool
            record = self._cache.get_render(grant.secret)
            if record is None:
                raise Refusal(503, "payload is still rendering", retry_after=await self._state.render_wait(grant.secret))
            accept = asked.get("Accept")
            version = self._negotiate(accept, record.min_version)
            ready = self._ready.get(record.blob_id, version) if version is not None else None
            if ready is not None and version is not None:
                size = len(ready)
                # The headers looked up inline (a call only for a version not seen yet).
                headers = self._payload_headers.get(version) or self._headers(version)
                response = _payload_response(ready, headers, self._piece(size, request), self._sending, size)
            else:
                response = await self._payload(grant, record, accept, version, request)
            self._metrics.get_requests.inc(grant.nodepool)
            if method == "GET":
                # A HEAD carries no payload: no node booted from it, so it is not `ignition-reached`.
                self._on_served(grant.secret)
        except Refusal as refusal:
            response = _refusal_response(refusal)
        finally:
            if admitted:
                self._in_flight -= 1
        response.headers["X-Request-Id"] = request_id
        status = response.status
        self._metrics.responses.inc(status)
        if self._access.enabled:
            # request.path never carries the query string, so `token=` cannot reach the log.
            self._access.record(method, request.path, status, request_id=request_id,
                                nodepool=nodepool, size=size if size >= 0 else _body_size(response),
                                duration_ms=(time.perf_counter() - started) * 1000,
                                client=remote or "-")
        return response

    async def _payload(self, grant: Grant, record: RenderRecord, accept: str | None, version: str | None,
                       request: web.BaseRequest) -> web.Response:
        """A body not kept ready at `version`: from the memory tier or disk, then kept."""
        body = self._cache.get_blob_from_memory(record.blob_id)
        if body is None:
            async with self._reads_ahead:
                body = await asyncio.get_running_loop().run_in_executor(self._readers, self._cache.get_blob, record.blob_id)
        if body is None:
            # Lost or failed its integrity check (quarantined): have the reconciler re-render it.
            self._on_missing(grant.secret)
            raise Refusal(503, "payload is being rebuilt", retry_after=5)
        if version is None:
            # Rare and final for that node: worth saying which feature needs the newer spec.
            raise Refusal(406, await asyncio.to_thread(unsatisfiable_reason, accept, body)) from None
        ready = self._ready.make(record.blob_id, version, body)
        return _payload_response(ready, self._headers(version), self._piece(len(ready), request), self._sending)

    def _headers(self, version: str) -> CIMultiDict[str]:
        """A payload response's headers at `version`, made once per version: each response takes
        a copy (aiohttp's own step for any headers given), not a new dict and media type."""
        headers = self._payload_headers.get(version)
        if headers is None:
            if len(self._payload_headers) >= 64:  # versions come from negotiate: a handful
                self._payload_headers.clear()
            headers = payload_headers(version)
            self._payload_headers[version] = headers
        return headers

    def _piece(self, size: int, request: web.BaseRequest) -> int:
        """How much of a `size`-byte body to write at once (ready.piece_for)."""
        if self._open_connections is None:
            return self._write_piece
        # Requests parsed on this connection so far, this one included (aiohttp's RequestHandler
        # keeps no public count; pyproject pins aiohttp's minor version, as guard.py's privates).
        earlier = getattr(request.protocol, "_request_count", 1) > 1
        return piece_for(size, self._open_connections(), earlier, self._write_piece, self._whole_writes)

    async def healthz(self, _request: web.BaseRequest) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, _request: web.BaseRequest) -> web.Response:
        if self._state.ready and not self._state.draining:
            return web.Response(text="ready\n" + "".join(f"behind: {what}\n" for what in self._state.behind()))
        return web.Response(status=503, text="not ready\n", headers={"Retry-After": "1"})


def payload_headers(version: str) -> CIMultiDict[str]:
    return CIMultiDict({"Content-Type": f"{IGNITION_MEDIA_TYPE};version={version}", "Cache-Control": "no-store"})


def _payload_response(body: ReadyBody, headers: CIMultiDict[str], piece: int,
                      sending: Sending | None = None, size: int = -1) -> web.Response:
    """`headers` (IgnitionHandlers._headers) are copied by aiohttp, never changed; `size` is
    len(body) where the caller has it."""
    size = len(body) if size < 0 else size
    if size <= piece and (not body.head or size <= HEAD_JOIN):
        # One write: aiohttp's own path for a bytes body is the shortest (no copy: no head to
        # splice, or a small body).
        return web.Response(body=body.joined(), headers=headers)
    return web.Response(body=PiecewiseBody(body, piece=piece, sending=sending, content_type=headers["Content-Type"]),
                        headers=headers)


def _refusal_response(refusal: Refusal) -> web.Response:
    headers = {"Cache-Control": "no-store"}
    if refusal.retry_after is not None:
        headers["Retry-After"] = str(refusal.retry_after)
    return web.Response(
        status=refusal.status, reason=_REASONS.get(refusal.status), text=refusal.reason + "\n", headers=headers
    )


def _body_size(response: web.Response) -> int:
    # A payload body (PiecewiseBody) is only measured by aiohttp as it is sent, after this log line.
    body = response.body
    return (body.size or 0) if isinstance(body, Payload) else len(body or b"")


MCS_PREFIX = "/config/"


Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def build_dispatch(handlers: IgnitionHandlers) -> Handler:
    """The serving port: four GET routes, dispatched on the path alone.

    aiohttp's Application matched every request against each route's pattern and wrapped it
    for middlewares: with the router, ~6% of a kept-alive request's CPU went to finding one of
    four fixed paths (py-spy, one worker under keep-alive load). 404 and 405 answer as aiohttp's router did.
    """
    exact: dict[str, Handler] = {
        "/ignition": handlers.hypershift, "/healthz": handlers.healthz, "/readyz": handlers.readyz}

    async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        handler = exact.get(path)
        nodepool = ""
        if handler is None:
            nodepool = path[len(MCS_PREFIX):] if path.startswith(MCS_PREFIX) else ""
            if not nodepool or "/" in nodepool:
                raise web.HTTPNotFound()
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ("GET", "HEAD"))
        return await (handler(request) if handler is not None else handlers.mcs(request, nodepool))

    return dispatch


def build_metrics_app(metrics: ServerMetrics,
                      before_scrape: Callable[[], Awaitable[None]] | None = None) -> web.Application:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def serve_metrics(_request: web.BaseRequest) -> web.Response:
        if before_scrape is not None:
            await before_scrape()
        body = await asyncio.to_thread(generate_latest, metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", serve_metrics)
    return app
