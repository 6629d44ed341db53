"""One keyed, fair work queue: what the reconciler runs, in which order, and how often.

The shape of controller-runtime's workqueue (and of kopf's per-object queues), for asyncio:
- **keyed and coalescing**: a key added while it waits is one piece of work, however often it
  is added; a key added while it runs runs once more after (never twice at once);
- **fair**: every key belongs to a lane (the reconciler's lanes are namespaces, one per
  hosted cluster), and lanes are taken round-robin, so one tenant's ten thousand keys delay
  another's by one turn, not by ten thousand;
- **urgent first**: an urgent key (a NodePool's first payload) goes ahead of every routine
  one (a re-render of a payload that already serves);
- **debounced**: `add(key, debounce=seconds)` lets a burst of adds coalesce first (loop time;
  the queue counts as busy meanwhile);
- **later**: `add_later(key, seconds)` (a retry after back-off, on the reconciler's clock)
  waits without a task per key and does not count as busy; an earlier or immediate add wins;
- **held**: while `held()`, nothing new is started (a batch of source changes is applied
  whole before any of it is reconciled).

Workers are started on demand, up to `concurrency`, and end when nothing is ready: an idle
queue costs nothing, and `join` waits until it is idle.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import logging
import time
from collections import OrderedDict, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Generic, Hashable, Iterator, TypeVar

log = logging.getLogger("ignition_server.reconcile")

K = TypeVar("K", bound=Hashable)

URGENT, ROUTINE = 0, 1  # tiers: every urgent key goes before any routine one


def _sequence(entry: tuple[int, object]) -> int:
    return entry[0]


@dataclass
class _Tier(Generic[K]):
    """One tier's lanes, taken round-robin; entries are (sequence, key), stale ones skipped."""

    lanes: OrderedDict[str, deque[tuple[int, K]]] = field(default_factory=OrderedDict)

    def push(self, lane: str, seq: int, key: K) -> None:
        self.lanes.setdefault(lane, deque()).append((seq, key))

    def pop(self, live: Callable[[K, int], bool]) -> K | None:
        """The next live key of the lane whose turn it is (that lane goes to the back)."""
        while self.lanes:
            lane, entries = next(iter(self.lanes.items()))
            while entries:
                seq, key = entries.popleft()
                if live(key, seq):
                    if entries:
                        self.lanes.move_to_end(lane)
                    else:
                        del self.lanes[lane]
                    return key
            del self.lanes[lane]
        return None


