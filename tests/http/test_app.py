"""The HTTP app in-process (aiohttp's test client), with a real encrypted cache behind it."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from pathlib import Path

from ignition_server.auth.tokens import TokenAuthenticator
from ignition_server.http.app import READS_AHEAD, IgnitionHandlers, ServingState
from ignition_server.metrics import ServerMetrics
from ignition_server.render.spec import encode
from payload_cache import CacheConfig, PayloadCache, RenderRecord, TokenRecord, TokenState


def served_cache(tmp_path: Path) -> PayloadCache:
    # No memory tier: every payload is read (and decrypted) from disk in a thread, so
    # requests really overlap.
    cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache", memory_bytes=0))
    config = {"ignition": {"version": "3.2.0"}, "storage": {"files": [
        {"path": f"/etc/f{i}", "contents": {"source": "data:," + "x" * 2000}} for i in range(200)]}}
    blob = cache.put_blob(encode(config, "3.2.0"))
    cache.put_render(RenderRecord("ns/token-p", "clusters/p", "digest", blob, "3.2.0", 0.0))
    cache.put_token("tok", TokenRecord("clusters/p", "ns/token-p", TokenState.CURRENT, None))
    return cache


async def test_overload_answers_503_with_retry_after_never_4xx(tmp_path: Path, serving_client) -> None:
    cache = served_cache(tmp_path)
    handlers = IgnitionHandlers(cache=cache, authenticator=TokenAuthenticator(cache), metrics=ServerMetrics(),
                                state=ServingState(ready=True), max_in_flight=1)
    client = await serving_client(handlers)
    headers = {"Authorization": "Bearer " + base64.b64encode(b"tok").decode()}
    responses = await asyncio.gather(*(client.get("/ignition", headers=headers) for _ in range(40)))
    statuses = [r.status for r in responses]
    assert set(statuses) <= {200, 503}
    assert statuses.count(503) >= 1 and statuses.count(200) >= 1
    for response in responses:
        if response.status == 503:
            assert response.headers["Retry-After"] == "1"
        else:
            assert len(json.loads(await response.read())["storage"]["files"]) == 200
    # Once the storm has passed, every request is served again.
    assert (await client.get("/ignition", headers=headers)).status == 200
    handlers.close()


async def test_not_ready_is_503_and_head_is_allowed(tmp_path: Path, serving_client) -> None:
    cache = served_cache(tmp_path)
    state = ServingState(ready=False)
    handlers = IgnitionHandlers(cache=cache, authenticator=TokenAuthenticator(cache), metrics=ServerMetrics(), state=state)
    client = await serving_client(handlers)
    headers = {"Authorization": "Bearer " + base64.b64encode(b"tok").decode()}
    assert (await client.get("/ignition", headers=headers)).status == 503
    assert (await client.get("/readyz")).status == 503
    state.ready = True
    assert (await client.get("/readyz")).status == 200
    assert (await client.head("/ignition", headers=headers)).status == 200
    assert (await client.put("/ignition", headers=headers)).status == 405
    handlers.close()


async def test_routes_answer_404_and_405_as_a_router_would(tmp_path: Path, serving_client) -> None:
    cache = served_cache(tmp_path)
    handlers = IgnitionHandlers(cache=cache, authenticator=TokenAuthenticator(cache), metrics=ServerMetrics(),
                                state=ServingState(ready=True))
    client = await serving_client(handlers)
    for path in ("/", "/ignition/", "/config/", "/config/p/extra", "/configs/p", "/metrics"):
        response = await client.get(path)
        assert response.status == 404, path
    refused = await client.post("/config/p?token=tok")
    assert refused.status == 405 and refused.headers["Allow"] == "GET,HEAD"
    # The MCS shape reaches its handler with the NodePool from the path.
    assert (await client.get("/config/p?token=tok")).status == 200
    assert (await client.get("/healthz")).status == 200
    handlers.close()


async def test_a_payload_is_kept_ready_per_version_and_a_new_render_replaces_it(tmp_path: Path, serving_client) -> None:
    cache = served_cache(tmp_path)  # no memory tier: a body not kept ready costs a disk read
    handlers = IgnitionHandlers(cache=cache, authenticator=TokenAuthenticator(cache), metrics=ServerMetrics(),
                                state=ServingState(ready=True))
    client = await serving_client(handlers)
    bearer = {"Authorization": "Bearer " + base64.b64encode(b"tok").decode()}

    async def fetch(version: str) -> dict:
        accept = f"application/vnd.coreos.ignition+json;version={version}"
        response = await client.get("/ignition", headers={**bearer, "Accept": accept})
        assert response.status == 200
        assert response.headers["Content-Type"].endswith(f"version={version}")
        body = await response.read()  # written in pieces: one Content-Length, the whole body
        assert int(response.headers["Content-Length"]) == len(body)
        return json.loads(body)

    for version in ("3.4.0", "3.3.0") * 4:
        assert (await fetch(version))["ignition"]["version"] == version
    # Two reads per version (kept from its second ask, http/ready.py); the repeats were sent as kept.
    assert cache.stats().disk_hits == 4
    # A re-render is a new blob: served at once, never the body kept for the old one.
    config = {"ignition": {"version": "3.2.0"}, "storage": {"files": [{"path": "/etc/new", "contents": {"source": "data:,"}}]}}
    cache.put_render(RenderRecord("ns/token-p", "clusters/p", "digest2", cache.put_blob(encode(config, "3.2.0")), "3.2.0", 0.0))
    assert [f["path"] for f in (await fetch("3.4.0"))["storage"]["files"]] == ["/etc/new"]
    handlers.close()


async def test_payload_headers_made_once_per_version_are_never_changed_by_a_response(tmp_path: Path,
                                                                                   serving_client) -> None:
    cache = served_cache(tmp_path)
    handlers = IgnitionHandlers(cache=cache, authenticator=TokenAuthenticator(cache), metrics=ServerMetrics(),
                                state=ServingState(ready=True))
    client = await serving_client(handlers)
    bearer = {"Authorization": "Bearer " + base64.b64encode(b"tok").decode()}
    seen = []
    for version in ("3.4.0", "3.4.0", "3.3.0", "3.4.0"):
        response = await client.get("/ignition", headers={
            **bearer, "Accept": f"application/vnd.coreos.ignition+json;version={version}",
            **({"X-Request-Id": "mine-1"} if len(seen) == 1 else {})})
        assert response.status == 200
        await response.read()
        seen.append(response.headers["X-Request-Id"])
        assert response.headers["Content-Type"] == f"application/vnd.coreos.ignition+json;version={version}"
        assert response.headers.getall("Cache-Control") == ["no-store"]
        assert len(response.headers.getall("X-Request-Id")) == 1
    assert seen[1] == "mine-1" and len(set(seen)) == 4
    kept = handlers._headers("3.4.0")
    assert handlers._headers("3.4.0") is kept  # made once
    assert dict(kept) == {"Content-Type": "application/vnd.coreos.ignition+json;version=3.4.0",
                          "Cache-Control": "no-store"}  # no response's own headers added to it
    handlers.close()


async def test_bodies_still_being_written_bound_new_payload_requests(tmp_path: Path, serving_client) -> None:
    # --max-in-flight counts a request until its handler returns; its body is written after. A
    # client that does not read holds its body in the server: past the bytes bound, 503 + Retry-After.
    cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache", memory_bytes=0))
    config = {"ignition": {"version": "3.2.0"}, "storage": {"files": [
        {"path": f"/etc/f{i}", "contents": {"source": "data:," + "x" * 1_000_000}} for i in range(24)]}}
    body = encode(config, "3.2.0")  # 24 MB: more than both ends' loopback socket buffers
    cache.put_render(RenderRecord("ns/token-p", "clusters/p", "digest", cache.put_blob(body), "3.2.0", 0.0))
    cache.put_token("tok", TokenRecord("clusters/p", "ns/token-p", TokenState.CURRENT, None))
    handlers = IgnitionHandlers(cache=cache, authenticator=TokenAuthenticator(cache), metrics=ServerMetrics(),
                                state=ServingState(ready=True), max_sending_bytes=len(body) // 2)
    client = await serving_client(handlers)
    bearer = "Bearer " + base64.b64encode(b"tok").decode()
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(f"GET /ignition HTTP/1.1\r\nHost: x\r\nAuthorization: {bearer}\r\n\r\n".encode())
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")  # then not read: the write stalls
    headers = {"Authorization": bearer}
    for _ in range(100):  # until the stalled write is under way
        refused = await client.get("/ignition", headers=headers)
        if refused.status == 503:
            break
        await refused.read()
        await asyncio.sleep(0.05)
    assert refused.status == 503 and refused.headers["Retry-After"] == "1"
    read = 0
    while chunk := await reader.read(1 << 20):  # the slow client reads its body after all
        read += len(chunk)
        if read >= len(body):
            break
    writer.close()
    response = await client.get("/ignition", headers=headers)
    assert response.status == 200 and len(await response.read()) == len(body)
    handlers.close()


async def test_aiohttp_counts_a_connections_requests_where_the_write_size_reads_it(aiohttp_raw_server, aiohttp_client) -> None:
    # IgnitionHandlers._piece writes a connection's first response in pieces and later ones whole
    # (http/ready.piece_for) by reading aiohttp's private per-connection request count: were it
    # renamed, every response would silently go in pieces (six socket writes where one does).
    from aiohttp import web

    seen: list[object] = []

    async def record(request: web.BaseRequest) -> web.Response:
        seen.append(getattr(request.protocol, "_request_count", None))
        return web.Response(text="ok")

    client = await aiohttp_client(await aiohttp_raw_server(record))
    for _ in range(3):  # one kept-alive connection (the test client's pool)
        assert (await client.get("/")).status == 200
    assert seen == [1, 2, 3]


async def test_payload_reads_stay_a_few_ahead_of_a_busy_event_loop(tmp_path: Path, serving_client) -> None:
    # Reader threads decrypt faster than a busy loop writes responses: every request in flight
    # had its body decrypted and waiting (issue 33). With all 40 requests waiting on their reads,
    # a loop then held up finds at most READS_AHEAD bodies read for it (40 before).
    cache = served_cache(tmp_path)
    reads = 0
    lock = threading.Lock()
    go = threading.Event()  # reads wait for it: none is taken up before the loop is held
    get_blob = cache.get_blob

    def counted(blob_id: str) -> bytes | None:
        nonlocal reads
        with lock:
            reads += 1
        go.wait(10)
        return get_blob(blob_id)

    cache.get_blob = counted  # type: ignore[method-assign]
    # No ready bodies: a body read twice would be kept, and a later request would not read.
    handlers = IgnitionHandlers(cache=cache, authenticator=TokenAuthenticator(cache), metrics=ServerMetrics(),
                                state=ServingState(ready=True), ready_bytes=0)
    client = await serving_client(handlers)
    headers = {"Authorization": "Bearer " + base64.b64encode(b"tok").decode()}
    fetches = [asyncio.ensure_future(client.get("/ignition", headers=headers)) for _ in range(40)]
    for _ in range(1000):  # until every request is in the handler, waiting on its read
        await asyncio.sleep(0.005)
        if handlers._in_flight == 40 and reads:
            break
    assert handlers._in_flight == 40
    go.set()
    time.sleep(0.5)  # the loop is busy elsewhere: the readers run on
    with lock:
        read_meanwhile = reads
    responses = await asyncio.gather(*fetches)
    assert [r.status for r in responses] == [200] * 40
    for response in responses:
        assert len(json.loads(await response.read())["storage"]["files"]) == 200
    assert reads == 40
    assert read_meanwhile <= READS_AHEAD, read_meanwhile
    handlers.close()
