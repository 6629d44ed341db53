"""The routing table as one haproxy.cfg. Pure: table and publications in, text out.

One `bind :::PORT v4v6` frontend in TCP mode reads the TLS ClientHello and routes on
`req.ssl_sni`:

- *passthrough* routes go to a TCP backend: TLS ends at the server (no token check possible);
- *terminate* routes loop (PROXY v2 over a unix socket, so the client's address survives) to
  an internal HTTPS frontend that terminates TLS with the server's published certificate (and,
  for each taken-over cluster's Route hostname the server publishes, that name's own certificate,
  chosen by SNI from a `crt-list`; those names are routed to the route too) and
  the server's own TLS settings (versions, ciphers, session tickets: its `tls.json`),
  checks the token (proxy.jwt_frontend: JWTs with `jwt_verify`, opaque tokens in the route's map),
  and re-encrypts to the backends, verifying them with the server's CA; or, when the backends
  are unix sockets (`unix@PATH`: the server in the proxy's own pod, `serve --edge-socket`),
  hands them the request in plain HTTP, TLS having ended in the same pod.

Every backend has `slots` server lines; the ones beyond the table's backends wait disabled, so
the controller changes addresses with `set server addr` / `set server state` instead of a
reload. Health checks ask `/readyz`; traffic errors eject a server (`observe`); a failed
connect is retried on another server (`retries`, `option redispatch`), and in terminate mode
an idempotent request is retried when its server dies under it (`retry-on`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ignition_server.edge_publication import EdgeTLS

from .jwt_frontend import TokenCheck, token_check_lines
from .publication import Publication
from .table import Backend, Route, Table

OPEN_PATHS = ("/healthz", "/readyz")  # health endpoints carry no token
# How long a new connection may take to send its ClientHello (the ingress frontend's
# inspect-delay) and, on a terminating route, to finish its TLS handshake: a node sends its
# ClientHello at once and answers the server's flight within a round trip. A stalled
# handshake (one that sent nothing, or stopped after its ClientHello) is cut here.
HANDSHAKE_TIMEOUT = "3s"


def stats_socket(table: Table) -> Path:
    return table.state_dir / "haproxy.sock"


def master_socket(table: Table) -> Path:
    return table.state_dir / "master.sock"


def map_path(table: Table, route: Route) -> Path:
    """The controller's copy of the route's token map: the file HAProxy loads at start and
    the name the runtime API's map commands address."""
    return table.state_dir / "maps" / f"{route.name}.map"


def cert_path(table: Table, route: Route) -> Path:
    return table.state_dir / "certs" / f"{route.name}.pem"


def host_certs_dir(table: Table, route: Route) -> Path:
    """Where a terminate route's published hostnames' certificates are, one `<host>.pem` each."""
    return table.state_dir / "certs" / route.name


def host_cert_path(table: Table, route: Route, host: str) -> Path:
    return host_certs_dir(table, route) / f"{host}.pem"


def crt_list_path(table: Table, route: Route) -> Path:
    return table.state_dir / "certs" / f"{route.name}.list"


def crt_list(table: Table, route: Route, publication: Publication) -> str:
    """The crt-list of a terminate route: each published hostname's certificate, for that SNI name
    only (the bind's `crt`, the server's default certificate, serves every other name)."""
    directory = host_certs_dir(table, route)  # one path, not one per host: this runs every sync
    return "".join(f"{directory}/{host}.pem {host}\n" for host, _ in publication.hosts)


def sni_names(route: Route, publication: Publication | None) -> list[str]:
    """The names a route answers: its own host, and a terminate route's published hostnames."""
    published = [h for h, _ in publication.hosts] if publication is not None and route.mode == "terminate" else []
    return [route.host, *(h for h in published if h != route.host.lower())]


def sni_names_path(table: Table, route: Route) -> Path:
    return table.state_dir / "certs" / f"{route.name}.names"


def _sni_match(table: Table, route: Route, publication: Publication | None) -> str:
    """The ACL matching a route's names: inline for its one host; from a file (`sni_names`, one a
    line, the controller writes it) once the server publishes hostnames: HAProxy takes at most 64
    words a line, and a fleet's taken-over clusters are hundreds."""
    names = sni_names(route, publication)
    if len(names) == 1:
        return f"req.ssl_sni -i {names[0]}"
    return f"req.ssl_sni -i -f {sni_names_path(table, route)}"


def loop_socket(table: Table, route: Route) -> Path:
    # unix@, not abns@: unix sockets are handed over on a seamless reload.
    return table.state_dir / f"t{table.routes.index(route)}.sock"


