"""Counts a serving process keeps, without Prometheus: a serving worker only reports them to the
owner (workers/worker.py), whose `metrics.ServerMetrics` exposes them. prometheus_client is not
among a worker's imports (~1 MiB of a worker's RSS with the JWT checks it does not import
either, issue 33)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol


# The connection table (http/connection_table.py) is the serving side's; metrics only read
# its counts, in this shape, so the table imports it from here and not the other way.
@dataclass(frozen=True)
class ConnectionCounts:
    open: tuple[int, ...]  # by row (serving process)
    refused: int  # since the table was made, dead processes' rows included
    timed_out: int


class Tally:
    """A count by one label's value, kept without a lock.

    Increments come from the event loop only, and a scrape (in another thread) copies the
    dict, which the GIL makes atomic. A prometheus_client Counter takes a lock per increment:
    two per request on the serving path, for nothing.
    """

    def __init__(self) -> None:
        self._counts: Counter[str | int] = Counter()

    def inc(self, value: str | int, count: int = 1) -> None:
        self._counts[value] += count

    def counts(self) -> dict[str | int, int]:
        return dict(self._counts)


class ServingCounts(Protocol):
    """What the HTTP app counts per request (`metrics.ServerMetrics`, or a worker's `ServingTallies`)."""

    @property
    def get_requests(self) -> Tally: ...

    @property
    def responses(self) -> Tally: ...


@dataclass
class ServingTallies:
    """A serving worker's counts: payload requests by NodePool, responses by status."""

    get_requests: Tally = field(default_factory=Tally)
    responses: Tally = field(default_factory=Tally)
