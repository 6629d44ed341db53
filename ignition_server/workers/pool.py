"""The owner's side of `serve --workers N`: start the workers, keep them fed, answer their
questions, take their reports, start again any that dies.

Every change to the token index (tokens, renders) reaches every worker in the order it
was made: the index tells `_collect` under its own lock, with the generation it made, and a
worker that starts late gets the rows of one consistent snapshot plus the changes after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import socket
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from payload_cache import PayloadCache

from ..auth.presented import Presented, admit
from ..auth.tokens import Refusal, TokenAuthenticator
from ..config import ServeSettings
from ..http.connection_table import ConnectionTable
from ..http.limits import FailedAuthLimiter
from ..metrics import ServerMetrics
from ..tls.certificates import TLSFiles
from .channel import Channel
from .messages import (
    Ask,
    AskWait,
    Behind,
    Drain,
    Granted,
    Hello,
    Hold,
    IndexChanges,
    Missing,
    Ready,
    Refused,
    RenderWaitIs,
    Report,
    Reported,
    ReportNow,
    WaitIs,
    WorkerSpec,
)
from .render_wait import IDLE_S
from .worker import process_name

log = logging.getLogger("ignition_server.workers")
RESTART_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)  # a worker that keeps dying is started again ever more slowly


@dataclass
class _Worker:
    number: int
    process: asyncio.subprocess.Process
    channel: Channel
    base_generation: int  # changes up to this one were in the rows it started from
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    reported: dict[int, asyncio.Future[None]] = field(default_factory=dict)


class WorkerPool:
    def __init__(self, *, settings: ServeSettings, count: int, port: int, tls_files: TLSFiles, cache: PayloadCache,
                 authenticator: TokenAuthenticator, metrics: ServerMetrics,
                 on_served: Callable[[str], None], on_missing: Callable[[str], None],
                 behind: Callable[[], list[str]] = lambda: [],
                 edge_listener: socket.socket | None = None,
                 render_wait: Callable[[], int] = lambda: IDLE_S,
                 render_wait_for: Callable[[str], int] = lambda _secret: IDLE_S) -> None:
        self._settings = settings
        self._edge_listener = edge_listener  # --edge-socket's, inherited by every worker
        self._count = count
        self._port = port
        self._tls_files = tls_files
        self._cache = cache
        self._auth = authenticator
        self._metrics = metrics
        self._on_served = on_served
        self._on_missing = on_missing
        self._behind = behind
        self._told_behind: list[str] = []
        self._render_wait = render_wait  # for any NodePool still rendering, told to every worker
        self._render_wait_for = render_wait_for  # for one, from its place in the queue, when a worker asks
        self._told_wait = IDLE_S
        # Each worker keeps its own memory tier and ready bodies: together they stay within --cache-memory.
        self._memory = settings.serving_memory
        self._workers: dict[int, _Worker] = {}
        # The connection limits are the server's: every worker counts in its row of one table.
        self._connections = ConnectionTable.create(count)
        metrics.watch_connections(self._connections.counts, [process_name(n) for n in range(count)])
        self._limiter = FailedAuthLimiter(settings.auth_failure_burst, settings.auth_failure_window)
        self._pending: list[tuple[int, Any]] = []
        self._pending_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_scheduled = False
        self._stopping = False
        self._report_ids = itertools.count(1)

    # -- publishing ----------------------------------------------------------------
    def _collect(self, generation: int, change: Any) -> None:
        """The index's listener: any thread, under the index lock, so keep it short."""
        with self._pending_lock:
            self._pending.append((generation, change))
            if self._flush_scheduled or self._loop is None:
                return
            self._flush_scheduled = True
        self._loop.call_soon_threadsafe(self._publish)

    def _publish(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, []
            self._flush_scheduled = False
        if not pending:
            return
        newest = pending[-1][0]
        for worker in self._workers.values():
            changes = [change for generation, change in pending if generation > worker.base_generation]
            if changes:
                worker.channel.send(IndexChanges(newest, changes))

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        """Start the workers; returns once each serves."""
        self._loop = asyncio.get_running_loop()
        self._cache.follow(self._collect)
        await asyncio.gather(*(self._spawn(number) for number in range(self._count)))
        await asyncio.gather(*(worker.ready.wait() for worker in self._workers.values()))

    async def _spawn(self, number: int) -> _Worker:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        edge = [self._edge_listener.fileno()] if self._edge_listener is not None else []
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ignition_server.workers.worker", str(theirs.fileno()), str(self._connections.fd),
                *map(str, edge), pass_fds=(theirs.fileno(), self._connections.fd, *edge),
            )
        finally:
            theirs.close()
        channel = await Channel.open(ours)
        # Rows and registration in one step of the loop: every change after the rows'
        # generation is still pending or yet to come, and will reach this worker.
        self._publish()
        generation, tokens, renders = self._cache.index_rows()
        worker = _Worker(number, process, channel, generation)
        self._workers[number] = worker
        channel.send(Hello(WorkerSpec(number, self._settings, self._port, self._tls_files, self._memory.tier,
                                      self._memory.ready, generation, tokens, renders)))
        if self._told_behind:
            channel.send(Behind(self._told_behind))
        if self._told_wait != IDLE_S:
            channel.send(RenderWaitIs(self._told_wait))
        asyncio.create_task(self._listen(worker), name=f"worker-{number}")
        return worker

    async def tell_behind(self, interval: float = 0.5) -> None:
        """Keep the workers' /readyz saying what the owner is behind on (a watch reconnecting),
        and their Retry-After for a payload still rendering following the render queue."""
        while True:
            self._tell_behind_now()
            self._tell_wait_now()
            await asyncio.sleep(interval)

    def _tell_wait_now(self) -> None:
        wait = self._render_wait()
        if wait != self._told_wait:
            self._told_wait = wait
            for worker in self._workers.values():
                worker.channel.send(RenderWaitIs(wait))

    def _tell_behind_now(self) -> None:
        behind = self._behind()
        if behind != self._told_behind:
            self._told_behind = behind
            for worker in self._workers.values():
                worker.channel.send(Behind(behind))

    async def run(self) -> None:
        """Start again any worker that exits, until `stop`; keep their /readyz current."""
        telling = asyncio.create_task(self.tell_behind(), name="workers-behind")
        try:
            await self._supervise()
        finally:
            telling.cancel()

    async def _supervise(self) -> None:
        failures = 0
        while not self._stopping:
            waits = {asyncio.create_task(w.process.wait()): w for w in self._workers.values()}
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            for task in done:
                worker = waits[task]
                if self._stopping:
                    return
                self._workers.pop(worker.number, None)
                self._metrics.worker_held.pop(worker.number, None)  # what it held died with it
                worker.channel.close()
                # Its connections died with it; what its row still counts would hold their places.
                self._connections.clear(worker.number)
                self._count_serving()
                delay = RESTART_DELAYS[min(failures, len(RESTART_DELAYS) - 1)]
                log.error("worker %d (pid %d) exited with %s; starting it again in %.1fs",
                          worker.number, worker.process.pid, worker.process.returncode, delay)
                failures += 1
                await asyncio.sleep(delay)
                self._metrics.worker_restarts.inc()
                await self._spawn(worker.number)
            if all(w.ready.is_set() for w in self._workers.values()):
                failures = 0

    async def stop(self, timeout: float) -> None:
        """Drain every worker (each finishes its in-flight responses), then reap them."""
        self._stopping = True
        self._publish()
        for worker in self._workers.values():
            worker.channel.send(Drain())
        processes = [worker.process for worker in self._workers.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in processes)), timeout)
        except asyncio.TimeoutError:
            for process in processes:
                if process.returncode is None:
                    log.error("worker pid %d did not drain in %.0fs; killing it", process.pid, timeout)
                    process.kill()
            await asyncio.gather(*(p.wait() for p in processes))
        for worker in self._workers.values():
            worker.channel.close()
        self._connections.close()
        self._metrics.workers_serving.set(0)

    def _count_serving(self) -> None:
        self._metrics.workers_serving.set(sum(w.ready.is_set() for w in self._workers.values()))

    # -- what workers say ----------------------------------------------------------
    async def _listen(self, worker: _Worker) -> None:
        with contextlib.suppress(EOFError):
            while True:
                match await worker.channel.receive():
                    case Ask(ask_id, presented, remote):
                        worker.channel.send(self._answer(ask_id, presented, remote))
                    case AskWait(ask_id, secret):
                        worker.channel.send(WaitIs(ask_id, self._render_wait_for(secret)))
                    case Report(deltas, served, held):
                        self._take_report(worker.number, deltas, served, held)
                    case Reported(report_id):
                        answered = worker.reported.pop(report_id, None)
                        if answered is not None and not answered.done():
                            answered.set_result(None)
                    case Missing(secret):
                        self._on_missing(secret)
                    case Ready(pid):
                        log.info("worker %d (pid %d) is serving", worker.number, pid)
                        worker.ready.set()
                        self._count_serving()

    async def gather_reports(self, timeout: float = 1.0) -> None:
        """Have every serving worker report now, so a scrape sees each request already answered."""
        # A scrape that sees a watch down is followed by workers' /readyz saying so: the
        # channel is ordered, so the news is in before the report is.
        self._tell_behind_now()
        report_id = next(self._report_ids)
        waits = []
        for worker in self._workers.values():
            if worker.ready.is_set():
                answered = asyncio.get_running_loop().create_future()
                worker.reported[report_id] = answered
                worker.channel.send(ReportNow(report_id))
                waits.append(answered)
        if waits:
            await asyncio.wait(waits, timeout=timeout)

    def _answer(self, ask_id: int, presented: Presented, remote: str | None) -> Granted | Refused:
        # Every failed attempt, whichever worker took it, is counted here: one limit per
        # source address for the whole server, as in a single process. Only failures are
        # held off: a credential that opens a payload is granted whatever its address did.
        try:
            return Granted(ask_id, admit(presented, self._auth))
        except Refusal as refusal:
            was_held = self._limiter.retry_after(remote) is not None
            answer = self._limiter.answer_failed(refusal, remote)
            if answer is not refusal and not was_held and answer.retry_after is not None:  # a new hold
                for worker in self._workers.values():
                    worker.channel.send(Hold(remote, answer.retry_after))
            return Refused(ask_id, answer.status, answer.reason, answer.retry_after)

    def _take_report(self, number: int, deltas: dict[str, dict[str | int, int]], served: list[str],
                     held: dict[str, int]) -> None:
        self._metrics.worker_held[number] = Counter(held)
        for nodepool, count in deltas.get("nodepools", {}).items():
            self._metrics.get_requests.inc(nodepool, count)
        for code, count in deltas.get("codes", {}).items():
            self._metrics.responses.inc(code, count)
        self._metrics.worker_cache.update({str(name): count for name, count in deltas.get("cache", {}).items()})
        for secret in served:
            self._on_served(secret)


MAX_AUTO_WORKERS = 8  # beyond this, say how many: each worker holds its own index replica and memory tier


def default_worker_count(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may use: its cpuset, and no more than a container's CPU limit
    (cgroup v2 `cpu.max`, "quota period"), rounded up; at most MAX_AUTO_WORKERS."""
    count = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return min(count, MAX_AUTO_WORKERS)
