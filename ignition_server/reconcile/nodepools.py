"""What happens to one NodePool: `NodePools.reconcile`, run by the work queue for each key queued.

The dispatcher (reconciler.py) indexes each token Secret and queues its key (`schedule`);
a change to anything a NodePool reads queues exactly its readers (`inputs_changed`, through
the input graph). The queue (work_queue.py) takes keys fairly: one lane per namespace,
round-robin, a first payload before any re-render, one run per key at a time, a burst
coalesced. Then, for one key, top to bottom:

    reconcile(key)
      the token Secret as indexed ─ gone? nothing to do
      gather its inputs ─ invalid? status, back-off
      current payload for this inputs digest? done
      blocked on a release or generated base? wait (its arrival queues the key again),
        or status + back-off when it cannot be had
      failed before with these inputs? the queue brings it back when the back-off ends
      render (one per inputs digest, in a thread) ─ failed? status, back-off; last good payload serves
      store ─ status `AsExpected` (written once the index is on disk)
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Literal, Protocol

from payload_cache import PayloadCache, RenderRecord

from .. import memory
from ..metrics import ServerMetrics
from ..model.objects import ManifestError, ObjectKey, secret_key
from ..model.token_secret import TokenSecret
from ..render.inputs import InvalidConfig, NodePoolInputs, RefusedInput, RenderedPayload, refusal
from ..sources.events import Source
from .bases import BaseIndex
from .faults import Faults, backoff
from .gather import gather, gather_for_render
from .generated_bases import GeneratedBaseWaits
from .input_graph import InputGraph
from .release_waits import ReleaseWaits
from .releases import Releases
from .status import Status, Waiting
from .tenancy import OutsideTenancy, Tenancy
from .work_queue import WorkQueue

log = logging.getLogger("ignition_server.reconcile")

Renderer = Callable[[NodePoolInputs], RenderedPayload]
Outcome = Literal["current", "rendered", "waiting", "failed", "backing-off", "gone"]


class StatusWriter(Protocol):
    """Writes a token Secret's status (queued per object, never awaited); `durable` runs first."""

    def __call__(self, key: ObjectKey, obj: dict[str, Any] | None, status: Status, *,
                 durable: Callable[[], Awaitable[None]] | None = None) -> None: ...


@dataclass
class RenderFailure:
    """A NodePool's last failed attempt: with these inputs, this often, not again before `retry_at`."""

    digest: str
    attempts: int
    retry_at: float