def server_name(slot: int) -> str:
    return f"s{slot}"


PLACEHOLDER = Backend("127.0.0.1", 1)  # a disabled slot's address until the controller fills it


def _server_lines(table: Table, route: Route) -> list[str]:
    out = []
    for slot in range(table.slots):
        if slot < len(route.backends):
            out.append(f"    server {server_name(slot)} {route.backends[slot].address}")
        else:
            out.append(f"    server {server_name(slot)} {PLACEHOLDER.address} disabled")
    return out


def _proxy_opts(route: Route) -> str:
    return " send-proxy-v2 check-send-proxy" if route.send_proxy else ""


def _ca(route: Route, publication: Publication | None) -> Path | None:
    return route.backend_ca or (publication.ca if publication else None)


def _passthrough(table: Table, route: Route, publication: Publication | None) -> list[str]:
    ca = _ca(route, publication)
    verify = f"verify required ca-file {ca}" if ca else "verify none"  # the check only: TLS is the client's
    return [
        f"backend {route.name}",
        "    mode tcp",
        "    balance roundrobin",
        "    option httpchk GET /readyz",
        "    http-check expect status 200",
        f"    default-server check check-ssl {verify} inter {table.check_interval} fall 2 rise 1"
        f" observe layer4 error-limit 2 on-error mark-down{_proxy_opts(route)}",
        *_server_lines(table, route),
        "",
    ]


_HAPROXY_VERSIONS = {"VersionTLS10": "TLSv1.0", "VersionTLS11": "TLSv1.1", "VersionTLS12": "TLSv1.2",
                     "VersionTLS13": "TLSv1.3"}


def _tls_options(tls: EdgeTLS) -> str:
    """The bind's TLS, the server's own (its publication's `tls.json`): HAProxy's defaults offered
    CBC-SHA suites and session tickets whatever the server's `--tls-profile` and `--fips`."""
    options = f" ssl-min-ver {_HAPROXY_VERSIONS[tls.min_version]}"
    if tls.ciphers:
        options += f" ciphers {tls.ciphers}"
    if tls.tls13_suites:
        options += f" ciphersuites {tls.tls13_suites}"
    return options if tls.session_tickets else options + " no-tls-tickets"


# A PROXY v2 connection names one client connection (HAProxy keys its pooled server connections
# on the PROXY header, the client's port included), so no other client can ever reuse it.
# Shared (the default), each response parked it in the server's idle pool, where the storm's,
# of clients long gone, took the pool's room (HAProxy 2.6 keeps idle + used within its estimate
# of need): the live one was closed instead and the node's next request paid a new connection.
# Private, it stays with its client connection (the session's list) and ends with it.
_PRIVATE_CONNECTIONS = (
    "    # A server connection carries its client's PROXY header: it is that client's alone.",
    "    http-reuse never",
)


def _terminate(table: Table, route: Route, publication: Publication) -> list[str]:
    ca = _ca(route, publication)
    in_pod = bool(route.backends) and all(b.unix for b in route.backends)
    if ca is None and not in_pod:
        raise ValueError(f"route {route.host}: no CA to verify the backends (publication has none; set backend_ca)")
    # In the pod: plain HTTP over the unix socket, each connection's PROXY v2 header naming the node.
    to_servers = f"ca-file {ca} check" if not in_pod else "check"
    tls = "" if in_pod else "ssl verify required "
    send_proxy = in_pod or route.send_proxy
    checks = token_check_lines(TokenCheck(
        key_files=list(publication.keys), issuers=list(publication.issuers) or ["kubernetes/serviceaccount"],
        bearer=True, open_paths=OPEN_PATHS, token_map=str(map_path(table, route)), require_keys=False,
    ))
    if table.in_pod:  # the one route: TLS on the public port itself
        bind = f":::{table.listen} v4v6"
        head = []
        if route.allow:
            head = [f"    tcp-request connection reject if !{{ src {' '.join(str(c) for c in route.allow)} }}"]
    else:
        sock = loop_socket(table, route)
        bind = f"unix@{sock} mode 600 accept-proxy"
        head = []
    crt_list_option = f" crt-list {crt_list_path(table, route)}" if publication.hosts else ""
    loop = [] if table.in_pod else [
        f"backend {route.name}_loop",
        "    mode tcp",
        f"    server loop unix@{sock} send-proxy-v2",
        "",
    ]
    return [
        *loop,
        f"frontend {route.name}_tls",
        "    mode http",
        "    # HAProxy 2.6 bounds a TLS handshake by the client timeout only (2.8's client-hs is not",
        "    # there): a ClientHello, then nothing, held its connection 60 s. A client idle this long",
        "    # (no byte sent or read) is cut; waiting on the server is not idleness (timeout server).",
        f"    timeout client {HANDSHAKE_TIMEOUT}",
        f"    bind {bind} ssl crt {cert_path(table, route)}{crt_list_option}{_tls_options(publication.tls)}",
        *head,
        "    option http-buffer-request",
        *checks,
        f"    default_backend {route.name}",
        "",
        f"backend {route.name}",
        "    mode http",
        "    balance roundrobin",
        "    option httpchk GET /readyz",
        "    http-check expect status 200",
        "    # A GET whose server dies under it is asked again of another one.",
        "    retry-on conn-failure empty-response response-timeout 502 503",
        "    http-request disable-l7-retry unless METH_GET || METH_HEAD",
        *(_PRIVATE_CONNECTIONS if send_proxy else []),
        f"    default-server {tls}{to_servers} inter {table.check_interval} fall 2 rise 1"
        f" observe layer7 error-limit 2 on-error mark-down{' send-proxy-v2 check-send-proxy' if send_proxy else ''}",
        *_server_lines(table, route),
        "",
    ]


