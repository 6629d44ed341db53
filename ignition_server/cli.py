"""`ignition-server`: wires the pieces together. Nothing imports this module.

Every flag can also come from `IGNITION_SERVER_<FLAG>` (e.g. IGNITION_SERVER_TOKEN_TTL=6s).
Exit codes: 0 done, 1 failed at run time, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from . import __version__
from .tls.profiles import profile as tls_profile
from .config import (
    RegistrySettings,
    ServeSettings,
    TLSSettings,
    parse_duration,
    parse_cidrs,
    parse_hostport,
)

ENV_PREFIX = "IGNITION_SERVER_"
FILE_MODE_SHARED = "ignition-server"  # the namespace deploy/ and examples/ use for the server's own objects
EXIT_FAILED, EXIT_USAGE = 1, 2


def _env(flag: str, default: Any = None) -> Any:
    return os.environ.get(ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_"), default)


def _default(settings: type, name: str) -> str:
    """A field's default (config.py writes each once), spelled as its flag takes it."""
    value = settings.__dataclass_fields__[name].default
    if name.endswith("listen"):
        return "off" if value is None else f"{value[0]}:{value[1]}"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _serve_default(name: str) -> str:
    return _default(ServeSettings, name)


def _registry_default(name: str) -> str:
    return _default(RegistrySettings, name)


def _add(parser: argparse.ArgumentParser, flag: str, **kwargs: Any) -> None:
    default = kwargs.pop("default", None)
    if kwargs.get("action") == "store_true":
        value = _env(flag)
        kwargs["default"] = str(value).lower() in ("1", "true", "yes") if value is not None else False
    else:
        kwargs["default"] = _env(flag, default)
        if kwargs.get("required") and kwargs["default"] is not None:
            kwargs["required"] = False
    help_text = kwargs.get("help", "")
    kwargs["help"] = f"{help_text} [env {ENV_PREFIX}{flag.lstrip('-').upper().replace('-', '_')}]"
    parser.add_argument(flag, **kwargs)


def _add_node_proxy(parser: argparse.ArgumentParser) -> None:
    _add(parser, "--node-http-proxy", default="", help="proxy a booting node reaches --public-url through (pointer configs' ignition.proxy)")
    _add(parser, "--node-https-proxy", default="", help="HTTPS proxy a booting node reaches --public-url through")
    _add(parser, "--node-no-proxy", default="", help="hosts/domains/CIDRs the node reaches without the proxy, comma-separated")


