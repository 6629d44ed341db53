"""The proxy controller's own metrics (HAProxy's traffic figures come from its exporter)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


@dataclass
class ProxyMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.map_entries = Gauge("ign_proxy_token_map_entries", "Opaque-token hashes in a route's map", ["route"], registry=r)
        self.last_sync = Gauge("ign_proxy_last_sync_timestamp_seconds", "When HAProxy last matched the table and publications", registry=r)
        self.runtime_errors = Counter("ign_proxy_runtime_api_errors", "Runtime API commands HAProxy refused or missed", registry=r)
        self.reloads = Counter("ign_proxy_reloads", "HAProxy reloads (only what the runtime API cannot change)", registry=r)
        self.runtime_changes = Counter("ign_proxy_runtime_changes", "Changes applied without a reload", ["kind"], registry=r)
        self.input_errors = Counter("ign_proxy_input_errors", "Unusable tables or publications (the last good one kept)", registry=r)

    def text(self) -> bytes:
        return generate_latest(self.registry)
