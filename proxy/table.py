"""The routing table: which SNI host name goes to which backends, and how.

A YAML file (the one input of `ignition-proxy render|run --config FILE`)::

    listen: 443                 # one port for every route: bind :::443 v4v6
    state_dir: /var/lib/ignition-proxy   # sockets, maps and copies HAProxy reads
    slots: 8                    # server lines per route; spare ones wait disabled
    metrics_listen: "[::]:9101" # the controller's own /metrics (optional)
    prometheus_listen: "[::]:8405"  # HAProxy's exporter (optional)
    in_pod: false               # true: the edge in the server's own pod (below)
    routes:
      - host: ignition.clusters-a.example.com
        mode: terminate         # or passthrough
        publication: /var/run/ignition/clusters-a   # the server's --edge-dir
        backends: ["10.0.1.5:9090", "[fd00::7]:9090"]   # or ["unix@/run/ignition/serve.sock"]
        allow: ["10.0.0.0/8", "fd00::/8"]           # optional source CIDRs
        send_proxy: true        # PROXY v2 to the backend (its --proxy-protocol-from)

`in_pod: true` runs the proxy as the TLS edge in the server's own pod: one terminate route whose
backends are the server's unix socket (`unix@PATH`, `serve --edge-socket PATH`), its TLS bound
on `listen` directly (no SNI routing, and no second pass of every byte through a loop socket).

Loading is pure (text in, :class:`Table` out); a bad table is a :class:`TableError` naming
what is wrong, and the caller keeps the last good one.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ignition_server import bounded_yaml

MODES = ("passthrough", "terminate")
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_PATH = re.compile(r"^/[A-Za-z0-9._/+@=~-]*$")


class TableError(ValueError):
    """The routing table cannot be used as written."""


@dataclass(frozen=True)
class Backend:
    host: str  # an IP literal (v4 or v6, unbracketed), a DNS name, or a unix socket's absolute path
    port: int  # 0 for a unix socket

    @property
    def unix(self) -> bool:
        """A server in the proxy's own pod (`serve --edge-socket`): plain HTTP, TLS ended here."""
        return self.host.startswith("/")

    @property
    def address(self) -> str:
        """host:port as HAProxy's server line and `set server addr` want it (IPv6 bare:
        HAProxy splits on the last colon); unix@PATH for a unix socket."""
        return f"unix@{self.host}" if self.unix else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        if self.unix:
            return self.address
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Endpoints:
    """A Service whose EndpointSlices give a route's backends (Kubernetes mode)."""

    namespace: str
    service: str
    port: int | str  # the target port, or its name in the slices


@dataclass(frozen=True)
class Route:
    host: str
    mode: str
    backends: tuple[Backend, ...]
    publication: Path | None = None
    allow: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    send_proxy: bool = False
    backend_ca: Path | None = None  # verifies the backends when re-encrypting (default: the publication's CA)
    endpoints: Endpoints | None = None

    @property
    def name(self) -> str:
        """A stable identifier for HAProxy section names and state files."""
        return "r_" + re.sub(r"[^A-Za-z0-9]", "_", self.host.lower())


@dataclass(frozen=True)
class Table:
    listen: int
    state_dir: Path
    routes: tuple[Route, ...]
    slots: int = 8
    metrics_listen: str | None = None
    prometheus_listen: str | None = None
    check_interval: str = "1s"
    extra: dict[str, Any] = field(default_factory=dict)
    in_pod: bool = False  # the TLS edge in the server's pod: its one route's TLS bound on `listen`

    def route(self, host: str) -> Route:
        return next(r for r in self.routes if r.host == host)


def parse_backend(text: str) -> Backend:
    """'10.0.0.5:9090', '[fd00::5]:9090', 'replica-a.svc:9090' or 'unix@/run/ignition/serve.sock'."""
    value = str(text).strip()
    if value.startswith("unix@"):
        return Backend(str(_path(value[len("unix@"):], f"backend {text!r}")), 0)
    if value.startswith("["):
        host, close, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        if not close:
            raise TableError(f"backend {text!r}: no closing bracket")
    else:
        host, _, port = value.rpartition(":")
        if ":" in host:
            raise TableError(f"backend {text!r}: an IPv6 address needs brackets, [addr]:port")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise TableError(f"backend {text!r} must be host:port with a port in 1..65535")
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        if not _HOST.match(host):
            raise TableError(f"backend {text!r}: {host!r} is neither an IP address nor a host name") from None
    return Backend(host, int(port))


def _path(value: Any, what: str) -> Path:
    if not isinstance(value, str) or not _PATH.match(value):
        raise TableError(f"{what} {value!r} must be an absolute plain path")
    return Path(value)