def node_proxy(args: argparse.Namespace) -> dict:
    """`ignition.proxy` of pointer configs from the --node-*-proxy flags ({}: none)."""
    from .render.cluster_proxy import proxy_settings

    settings = proxy_settings({"httpProxy": args.node_http_proxy or "", "httpsProxy": args.node_https_proxy or "",
                               "noProxy": args.node_no_proxy or ""})
    if settings.no_proxy and not settings:
        raise ValueError("--node-no-proxy needs --node-http-proxy or --node-https-proxy")
    return settings.ignition() if settings else {}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ignition-server", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ignition-server {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve Ignition payloads")
    _add(serve, "--source", help="directory of Kubernetes manifests (or --kubernetes)")
    _add(serve, "--cache-dir", required=True, help="where payloads, the token index and the self-made CA live")
    _add(serve, "--listen", default=_serve_default("listen"), help="HOST:PORT for the Ignition endpoint (TLS)")
    _add(serve, "--metrics-listen", default=_serve_default("metrics_listen"), help="HOST:PORT for /metrics (plain HTTP); 'off' disables")
    _add(serve, "--tls-cert", help="serving certificate (PEM); without it a self-made CA signs one")
    _add(serve, "--tls-key", help="key of --tls-cert (PEM)")
    _add(serve, "--tls-profile", default="Default", choices=["Default", "Old", "Intermediate", "Modern", "Custom"],
         help="the cluster's TLS security profile (OpenShift's names)")
    _add(serve, "--tls-min-version", help="with --tls-profile Custom: VersionTLS10 .. VersionTLS13")
    _add(serve, "--tls-ciphers", help="with --tls-profile Custom: OpenSSL cipher names, colon-separated")
    _add(serve, "--fips", action="store_true", help="only FIPS-approved TLS algorithms (AES-GCM, SHA-2; no ChaCha20)")
    _add(serve, "--token-ttl", default=_serve_default("token_ttl"), help="token lifetime; rotation at half of it (e.g. 6s, 11h)")
    _add(serve, "--service-account-overlap", default=_serve_default("service_account_overlap"), help="how long a replaced service-account key or token Secret stays accepted")
    _add(serve, "--edge-dir", help="publish what a front proxy (ignition-proxy) needs to check tokens here")
    _add(serve, "--proxy-protocol-from", default=_serve_default("proxy_protocol_from"), help="CIDRs (comma-separated) whose connections start with a PROXY v1/v2 header; empty: off")
    _add(serve, "--public-url", help="URL pointer configs use (also the self-made certificate's name)")
    _add_node_proxy(serve)
    _add(serve, "--cache-key-file", help="key file outside the cache dir (default: <cache-dir>.key)")
    _add(serve, "--cache-memory", default=_serve_default("cache_memory_bytes"),
         help="memory for payloads in the whole server, every worker's memory tier and ready bodies together, "
              "in bytes (Ki/Mi/Gi suffixes)")
    _add(serve, "--source-read-only", action="store_true", help="never write back to the source")
    _add(serve, "--render-concurrency", default=_serve_default("render_concurrency"), help="renders running at once")
    _add(serve, "--workers", default="auto",
         help="serving processes on the one port (SO_REUSEPORT); 'auto': one per CPU this process may use; "
              "0: serve in the owner process itself")
    _add(serve, "--max-in-flight", default=_serve_default("max_in_flight"), help="payload requests answered at once; more get 503 + Retry-After")
    _add(serve, "--log-format", default=_serve_default("log_format"), choices=["auto", "json", "text"], help="log format")
    _add(serve, "--auth-failure-burst", default=_serve_default("auth_failure_burst"), help="failed authentications per source address before 503 + Retry-After")
    _add(serve, "--auth-failure-window", default=_serve_default("auth_failure_window"), help="the window of --auth-failure-burst")
    _add(serve, "--header-timeout", default=_serve_default("header_timeout"), help="a connection whose request headers take longer is closed")
    _add(serve, "--connections-per-source", default=_serve_default("connections_per_source"), help="open connections one address may hold (the whole server's, across workers)")
    _add(serve, "--connections-total", default=_serve_default("connections_total"), help="open connections in all (the whole server's, across workers)")
    _add(serve, "--kubernetes", action="store_true", help="read and write the objects in a live cluster instead of --source")
    _add(serve, "--kubeconfig", help="kubeconfig for --kubernetes (default: the in-cluster service account)")
    _add(serve, "--namespace", help="watch only these namespaces, comma-separated (default: every namespace the RBAC allows)")
    _add(serve, "--shared-namespaces",
         help="namespaces whose objects may shape any NodePool (input-* references, release catalogs, mirror sets), "
              "comma-separated; every other object shapes only its own namespace's NodePools "
              f"(default: the server's own namespace: --pod-namespace in Kubernetes mode, {FILE_MODE_SHARED} with --source)")
    _add(serve, "--pod-namespace", help="namespace of the Lease and the shared CA (default: this pod's namespace)")
    _add(serve, "--replica-id", help="this replica's name in the Lease (default: the host name)")
    _add(serve, "--lease-duration", default=_serve_default("lease_duration"), help="how long a Lease holder that stops renewing keeps it")
    _add(serve, "--ca-lifetime", default=_serve_default("ca_lifetime"), help="lifetime of the self-made CA (renewed at 80%% of it, overlapping one token TTL)")
    _add(serve, "--ca-check-interval", default=_serve_default("ca_check_interval"), help="how often the CA's age is checked")
    _add(serve, "--prune-expired-after", default=_serve_default("prune_grace"), help="--kubernetes: delete expired token Secrets (and their user-data) this long after expiry")

    _add(serve, "--release-resolve", action="store_true",
         help="read releases missing from the catalog from their registry, with the NodePool's pull secret")
    _add(serve, "--release-architecture", default=_registry_default("architecture"), help="the image picked from a release's manifest list")
    _add(serve, "--registry-overrides", default=_registry_default("overrides"), help="mirrors tried before the origin: SOURCE=MIRROR[,SOURCE=MIRROR...]")
    _add(serve, "--registry-allow", default=_registry_default("allow"),
         help="registries releases and their images may be read from: hosts or host/repository prefixes, "
              "comma-separated ('*': any); configured mirrors are allowed as such")
    _add(serve, "--registry-ca-file", help="CA bundle (PEM) registries are trusted with, besides the system's and the user-ca-bundle")
    _add(serve, "--release-tag-ttl", default=_registry_default("tag_ttl"), help="how long a release tag's digest is trusted before it is asked again")
    _add(serve, "--registry-timeout", default=_registry_default("timeout"), help="connect and read timeout of registry requests")
    _add(serve, "--generate-bases", action="store_true",
         help="with --release-resolve: a cluster with no MCO base ConfigMap for a release gets one generated by the "
              "release's machine-config-operator, once per (cluster configuration, release digest)")
    _add(serve, "--base-timeout", default=_registry_default("base_timeout"), help="time limit of each MCO bootstrap step (killed past it)")
    _add(serve, "--base-sandbox", default=_registry_default("base_sandbox"), choices=["namespaces", "none"],
         help="how a release's MCO binaries run: 'namespaces' (no network, none of the server's files, an "
              "unprivileged user; needs user namespaces when not root) or 'none' (as the server's own user)")
    _add(serve, "--base-uid", default=_registry_default("base_uid"), help="as root: the uid a release's MCO binaries run as")
    _add(serve, "--base-memory", default=_registry_default("base_memory_bytes"), help="address-space limit (RLIMIT_AS) of each MCO bootstrap step")

    render = commands.add_parser("render", help="print a NodePool's payload")
    _add(render, "--source", required=True, help="directory of Kubernetes manifests")
    _add(render, "--nodepool", required=True, help="NAMESPACE/NAME of the NodePool")
    _add(render, "--spec-version", help="Ignition spec version to print (default: the lowest that expresses it)")
    _add(render, "--shared-namespaces", default=FILE_MODE_SHARED,
         help="namespaces whose objects may shape any NodePool, as `serve` takes them (it prints what serve would serve)")

    userdata = commands.add_parser("userdata", help="print a NodePool's pointer config (cloud user-data)")
    _add(userdata, "--source", required=True, help="directory of Kubernetes manifests")
    _add(userdata, "--nodepool", required=True, help="NAMESPACE/NAME of the NodePool")
    _add(userdata, "--shape", default="hypershift", choices=["hypershift", "mcs"], help="request shape")
    _add(userdata, "--public-url", required=True, help="https://HOST:PORT nodes reach the server at")
    _add(userdata, "--ca-file", help="CA the pointer config trusts (default: <cache-dir>/tls/ca.crt)")
    _add(userdata, "--cache-dir", default=".", help="the server's cache dir, for its self-made CA")
    _add_node_proxy(userdata)

    base = commands.add_parser("base", help="MCO base configurations: import one as the ConfigMap the server reads")
    base.add_argument("action", choices=["import"])
    _add(base, "--from", dest="source", required=True,
         help="a directory of MachineConfigs as `machine-config-operator bootstrap` writes them, "
              "or a file holding a machine-config-server's /config/worker Ignition JSON")
    _add(base, "--namespace", required=True, help="the hosted cluster's namespace (where its token Secrets are)")
    _add(base, "--release", default="", help="release pull spec the base belongs to")
    _add(base, "--release-version", default="", help="release version the base belongs to (e.g. 4.17.3)")
    _add(base, "--name", help="ConfigMap name (default: mco-base-<release version or digest>)")
    _add(base, "--output", help="write the ConfigMap YAML here (default: stdout)")

    cache = commands.add_parser("cache", help="inspect or maintain the payload cache")
    cache.add_argument("action", choices=["stats", "verify", "gc", "rekey"])
    _add(cache, "--cache-dir", required=True, help="the cache directory")
    _add(cache, "--cache-key-file", help="key file (default: <cache-dir>.key)")
    return parser


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
        public_url=args.public_url,
        node_http_proxy=node_proxy(args).get("httpProxy", ""),
        node_https_proxy=node_proxy(args).get("httpsProxy", ""),
        node_no_proxy=tuple(node_proxy(args).get("noProxy", ())),
        cache_key_file=Path(args.cache_key_file) if args.cache_key_file else None,
        cache_memory_bytes=parse_size(str(args.cache_memory)),
        source_read_only=bool(args.source_read_only),
        render_concurrency=max(1, int(args.render_concurrency)),
        max_in_flight=max(1, int(args.max_in_flight)),
        workers=_workers(args.workers),
        auth_failure_burst=max(1, int(args.auth_failure_burst)),
        auth_failure_window=parse_duration(args.auth_failure_window),
        header_timeout=parse_duration(args.header_timeout),
        connections_per_source=max(1, int(args.connections_per_source)),
        connections_total=max(1, int(args.connections_total)),
        log_format=args.log_format,
        registry=_registry_settings(args),
    )


