"""`data.reason` / `data.message` on the token Secret: how a NodePool's payload is doing."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from ..model.objects import ObjectKey, secret_value, set_secret_value
from .tenancy import Tenancy

log = logging.getLogger("ignition_server.reconcile")


@dataclass(frozen=True)
class Status:
    reason: str  # "AsExpected" or why not, e.g. "InvalidConfig"
    message: str = ""


@dataclass(frozen=True)
class Waiting:
    """A render that cannot start yet, and what it waits for: a release being read, a base being
    generated (release_waits.py, generated_bases.py). No status is written; when it arrives the
    NodePool, a reader of it in the input graph, is queued again."""

    on: str


@dataclass(kw_only=True)
class DependencyWaits:
    """What the release and base waits share (release_waits.py, generated_bases.py): NodePools
    blocked on a dependency the writer fetches, and requeued when it arrives.

    `requeue(dependency)` hands the dependency's readers (the input graph's) back to the work
    queue with their back-off dropped: what they waited for is here (or failed, and says so)."""

    source: Any
    tenancy: Tenancy
    share_namespace: str | None  # several replicas: the writer publishes what it fetched here
    writer: Callable[[], bool]
    requeue: Callable[[ObjectKey], None]
    _asking: set[str] = field(default_factory=set)  # dependencies whose inputs are being read for their fetch

    async def publish(self, obj: dict[str, Any], what: str) -> None:
        """Publish what the writer fetched for the other replicas (a ConfigMap in its namespace)."""
        try:
            await self.source.put(obj, beside=ObjectKey("ConfigMap", str(self.share_namespace), obj["metadata"]["name"]))
        except Exception as exc:  # the others keep waiting; the next fetch (or restart) publishes again
            log.error("could not publish %s for the other replicas: %s", what, exc)


def written_status(obj: dict[str, Any]) -> Status:
    """What a token Secret says now."""
    reason, message = ((secret_value(obj, k) or b"").decode(errors="replace") for k in ("reason", "message"))
    return Status(reason, message)


def status_mutation(status: Status) -> Callable[[dict[str, Any]], bool]:
    def mutate(obj: dict[str, Any]) -> bool:
        if written_status(obj) == status:
            return False
        set_secret_value(obj, "reason", status.reason.encode())
        set_secret_value(obj, "message", status.message.encode())
        return True

    return mutate
