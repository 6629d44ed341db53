"""`ignition-server`'s flags: every command's, each also read from `IGNITION_SERVER_<FLAG>`
(e.g. IGNITION_SERVER_TOKEN_TTL=6s), defaults taken from the settings object (config.py)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..config import RegistrySettings, ServeSettings

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ENV_PREFIX = "IGNITION_SERVER_"
FILE_MODE_SHARED = "ignition-server"  # the namespace deploy/ and examples/ use for the server's own objects
# --help's first line, as it has always read.
_DESCRIPTION = "`ignition-server`: wires the pieces together. Nothing imports this module."


def _env(flag: str, default: Any = None) -> Any:
    return os.environ.get(ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_"), default)


def _default(settings: type[DataclassInstance], name: str) -> str:
    """A field's default (config.py writes each once), spelled as its flag takes it."""
    value = settings.__dataclass_fields__[name].default
    if name.endswith("listen"):
        assert value is None or isinstance(value, tuple), name  # (host, port), or None: not served
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ignition-server", description=_DESCRIPTION)
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
    _add(serve, "--edge-socket", help="also serve plain HTTP on this unix socket, for a TLS edge in the same pod "
         "(ignition-proxy with a terminate route to unix@PATH); each connection starts with a PROXY v2 header")
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
    _add(serve, "--handshake-timeout", default=_serve_default("handshake_timeout"), help="a connection whose PROXY header and TLS handshake take longer is closed (a stalled handshake holds its place in the per-source count until then)")
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
    _add(serve, "--take-over", action="store_true",
         help="--kubernetes: for every HostedControlPlane annotated hypershift.openshift.io/disable-ignition-server, "
              "keep the ConfigMaps and CA Secret HyperShift's control plane stops writing (README, Taking over)")
    _add(serve, "--managed-service", default="",
         help="--take-over: the value of the control-plane-operator's MANAGED_SERVICE where HyperShift runs "
              "(ARO-HCP on Azure Red Hat OpenShift: an Azure HCP with the Swift annotation is then private, as the CPO decides)")
    _add(serve, "--namespace-memory", default="64Mi",
         help="--kubernetes: what the objects this server reads may hold per namespace (0: unbounded); an object "
              "past it is refused, logged and told (an Event), its namespace keeping its last good state")
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
    cache.add_argument("action", choices=["stats", "verify", "gc", "rekey", "add-key", "prune-keys"],
                       help="add-key, rekey, prune-keys rotate the AES key (in that order)")
    _add(cache, "--cache-dir", required=True, help="the cache directory")
    _add(cache, "--cache-key-file", help="key file (default: <cache-dir>.key)")
    return parser