def _registry_settings(args: argparse.Namespace) -> Any:
    from .registry.allowed import parse_allowed
    from .registry.mirrors import parse_overrides

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
        from .workers.pool import default_worker_count

        return default_worker_count()
    count = int(value)
    if count < 0:
        raise ValueError("--workers takes a count >= 0 or 'auto'")
    return count


def _tls_profile(args: argparse.Namespace) -> Any:
    from .tls.fips import fips_profile

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


def _serve(args: argparse.Namespace) -> int:
    from . import logs, memory
    from .no_core_dumps import disable_core_dumps
    from .server import IgnitionServer

    settings = serve_settings(args)
    logs.configure(settings.log_format)
    disable_core_dumps()  # before the cache key or any token is read
    memory.tune()
    if not settings.kubernetes and not settings.source_dir.is_dir():
        logging.getLogger("ignition_server").warning(
            "source directory %s is not there (yet): serving what the cache knows", settings.source_dir
        )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await IgnitionServer(settings).run(stop)

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    return 0


def _newest_secret(source_dir: Path, nodepool: str, shared: frozenset[str] | None = None) -> tuple[Any, Any, Any, Any]:
    """The source as one listing, the NodePool's newest live token Secret, the release catalog
    (from the `shared` namespaces only, as `serve` reads it; None: any), the MCO bases."""
    from .sources.files import FileSource
    from .model.token_secret import is_token_secret, parse_token_secret
    from .reconcile.bases import BaseIndex, is_base
    from .reconcile.releases import ReleaseCatalog, is_catalog

    source = FileSource(source_dir)
    source._rescan()
    objects = source.objects()
    catalog = ReleaseCatalog()
    bases = BaseIndex()
    for key, obj in objects.items():
        if is_catalog(obj) and (shared is None or key.namespace in shared):
            catalog.update(key, source.get_full(key))
        if is_base(obj):
            bases.update(key, obj)
    now = time.time()
    secrets = [parse_token_secret(o) for o in objects.values() if is_token_secret(o)]
    matching = [s for s in secrets if s.nodepool == nodepool and not s.expired(now)]
    if not matching:
        known = sorted({s.nodepool for s in secrets})
        raise LookupError(f"no token Secret for NodePool {nodepool}; known: {', '.join(known) or 'none'}")
    return source, max(matching, key=lambda s: (s.creation_time or 0.0)), catalog, bases


