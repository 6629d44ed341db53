"""The parsed flags of `ignition-server serve` as the settings object the server runs with
(config.py), checked here: a bad value is a usage error before anything starts."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Any

from ..config import RegistrySettings, ServeSettings, TLSSettings, parse_cidrs, parse_duration, parse_hostport
from ..tls.profiles import profile as tls_profile
from .parser import FILE_MODE_SHARED


def node_proxy(args: argparse.Namespace) -> dict:
    """`ignition.proxy` of pointer configs from the --node-*-proxy flags ({}: none)."""
    from ..render.cluster_proxy import proxy_settings

    settings = proxy_settings({"httpProxy": args.node_http_proxy or "", "httpsProxy": args.node_https_proxy or "",
                               "noProxy": args.node_no_proxy or ""})
    if settings.no_proxy and not settings:
        raise ValueError("--node-no-proxy needs --node-http-proxy or --node-https-proxy")
    return settings.ignition() if settings else {}


def parse_size(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 1000, "M": 1000**2, "G": 1000**3}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    metrics = None if str(args.metrics_listen).lower() == "off" else parse_hostport(args.metrics_listen, 8080)
    if not args.source and not args.kubernetes:
        raise ValueError("serve needs --source DIR or --kubernetes")
    pod_namespace = args.pod_namespace or _pod_namespace()
    proxy = node_proxy(args)
    return ServeSettings(
        source_dir=Path(args.source or "."),
        kubernetes=bool(args.kubernetes),
        kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
        namespaces=tuple(n.strip() for n in (args.namespace or "").split(",") if n.strip()),
        pod_namespace=pod_namespace,
        shared_namespaces=_shared_namespaces(args, pod_namespace),
        replica_id=args.replica_id or socket.gethostname(),
        lease_duration=parse_duration(args.lease_duration),
        prune_grace=parse_duration(args.prune_expired_after),
        take_over=bool(args.take_over),
        managed_service=str(args.managed_service or ""),
        namespace_budget=parse_size(str(args.namespace_memory)),
        ca_lifetime=parse_duration(args.ca_lifetime),
        ca_check_interval=parse_duration(args.ca_check_interval),
        cache_dir=Path(args.cache_dir),
        listen=parse_hostport(args.listen, 9090),
        metrics_listen=metrics,
        tls=TLSSettings(Path(args.tls_cert) if args.tls_cert else None, Path(args.tls_key) if args.tls_key else None,
                        _tls_profile(args)),
        token_ttl=parse_duration(args.token_ttl),
        service_account_overlap=parse_duration(args.service_account_overlap),
        edge_dir=Path(args.edge_dir) if args.edge_dir else None,
        proxy_protocol_from=parse_cidrs(args.proxy_protocol_from),
        edge_socket=Path(args.edge_socket) if args.edge_socket else None,
        public_url=args.public_url,
        node_http_proxy=proxy.get("httpProxy", ""),
        node_https_proxy=proxy.get("httpsProxy", ""),
        node_no_proxy=tuple(proxy.get("noProxy", ())),
        cache_key_file=Path(args.cache_key_file) if args.cache_key_file else None,
        cache_memory_bytes=parse_size(str(args.cache_memory)),
        source_read_only=bool(args.source_read_only),
        render_concurrency=max(1, int(args.render_concurrency)),
        max_in_flight=max(1, int(args.max_in_flight)),
        workers=_workers(args.workers),
        auth_failure_burst=max(1, int(args.auth_failure_burst)),
        auth_failure_window=parse_duration(args.auth_failure_window),
        header_timeout=parse_duration(args.header_timeout),
        handshake_timeout=parse_duration(args.handshake_timeout),
        connections_per_source=max(1, int(args.connections_per_source)),
        connections_total=max(1, int(args.connections_total)),
        log_format=args.log_format,
        registry=_registry_settings(args),
    )


def _registry_settings(args: argparse.Namespace) -> Any:
    from ..registry.allowed import parse_allowed
    from ..registry.mirrors import parse_overrides

    parse_overrides(args.registry_overrides)  # a bad spelling is a usage error now, not at the first release
    parse_allowed(args.registry_allow)
    if args.generate_bases and not args.release_resolve:
        raise ValueError("--generate-bases needs --release-resolve (the MCO image is pulled from the release's registry)")
    return RegistrySettings(
        resolve=bool(args.release_resolve),
        architecture=args.release_architecture,
        overrides=args.registry_overrides or "",
        allow=args.registry_allow,
        ca_file=Path(args.registry_ca_file) if args.registry_ca_file else None,
        tag_ttl=parse_duration(args.release_tag_ttl),
        timeout=parse_duration(args.registry_timeout),
        generate_bases=bool(args.generate_bases),
        base_timeout=parse_duration(args.base_timeout),
        base_memory_bytes=parse_size(str(args.base_memory)),
        base_sandbox=args.base_sandbox,
        base_uid=int(args.base_uid),
    )


def _workers(value: str) -> int:
    if str(value).lower() == "auto":
        from ..workers.pool import default_worker_count

        return default_worker_count()
    count = int(value)
    if count < 0:
        raise ValueError("--workers takes a count >= 0 or 'auto'")
    return count


def _tls_profile(args: argparse.Namespace) -> Any:
    from ..tls.fips import fips_profile

    chosen = tls_profile(args.tls_profile, min_version=args.tls_min_version, ciphers=args.tls_ciphers)
    return fips_profile(chosen) if args.fips else chosen


def _shared_namespaces(args: argparse.Namespace, pod_namespace: str) -> tuple[str, ...]:
    listed = tuple(n.strip() for n in (args.shared_namespaces or "").split(",") if n.strip())
    if args.kubernetes:
        # The server's own publications (resolved releases, generated bases) live there.
        return tuple(dict.fromkeys((pod_namespace, *listed)))
    return listed or (FILE_MODE_SHARED,)


def _pod_namespace() -> str:
    in_cluster = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    return in_cluster.read_text().strip() if in_cluster.is_file() else "default"
