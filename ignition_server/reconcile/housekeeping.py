"""The reconciler's clock: what happens on a tick rather than on a source change.

Rotation of due Secrets (rotation.py), deleting expired ones (write_backs.py), releases
asked for again by a new writer (release_waits.py),
the tokens of Secrets that expired retired (token_secrets.py), the cache's expired tokens
forgotten and its unreferenced payloads collected, and the index flushed when dirty.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from payload_cache import PayloadCache

from ..metrics import ServerMetrics
from .faults import Faults
from .release_waits import ReleaseWaits
from .rotation import Rotation
from .token_secrets import TokenSecrets
from .write_backs import WriteBacks

log = logging.getLogger("ignition_server.reconcile")

GC_INTERVAL = 600.0


@dataclass
class Housekeeping:
    tokens: TokenSecrets
    rotation: Rotation
    write_backs: WriteBacks
    release_waits: ReleaseWaits
    cache: PayloadCache
    faults: Faults
    metrics: ServerMetrics
    persist_index: Callable[[], Awaitable[None]]
    clock: Callable[[], float] = time.time

    async def run(self, *, tick: float = 0.5) -> None:
        """Rotation, expiry and index persistence, until cancelled (render retries are the work queue's)."""
        last_forget = 0.0
        last_gc = self.clock()  # not at start-up: nothing is unreferenced before the first listing
        while True:
            await asyncio.sleep(tick)
            try:
                await self.rotation.rotate_due()
                await self.write_backs.prune_expired(self.tokens.secrets)
                self.release_waits.nudge()
                now = self.clock()
                for secret in list(self.tokens.secrets.values()):
                    if secret.expired(now):
                        try:
                            self.tokens.refresh(secret)
                        except Exception as exc:  # one Secret's fault must not stop the sweep
                            self.faults.failed("expiry", secret.ref, exc)
                        else:
                            self.faults.succeeded("expiry", secret.ref)
                self.metrics.rotation_overdue.set(self.rotation.overdue(now))
                if now - last_forget > 60:
                    self.cache.forget_expired(now)
                    last_forget = now
                if now - last_gc > GC_INTERVAL:
                    last_gc = now
                    report = await asyncio.to_thread(self.cache.gc, now)
                    if report.deleted:
                        log.info("cache gc: deleted %d unreferenced payload(s), %d bytes", report.deleted, report.bytes_freed)
                if self.cache.dirty:
                    await self.persist_index()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("housekeeping failed; trying again")
