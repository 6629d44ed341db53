"""Listening TCP sockets as the server and the front proxy (`proxy/cli.py`) both open them, and
the unix socket the server's in-pod edge hands it requests on."""

from __future__ import annotations

import contextlib
import os
import socket
import stat


def listening_socket(host: str, port: int, backlog: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound, listening socket; `::` (or an empty host) is dual-stack: IPv4 clients arrive
    as v4-mapped addresses on the same socket (asyncio alone would make it IPv6-only)."""
    sock = bound_socket(host, port, reuse_port=reuse_port)
    try:
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def bound_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to (host, port), not yet listening; with `reuse_port`, several
    processes' sockets share the port (the kernel spreads connections over the listening ones)."""
    if host in ("::", ""):
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        host = "::"
    else:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def unix_listening_socket(path: str | os.PathLike[str], backlog: int, mode: int = 0o660) -> socket.socket:
    """A listening unix socket at `path` (a stale one left by a killed server is replaced),
    `mode` set before it listens: the pod's edge reaches it, nothing outside the pod can."""
    path = os.fspath(path)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, mode)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
