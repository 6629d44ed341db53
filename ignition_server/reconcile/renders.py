"""The watcher's renders: a NodePool's inputs to its payload in the cache, off the event loop.

The dispatcher (reconciler.py) calls `schedule` for each token Secret the token index took,
and `inputs_changed` for each changed object, which schedules exactly its readers (the
InputGraph, which `inputs_for` keeps current); the RenderScheduler decides when a NodePool
renders and stores the result. Renders run in threads with bounded concurrency, a burst of
changes to one NodePool's inputs renders once (debounce), and identical inputs render once (single-flight, by inputs digest), so
serving never stalls. A failed render keeps the last good payload serving, says why in the
Secret's status and is retried with back-off; a render waits (no status churn) while its
release or generated base is not known yet (release_waits.py, generated_bases.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from payload_cache import PayloadCache, RenderRecord

from .. import memory
from ..metrics import ServerMetrics
from ..render.inputs import InvalidConfig, NodePoolInputs, RefusedInput, RenderedPayload, refusal
from ..model.objects import ManifestError, ObjectKey
from ..model.token_secret import TokenSecret
from .bases import BaseIndex
from .faults import Faults, backoff
from .gather import gather, gather_for_render
from .generated_bases import GeneratedBaseWaits
from .input_graph import InputGraph
from .release_waits import ReleaseWaits
from .releases import Releases
from .status import WAIT, Status
from .tenancy import OutsideTenancy, Tenancy

log = logging.getLogger("ignition_server.reconcile")

Renderer = Callable[[NodePoolInputs], RenderedPayload]


@dataclass
class PendingRender:
    task: asyncio.Task[None]
    digest: str


@dataclass
class RenderScheduler:
    """When a NodePool renders, and what becomes of the result: queued, debounced, single-flight."""

    source: Any
    cache: PayloadCache
    renderer: Renderer
    metrics: ServerMetrics
    faults: Faults
    releases: Releases
    bases: BaseIndex
    tenancy: Tenancy
    input_graph: InputGraph  # told what each render read
    release_waits: ReleaseWaits  # asked before a render: is its release known?
    base_waits: GeneratedBaseWaits  # and its generated base?
    secret_of: Callable[[ObjectKey], TokenSecret | None]  # the token Secret as the index holds it now
    persist_index: Callable[[], Awaitable[None]]  # durable before a render is said to be done
    write_status: Callable[[ObjectKey, dict[str, Any] | None, Status], None]  # queued, never awaited
    clock: Callable[[], float] = time.time
    debounce: float = 0.05  # a burst of changes to one NodePool's inputs renders once
    render_concurrency: int = 2
    _renders: dict[str, asyncio.Task[RenderedPayload]] = field(default_factory=dict)  # by inputs digest
    _pending: dict[ObjectKey, PendingRender] = field(default_factory=dict)
    _failures: dict[ObjectKey, tuple[str, int, float]] = field(default_factory=dict)  # digest, attempts, retry at
    _semaphore: asyncio.Semaphore | None = None

    def inputs_for(self, secret: TokenSecret) -> NodePoolInputs:
        try:
            inputs, deps = gather(secret, secret.annotations, self.source.get, self.releases, bases=self.bases,
                                  generated=self.base_waits.known, tenancy=self.tenancy)
        except OutsideTenancy as exc:
            self.metrics.tenancy_refusals.labels(what="input").inc()
            raise InvalidConfig(str(exc)) from None
        except ManifestError as exc:
            raise InvalidConfig(str(exc)) from None
        self.input_graph.track(secret.key, deps)
        return inputs

    def inputs_changed(self, dependency: ObjectKey) -> None:
        """Re-render exactly the NodePools that read `dependency` (the digest decides if anything changed)."""
        for key in self.input_graph.readers_of(dependency):
            secret = self.secret_of(key)
            if secret is not None:
                self.schedule(secret)

    def schedule(self, secret: TokenSecret) -> None:
        """Render `secret`'s NodePool if its inputs changed (or its last render failed and is due)."""
        try:
            inputs = self.inputs_for(secret)
        except InvalidConfig as exc:
            self._render_failed(secret, "", str(exc))
            return
        except Exception as exc:  # a bug in reading one NodePool's inputs must not stop the others
            self._render_failed(secret, "", f"cannot gather the inputs: {type(exc).__name__}: {exc}")
            return
        digest = inputs.digest()
        based = self.base_waits.blocked(secret, inputs)  # a base still to generate: the payload is not current
        record = self.cache.get_render(secret.ref)
        if record is not None and record.inputs_digest == digest and self.cache.has_blob(record.blob_id) \
                and secret.reason in (None, "", "AsExpected") and based is None:
            self._failures.pop(secret.key, None)
            return
        # (A Secret that says a render failed although its payload is current, as after its
        # config was broken and then put back, renders once more so its status says so.)
        blocked = self.release_waits.blocked(secret, inputs)
        if blocked is None:
            blocked = based
        if blocked == WAIT:
            return  # release_waits.resolved (base_waits.generated) brings it back
        if isinstance(blocked, Status):
            self._render_failed(secret, digest, blocked.message, blocked.reason)
            return
        pending = self._pending.get(secret.key)
        if pending is not None:
            if pending.digest == digest:
                return
            pending.task.cancel()
        failure = self._failures.get(secret.key)
        if failure is not None and failure[0] == digest and failure[2] > self.clock():
            return  # the retry timer will come back to it
        task = asyncio.create_task(self._render_and_store(secret, digest), name=f"render {secret.ref}")
        self._pending[secret.key] = PendingRender(task, digest)
        self.metrics.render_queue.set(len(self._pending))

    async def _render_and_store(self, secret: TokenSecret, digest: str) -> None:
        try:
            await asyncio.sleep(self.debounce)  # a newer change in the meantime cancels this one
            try:
                rendered = await self._render_once(secret, digest)
                blob_id = await asyncio.to_thread(self.cache.put_blob, rendered.body)
            except InvalidConfig as exc:
                self._render_failed(secret, digest, str(exc), retry=not isinstance(exc, RefusedInput))
                return
            except Exception as exc:  # a renderer bug must not take the watcher down
                log.debug("render of %s failed", secret.ref, exc_info=True)
                self._render_failed(secret, digest, f"render failed: {type(exc).__name__}: {exc}")
                return
            self.cache.put_render(
                RenderRecord(secret.ref, secret.nodepool, digest, blob_id, rendered.min_version, self.clock())
            )
            self.metrics.payloads_cached.set(self.cache.render_count())
            self._failures.pop(secret.key, None)
            self.faults.succeeded("render", secret.ref)
            # Durable before we say so: a crash after "AsExpected" must not cost a render.
            await self.persist_index()
            log.info("payload ready for %s (%s, %d bytes)", secret.nodepool, secret.ref, len(rendered.body))
            message = "; ".join(rendered.notes)
            # Queued, not awaited: the write-back re-enters the handler, and a render must
            # not wait on (or fail with) what that does to other objects.
            self.write_status(secret.key, None, Status("AsExpected", message))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # e.g. the index flush: the next housekeeping tick flushes again
            self.faults.failed("render", secret.ref, exc)
        finally:
            current = self._pending.get(secret.key)
            if current is not None and current.task is asyncio.current_task():
                del self._pending[secret.key]
            self.metrics.render_queue.set(len(self._pending))
            if not self._pending:
                await asyncio.to_thread(memory.release)  # a burst of renders is over

    async def _render_once(self, secret: TokenSecret, digest: str) -> RenderedPayload:
        running = self._renders.get(digest)
        if running is None:
            running = asyncio.ensure_future(self._render(secret))
            self._renders[digest] = running
            running.add_done_callback(lambda _t: self._renders.pop(digest, None))
        return await asyncio.shield(running)

    async def _render(self, secret: TokenSecret) -> RenderedPayload:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.render_concurrency)
        async with self._semaphore:
            self.metrics.payload_cache_miss.inc()
            started = time.perf_counter()
            try:
                return await asyncio.to_thread(self._render_full, secret)
            finally:
                self.metrics.payload_generation.observe(time.perf_counter() - started)

    def _render_full(self, secret: TokenSecret) -> RenderedPayload:
        """Read what the render needs in full (the config, large inputs) and render. Runs in a thread."""
        obj = self.source.get_full(secret.key)
        if obj is None:
            raise InvalidConfig(f"{secret.ref} is no longer in the source")
        try:
            inputs = gather_for_render(
                secret, obj, self.source.get_full, self.releases, self.bases, self.base_waits.known, self.tenancy,
            )
        except ManifestError as exc:
            raise refusal(exc, str(exc)) from None
        return self.renderer(inputs)

    def _render_failed(self, secret: TokenSecret, digest: str, message: str, reason: str = "InvalidConfig",
                       *, retry: bool = True) -> None:
        self.metrics.render_failures.inc()
        previous = self._failures.get(secret.key)
        attempts = previous[1] + 1 if previous and previous[0] == digest else 1
        delay = backoff(attempts) if retry else math.inf  # until the inputs change
        self._failures[secret.key] = (digest, attempts, self.clock() + delay)
        serving = "the last good payload keeps serving" if self.cache.get_render(secret.ref) else "no payload yet"
        self.faults.failed("render", secret.ref, f"{message} ({serving})")  # logged once, counted
        self.write_status(secret.key, None, Status(reason, message))

    async def retry_failed(self) -> None:
        now = self.clock()
        for key, (_digest, _attempts, retry_at) in list(self._failures.items()):
            secret = self.secret_of(key)
            if secret is None:
                self._failures.pop(key, None)
            elif retry_at <= now and key not in self._pending:
                self._failures[key] = (_digest, _attempts, 0.0)
                self.schedule(secret)

    def payload_missing(self, secret_ref: str) -> None:
        """The stored payload is gone or failed its integrity check: render it again."""
        namespace, _, name = secret_ref.partition("/")
        secret = self.secret_of(ObjectKey("Secret", namespace, name))
        if secret is not None:
            self.schedule(secret)  # has_blob is False now, so this renders

    def clear_backoff(self, key: ObjectKey) -> None:
        """What the NodePool's failed render waited for has changed: the next schedule renders at once."""
        self._failures.pop(key, None)

    def forget(self, key: ObjectKey) -> None:
        """The token Secret is gone: its queued render is cancelled (its back-off goes at the next retry_failed)."""
        pending = self._pending.pop(key, None)
        if pending:
            pending.task.cancel()

    def pending(self) -> list[asyncio.Task[None]]:
        """The renders queued or running."""
        return [p.task for p in self._pending.values()]
