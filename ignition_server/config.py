"""Settings: plain typed values built once by the CLI and passed down; nothing here does I/O.

Each default is written once, here: the CLI's flags take theirs from these fields.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path

from .tls.profiles import TLSProfile

DEFAULT_TOKEN_TTL = 11 * 3600.0  # HyperShift's token TTL
SUPERSEDED_GRACE = 2 * 3600.0
# --registry-allow: releases and their images as Red Hat ships them (quay.io is open to anyone,
# so only its OpenShift release organisation), and Red Hat's own registry (registry/allowed.py).
DEFAULT_REGISTRY_ALLOW = "quay.io/openshift-release-dev,registry.redhat.io"  # an outdated token Secret stays valid this long (DESIGN §3)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """'6s', '11h', '1h30m', '250ms' or plain seconds ('90') to seconds."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _DURATION_PART.finditer(value):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos != len(value) or not value:
            raise ValueError(f"not a duration: {text!r} (use e.g. 6s, 30m, 11h, 1h30m)") from None
    if seconds <= 0:
        raise ValueError(f"a duration must be positive: {text!r}")
    return seconds


def parse_cidrs(text: str) -> tuple[IPNetwork, ...]:
    """'10.0.0.0/8,fd00::/8' (or plain addresses) to networks; '' to none."""
    out: list[IPNetwork] = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            try:
                out.append(ipaddress.ip_network(part, strict=False))
            except ValueError:
                raise ValueError(f"not a CIDR: {part!r}") from None
    return tuple(out)


def parse_hostport(text: str, default_port: int) -> tuple[str, int]:
    """'HOST:PORT', ':PORT', 'HOST' or '[v6]:PORT'."""
    value = text.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest.lstrip(":") or str(default_port)
    elif value.count(":") == 1:
        host, port = value.split(":")
    elif value.count(":") > 1:
        host, port = value, str(default_port)
    else:
        host, port = value, str(default_port)
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"not HOST:PORT: {text!r}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"port out of range in {text!r}")
    return host or "0.0.0.0", number


@dataclass(frozen=True)
class PayloadMemory:
    """One serving process's share of --cache-memory, in bytes: its memory tier (payloads as
    stored) and its ready bodies (payloads at the version asked for, http/ready.py)."""

    tier: int
    ready: int


# The share of each serving process's payload memory kept as ready bodies. A fleet's nodes
# ask one version per boot image, so the ready bodies hold the hot NodePools; the memory tier
# is consulted only when they miss, and spares such a miss the disk read + AES-GCM (~35 of the
# ~55 µs a whole miss costs for 300 KiB, bench hotpath). A ready hit spares all of it.
READY_SHARE = 0.75
# 32 MiB in all: with 2 workers, ~40 payloads of 300 KiB ready in each (a storm's hot NodePools),
# and the server within its RSS target at 5,280 NodePools (bench/README.md, memory).
DEFAULT_CACHE_MEMORY = 32 * 1024 * 1024


def payload_memory(total: int, processes: int) -> PayloadMemory:
    """Split `total` (--cache-memory, for the whole server) among `processes` serving
    processes: together their memory tiers and ready bodies stay within it."""
    share = max(total, 0) // max(processes, 1)
    ready = int(share * READY_SHARE)
    return PayloadMemory(tier=share - ready, ready=ready)


@dataclass(frozen=True)
class TLSSettings:
    cert_file: Path | None = None
    key_file: Path | None = None
    profile: TLSProfile = TLSProfile()


@dataclass(frozen=True)
class RegistrySettings:
    """Reading releases from registries (off: only the catalog ConfigMaps)."""

    resolve: bool = False
    architecture: str = "amd64"
    overrides: str = ""  # --registry-overrides src=dst,...
    allow: str = DEFAULT_REGISTRY_ALLOW
    ca_file: Path | None = None  # trusted besides the system's CAs and each cluster's user-ca-bundle
    tag_ttl: float = 300.0
    timeout: float = 30.0
    # --generate-bases: a cluster without a given MCO base gets one from its release's MCO
    # (needs `resolve`: the MCO image is pulled with the same client).
    generate_bases: bool = False
    base_timeout: float = 300.0
    base_memory_bytes: int = 4 << 30
    # "namespaces": each step in its own namespaces, seeing nothing of the server's (basegen/sandbox.py);
    # "none": beside the server, as its user (only where nothing else runs with it).
    base_sandbox: str = "namespaces"
    base_uid: int = 65534  # as root: the uid the steps run as


