"""`data.reason` / `data.message` on the token Secret: how a NodePool's payload is doing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..model.objects import secret_value, set_secret_value


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
