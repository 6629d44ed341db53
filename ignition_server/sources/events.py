"""What every source (files today, Kubernetes later) hands to the reconciler."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Literal, Protocol, runtime_checkable

from ..model.objects import ObjectKey

ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class Change:
    type: ChangeType
    key: ObjectKey
    obj: dict[str, Any]


ChangeHandler = Callable[[list[Change]], Awaitable[None]]
# Held by a source while it reads a batch it will hand over (the consumer's heavier work waits).
Ingesting = Callable[[], AbstractContextManager[object]]
# Changes an object in place; returns False when there is nothing to write.
Mutation = Callable[[dict[str, Any]], bool]


class Source(Protocol):
    @property
    def writable(self) -> bool: ...

    def describe(self) -> str: ...

    def objects(self) -> dict[ObjectKey, dict[str, Any]]: ...

    def get(self, key: ObjectKey) -> dict[str, Any] | None: ...

    def get_full(self, key: ObjectKey) -> dict[str, Any] | None: ...

    def attach(self, handler: ChangeHandler) -> None:
        """Hand every later batch of changes to `handler` (`run` attaches the one it is given)."""
        ...

    async def run(self, handler: ChangeHandler, *, ingesting: Ingesting | None = None) -> None:
        """Hand the listing, then every change, to `handler` until cancelled; hold `ingesting`
        while reading a batch (the reconciler starts no render meanwhile: a flood is indexed whole,
        another tenant's token Secret with it, before renders take the CPU)."""
        ...

    async def write_back(self, key: ObjectKey, mutate: Mutation) -> dict[str, Any] | None: ...

    async def put(self, obj: dict[str, Any], *, beside: ObjectKey) -> None: ...

    async def flush(self) -> None: ...


@runtime_checkable
class PruningSource(Source, Protocol):
    """A source that can also delete objects and record events (the Kubernetes source).
    The file source cannot: expired token Secrets stay in their files, ignored."""

    async def delete(self, key: ObjectKey, *, resource_version: str | None = None) -> bool: ...

    async def record_event(self, about: ObjectKey, reason: str, message: str, *, warning: bool = True) -> None: ...