@dataclass
class WorkQueue(Generic[K]):
    process: Callable[[K], Awaitable[None]]  # a key's work; an exception is logged, the key is not retried
    lane_of: Callable[[K], str]  # the lane a key waits in (a namespace)
    concurrency: int = 2
    on_depth: Callable[[int], None] = lambda _depth: None  # keys waiting or running, after each change
    clock: Callable[[], float] = time.monotonic  # what `after` counts in (the reconciler's clock)
    _tiers: tuple[_Tier[K], _Tier[K]] = field(default_factory=lambda: (_Tier(), _Tier()))
    _ready: dict[K, tuple[int, int]] = field(default_factory=dict)  # key -> (tier, sequence) of its live entry
    _later: list[tuple[float, int, K, int]] = field(default_factory=list)  # heap: (due, sequence, key, tier)
    _later_due: dict[K, tuple[float, int]] = field(default_factory=dict)  # key -> (due, sequence) of its live timer
    _debouncing: dict[K, tuple[asyncio.TimerHandle, int]] = field(default_factory=dict)  # key -> (timer, tier)
    _running: set[K] = field(default_factory=set)
    _again: dict[K, tuple[int, float]] = field(default_factory=dict)  # added while running: (tier, after), once done
    _workers: set[asyncio.Task[None]] = field(default_factory=set)
    _holds: int = 0
    _timer: asyncio.TimerHandle | None = None
    _timer_due: float = 0.0
    _seq: Iterator[int] = field(default_factory=itertools.count)

    # -- adding ------------------------------------------------------------------------

    def add(self, key: K, *, urgent: bool = False, debounce: float = 0.0) -> None:
        """Reconcile `key` now (or once `debounce` seconds pass without it being needed sooner),
        once, however often it is added meanwhile."""
        tier = URGENT if urgent else ROUTINE
        if self._coalesced(key, tier, 0.0):
            return
        if debounce > 0:
            if key not in self._debouncing:
                timer = asyncio.get_running_loop().call_later(debounce, self._debounced, key)
                self._debouncing[key] = (timer, tier)
                self._changed()
            return
        self._later_due.pop(key, None)  # an immediate add wins over a timer
        self._stop_debounce(key)
        self._enqueue(key, tier)

    def add_later(self, key: K, delay: float) -> None:
        """Reconcile `key` (routine) once `delay` seconds of the clock have passed: a retry after
        back-off. Not busy meanwhile; any add before then runs it sooner."""
        if self._coalesced(key, ROUTINE, delay) or key in self._debouncing:
            return
        due = self.clock() + delay
        current = self._later_due.get(key)
        if current is not None and current[0] <= due:
            return  # an earlier timer covers it
        seq = next(self._seq)
        self._later_due[key] = (due, seq)
        heapq.heappush(self._later, (due, seq, key, ROUTINE))
        self._arm_timer()
        self._changed()

    def _coalesced(self, key: K, tier: int, delay: float) -> bool:
        """Already in hand: running (it runs once more after), or ready (moved up if now urgent)."""
        if key in self._running:
            before = self._again.get(key)
            self._again[key] = (tier, delay) if before is None else (min(tier, before[0]), min(delay, before[1]))
            return True
        queued = self._ready.get(key)
        if queued is not None:
            if tier < queued[0]:
                self._enqueue(key, tier)  # the routine entry goes stale
            return True
        return False

    def _debounced(self, key: K) -> None:
        entry = self._debouncing.pop(key, None)
        if entry is not None:
            self.add(key, urgent=entry[1] == URGENT)

    def _stop_debounce(self, key: K) -> None:
        entry = self._debouncing.pop(key, None)
        if entry is not None:
            entry[0].cancel()

    def forget(self, key: K) -> None:
        """`key` is gone: it waits no more, and is not run again after a run in progress."""
        self._ready.pop(key, None)
        self._later_due.pop(key, None)
        self._stop_debounce(key)
        self._again.pop(key, None)
        self._changed()

    def _enqueue(self, key: K, tier: int) -> None:
        seq = next(self._seq)
        self._ready[key] = (tier, seq)
        self._tiers[tier].push(self.lane_of(key), seq, key)
        self._changed()
        self._start_workers()

    # -- holding -----------------------------------------------------------------------

    @contextmanager
    def held(self) -> Iterator[None]:
        """Start nothing new inside (runs in progress go on): a batch is applied whole first."""
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1
            self._start_workers()

    # -- running -----------------------------------------------------------------------

    def _start_workers(self) -> None:
        if self._holds:
            return
        ready = len(self._ready)
        while ready > 0 and len(self._workers) < self.concurrency:
            task = asyncio.get_running_loop().create_task(self._work(), name="reconcile worker")
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)  # also when cancelled before it ran
            ready -= 1

    def _next(self) -> K | None:
        for tier in self._tiers:
            key = tier.pop(self._is_live)
            if key is not None:
                del self._ready[key]
                return key
        return None

    def _is_live(self, key: K, seq: int) -> bool:
        entry = self._ready.get(key)
        return entry is not None and entry[1] == seq

    async def _work(self) -> None:
        try:
            await self._work_until_idle()
        finally:
            # Gone from the count in the same step as it found nothing to do: a key added
            # right after starts a new worker rather than waiting for this one.
            me = asyncio.current_task()
            if me is not None:
                self._workers.discard(me)

    async def _work_until_idle(self) -> None:
        while not self._holds:
            key = self._next()
            if key is None:
                return
            self._running.add(key)
            try:
                await self.process(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # process() keeps its own faults; this is a bug, and one key's
                log.exception("reconciling %s failed", key)
            finally:
                self._running.discard(key)
                again = self._again.pop(key, None)
                if again is not None and again[1] > 0:
                    self.add_later(key, again[1])
                elif again is not None:
                    self.add(key, urgent=again[0] == URGENT)
                self._changed()

    def _arm_timer(self) -> None:
        """One loop timer for the earliest due key. It counts in `clock`'s seconds; a clock that
        is not the loop's (a test's) is looked at again each second until the key is due."""
        self._drop_stale_timers()
        if not self._later:
            return
        due = self._later[0][0]
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        self._timer_due = due
        delay = min(max(due - self.clock(), 0.0), 1.0)
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.run_due()

    def run_due(self) -> None:
        """Add every key whose `after` has passed (the timer calls this; so may a test that moved its clock)."""
        now = self.clock()
        while self._later and self._later[0][0] <= now:
            due, seq, key, tier = heapq.heappop(self._later)
            if self._later_due.get(key) != (due, seq):
                continue  # replaced by an earlier timer, an immediate add, or forgotten
            del self._later_due[key]
            self.add(key, urgent=tier == URGENT)
        self._arm_timer()

    def _drop_stale_timers(self) -> None:
        while self._later and self._later_due.get(self._later[0][2]) != (self._later[0][0], self._later[0][1]):
            heapq.heappop(self._later)

    # -- looking on --------------------------------------------------------------------

    def depth(self) -> int:
        """Keys waiting (now or later) or running."""
        return len(self._ready) + len(self._later_due) + len(self._debouncing) + len(self._running)

    def busy(self) -> bool:
        """Something is ready, debouncing or running (a key waiting out a back-off does not count)."""
        return bool(self._ready or self._running or self._workers or self._debouncing)

    def ahead_of(self, key: K) -> int | None:
        """Keys that start before `key`: 0 while it runs, None unless it is ready (waiting out a
        back-off or a debounce, or not queued). Every urgent key goes first; in its own tier the
        lanes are taken in turn, so a key i deep in its lane waits for i keys of every other
        lane (one more of each lane whose turn comes before its own). What a 503's Retry-After
        is made of (workers/render_wait.py); O(lanes + log of its lane), entries gone stale count as live."""
        if key in self._running:
            return 0
        entry = self._ready.get(key)
        if entry is None:
            return None
        tier, seq = entry
        ahead = sum(len(lane) for lane in self._tiers[URGENT].lanes.values()) if tier == ROUTINE else 0
        lanes = self._tiers[tier].lanes
        own = self.lane_of(key)
        # A lane's entries are in sequence order: found by bisection, not a walk of the lane,
        # which a tenant asking for each of 10,000 queued NodePools made 10,000 steps a question.
        depth = bisect.bisect_left(lanes[own], seq, key=_sequence)
        before = True  # lanes ahead of `own` in the ring get one turn more
        for lane, entries in lanes.items():
            if lane == own:
                before = False
                continue
            ahead += min(len(entries), depth + before)
        return ahead + depth

    def waiting_later(self, key: K) -> bool:
        return key in self._later_due

    def queued(self, key: K) -> bool:
        return key in self._ready or key in self._later_due or key in self._running

    def workers(self) -> list[asyncio.Task[None]]:
        return list(self._workers)

    async def join(self) -> None:
        """Until nothing is ready, debouncing or running (back-off timers may still be set)."""
        while self.busy():
            if self._workers:
                await asyncio.gather(*self._workers, return_exceptions=True)
            else:
                await asyncio.sleep(0.005)  # a debounce running out, or a holder letting go

    def cancel(self) -> None:
        """Shutdown: stop every worker and timer; nothing waiting is run."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for key in list(self._debouncing):
            self._stop_debounce(key)
        for task in list(self._workers):
            task.cancel()

    def _changed(self) -> None:
        self.on_depth(self.depth())
