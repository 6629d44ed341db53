"""`ignition-server serve`: the settings from the flags, then the server until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from .. import logs, memory
from ..no_core_dumps import disable_core_dumps
from ..server import IgnitionServer
from .settings import serve_settings


def run(args: argparse.Namespace) -> int:
    settings = serve_settings(args)
    logs.configure(settings.log_format)
    disable_core_dumps()  # before the cache key or any token is read
    memory.tune()
    if not settings.kubernetes and not settings.source_dir.is_dir():
        logging.getLogger("ignition_server").warning(
            "source directory %s is not there (yet): serving what the cache knows", settings.source_dir
        )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await IgnitionServer(settings).run(stop)

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    return 0
