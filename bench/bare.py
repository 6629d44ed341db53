"""Bare aiohttp + uvloop: the baseline of `python -m bench compare` (no auth, no index, no cache).

    python -m bench.bare --port P --cert C --key K --payload FILE

One process serving one pre-built body at every path; run two of them on the same port
(SO_REUSEPORT) for the two-process baseline. TLS as nginx is configured in the bench: TLS 1.2+,
no session tickets, no session cache, so every handshake costs what a booting node costs.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
from pathlib import Path

import uvloop
from aiohttp import web


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_TICKET
    context.num_tickets = 0
    context.load_cert_chain(cert, key)
    return context


async def serve(args: argparse.Namespace) -> None:
    body = args.payload.read_bytes()

    async def handler(_request: web.BaseRequest) -> web.Response:
        return web.Response(body=body, content_type="application/json", headers={"Cache-Control": "no-store"})

    server = web.Server(handler)
    runner = web.ServerRunner(server, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, ssl_context=tls_context(args.cert, args.key),
                       reuse_port=True, backlog=1024)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bare", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--payload", type=Path, required=True)
    args = parser.parse_args(argv)
    uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