def _render(args: argparse.Namespace) -> int:
    from .render.payload import render_payload
    from .render.spec import (
        SUPPORTED_VERSIONS, UnsatisfiableVersion, accept_for, body_version, negotiate, unsatisfiable_reason, with_version,
    )
    from .reconcile.gather import gather

    from .model.token_secret import token_secret_config

    from .reconcile.releases import Releases
    from .reconcile.tenancy import Tenancy

    tenancy = Tenancy(frozenset(n.strip() for n in args.shared_namespaces.split(",") if n.strip()))
    source, secret, catalog, bases = _newest_secret(Path(args.source), args.nodepool, tenancy.shared)
    config = token_secret_config(source.get_full(secret.key))
    inputs, _deps = gather(secret, secret.annotations, source.get_full, Releases(catalog), config, bases,
                           tenancy=tenancy)
    rendered = render_payload(inputs)
    body = rendered.body
    if args.spec_version:
        if args.spec_version not in SUPPORTED_VERSIONS:
            print(f"error: --spec-version {args.spec_version} is not one of {', '.join(SUPPORTED_VERSIONS)}", file=sys.stderr)
            return 2
        try:
            body = with_version(body, negotiate(accept_for(args.spec_version), body_version(body)))
        except UnsatisfiableVersion:
            print(f"error: {unsatisfiable_reason(accept_for(args.spec_version), body)}", file=sys.stderr)
            return 2
    sys.stdout.write(body.decode() + "\n")
    for note in rendered.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _userdata(args: argparse.Namespace) -> int:
    from .render.userdata import fits, pointer_user_data

    _source, secret, _catalog, _bases = _newest_secret(Path(args.source), args.nodepool)
    if not secret.token:
        raise LookupError(f"token Secret {secret.ref} holds no token yet")
    ca_file = Path(args.ca_file) if args.ca_file else Path(args.cache_dir) / "tls" / "ca.crt"
    user_data = pointer_user_data(
        source_url=args.public_url, token=secret.token, ca_pem=ca_file.read_bytes(), shape=args.shape,
        proxy=node_proxy(args) or None,
        nodepool=secret.nodepool,
    )
    sys.stdout.write(user_data.decode() + "\n")
    limits = fits(user_data)
    print(f"note: {len(user_data)} bytes; fits " + ", ".join(f"{cloud}: {'yes' if ok else 'no'}" for cloud, ok in limits.items()), file=sys.stderr)
    return 0


