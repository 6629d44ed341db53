"""Prometheus metrics with HyperShift's names, so existing dashboards keep working.

Every server builds its own registry (no process-global state); `/metrics` on the
metrics port serves it.
"""

from __future__ import annotations

from collections import Counter as Tally
from typing import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from payload_cache import CacheStats

from . import tallies
from .tallies import ConnectionCounts

# The reference's buckets (5-60 s renders) plus fast ones for our own renderer.
GENERATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 40, 50, 60)


class LabelTally(tallies.Tally, Collector):
    """A counter by one label, counted without a lock (tallies.Tally), exposed as a Prometheus counter."""

    def __init__(self, name: str, documentation: str, label: str, *, sample: str | None = None) -> None:
        super().__init__()
        self._name, self._documentation, self._label = name, documentation, label
        self._sample = sample or name

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self._name, self._documentation, "counter")
        for value, count in sorted(self.counts().items(), key=lambda item: str(item[0])):
            metric.add_sample(self._sample, {self._label: str(value)}, float(count))
        yield metric


class _CacheCollector(Collector):
    def __init__(self, stats: Callable[[], CacheStats], metrics: ServerMetrics) -> None:
        self._stats = stats
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        stats = self._stats()
        elsewhere = self._metrics.worker_cache  # hits and misses reported by serving workers
        held = self._metrics.worker_held.values()
        hits = Metric("ign_server_cache_hits", "Payload cache hits by tier", "counter")
        for tier in ("memory", "disk"):
            count = getattr(stats, f"{tier}_hits", 0) + elsewhere[f"{tier}_hits"]
            hits.add_sample("ign_server_cache_hits_total", {"tier": tier}, float(count))
        yield hits
        misses = Metric("ign_server_cache_misses", "Payload cache misses (no blob on disk)", "counter")
        misses.add_sample("ign_server_cache_misses_total", {}, float(getattr(stats, "misses", 0) + elsewhere["misses"]))
        yield misses
        # memory + ready, over every serving process, stays within --cache-memory.
        size = GaugeMetricFamily("ign_server_cache_bytes", "Payload bytes held, by tier (ready: bodies kept at the "
                                 "version asked for)", labels=["tier"])
        size.add_metric(["memory"], float(getattr(stats, "memory_bytes", 0) + sum(h["memory"] for h in held)))
        size.add_metric(["ready"], float(self._metrics.ready_held() + sum(h["ready"] for h in held)))
        size.add_metric(["disk"], float(getattr(stats, "disk_bytes", 0)))
        yield size
        quarantined = Metric("ign_server_cache_quarantined_blobs", "Blobs that failed their integrity check", "counter")
        quarantined.add_sample("ign_server_cache_quarantined_blobs_total", {},
                               float(getattr(stats, "quarantined", 0) + elsewhere["quarantined"]))
        yield quarantined
        gc_runs = Metric("ign_server_cache_gc_runs", "Garbage collections of unreferenced blobs", "counter")
        gc_runs.add_sample("ign_server_cache_gc_runs_total", {}, float(getattr(stats, "gc_runs", 0)))
        yield gc_runs


