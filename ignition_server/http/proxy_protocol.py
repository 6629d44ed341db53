"""PROXY protocol (v1 and v2) on the serving port, for trusted peers only.

A front proxy (HAProxy with `send-proxy-v2`) opens the connection, so without this the server
would count every node behind it under the proxy's address: one client holding connections
there (handshakes left stalled after the ClientHello) filled that one address's quota for all of
them. With `--proxy-protocol-from CIDR,...` a connection from one of those addresses may start
with a PROXY header (before TLS); the address in it becomes the connection's peer for
everything above (the connection guard's per-source limits, the access log, auth-failure
limits). A connection from a trusted address without a header (a kubelet probe from inside the
pod network, the proxy's own address) is served as that address, which is all it could have
claimed anyway; whether a header follows is decided by peeking at the first bytes, which a
TLS record (0x16) never shares with a header. A connection from any other address is served as
it is, its bytes never read as a header: an untrusted client cannot claim an address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import struct
from collections.abc import Sequence
from typing import Any, Callable

log = logging.getLogger("ignition_server.http")

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
V1_MAX = 107
Peer = tuple[str, int]


class ProxyHeaderError(ValueError):
    """Not a PROXY header (the connection is closed)."""


# The send buffer of a connection from the pod's TLS edge. At the default (212,992 bytes,
# overhead included) a ~300 KiB payload took several writes, each waiting for HAProxy to read
# 16 KiB more: a serving process's CPU per kept-alive request through the edge went from
# ~0.17 to ~0.10 ms, a storm's per connection from ~0.36 to ~0.31 ms, once the whole body fit
# (HAProxy's too fell, with fewer wake-ups). A limit, not an allocation: what waits in it is the
# body the edge has not read yet. The kernel caps it at net.core.wmem_max.
EDGE_SNDBUF = 1 << 20

_V4_MAPPED = bytes(10) + b"\xff\xff"  # ::ffff:a.b.c.d


def parse_v2(header: bytes, body: bytes) -> Peer | None:
    """The source address of a v2 header (`header`: its 16 fixed bytes). None for LOCAL
    (the proxy's own health check) or a family without addresses. Pure."""
    if header[:12] != V2_SIGNATURE:
        raise ProxyHeaderError("bad v2 signature")
    version, command = header[12] >> 4, header[12] & 0x0F
    if version != 2 or command not in (0, 1):
        raise ProxyHeaderError("unsupported v2 version or command")
    if command == 0:
        return None
    family = header[13] >> 4
    if family == 1 and len(body) >= 12:
        return socket.inet_ntop(socket.AF_INET, body[0:4]), struct.unpack("!H", body[8:10])[0]
    if family == 2 and len(body) >= 36:
        if body[0:12] == _V4_MAPPED:  # an IPv4 node behind a dual-stack (v4v6) proxy: no parse later
            return socket.inet_ntop(socket.AF_INET, body[12:16]), struct.unpack("!H", body[32:34])[0]
        return socket.inet_ntop(socket.AF_INET6, body[0:16]), struct.unpack("!H", body[32:34])[0]
    return None


def parse_v1(line: bytes) -> Peer | None:
    """`PROXY TCP4 src dst sport dport\\r\\n` (or `PROXY UNKNOWN ...`). Pure."""
    parts = line.rstrip(b"\r\n").decode("ascii", "replace").split(" ")
    if parts[0] != "PROXY" or len(parts) < 2:
        raise ProxyHeaderError("bad v1 header")
    if parts[1] == "UNKNOWN":
        return None
    if parts[1] not in ("TCP4", "TCP6") or len(parts) != 6:
        raise ProxyHeaderError("bad v1 header")
    try:
        return str(ipaddress.ip_address(parts[2])), int(parts[4])
    except ValueError:
        raise ProxyHeaderError("bad v1 address") from None


async def _read_exactly(loop: asyncio.AbstractEventLoop, conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = await loop.sock_recv(conn, size - len(data))
        if not chunk:
            raise ProxyHeaderError("closed inside the header")
        data += chunk
    return data


_MAGICS = (V1_PREFIX, V2_SIGNATURE)


async def _readable(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(conn.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(conn.fileno())


async def header_follows(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bool:
    """Whether the connection's first bytes are a PROXY header's (peeked: nothing is read)."""
    while True:
        await _readable(loop, conn)
        first = conn.recv(len(V2_SIGNATURE), socket.MSG_PEEK)
        if not first:
            raise ProxyHeaderError("closed before its first byte")
        if any(first.startswith(magic) for magic in _MAGICS):
            return True
        if not any(magic.startswith(first) for magic in _MAGICS):
            return False
        await asyncio.sleep(0.01)  # a header's first bytes only (split): the rest is on its way


NOT_YET = ("", -1)  # header_now: cannot be told without waiting for more bytes


def header_now(conn: socket.socket) -> Peer | None:
    """A v2 or v1 header that has arrived whole (as a proxy sends it, in the connection's first
    segment), read off the socket exactly: its peer, or None (LOCAL or UNKNOWN, no address).
    `NOT_YET` when that cannot be told from what is there (nothing yet, a split header, no
    header at all): the caller takes the careful path (`header_follows`, `read_header`)."""
    try:
        first = conn.recv(512, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return NOT_YET
    if first.startswith(V1_PREFIX):  # nginx's `proxy_protocol on` sends v1 only
        end = first.find(b"\r\n", 0, V1_MAX)
        if end < 0:
            return NOT_YET
        line = conn.recv(end + 2)  # exactly the line, which has arrived: this does not block
        return parse_v1(line)
    if len(first) < 16 or not first.startswith(V2_SIGNATURE):
        return NOT_YET
    (length,) = struct.unpack("!H", first[14:16])
    if len(first) < 16 + length:
        return NOT_YET
    peer = parse_v2(first[:16], first[16:16 + length])
    conn.recv(16 + length)  # exactly the header, which has arrived: this does not block
    return peer


async def read_header(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> Peer | None:
    """Read exactly the header off the socket (nothing after it: TLS starts there)."""
    first = await _read_exactly(loop, conn, 6)
    if first == V1_PREFIX:
        line = first
        while not line.endswith(b"\r\n"):  # byte by byte: the ClientHello follows the line
            if len(line) >= V1_MAX:
                raise ProxyHeaderError("v1 header too long")
            line += await _read_exactly(loop, conn, 1)
        return parse_v1(line)
    header = first + await _read_exactly(loop, conn, 10)
    (length,) = struct.unpack("!H", header[14:16])
    return parse_v2(header, await _read_exactly(loop, conn, length))


class _PeerView:
    """The transport as seen from above, with the address from the PROXY header."""

    def __init__(self, transport: asyncio.BaseTransport, peer: Peer) -> None:
        self._transport, self._peer = transport, peer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self._peer
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _PeerProtocol:
    def __init__(self, inner: asyncio.Protocol, peer: Peer) -> None:
        self.inner, self.peer = inner, peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(_PeerView(transport, self.peer))  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def plain_address(host: str) -> str:
    """An IPv4 client on a dual-stack socket (or in a v4v6 proxy's header) as plain IPv4."""
    if ":" not in host:
        return host  # IPv4 already (the usual case: no parse per connection)
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped) if mapped is not None else host


def trusted(peer: Any, networks: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    if not networks:
        return False
    try:
        address = ipaddress.ip_address(str(peer[0]).split("%")[0])
    except (ValueError, TypeError, IndexError):
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)


# A unix socket's peer has no address: one that sends no PROXY header is the pod itself.
LOCAL_PEER: Peer = ("127.0.0.1", 0)
# Connections taken off the listener per wake-up, at most (asyncio's own servers take `backlog`).
ACCEPT_BATCH = 128
# After accept fails for want of file descriptors (EMFILE): how long to leave the listener be.
ACCEPT_PAUSE = 1.0


async def serve_connections(
    listener: socket.socket,
    factory: Callable[[int], asyncio.Protocol],
    *,
    networks: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network],
    ssl_context: ssl.SSLContext | None,
    handshake_timeout: float,
    admit: Callable[[str], int],
    release: Callable[[int], None],
    trust_all: bool = False,
    batch: int = ACCEPT_BATCH,
) -> None:
    """Accept on `listener` until cancelled; trusted peers' connections start with a header.

    Each connection is counted (`admit`: its bucket, or -1 to refuse it) as it is accepted, or
    for a trusted proxy's connection once its header names the client; `factory(bucket)` makes
    its protocol, which releases the count when it closes. One that never gets that far (a
    handshake that fails, or is not done `handshake_timeout` after the accept: the header and
    the TLS handshake share that deadline) is released here.

    In a boot storm every request is a new connection, so the accept path is kept short: the
    listener is read whenever it is readable, as many connections at a time as are waiting
    (not one future and one reader registration per connection, as `loop.sock_accept` does),
    and an untrusted peer's connection goes straight to the event loop's TLS handshake with
    no coroutine of its own around it.

    `trust_all`: every peer may send a header (the in-pod edge's unix socket, which only the
    pod reaches); one that sends none is the pod itself (`LOCAL_PEER`). `batch`: connections
    taken per wake-up; several processes accepting on one socket take one each, so that none
    takes every waiting connection while the others idle."""
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[Any]] = set()

    def closed_early(peer: Any, error: BaseException) -> None:
        log.debug("connection from %s closed: %s %s", peer[0] if peer else "?", type(error).__name__, error)

    def start(conn: socket.socket, real: Any, bucket: int, timeout: float | None, translate: bool) -> None:
        """The TLS handshake (or none), then the protocol: the count is released here if it fails.
        `translate`: the client is not the socket's IPv4 peer as is (a PROXY header's address,
        an IPv6 or IPv4-mapped one), so the protocol is shown `(plain address, port)` instead."""
        made_protocol: list[asyncio.Protocol] = []

        def made() -> asyncio.Protocol:
            protocol = factory(bucket)
            made_protocol.append(protocol)
            if translate:
                return _PeerProtocol(protocol, (plain_address(str(real[0])), int(real[1])))  # type: ignore[return-value]
            return protocol

        def done(task: asyncio.Task[Any]) -> None:
            pending.discard(task)
            error = None if task.cancelled() else task.exception()
            if task.cancelled() or error is not None:
                if error is not None:
                    closed_early(real, error)
                conn.close()
                if not getattr(made_protocol[0] if made_protocol else None, "made", False):
                    release(bucket)

        task = loop.create_task(loop.connect_accepted_socket(
            made, conn, ssl=ssl_context, ssl_handshake_timeout=timeout if ssl_context else None))
        pending.add(task)
        task.add_done_callback(done)

    async def announced(conn: socket.socket, peer: Any) -> None:
        """A trusted proxy's connection: its PROXY header (if any) names the client it counts under."""
        try:
            deadline = loop.time() + handshake_timeout

            async def header() -> Peer | None:
                return await read_header(loop, conn) if await header_follows(loop, conn) else None
            real = await asyncio.wait_for(header(), handshake_timeout) or (
                peer[:2] if isinstance(peer, tuple) else LOCAL_PEER)
        except (ProxyHeaderError, asyncio.TimeoutError, OSError) as error:
            closed_early(peer, error)
            conn.close()
            return
        except BaseException:
            conn.close()
            raise
        bucket = admit(plain_address(str(real[0])))
        if bucket < 0:
            conn.close()
            return
        start(conn, real, bucket, max(0.001, deadline - loop.time()), translate=True)

    def accept_waiting() -> None:
        for _ in range(batch):
            try:
                conn, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # EMFILE and the like: let connections wait in the backlog a while
                log.warning("accepting a connection failed (%s): pausing accept %.0f s", error, ACCEPT_PAUSE)
                loop.remove_reader(listener.fileno())
                loop.call_later(ACCEPT_PAUSE, resume)
                return
            conn.setblocking(False)
            if conn.family == socket.AF_UNIX:  # the pod's TLS edge (--edge-socket)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, EDGE_SNDBUF)
            if trust_all or trusted(peer, networks):
                try:
                    real = header_now(conn)
                except (ProxyHeaderError, OSError) as error:
                    closed_early(peer, error)
                    conn.close()
                    continue
                if real is not NOT_YET:  # the usual case: read with the accept, no coroutine
                    real = real or (peer[:2] if isinstance(peer, tuple) else LOCAL_PEER)
                    bucket = admit(plain_address(str(real[0])))
                    if bucket < 0:
                        conn.close()
                        continue
                    start(conn, real, bucket, handshake_timeout, translate=True)
                    continue
                task = loop.create_task(announced(conn, peer))
                pending.add(task)
                task.add_done_callback(pending.discard)
                continue
            bucket = admit(str(peer[0]))
            if bucket < 0:
                conn.close()  # refused before any work: no handshake, no task
                continue
            start(conn, peer, bucket, handshake_timeout, translate=conn.family != socket.AF_INET)

    def resume() -> None:
        if listener.fileno() != -1:  # not closed meanwhile (the server stopped)
            loop.add_reader(listener.fileno(), accept_waiting)

    listener.setblocking(False)
    loop.add_reader(listener.fileno(), accept_waiting)
    try:
        await loop.create_future()  # until cancelled (the server stops)
    finally:
        loop.remove_reader(listener.fileno())
        for task in list(pending):
            task.cancel()
        listener.close()
