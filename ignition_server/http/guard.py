"""Connections cost bounded resources: a slow client cannot hold one, one address cannot hold many.

aiohttp bounds a request's size but not how long its headers may take: a client sending one
byte a second ("slowloris") holds a connection, and a file descriptor, for as long as it likes.
The guard sits between the TLS layer and aiohttp's protocol: a connection whose first request's
headers are not complete within `header_timeout` is closed, and connections beyond
`per_source` from one address, or `total` in all, are closed as they arrive. A node that is
refused that way retries (the Ignition client treats a failed connection like a 5xx).
The limits are the whole server's: every serving process counts in its row of one shared
connection table (`connection_table`).

A connection counts from accept to close. asyncio hands a TLS connection to its protocol only
once the handshake is done, so a client that opens connections and never finishes a
handshake held 300 from one address with a limit of 20: with TLS, connections are accepted
here (`serve_connections`) and counted before the handshake starts. The handshake (and a
trusted proxy's PROXY header) has `handshake_timeout` (2 s), not the header timeout: a
ClientHello followed by nothing held its place in the count 10 s, so one client opening 30 such
connections a second kept an address at its quota of 256 (behind a proxy that sends no
header, every node's address). And a connection's first
request may send at most `header_bytes` before its headers end (incomplete headers cost
~1.8 MB each in aiohttp's parser: 128 fields of 8 KiB); later requests on a kept-alive
connection are bounded by aiohttp's own field limits and the short keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, cast

from aiohttp import web

from ..sockets import listening_socket
from .connection_table import ConnectionRow, ConnectionTable
from .deadlines import Deadlines
from .proxy_protocol import serve_connections

log = logging.getLogger("ignition_server.http")

_HEADERS_END = b"\r\n\r\n"
HEADER_BYTES = 32 * 1024  # a node's request is well under 1 KiB
LINGER_SECONDS = 1.0  # after the server's TLS close, for the socket to pass on what it still queues


@dataclass
class ConnectionGuard:
    """The limits, and where this process counts its connections: its row of the server's
    connection table (one row of a table of its own when it serves alone)."""

    header_timeout: float = 10.0
    per_source: int = 256
    total: int = 10_000
    row: ConnectionRow = field(default_factory=lambda: ConnectionTable.create(1, shared=False).row(0))
    header_bytes: int = HEADER_BYTES
    # The PROXY header and TLS handshake, before `header_timeout` starts: a stalled handshake
    # (a ClientHello, then nothing) holds its place in the per-source count until then.
    handshake_timeout: float = 2.0
    _all_closed: asyncio.Event | None = field(default=None, init=False, repr=False)
    # One timer each for every connection's header deadline and TLS-close cut (deadlines.py).
    headers_due: Deadlines[_Guarded] = field(init=False, repr=False)
    cuts_due: Deadlines[_NoLingerClose] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.headers_due = Deadlines(self.header_timeout, _Guarded.too_slow)
        self.cuts_due = Deadlines(LINGER_SECONDS, _NoLingerClose.cut)

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Guarded(self, factory())

    def admit(self, source: str) -> int:
        """Count a connection from `source` as it is accepted: its bucket, or -1 (refused)."""
        return self.row.admit(source, self.per_source, self.total)

    def admitted(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[int], asyncio.Protocol]:
        """A protocol for a connection already counted in `bucket` (admitted at accept)."""
        return lambda bucket: _Guarded(self, factory(), bucket)

    async def wait_closed(self, timeout: float) -> bool:
        """Once the site has stopped and aiohttp has closed its connections: wait until each
        is really gone, up to `timeout`. A transport closes only after its last buffered bytes
        are written, and a process that exits before that cuts the end off a response (aiohttp
        is done with a response once it is in the transport's buffer)."""
        if self.row.open_here() <= 0:
            return True
        self._all_closed = asyncio.Event()
        try:
            await asyncio.wait_for(self._all_closed.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def connection_closed(self) -> None:
        if self._all_closed is not None and self.row.open_here() <= 0:
            self._all_closed.set()


class _Guarded(asyncio.Protocol):
    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol, bucket: int = -1) -> None:
        self.guard, self.inner = guard, inner
        self.bucket = bucket  # the source's bucket in the connection table once counted
        self.made = False
        self.transport: asyncio.Transport | None = None
        self.waiting = False  # for the first request's headers (its deadline in guard.headers_due)
        self.tail = b""
        self.header_bytes = 0
        self.closing: _NoLingerClose | None = None  # the TLS transport as aiohttp sees it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's protocol is given a (read-write) Transport, whose abort() the guard uses.
        stream = cast(asyncio.Transport, transport)
        guard = self.guard
        bucket = self.bucket
        if bucket < 0:  # not counted at accept (plain HTTP): counted now
            peer = stream.get_extra_info("peername")
            bucket = guard.admit(str(peer[0]) if peer else "")
            if bucket < 0:
                stream.abort()  # before aiohttp sees it: nothing else to clean up
                return
        self.made = True
        self.bucket, self.transport = bucket, stream
        self.waiting = True
        guard.headers_due.set(self)
        if transport.get_extra_info("ssl_object") is not None:
            self.closing = _NoLingerClose(transport, guard.cuts_due)
            transport = self.closing  # type: ignore[assignment]
        self.inner.connection_made(transport)

    def too_slow(self) -> None:
        """Its first request's headers are not in after `header_timeout` (guard.headers_due)."""
        self.waiting = False
        self.guard.row.timed_out()
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.waiting:
            self.header_bytes += len(data)
            if self.header_bytes > self.guard.header_bytes and _HEADERS_END not in self.tail + data:
                self.guard.row.timed_out()
                self.waiting = False
                self.guard.headers_due.drop(self)
                if self.transport is not None:
                    self.transport.abort()
                return
            self.tail = (self.tail + data)[-4096:]
            if _HEADERS_END in self.tail:  # the first request's headers are in: aiohttp's timeouts from here
                self.waiting = False
                self.guard.headers_due.drop(self)
                self.tail = b""
                # From here the TLS layer hands data straight to aiohttp: the instance attribute
                # wins over this method, so a kept-alive request costs no call through the guard.
                self.data_received = self.inner.data_received  # type: ignore[method-assign]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.made:
            return  # refused, or never past its handshake: aiohttp never saw it (the accept loop releases it)
        if self.waiting:
            self.waiting = False
            self.guard.headers_due.drop(self)
        if self.closing is not None:
            self.closing.closed()
        self.guard.row.release(self.bucket)
        self.bucket = -1
        self.inner.connection_lost(exc)
        self.guard.connection_closed()

    def __getattr__(self, name: str) -> Any:  # anything else aiohttp asks of its protocol
        return getattr(self.inner, name)


class _NoLingerClose:
    """A TLS transport whose close waits for the client's close_notify only briefly once the
    response is handed over.

    A TLS close sends close_notify, then waits for the client's for up to 30 s (the event
    loop's ssl_shutdown_timeout): a client that never reads (one dribbling a second request on
    a kept-alive connection, or just idle) kept its connection, and its place in the
    per-source count, 35 s in all where aiohttp's keep-alive close came at 5 s. The closer
    need not wait (RFC 8446 §6.1). So when the TLS layer has nothing left to send at the close
    (close_notify and all before it are with the TCP socket), the connection is cut
    `LINGER_SECONDS` later: time for the socket to pass on what it still queues (under its
    high-water mark: 64 KiB) to a client that reads. With response bytes still queued in the TLS
    layer (a reader slower than that), the close stays the loop's own."""

    def __init__(self, transport: asyncio.BaseTransport, cuts: Deadlines[_NoLingerClose]) -> None:
        self._transport = transport
        self._cuts = cuts  # the guard's: one timer for every connection's cut
        self._gone = False
        # aiohttp writes through these on every response: looked up once, not through __getattr__.
        self.write = transport.write  # type: ignore[attr-defined]
        self.writelines = transport.writelines  # type: ignore[attr-defined]
        self.is_closing = transport.is_closing

    def close(self) -> None:
        transport = self._transport
        transport.close()
        # aiohttp closes its transport once more after the connection is lost: nothing to cut
        # then (a cut armed there outlived every connection of a boot storm by LINGER_SECONDS).
        if not self._gone and self not in self._cuts and transport.get_write_buffer_size() == 0:  # type: ignore[attr-defined]
            self._cuts.set(self)

    def cut(self) -> None:
        self._transport.abort()  # type: ignore[attr-defined]

    def closed(self) -> None:
        """The connection is gone: nothing left to cut."""
        self._gone = True
        self._cuts.drop(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class _AcceptServer:
    """What aiohttp's site keeps of a server (`sockets`, `close`) for the PROXY-header accept loop."""

    def __init__(self, task: asyncio.Task[None], sock: socket.socket) -> None:
        self.task, self.sockets = task, [sock]

    def close(self) -> None:
        self.task.cancel()

    async def wait_closed(self) -> None:
        await asyncio.gather(self.task, return_exceptions=True)


class GuardedSite(web.TCPSite):
    """aiohttp's TCPSite with the guard between the listener and aiohttp's protocol, and with
    PROXY headers read first on connections from `proxy_from`.

    aiohttp has no public way to wrap a site's protocol factory or to accept connections itself,
    so this reads TCPSite's private `_runner`, `_host`, `_port`, `_backlog`, `_reuse_port` and
    `_ssl_context`, and sets `_server` (what BaseSite.stop closes and BaseRunner.addresses lists)
    and `_bound_port` (behind TCPSite.port). That is why pyproject.toml allows one minor version
    of aiohttp, the one this was built against."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, guard: ConnectionGuard,
                 proxy_from: Sequence[IPNetwork] = (), **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._guard = guard
        self._proxy_from = tuple(proxy_from)

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        sock = listening_socket(self._host or "::", self._port, self._backlog, reuse_port=bool(self._reuse_port))
        if self._proxy_from or self._ssl_context is not None:
            # Accepted here, not by asyncio's server: counted before a TLS handshake (module doc).
            guard = self._guard
            task = asyncio.create_task(serve_connections(
                sock, guard.admitted(server), networks=self._proxy_from, ssl_context=self._ssl_context,
                handshake_timeout=guard.handshake_timeout, admit=guard.admit, release=guard.row.release), name="accept")
            self._server = _AcceptServer(task, sock)  # type: ignore[assignment]
        else:
            self._server = await asyncio.get_running_loop().create_server(
                self._guard.wrap(server), sock=sock, ssl=self._ssl_context, backlog=self._backlog,
                # Unused: with TLS, connections are accepted by serve_connections (above).
                ssl_handshake_timeout=self._guard.handshake_timeout if self._ssl_context is not None else None,
            )
        self._bound_port = sock.getsockname()[1]


class GuardedUnixSite(web.BaseSite):
    """Plain HTTP on a listening unix socket (made by the owner, shared by every serving
    process) for the pod's own TLS edge: each connection starts with the edge's PROXY v2
    header naming the node, which the guard counts and everything above sees as the client.
    TLS has ended at the edge, in the same pod; the socket never leaves it."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, *, guard: ConnectionGuard, shared: bool,
                 **kwargs: Any) -> None:
        super().__init__(runner, **kwargs)
        self._sock, self._guard, self._shared = sock, guard, shared

    @property
    def name(self) -> str:
        return f"http://unix:{self._sock.getsockname()}:"

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        guard = self._guard
        task = asyncio.create_task(serve_connections(
            self._sock, guard.admitted(server), networks=(), ssl_context=None, handshake_timeout=guard.handshake_timeout,
            admit=guard.admit, release=guard.row.release, trust_all=True, batch=1 if self._shared else 128),
            name="accept-edge")
        self._server = _AcceptServer(task, self._sock)  # type: ignore[assignment]
