"""HAProxy says when it is up: its master, run with `-Ws`, sends systemd's `READY=1` to the
datagram socket named by `NOTIFY_SOCKET` once its worker serves (libsystemd's sd_notify; no
systemd needed, only the socket).

The controller used to poll the stats socket for 10 s and, past that, stop HAProxy and exit:
on a loaded machine a start (config check, then the master, then its worker loading
certificates and maps) could take longer, and a HAProxy that was about to be ready was killed
(the proxy tests then waited in vain for its stats socket). Waiting for HAProxy's own word,
for as long as it is alive, has no such guess in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
from pathlib import Path


class HAProxyExited(RuntimeError):
    """HAProxy ended before it said it was ready."""


def notify_socket(path: Path) -> socket.socket:
    """A bound datagram socket at `path` (a stale one replaced) for HAProxy's READY=1."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o600)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


async def wait_ready(sock: socket.socket, process: subprocess.Popen[bytes], poll: float = 0.2) -> None:
    """Until HAProxy sends READY=1; HAProxyExited if it ends first. `poll`: how often whether
    it is still alive is looked at while nothing arrives."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            message = await asyncio.wait_for(loop.sock_recv(sock, 4096), poll)
        except asyncio.TimeoutError:
            if process.poll() is not None:
                raise HAProxyExited(f"HAProxy exited with {process.returncode} before it was ready") from None
            continue
        if b"READY=1" in message.split(b"\n"):
            return
