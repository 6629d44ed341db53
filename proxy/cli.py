"""`ignition-proxy`: render the routing table as haproxy.cfg, or run HAProxy and keep it in step."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Sequence

from aiohttp import web

from ignition_server.sockets import listening_socket
from ignition_server.sources.kube.client import KubeClient

from .controller import Controller, read_desired
from .publication import PublicationError
from .render import render_config
from .table import TableError, read_table

ENV_PREFIX = "IGNITION_PROXY_"


def _env(flag: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_"), default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ignition-proxy", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("render", "print the haproxy.cfg of the routing table"),
                       ("run", "run HAProxy from the routing table and keep it in step")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--config", default=_env("--config"), required=_env("--config") is None,
                         help=f"the routing table (YAML) [env {ENV_PREFIX}CONFIG]")
        if name == "run":
            sub.add_argument("--haproxy", default=_env("--haproxy", "haproxy"), help=f"HAProxy binary [env {ENV_PREFIX}HAPROXY]")
            sub.add_argument("--kubeconfig", default=_env("--kubeconfig"),
                             help=f"for routes with endpoints (default: in-cluster) [env {ENV_PREFIX}KUBECONFIG]")
            sub.add_argument("--interval", type=float, default=float(_env("--interval", "0.5") or 0.5),
                             help=f"seconds between syncs [env {ENV_PREFIX}INTERVAL]")
    return parser


async def _serve_metrics(controller: Controller, listen: str) -> web.AppRunner:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "::"

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=controller.metrics.text(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # `::` must take IPv4 too (a kubelet probes the pod's IPv4 address): asyncio alone would
    # make the socket IPv6-only. The server's listener helper makes it dual-stack.
    await web.SockSite(runner, listening_socket(host, int(port), 128)).start()
    return runner


async def _run(args: argparse.Namespace) -> int:
    table = await asyncio.to_thread(read_table, Path(args.config))  # the publications may come later
    kube = None
    if any(route.endpoints for route in table.routes):
        kube = await KubeClient.connect(Path(args.kubeconfig) if args.kubeconfig else None)
    controller = Controller(Path(args.config), haproxy=args.haproxy, interval=args.interval, kube=kube)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = await _serve_metrics(controller, table.metrics_listen) if table.metrics_listen else None
    try:
        await controller.run(stop)
    finally:
        if runner is not None:
            await runner.cleanup()
        if kube is not None:
            await kube.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        if args.command == "render":
            desired = read_desired(Path(args.config))
            sys.stdout.write(render_config(desired.table, desired.publications))
            return 0
        return asyncio.run(_run(args))
    except (TableError, PublicationError, ValueError) as error:
        print(f"ignition-proxy: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
