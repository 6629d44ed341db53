"""The watcher in tests: waiting until it has nothing in hand."""

from __future__ import annotations

import asyncio

from ignition_server.reconcile.reconciler import Reconciler


async def wait_idle(reconciler: Reconciler) -> None:
    """Until no render and no queued write-back is pending.

    A write-back that failed and waits for its retry does not count."""
    while reconciler.renders.pending() or reconciler.work.running():
        tasks = reconciler.renders.pending() + list(reconciler.work.running())
        await asyncio.gather(*tasks, return_exceptions=True)