def _endpoints(value: Any, host: str) -> Endpoints | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"namespace", "service", "port"}:
        raise TableError(f"route {host}: endpoints takes namespace, service and port")
    namespace = _kubernetes_name(host, "namespace", value.get("namespace"))
    service = _kubernetes_name(host, "service", value.get("service"))
    port = value.get("port")
    if not (isinstance(port, int) and 0 < port < 65536) and not (isinstance(port, str) and re.match(r"^[a-z0-9-]{1,15}$", port)):
        raise TableError(f"route {host}: endpoints port {port!r} must be a port number or name")
    return Endpoints(namespace, service, port)


def _kubernetes_name(host: str, what: str, name: object) -> str:
    if not isinstance(name, str) or not re.match(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", name):
        raise TableError(f"route {host}: endpoints {what} {name!r} is not a Kubernetes name")
    return name


def _route(item: Any, index: int) -> Route:
    if not isinstance(item, dict):
        raise TableError(f"routes[{index}] must be a mapping")
    unknown = set(item) - {"host", "mode", "backends", "publication", "allow", "send_proxy", "backend_ca", "endpoints"}
    if unknown:
        raise TableError(f"routes[{index}]: unknown keys {sorted(unknown)}")
    host = item.get("host")
    if not isinstance(host, str) or not _HOST.match(host):
        raise TableError(f"routes[{index}].host {host!r} is not a host name")
    mode = item.get("mode", "passthrough")
    if mode not in MODES:
        raise TableError(f"route {host}: mode {mode!r} must be one of {', '.join(MODES)}")
    endpoints = _endpoints(item.get("endpoints"), host)
    backends = item.get("backends", [] if endpoints else None)
    if not isinstance(backends, list) or not (backends or endpoints):
        raise TableError(f"route {host}: backends must be a non-empty list of host:port (or give endpoints)")
    try:
        allow = tuple(ipaddress.ip_network(str(c), strict=False) for c in item.get("allow") or ())
    except ValueError as error:
        raise TableError(f"route {host}: allow: {error}") from None
    publication = _path(item["publication"], f"route {host}: publication") if item.get("publication") else None
    if mode == "terminate" and publication is None:
        raise TableError(f"route {host}: terminate needs the server's publication (its --edge-dir)")
    backend_ca = _path(item["backend_ca"], f"route {host}: backend_ca") if item.get("backend_ca") else None
    parsed = tuple(parse_backend(b) for b in backends)
    if any(b.unix for b in parsed) and (mode != "terminate" or not all(b.unix for b in parsed) or endpoints):
        raise TableError(f"route {host}: unix@ backends (the server in this pod) take a terminate route "
                         "whose backends are all unix sockets")
    return Route(
        host=host.lower(), mode=mode, backends=parsed,
        publication=publication, allow=allow, send_proxy=bool(item.get("send_proxy", False)), backend_ca=backend_ca,
        endpoints=endpoints,
    )


def load_table(text: str) -> Table:
    """Parse and check a routing table (YAML). Pure."""
    try:
        data = bounded_yaml.load(text)
    except yaml.YAMLError as error:
        raise TableError(f"not YAML: {error}") from None
    if not isinstance(data, dict):
        raise TableError("the table must be a mapping")
    listen = data.get("listen", 443)
    if not isinstance(listen, int) or not 0 < listen < 65536:
        raise TableError(f"listen {listen!r} must be a port in 1..65535")
    slots = data.get("slots", 8)
    if not isinstance(slots, int) or not 1 <= slots <= 256:
        raise TableError(f"slots {slots!r} must be in 1..256")
    state_dir = _path(data.get("state_dir"), "state_dir")
    raw_routes = data.get("routes")
    if not isinstance(raw_routes, list) or not raw_routes:
        raise TableError("routes must be a non-empty list")
    routes = tuple(_route(item, i) for i, item in enumerate(raw_routes))
    hosts = [r.host for r in routes]
    if len(set(hosts)) != len(hosts) or len({r.name for r in routes}) != len(routes):
        raise TableError("each route's host must be unique")
    for route in routes:
        if len(route.backends) > slots:
            raise TableError(f"route {route.host}: {len(route.backends)} backends but only {slots} slots")
    interval = str(data.get("check_interval", "1s"))
    if not re.match(r"^\d+(ms|s)$", interval):
        raise TableError(f"check_interval {interval!r} must be like 500ms or 2s")
    in_pod = data.get("in_pod", False)
    if not isinstance(in_pod, bool):
        raise TableError(f"in_pod {in_pod!r} must be true or false")
    if in_pod and (len(routes) != 1 or not all(b.unix for b in routes[0].backends)):
        raise TableError("in_pod takes one terminate route whose backends are the server's unix socket (unix@PATH)")
    return Table(
        listen=listen, state_dir=state_dir, routes=routes, slots=slots,
        metrics_listen=data.get("metrics_listen"), prometheus_listen=data.get("prometheus_listen"),
        check_interval=interval, in_pod=in_pod,
    )


def read_table(path: Path) -> Table:
    return load_table(path.read_text())
