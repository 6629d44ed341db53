"""A serving worker: `python -m ignition_server.workers.worker FD TABLE_FD`, started by the owner
(FD: its channel; TABLE_FD: the server's connection table, `connection_table`).

It serves from a replica of the owner's token index (fed over the channel) and the
encrypted blobs on disk, never renders or writes, and asks the owner before refusing a
request. When the owner goes away (its end of the channel closes) it drains and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import sys
import time
from collections import Counter
from dataclasses import replace

from payload_cache import CacheConfig, PayloadCache

from .. import logs, memory
from ..auth.presented import Presented
from ..auth.tokens import Grant, Refusal, TokenAuthenticator
from ..http.access_log import AccessLog
from ..http.app import IgnitionHandlers, ServingState, build_dispatch
from ..http.connection_table import ConnectionTable
from ..http.guard import ConnectionGuard
from ..http.limits import FailedAuthLimiter
from ..http.listen import start_site
from ..http.ready import WRITE_PIECE
from ..tallies import ServingTallies
from ..tls.certificates import reload_on_change, serving_context
from ..tls.sni import HostCertificates, refresh_periodically
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

log = logging.getLogger("ignition_server.worker")
REPORT_INTERVAL = 1.0  # served NodePools and counters go to the owner this often
TRIM_EVERY = 10  # reports between heap trims
WAIT_ASK_TIMEOUT = 1.0  # the owner busy beyond this: a node still rendering is told the queue's general wait
WAIT_REUSE_S = 2.0  # an owner's answer for a NodePool still rendering serves its retries this long
WAITS_KEPT = 4_096  # answers kept before those older than WAIT_REUSE_S are let go


def process_name(number: int) -> str:
    """How logs, request ids and metrics name worker `number`."""
    return f"w{number}"




class Worker:
    def __init__(self, spec: WorkerSpec, channel: Channel, connections: ConnectionTable,
                 edge_listener: socket.socket | None = None) -> None:
        self.channel = channel
        self.connections = connections
        self.edge_listener = edge_listener  # --edge-socket's, inherited from the owner
        settings = spec.settings
        self.cache = PayloadCache.replica(
            CacheConfig(settings.cache_dir, settings.cache_key_file, spec.memory_bytes), spec.tokens, spec.renders)
        self.spec = replace(spec, tokens=[], renders=[])  # the rows are in the replica now (~4 MiB at 5,280)
        self.generation = spec.generation
        self.metrics = ServingTallies()  # reported to the owner, whose /metrics shows them
        self._behind: list[str] = []
        self._render_wait = IDLE_S
        # What the owner says is behind, and how long a node should wait for a render.
        self.state = ServingState(behind=lambda: self._behind, render_wait=self.render_wait_for)
        self._asks: dict[int, asyncio.Future[Granted | Refused]] = {}
        self._wait_asks: dict[int, asyncio.Future[int]] = {}
        self._waits_told: dict[str, tuple[float, int]] = {}  # secret -> (when, Retry-After) the owner said
        self._ids = itertools.count(1)
        self._served: set[str] = set()
        self._owner_gone = False
        self._reported: dict[str, Counter[str | int]] = {}  # what the last report counted, by kind
        self._held: dict[str, int] = {}  # payload bytes held, as last reported
        self.limiter = FailedAuthLimiter(settings.auth_failure_burst, settings.auth_failure_window)
        self.handlers = IgnitionHandlers(
            cache=self.cache,
            # Service-account JWTs are the owner's to verify (it holds the keys); this
            # authenticator refuses them, and the refusal becomes a question to the owner.
            authenticator=TokenAuthenticator(self.cache),
            metrics=self.metrics,
            state=self.state,
            on_served=self._served.add,
            on_missing=lambda secret: self.channel.send(Missing(secret)),
            max_in_flight=settings.max_in_flight,
            limiter=self.limiter,
            second_opinion=self.ask_owner,
            request_id_prefix=f"{process_name(spec.number)}-",
            access=AccessLog(settings.log_format),
            # Whole while few connections are open here, 64 KiB pieces beyond (http/ready.py).
            write_piece=WRITE_PIECE,
            open_connections=connections.row(spec.number).open_here,
            ready_bytes=spec.ready_bytes,
        )

    async def ask_owner(self, presented: Presented, remote: str | None) -> Grant:
        if self._owner_gone:
            raise Refusal(503, "the token check is unavailable for a moment", retry_after=1)
        ask_id = next(self._ids)
        answer: asyncio.Future[Granted | Refused] = asyncio.get_running_loop().create_future()
        self._asks[ask_id] = answer
        self.channel.send(Ask(ask_id, presented, remote))
        try:
            answered = await asyncio.wait_for(answer, timeout=5.0)
        except (asyncio.TimeoutError, EOFError):
            raise Refusal(503, "the token check is unavailable for a moment", retry_after=1) from None
        finally:
            self._asks.pop(ask_id, None)
        if isinstance(answered, Granted):
            return answered.grant
        raise Refusal(answered.status, answered.reason, retry_after=answered.retry_after)

    async def render_wait_for(self, secret: str) -> int:
        """A payload still rendering: its node's Retry-After, from its place in the owner's
        render queue. An answer serves the same node for WAIT_REUSE_S, less the time gone
        (Ignition retries a 503 after 0.2, 0.4 and 0.8 s: one question to the owner, not three);
        not longer, or a first guess would outlive a rate that changed."""
        now = time.monotonic()
        asked = self._waits_told.get(secret)
        if asked is not None and now - asked[0] < WAIT_REUSE_S:
            return max(1, round(asked[1] - (now - asked[0])))
        seconds = await self._ask_wait(secret)
        if len(self._waits_told) >= WAITS_KEPT:  # those asked long ago go
            self._waits_told = {s: a for s, a in self._waits_told.items() if now - a[0] < WAIT_REUSE_S}
        self._waits_told[secret] = (now, seconds)
        return seconds

    async def _ask_wait(self, secret: str) -> int:
        """The owner's answer, or what it last told every worker if it cannot answer at once."""
        if self._owner_gone:
            return self._render_wait
        ask_id = next(self._ids)
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._wait_asks[ask_id] = answer
        self.channel.send(AskWait(ask_id, secret))
        try:
            return await asyncio.wait_for(answer, timeout=WAIT_ASK_TIMEOUT)
        except (asyncio.TimeoutError, EOFError):
            return self._render_wait
        finally:
            self._wait_asks.pop(ask_id, None)

    async def run(self, stop: asyncio.Event) -> None:
        settings = self.spec.settings
        ssl_context, tls_loaded = serving_context(self.spec.tls_files, settings.tls.profile)
        hosts = HostCertificates.for_files(self.spec.tls_files, settings.tls.profile)  # taken-over clusters' Routes
        if hosts is not None:
            hosts.install(ssl_context)
        guard = ConnectionGuard(settings.header_timeout, settings.connections_per_source, settings.connections_total,
                                self.connections.row(self.spec.number), handshake_timeout=settings.handshake_timeout)
        runner, _port = await start_site(build_dispatch(self.handlers), (settings.listen[0], self.spec.port), ssl_context,
                                         guard=guard, shutdown_timeout=settings.shutdown_timeout, reuse_port=True,
                                         proxy_from=settings.proxy_protocol_from, edge_listener=self.edge_listener,
                                         edge_shared=True)
        self.state.ready = True
        self.channel.send(Ready(os.getpid()))
        tasks = [
            asyncio.create_task(self._receive(stop), name="owner-channel"),
            asyncio.create_task(self._report_periodically(), name="report"),
            asyncio.create_task(reload_on_change(ssl_context, self.spec.tls_files, loaded=tls_loaded),
                                name="tls-reload"),
        ]
        if hosts is not None:
            tasks.append(asyncio.create_task(refresh_periodically(hosts), name="sni-hosts"))
        try:
            await stop.wait()
        finally:
            log.info("worker %d draining: no new connections, finishing in-flight responses", self.spec.number)
            self.state.draining = True
            await runner.cleanup()  # stops accepting, finishes in-flight responses
            await guard.wait_closed(settings.shutdown_timeout)  # and their last bytes leave before we exit
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._report()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.channel.drain(), 2.0)
            self.handlers.close()

    async def _receive(self, stop: asyncio.Event) -> None:
        try:
            while True:
                match await self.channel.receive():
                    case IndexChanges(generation, changes):
                        self.cache.apply(changes)
                        self.generation = generation
                    case Granted() | Refused() as answered:
                        answer = self._asks.get(answered.ask_id)
                        if answer is not None and not answer.done():
                            answer.set_result(answered)
                    case WaitIs(ask_id, seconds):
                        waiting = self._wait_asks.get(ask_id)
                        if waiting is not None and not waiting.done():
                            waiting.set_result(seconds)
                    case Behind(what):
                        self._behind = what
                    case RenderWaitIs(seconds):
                        self._render_wait = seconds
                    case Hold(source, seconds):  # every failure is the owner's to count; it says whom to hold off
                        self.limiter.hold(source, seconds)
                    case ReportNow(report_id):  # a scrape of the owner's /metrics is waiting
                        self._report()
                        self.channel.send(Reported(report_id))
                    case Drain():
                        break
        except EOFError:
            log.warning("worker %d: the owner process is gone; draining", self.spec.number)
        finally:
            self._owner_gone = True
            for answer in self._asks.values():
                if not answer.done():
                    answer.set_exception(EOFError())
            for waiting in self._wait_asks.values():
                if not waiting.done():
                    waiting.set_exception(EOFError())
            stop.set()

    async def _report_periodically(self) -> None:
        ticks = answered = 0
        served_since_trim = False
        while True:
            await asyncio.sleep(REPORT_INTERVAL)
            self._report()
            before, answered = answered, sum(self._reported.get("codes", Counter()).values())  # so far
            served = answered != before
            served_since_trim |= served
            ticks += 1
            if ticks % TRIM_EVERY == 0 or (served_since_trim and not served):
                # Bodies come from the heap here (memory.SERVING_MMAP_THRESHOLD); what a storm
                # freed between live ones goes back to the OS instead of staying in RSS: during
                # a long one every TRIM_EVERY reports, and at once when it is over (a quiet
                # second after serving; at 5,280 NodePools served once, ~40 MiB a worker).
                served_since_trim = False
                await asyncio.to_thread(memory.release)

    def _report(self) -> None:
        """What the owner's /metrics and status writes need: deltas since the last report."""
        nodepools = Counter(self.metrics.get_requests.counts())
        codes = Counter(self.metrics.responses.counts())
        stats = self.cache.stats()
        cache: Counter[str | int] = Counter({"memory_hits": stats.memory_hits, "disk_hits": stats.disk_hits, "misses": stats.misses,
                         "quarantined": stats.quarantined})
        deltas: dict[str, dict[str | int, int]] = {}
        for name, now in (("nodepools", nodepools), ("codes", codes), ("cache", cache)):
            before = self._reported.get(name, Counter())
            delta = now - before
            if delta:
                deltas[name] = dict(delta)
            self._reported[name] = now
        held = {"memory": stats.memory_bytes, "ready": self.handlers.ready_held()}
        if deltas or self._served or held != self._held:
            self.channel.send(Report(deltas, sorted(self._served), held))
            self._served.clear()
            self._held = held