class _ConnectionCollector(Collector):
    """Read from the shared connection table at scrape time: every serving process's row."""

    def __init__(self, counts: Callable[[], ConnectionCounts], processes: Sequence[str]) -> None:
        self._counts = counts
        self._processes = tuple(processes)

    def collect(self) -> Iterable[Metric]:
        counts = self._counts()
        held = GaugeMetricFamily("ign_server_connections_open", "Open connections, by serving process",
                                 labels=["process"])
        for process, count in zip(self._processes, counts.open):
            held.add_metric([process], float(count))
        yield held
        refused = Metric("ign_server_connections_refused",
                         "Connections closed on arrival: their address or the server was at its limit", "counter")
        refused.add_sample("ign_server_connections_refused_total", {}, float(counts.refused))
        yield refused
        slow = Metric("ign_server_connections_timed_out",
                      "Connections closed because their first request's headers took longer than --header-timeout",
                      "counter")
        slow.add_sample("ign_server_connections_timed_out_total", {}, float(counts.timed_out))
        yield slow


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        # `ign_server_get_request{nodePool}` with HyperShift's exact name (a Counter appends _total).
        self.get_requests = LabelTally("ign_server_get_request", "Payload requests served, by authenticated NodePool",
                                       "nodePool")
        self.registry.register(self.get_requests)
        self.token_rotations = Counter(
            "ign_server_token_rotation", "Token rotations performed", registry=self.registry
        )
        self.payload_cache_miss = Counter(
            "ign_server_payload_cache_miss",
            "Requests or reconciles that needed a payload render",
            registry=self.registry,
        )
        self.payload_generation = Histogram(
            "ign_server_payload_generation_seconds",
            "Time to render one payload",
            buckets=GENERATION_BUCKETS,
            registry=self.registry,
        )
        self.payloads_cached = Gauge(
            "ign_server_payload_cache_total", "Payloads ready to serve", registry=self.registry
        )
        self.render_failures = Counter(
            "ign_server_render_failures", "Renders that failed (the last good payload keeps serving)",
            registry=self.registry,
        )
        self.render_queue = Gauge("ign_server_render_queue_depth", "NodePools queued (now, debouncing or after a "
                                  "back-off) or being reconciled", registry=self.registry)
        self.reconciles = Counter(
            "ign_server_reconciles", "NodePools reconciled, by outcome: current (nothing to do), rendered, "
            "waiting (for a release or base), failed, backing-off, gone", ["outcome"], registry=self.registry,
        )
        self.responses = LabelTally("ign_server_responses", "Responses by status code", "code",
                                    sample="ign_server_responses_total")
        self.registry.register(self.responses)

        self.watch_errors = Counter(
            "ign_server_watch_errors", "Faults in handling one object (retried with back-off), by step",
            ["step"], registry=self.registry,
        )
        self.rotation_overdue = Gauge(
            "ign_server_rotation_overdue_secrets",
            "Token Secrets whose last rotation is older than the TTL although this server rotates them",
            registry=self.registry,
        )
        # The wall between tenants (reconcile/tenancy.py): what one namespace tried to do to another.
        self.tenancy_refusals = Counter(
            "ign_server_tenancy_refusals",
            "Objects refused for reaching past their namespace (what: input, shared-object, duplicate-token, "
            "service-account-key)", ["what"], registry=self.registry,
        )
        # Kubernetes mode: the informers' health and the Lease.
        self.source_watch_up = Gauge(
            "ign_server_source_watch_up", "1 while a watch stream of the source is live and current", ["kind"],
            registry=self.registry,
        )
        self.source_watch_restarts = Counter(
            "ign_server_source_watch_restarts", "Watch streams started again (reason: ended, gone, error)",
            ["kind", "reason"], registry=self.registry,
        )
        self.api_requests = Counter(
            "ign_server_api_requests", "Requests to the Kubernetes API server, by verb", ["verb"], registry=self.registry,
        )
        # Releases read from registries (registry/).
        self.registry_requests = Counter(
            "ign_server_registry_requests", "Requests to image registries, by registry host and result",
            ["registry", "result"], registry=self.registry,
        )
        self.registry_bytes = Counter(
            "ign_server_registry_bytes", "Bytes received from image registries (manifests and layers)", registry=self.registry,
        )
        self.release_fetches = Counter(
            "ign_server_release_fetches", "Releases read from a registry (not the catalog or the cache)", registry=self.registry,
        )
        self.base_generations = Counter(
            "ign_server_base_generations", "MCO bootstrap runs generating a base (cluster configuration, release), by result",
            ["result"], registry=self.registry,
        )
        self.release_resolution = Histogram(
            "ign_server_release_resolution_seconds", "Time to resolve a release (cache or registry)",
            buckets=GENERATION_BUCKETS, registry=self.registry,
        )
        self.leader = Gauge("ign_server_leader", "1 on the replica that holds the Lease (the writer)", registry=self.registry)
        # Worker processes (serve --workers N): their own counters arrive as reports.
        self.workers_serving = Gauge("ign_server_workers_serving", "Worker processes serving now", registry=self.registry)
        self.worker_restarts = Counter(
            "ign_server_worker_restarts", "Worker processes started again after they exited", registry=self.registry,
        )
        self.worker_cache: Tally[str] = Tally()
        # Payload bytes each worker holds now, by tier ("memory", "ready"), from its last report.
        self.worker_held: dict[int, Tally[str]] = {}
        # Bodies kept ready by this process, when it serves itself (one process).
        self.ready_held: Callable[[], int] = lambda: 0

    def render_progress(self) -> tuple[float, float]:
        """(NodePools queued for a render now, renders started since the process did): what
        the 503's Retry-After follows (workers/render_wait.py)."""
        depth = next(iter(self.render_queue.collect())).samples[0].value
        started = next(s.value for s in next(iter(self.payload_cache_miss.collect())).samples if s.name.endswith("_total"))
        return depth, started

    def watch_cache(self, stats: Callable[[], CacheStats]) -> None:
        self.registry.register(_CacheCollector(stats, self))

    def watch_connections(self, counts: Callable[[], ConnectionCounts], processes: Sequence[str]) -> None:
        """`processes` names the table's rows, in order (the request-id prefixes' `w0`, `w1`, ...)."""
        self.registry.register(_ConnectionCollector(counts, processes))
