"""Putting an aiohttp app on a port: one way, for the single process and for workers."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Sequence

from aiohttp import web

from ..sockets import bound_socket
from .app import Handler
from .guard import ConnectionGuard, GuardedSite, GuardedUnixSite, IPNetwork

# An idle kept-alive connection is closed after this (aiohttp's default is an hour). A node
# fetches once; a short wait also bounds a kept-alive connection's next request, whose headers
# count as idle until they end (at 75 s, one dribbling them stayed open about two minutes).
KEEPALIVE_TIMEOUT = 5.0
# aiohttp's parser keeps a request's headers until they end: 128 fields of 8 KiB by default,
# ~1.8 MB for one incomplete request. A node sends fewer than ten.
MAX_HEADERS = 32
MAX_FIELD_SIZE = 8190
MAX_LINE_SIZE = 8190


async def start_site(app: web.Application | Handler, listen: tuple[str, int], ssl_context: ssl.SSLContext | None, *,
                     shutdown_timeout: float, guard: ConnectionGuard | None = None, reuse_port: bool = False,
                     proxy_from: Sequence[IPNetwork] = (), edge_listener: socket.socket | None = None,
                     edge_shared: bool = False) -> tuple[web.BaseRunner, int]:
    """Start serving `app` (an Application, or a bare request handler: the serving port's
    dispatch); returns its runner (clean it up to drain) and the bound port. With
    `edge_listener` (a listening unix socket, `edge_shared` when other processes accept on it
    too) the same app is also served there, plain HTTP behind the pod's TLS edge."""
    runner: web.BaseRunner
    if isinstance(app, web.Application):
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout,
                               keepalive_timeout=KEEPALIVE_TIMEOUT, max_headers=MAX_HEADERS,
                               max_field_size=MAX_FIELD_SIZE, max_line_size=MAX_LINE_SIZE)
    else:  # the low-level server takes the connection options itself
        runner = web.ServerRunner(web.Server(app, access_log=None, keepalive_timeout=KEEPALIVE_TIMEOUT,
                                             max_headers=MAX_HEADERS, max_field_size=MAX_FIELD_SIZE,
                                             max_line_size=MAX_LINE_SIZE),
                                  handle_signals=False, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site: web.TCPSite
    if guard is not None:
        site = GuardedSite(runner, listen[0], listen[1], guard=guard, proxy_from=proxy_from, ssl_context=ssl_context,
                           reuse_address=True, reuse_port=reuse_port or None)
    else:
        site = web.TCPSite(runner, listen[0], listen[1], ssl_context=ssl_context, reuse_address=True,
                           reuse_port=reuse_port or None)
    await site.start()
    if edge_listener is not None:
        assert guard is not None, "the edge's socket is served through the connection guard"
        await GuardedUnixSite(runner, edge_listener, guard=guard, shared=edge_shared).start()
    return runner, site.port  # the bound port once started: the one the OS chose for port 0


def reserve_port(listen: tuple[str, int]) -> socket.socket:
    """A bound, never-listening SO_REUSEPORT socket: fixes the port (port 0 picks one) that
    the serving workers then listen on together, and keeps it ours while workers restart.
    The kernel spreads connections over listening sockets only, so this one takes none."""
    return bound_socket(listen[0], listen[1], reuse_port=True)
