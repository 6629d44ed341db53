"""The reconciler in tests: waiting until it has nothing in hand."""

from __future__ import annotations

import asyncio

from ignition_server.reconcile.reconciler import Reconciler


async def wait_idle(reconciler: Reconciler) -> None:
    """Until no NodePool is ready or being reconciled and no queued write-back is pending.

    A NodePool or write-back waiting out its back-off does not count."""
    while reconciler.nodepools.queue.busy() or reconciler.work.running():
        tasks = reconciler.nodepools.queue.workers() + list(reconciler.work.running())
        await asyncio.gather(*tasks, return_exceptions=True)
        if not tasks:
            await asyncio.sleep(0.005)  # a debounce running out