@dataclass(frozen=True)
class ServeSettings:
    source_dir: Path
    cache_dir: Path
    listen: tuple[str, int] = ("0.0.0.0", 9090)  # HyperShift's ignition server port
    metrics_listen: tuple[str, int] | None = ("0.0.0.0", 8080)  # HyperShift's metrics port
    tls: TLSSettings = TLSSettings()
    token_ttl: float = DEFAULT_TOKEN_TTL
    # How long a replaced service-account signing key or token Secret stays accepted.
    service_account_overlap: float = 3600.0
    # Where to publish what a front proxy needs to check tokens (None: nothing published).
    edge_dir: Path | None = None
    # Peers trusted to start a connection with a PROXY header (the front proxy's addresses).
    proxy_protocol_from: tuple[IPNetwork, ...] = ()
    # A unix socket for the pod's own TLS edge (HAProxy terminating TLS in a container beside
    # the server): plain HTTP, each connection starting with a PROXY v2 header. None: off.
    edge_socket: Path | None = None
    public_url: str | None = None
    # The proxy a booting node needs to reach public_url: pointer configs carry it as
    # `ignition.proxy` (httpProxy, httpsProxy, noProxy); "" / () when none.
    node_http_proxy: str = ""
    node_https_proxy: str = ""
    node_no_proxy: tuple[str, ...] = ()
    cache_key_file: Path | None = None
    cache_memory_bytes: int = DEFAULT_CACHE_MEMORY  # payload bytes of the whole server (payload_memory)
    source_read_only: bool = False
    poll_interval: float = 1.0  # picks a change up within 2 s; inotify would make it instant
    render_concurrency: int = 2
    # Payload requests answered at once; more get 503 + Retry-After (memory stays bounded in a boot storm).
    max_in_flight: int = 1024
    # Failed authentications per source address before 503 + Retry-After, and their window.
    auth_failure_burst: int = 30
    auth_failure_window: float = 10.0
    # A connection's first request headers must be in within this; connections per address and in all.
    header_timeout: float = 10.0
    # A connection's PROXY header and TLS handshake must be done within this (ClientHello, then
    # the client's one or two answering flights: round trips, not a download).
    handshake_timeout: float = 2.0
    connections_per_source: int = 256
    connections_total: int = 10_000
    shutdown_timeout: float = 10.0
    log_format: str = "auto"  # text on a terminal, JSON otherwise (logs.resolve_format)
    # Kubernetes mode: the objects live in the API server; several replicas, one writer.
    kubernetes: bool = False
    kubeconfig: Path | None = None
    namespaces: tuple[str, ...] = ()
    pod_namespace: str = "default"
    # Namespaces whose objects may shape any NodePool (input-* references, release catalogs,
    # published bases, mirror sets); every other object shapes only its own namespace's.
    shared_namespaces: tuple[str, ...] = ("ignition-server",)
    replica_id: str = "ignition-server"
    lease_duration: float = 15.0
    prune_grace: float = 60.0
    # Keep what HyperShift's control plane stops writing for HostedControlPlanes annotated
    # disable-ignition-server (README, "Taking over from HyperShift's ignition server").
    take_over: bool = False
    # What HyperShift's control-plane-operator has in MANAGED_SERVICE where this server takes over
    # ("ARO-HCP" on Azure Red Hat OpenShift; "" elsewhere): the CPO's netutil.IsPrivateHCP reads it.
    managed_service: str = ""
    # The self-made CA: its lifetime (renewed at 80% of it, with an overlap of one token TTL).
    ca_lifetime: float = 3650 * 86400.0
    ca_check_interval: float = 60.0
    watch_timeout: float = 300.0
    # --kubernetes: bytes of objects kept whole per namespace (0: unbounded); past it, refused.
    namespace_budget: int = 64 << 20
    registry: RegistrySettings = RegistrySettings()
    # Serving processes beside the owner (0: the owner serves itself, one process in all). No
    # default here: the CLI's is "one per CPU this process may use" (workers/pool.py), which
    # reads the machine, and settings do no I/O.
    workers: int = field(kw_only=True)

    @property
    def serving_memory(self) -> PayloadMemory:
        """What each serving process may hold of payloads: the owner alone, or each worker."""
        return payload_memory(self.cache_memory_bytes, max(self.workers, 1))

    @property
    def edge_token_map(self) -> Path:
        """Hashes of the valid opaque tokens, for the edge's token check (HAProxy map)."""
        return self.cache_dir / "edge" / "tokens.map"