async def _main(fd: int, connections_fd: int, edge_fd: int | None = None) -> None:
    channel = await Channel.open(socket.socket(fileno=fd))
    hello = await channel.receive()
    assert isinstance(hello, Hello)
    spec = hello.spec
    del hello  # `spec` alone holds the rows now (let go of below)
    logs.configure(spec.settings.log_format)
    memory.tune(memory.SERVING_MMAP_THRESHOLD)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # Ctrl-C reaches the whole process group: the owner decides when workers drain.
    loop.add_signal_handler(signal.SIGINT, lambda: None)
    started = time.perf_counter()
    edge = socket.socket(fileno=edge_fd) if edge_fd is not None else None
    worker = Worker(spec, channel, ConnectionTable.attach(connections_fd), edge)
    del spec  # its rows: the worker keeps them in its index only
    log.info("worker %d (pid %d) serving %d payloads after %.3fs", worker.spec.number, os.getpid(),
             worker.cache.render_count(), time.perf_counter() - started)
    await worker.run(stop)


def main(argv: list[str] | None = None) -> int:
    from ..no_core_dumps import disable_core_dumps

    disable_core_dumps()  # an execve made this process dumpable again
    args = sys.argv[1:] if argv is None else argv
    fd, connections_fd = int(args[0]), int(args[1])
    edge_fd = int(args[2]) if len(args) > 2 else None  # --edge-socket's listener, the owner's
    try:
        import uvloop

        uvloop.run(_main(fd, connections_fd, edge_fd))
    except ImportError:
        asyncio.run(_main(fd, connections_fd, edge_fd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