@dataclass
class NodePools:
    source: Source
    cache: PayloadCache
    renderer: Renderer
    metrics: ServerMetrics
    faults: Faults
    releases: Releases
    bases: BaseIndex
    tenancy: Tenancy
    input_graph: InputGraph  # told what each NodePool read; names the readers of a changed object
    release_waits: ReleaseWaits  # asked before a render: is its release known?
    base_waits: GeneratedBaseWaits  # and its generated base?
    secret_of: Callable[[ObjectKey], TokenSecret | None]  # the token Secret as the index holds it now
    persist_index: Callable[[], Awaitable[None]]  # the index on disk before a render is said to be done
    write_status: StatusWriter
    clock: Callable[[], float] = time.time
    debounce: float = 0.05  # a burst of changes to a payload that already serves renders once
    render_concurrency: int = 2
    queue: WorkQueue[ObjectKey] = field(init=False)
    _renders: dict[str, asyncio.Future[RenderedPayload]] = field(default_factory=dict)  # by inputs digest
    _failures: dict[ObjectKey, RenderFailure] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.queue = WorkQueue(process=self._reconcile_counted, lane_of=lambda key: key.namespace,
                               concurrency=self.render_concurrency, on_depth=self.metrics.render_queue.set,
                               clock=self.clock)

    # -- what queues a NodePool ----------------------------------------------------------

    def schedule(self, secret: TokenSecret) -> None:
        """Reconcile `secret`'s NodePool soon: a first payload at once and ahead of re-renders."""
        first = self.cache.get_render(secret.ref) is None
        self.queue.add(secret.key, urgent=first, debounce=0.0 if first else self.debounce)

    def inputs_changed(self, dependency: ObjectKey) -> None:
        """Queue exactly the NodePools that read `dependency` (the digest decides if anything changed)."""
        for key in self.input_graph.readers_of(dependency):
            secret = self.secret_of(key)
            if secret is not None:
                self.schedule(secret)

    def payload_missing(self, secret_ref: str) -> None:
        """The stored payload is gone or failed its integrity check: render it again, first."""
        key = secret_key(secret_ref)
        if self.secret_of(key) is not None:
            self.queue.add(key, urgent=True)

    def renders_ahead(self, secret_ref: str) -> int | None:
        """Renders queued before this NodePool's (0: rendering now; None: not queued for one)."""
        return self.queue.ahead_of(secret_key(secret_ref))

    def dependency_arrived(self, dependency: ObjectKey) -> None:
        """What the readers of `dependency` waited for (a release, a generated base) is here, or
        failed: they are queued again, their back-off dropped (release_waits.py, generated_bases.py)."""
        for key in self.input_graph.readers_of(dependency):
            self._failures.pop(key, None)
        self.inputs_changed(dependency)

    def forget(self, key: ObjectKey) -> None:
        """The token Secret is gone: nothing of it waits any more."""
        self.queue.forget(key)
        self._failures.pop(key, None)

    # -- one NodePool, top to bottom -----------------------------------------------------

    async def _reconcile_counted(self, key: ObjectKey) -> None:
        self.metrics.reconciles.labels(outcome=await self.reconcile(key)).inc()

    async def reconcile(self, key: ObjectKey) -> Outcome:
        secret = self.secret_of(key)
        if secret is None:
            return "gone"  # since it was queued
        try:
            inputs = self._gather(secret)
        except InvalidConfig as exc:
            return self._failed(secret, "", str(exc))
        except Exception as exc:  # a bug in reading one NodePool's inputs must not stop the others
            return self._failed(secret, "", f"cannot gather the inputs: {type(exc).__name__}: {exc}")
        digest = inputs.digest()
        based = self.base_waits.blocked(secret, inputs)  # a base still to generate: the payload is not current
        if based is None and self._current(secret, digest):
            self._failures.pop(key, None)
            return "current"
        blocked = self.release_waits.blocked(secret, inputs) or based
        if isinstance(blocked, Waiting):
            return "waiting"
        if isinstance(blocked, Status):
            return self._failed(secret, digest, blocked.message, blocked.reason)
        if self._backing_off(key, digest):
            return "backing-off"
        try:
            rendered = await self._render_once(secret, inputs, digest)
            blob_id = await asyncio.to_thread(self.cache.put_blob, rendered.body)
        except InvalidConfig as exc:
            return self._failed(secret, digest, str(exc), retry=not isinstance(exc, RefusedInput))
        except Exception as exc:  # a renderer bug must not take the reconciler down
            log.debug("render of %s failed", secret.ref, exc_info=True)
            return self._failed(secret, digest, f"render failed: {type(exc).__name__}: {exc}")
        self._store(secret, digest, blob_id, rendered)
        # Durable before it says so: a crash after "AsExpected" must not cost a render.
        self.write_status(key, None, Status("AsExpected", "; ".join(rendered.notes)), durable=self.persist_index)
        if self.queue.depth() <= 1:
            await asyncio.to_thread(memory.release)  # a burst of renders is over
        return "rendered"

    def _gather(self, secret: TokenSecret) -> NodePoolInputs:
        """What the NodePool reads now (slim: large values as digests), recorded in the input graph."""
        try:
            inputs, deps = gather(secret, secret.annotations, self.source.get, self.releases, bases=self.bases,
                                  generated=self.base_waits.lookup(), tenancy=self.tenancy, consumed=self.base_waits.consumed)
        except OutsideTenancy as exc:
            self.metrics.tenancy_refusals.labels(what="input").inc()
            if exc.key is not None:  # judged again when the operator marks (or adds) that object
                self.input_graph.track(secret.key, frozenset({exc.key}))
            raise InvalidConfig(str(exc)) from None
        except ManifestError as exc:
            raise InvalidConfig(str(exc)) from None
        self.input_graph.track(secret.key, deps)
        return inputs

    def _current(self, secret: TokenSecret, digest: str) -> bool:
        """The stored payload was rendered from these inputs and its Secret says so.
        (A Secret that says a render failed although its payload is current, as after its
        config was broken and then put back, renders once more so its status says so.)"""
        record = self.cache.get_render(secret.ref)
        return record is not None and record.inputs_digest == digest and self.cache.has_blob(record.blob_id) \
            and secret.reason in (None, "", "AsExpected")

    def _backing_off(self, key: ObjectKey, digest: str) -> bool:
        failure = self._failures.get(key)
        if failure is None or failure.digest != digest:
            return False
        wait = failure.retry_at - self.clock()
        if wait <= 0:
            return False
        if math.isfinite(wait):
            self.queue.add_later(key, wait)  # brought back when the back-off ends
        return True

    async def _render_once(self, secret: TokenSecret, decided: NodePoolInputs, digest: str) -> RenderedPayload:
        running = self._renders.get(digest)
        if running is None:
            running = asyncio.ensure_future(self._render(secret, decided))
            self._renders[digest] = running
            running.add_done_callback(lambda _t: self._renders.pop(digest, None))
        return await asyncio.shield(running)

    async def _render(self, secret: TokenSecret, decided: NodePoolInputs) -> RenderedPayload:
        self.metrics.payload_cache_miss.inc()
        started = time.perf_counter()
        try:
            return await asyncio.to_thread(self._render_full, secret, decided)
        finally:
            self.metrics.payload_generation.observe(time.perf_counter() - started)

    def _render_full(self, secret: TokenSecret, decided: NodePoolInputs) -> RenderedPayload:
        """Read what the render needs in full (the config, large inputs) and render. Runs in a thread.

        The release's images are the ones the decision to render saw (`decided`), not the catalog
        as it may stand a moment later: the payload is what its stored inputs digest says, so a
        catalog listed during the render queues one more render rather than a record that lies."""
        obj = self.source.get_full(secret.key)
        if obj is None:
            raise InvalidConfig(f"{secret.ref} is no longer in the source")
        try:
            inputs = gather_for_render(
                secret, obj, self.source.get_full, self.releases, self.bases, self.base_waits.lookup(), self.tenancy,
            )
        except ManifestError as exc:
            raise refusal(exc, str(exc)) from None
        inputs = replace(inputs, haproxy_image=decided.haproxy_image, os_image_url=decided.os_image_url,
                         extensions_image=decided.extensions_image)
        return self.renderer(inputs)

    def _store(self, secret: TokenSecret, digest: str, blob_id: str, rendered: RenderedPayload) -> None:
        self.cache.put_render(
            RenderRecord(secret.ref, secret.nodepool, digest, blob_id, rendered.min_version, self.clock())
        )
        self.metrics.payloads_cached.set(self.cache.render_count())
        self._failures.pop(secret.key, None)
        self.faults.succeeded("render", secret.ref)
        log.info("payload ready for %s (%s, %d bytes)", secret.nodepool, secret.ref, len(rendered.body))

    def _failed(self, secret: TokenSecret, digest: str, message: str, reason: str = "InvalidConfig",
                *, retry: bool = True) -> Outcome:
        """Say why (status, log once, metric) and come back after the back-off (never, for a
        refusal that the same bytes would earn again: until the inputs change)."""
        self.metrics.render_failures.inc()
        previous = self._failures.get(secret.key)
        attempts = previous.attempts + 1 if previous is not None and previous.digest == digest else 1
        delay = backoff(attempts) if retry else math.inf
        self._failures[secret.key] = RenderFailure(digest, attempts, self.clock() + delay)
        if retry:
            self.queue.add_later(secret.key, delay)
        serving = "the last good payload keeps serving" if self.cache.get_render(secret.ref) else "no payload yet"
        self.faults.failed("render", secret.ref, f"{message} ({serving})")  # logged once, counted
        self.write_status(secret.key, None, Status(reason, message))
        return "failed"

