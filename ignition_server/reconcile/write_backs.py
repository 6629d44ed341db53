"""What the writing replica writes into the source besides rotation (rotation.py): each
token Secret's status, `ignition-reached`, and deleting expired token Secrets and the
user-data of gone ones. With several replicas (Kubernetes mode) only the Lease holder
writes. Each write is gated by `writer()` and queued per object (`work`), never awaited by
the event handler: a write-back re-enters the handler, and one object's failure reaches no other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Awaitable, Callable

from ..model.objects import ObjectKey, secret_key, set_annotation
from ..model.token_secret import ANNOTATION_IGNITION_REACHED, TokenSecret
from ..render.userdata import user_data_secret_name
from ..sources.events import PruningSource
from .faults import Faults
from .object_work import ObjectWork
from .status import Status, status_mutation, written_status

log = logging.getLogger("ignition_server.reconcile")


def user_data_key(secret: TokenSecret) -> ObjectKey:
    """The user-data Secret HyperShift writes beside a token Secret."""
    return ObjectKey("Secret", secret.key.namespace, user_data_secret_name(
        nodepool_name=secret.nodepool.partition("/")[2], token_secret_name=secret.key.name, user_data=b""))


@dataclass
class WriteBacks:
    source: Any
    work: ObjectWork  # write-backs, queued per object
    faults: Faults
    secret_of: Callable[[ObjectKey], TokenSecret | None]  # the token Secret as the index holds it now
    writer: Callable[[], bool] = lambda: True
    clock: Callable[[], float] = time.time
    prune_grace: float = 60.0  # an expired token Secret is deleted this long after its expiry (sources that can)
    _reached_written: set[ObjectKey] = field(default_factory=set)

    def status_later(self, key: ObjectKey, obj: dict[str, Any] | None, status: Status, *,
                     durable: Callable[[], Awaitable[None]] | None = None) -> None:
        """Write `status` when it changes, queued per object; `durable` (the index flush) is awaited
        first, so that a status saying a payload is ready is never ahead of the index on disk."""
        current = self.secret_of(key)
        if current is not None and (current.reason, current.message) == (status.reason, status.message) \
                and not self.work.in_hand(key.ref, "status"):
            self.work.discard(key.ref, "status")  # an older status waiting for its retry is moot
            return  # the common case after a restart: no task per NodePool for nothing to write
        # The flush starts now, not when a worker takes the job: a burst of statuses shares one
        # flush rather than each worker's turn costing its own (a retry flushes again).
        flushing = asyncio.ensure_future(durable()) if durable is not None else None
        if flushing is not None:
            flushing.add_done_callback(lambda f: f.cancelled() or f.exception())  # the job's to raise
        self.work.submit(key.ref, "status", lambda: self._status(key, status, obj, flushing, durable))

    async def _status(self, key: ObjectKey, status: Status, obj: dict[str, Any] | None,
                      flushing: asyncio.Future[None] | None, durable: Callable[[], Awaitable[None]] | None) -> None:
        if flushing is not None and durable is not None:
            if flushing.done() and (flushing.cancelled() or flushing.exception() is not None):
                await durable()  # a retry after a failed flush: one of its own
            else:
                await asyncio.shield(flushing)
        # Only when it changes: the reference flooded its API server otherwise (OCPBUGS-42320).
        current = self.secret_of(key)
        if current is not None and (current.reason, current.message) == (status.reason, status.message):
            return
        if obj is not None and written_status(obj) == status:
            return
        written = await self.write(key, status_mutation(status), "status")
        if written and status.reason != "AsExpected" and isinstance(self.source, PruningSource):
            # Once per change of status, like the status itself: `kubectl describe` shows why.
            await self.source.record_event(key, status.reason, status.message)

    async def write(self, key: ObjectKey, mutate: Callable[[dict[str, Any]], bool], what: str) -> bool:
        """True when written. Raises when it could not be (the caller's queue retries with back-off)."""
        if not self.writer():
            log.debug("not the writer: %s of %s left to the replica that writes", what, key)
            return False
        if not self.source.writable:
            log.debug("source %s is read-only: %s of %s not written back", self.source.describe(), what, key)
            return False
        try:  # how many at once is `work`'s bound (ObjectWork.concurrency)
            return await self.source.write_back(key, mutate) is not None
        except KeyError:
            return False  # gone from the source meanwhile: nothing to write to

    def note_served(self, secret_ref: str) -> None:
        """Set `ignition-reached` once per Secret, off the request path (the reference paid a GET+UPDATE per request)."""
        key = secret_key(secret_ref)
        secret = self.secret_of(key)
        if secret is None or secret.ignition_reached or key in self._reached_written:
            return
        self._reached_written.add(key)

        def mutate(obj: dict[str, Any]) -> bool:
            notes = (obj.get("metadata") or {}).get("annotations") or {}
            if str(notes.get(ANNOTATION_IGNITION_REACHED, "")).lower() == "true":
                return False
            set_annotation(obj, ANNOTATION_IGNITION_REACHED, "True")
            return True

        self.work.submit(key.ref, "write-back", lambda: self.write(key, mutate, "ignition-reached"))

    def orphaned_user_data(self, secret: TokenSecret) -> None:
        """A token Secret deleted (its NodePool gone, or superseded and expired): its user-data
        Secret points at a token that no longer opens anything, so it goes too."""
        if not self.writer() or not isinstance(self.source, PruningSource):
            return
        key = user_data_key(secret)
        if self.source.get(key) is None:
            return
        self.work.submit(key.ref, "prune", partial(self.source.delete, key))
        log.info("deleting %s: its token Secret %s is gone", key.ref, secret.ref)

    async def prune_expired(self, secrets: Mapping[ObjectKey, TokenSecret]) -> int:
        """Delete token Secrets that expired (`grace` seconds ago, so every replica has
        stopped serving them) and their user-data Secrets (the reference leaked both)."""
        if not self.writer() or not isinstance(self.source, PruningSource):
            return 0
        now = self.clock()
        pruned = 0
        for key, secret in list(secrets.items()):  # a copy: the deletes below await, the index moves on
            if secret.expiration is None or now < secret.expiration + self.prune_grace or self.faults.waiting("prune", key.ref):
                continue
            user_data = user_data_key(secret)
            try:
                if self.source.get(user_data) is not None:
                    await self.source.delete(user_data)
                await self.source.delete(key)
            except Exception as exc:
                self.faults.failed("prune", key.ref, exc)
                continue
            self.faults.succeeded("prune", key.ref)
            log.info("deleted the expired token Secret %s and its user-data", key.ref)
            pruned += 1
        return pruned