def _cache(args: argparse.Namespace) -> int:
    from payload_cache import CacheConfig, PayloadCache, stats_report

    cache = PayloadCache.open(
        CacheConfig(cache_dir=Path(args.cache_dir), key_file=Path(args.cache_key_file) if args.cache_key_file else None)
    )
    if args.action == "stats":
        result: Any = stats_report(cache)
    elif args.action == "verify":
        progress = None
        if sys.stderr.isatty():
            def progress(done: int, total: int) -> None:
                print(f"\rverified {done}/{total}", end="", file=sys.stderr, flush=True)
        result = cache.verify(progress=progress)
    elif args.action == "gc":
        result = cache.gc()
    else:
        result = {"reencrypted": cache.rekey()}
    cache.flush()
    print(json.dumps(_plain(result), indent=2, sort_keys=True))
    return 0


def _base(args: argparse.Namespace) -> int:
    import re

    import yaml

    from .base_import import base_configmap, from_bootstrap_documents, from_mcs_config
    from payload_cache.fsio import atomic_write

    where = Path(args.source)
    if where.is_dir():
        texts = [(str(p), p.read_text(encoding="utf-8")) for p in sorted(where.rglob("*"))
                 if p.is_file() and p.suffix in (".yaml", ".yml", ".json")]
        machineconfigs = from_bootstrap_documents(texts)
    else:
        text = where.read_text(encoding="utf-8")
        machineconfigs = from_mcs_config(text) if text.lstrip().startswith("{") else from_bootstrap_documents([(str(where), text)])
    tail = args.release_version or args.release.rpartition(":")[2][:12]
    name = args.name or "mco-base-" + re.sub(r"[^a-z0-9-]+", "-", tail.lower()).strip("-")
    configmap = base_configmap(machineconfigs, name=name, namespace=args.namespace,
                               release=args.release, version=args.release_version)
    text = yaml.safe_dump(configmap, sort_keys=False)
    if args.output:
        atomic_write(Path(args.output), text.encode(), 0o644)
    else:
        sys.stdout.write(text)
    print(f"{len(machineconfigs)} MachineConfig(s): {', '.join(mc['metadata']['name'] for mc in machineconfigs)}", file=sys.stderr)
    return 0


def _plain(value: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve" and args.fips:
        from .tls.fips import reexec_with_fips_openssl

        reexec_with_fips_openssl(list(argv) if argv is not None else sys.argv[1:])
    handlers = {"serve": _serve, "render": _render, "userdata": _userdata, "cache": _cache, "base": _base}
    try:
        return handlers[args.command](args)
    except LookupError as exc:
        print(f"ignition-server {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as exc:
        print(f"ignition-server {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