# The in-pod edge's buffer per direction of a stream (HAProxy's default is 16 KiB). It relays a
# 293-416 KB payload from the unix socket into TLS: at 16 KiB each read from the socket and each
# SSL_write carried at most 16,320 bytes (one record, never a full one), so a payload took ~20
# reads, sends and client wake-ups; at 32 KiB a write carries two records, half as many. Kept
# alive (3 interleaved rounds, machine at load 10-18): HAProxy 0.29-0.32 -> 0.27-0.28 ms CPU a
# request, the load client's (a node's) 0.23-0.25 -> 0.21-0.22; the storm's per-connection cost
# did not move. 64 KiB measured the same; 128 and 256 KiB worse (at 512 KiB perf showed page
# faults in its memmove: buffers that large are mmap'd).
# Only a stream moving data holds buffers, so idle kept-alive connections cost nothing more.
IN_POD_BUFSIZE = 32768


def render_config(table: Table, publications: Mapping[str, Publication]) -> str:
    """haproxy.cfg for `table`; `publications` maps a terminate route's name to what its
    server published (keys, issuers, CA). Raises ValueError when a terminate route has none."""
    out = [
        "# Generated by ignition-proxy (proxy/render.py) from the routing table; do not edit.",
        "global",
        f"    stats socket {stats_socket(table)} mode 600 level admin expose-fd listeners",
        "    stats timeout 30s",
        "    hard-stop-after 5m",
        *([f"    tune.bufsize {IN_POD_BUFSIZE}"] if table.in_pod else []),
        "",
        "defaults",
        "    timeout connect 3s",
        "    timeout client 60s",
        "    timeout server 120s",
        "    timeout check 2s",
        "    timeout http-request 10s",
        "    retries 3",
        "    option redispatch 1",
        "",
    ]
    if not table.in_pod:
        out += _ingress(table, publications)
    if table.prometheus_listen:
        out += [
            "frontend prometheus",
            "    mode http",
            f"    bind {table.prometheus_listen}",
            "    http-request use-service prometheus-exporter if { path /metrics }",
            "    no log",
            "",
        ]
    for route in table.routes:
        publication = publications.get(route.name)
        if route.mode == "passthrough":
            out += _passthrough(table, route, publication)
        else:
            if publication is None:
                raise ValueError(f"route {route.host}: terminate needs its server's publication")
            out += _terminate(table, route, publication)
    return "\n".join(out) + "\n"


def _ingress(table: Table, publications: Mapping[str, Publication]) -> list[str]:
    """The TCP frontend on `listen` that routes each connection on its ClientHello's SNI."""
    out = [
        "frontend ingress",
        "    mode tcp",
        f"    bind :::{table.listen} v4v6",
        f"    tcp-request inspect-delay {HANDSHAKE_TIMEOUT}",
    ]
    # Allow-lists before the accept: an accept ends the content rules.
    for route in table.routes:
        if route.allow:
            cidrs = " ".join(str(c) for c in route.allow)
            match = _sni_match(table, route, publications.get(route.name))
            out.append(f"    tcp-request content reject if {{ {match} }} !{{ src {cidrs} }}")
    out.append("    tcp-request content accept if { req.ssl_hello_type 1 }")
    for route in table.routes:
        target = route.name if route.mode == "passthrough" else f"{route.name}_loop"
        out.append(f"    use_backend {target} if {{ {_sni_match(table, route, publications.get(route.name))} }}")
    out.append("")
    return out
