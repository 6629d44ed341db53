"""nginx as the pod's TLS edge, for `bench compare` and `bench storm` (issue 32's "measure before
choosing"): targets `nstream` and `nhttp`, beside nginx static (`nginx`) and the HAProxy edge (`edge`).

Both end TLS in nginx 1.22 (Debian) with the certificate and TLS settings nginx static has in the
bench, and hand each request to `serve --edge-socket` (plain HTTP over a unix socket):

  nstream  the `stream` module (libnginx-mod-stream): TLS ended, bytes relayed, `proxy_protocol on`
           (a PROXY v1 line naming the node, which the edge socket reads as it reads HAProxy's v2).
           No HTTP parse at the edge, so no token pre-check there; one server connection per client connection.
  nhttp    the `http` proxy: a pool of kept-alive server connections (`keepalive`), the node's
           address in `X-Real-IP` (the server does not read it yet: its logs and limits see the pod),
           and a shape-only pre-check of the credential (`Authorization: Bearer <printable>`, else 401);
           nginx has no sha256 or JWT check, so it cannot check the token map as the HAProxy edge does.

The configs are rendered here, pure; the measured figures and the verdict are in bench/README.md.
"""

from __future__ import annotations

import os
from pathlib import Path

STREAM_MODULE = Path("/usr/lib/nginx/modules/ngx_stream_module.so")  # Debian's libnginx-mod-stream
# What the edge reads from the server at a time (per direction in stream, the first read in http).
# 32 KiB: two TLS records per write, as the HAProxy edge's tune.bufsize (proxy/render.py).
# 128 KiB measured the same (0.85 against 0.84 ms a storm connection, 0.29 kept alive; one round, load 17).
EDGE_BUFFER_KIB = 32


def head(root: Path, workers: int, modules: str = "") -> str:
    """What every bench nginx starts with: its workers, pid and error log under `root`."""
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers must read the payload and the key
    return (f"{modules}{user}worker_processes {workers};\npid {root}/nginx.pid;\n"
            f"error_log {root}/logs/error.log warn;\nevents {{ worker_connections 4096; }}\n")


def http_head(root: Path) -> str:
    """The `http` block's first lines: no access log, temp paths under `root`, connections kept."""
    temps = "".join(f"    {kind}_temp_path {root}/tmp_{kind};\n" for kind in ("proxy", "fastcgi", "uwsgi", "scgi"))
    return (f"    access_log off;\n    client_body_temp_path {root}/tmp_body;\n{temps}"
            "    keepalive_requests 1000000;\n")


def tls_lines(cert: Path, key: Path, indent: str = "        ") -> str:
    """nginx static's TLS in the bench: every handshake a full one, as a booting node's."""
    return "".join(f"{indent}{line}\n" for line in (
        f"ssl_certificate {cert};", f"ssl_certificate_key {key};", "ssl_protocols TLSv1.2 TLSv1.3;",
        "ssl_session_tickets off;", "ssl_session_cache off;"))


def stream_conf(root: Path, workers: int, port: int, cert: Path, key: Path, sock: Path) -> str:
    return head(root, workers, f"load_module {STREAM_MODULE};\n") + f"""stream {{
    server {{
        listen 127.0.0.1:{port} ssl;
{tls_lines(cert, key)}        proxy_pass unix:{sock};
        proxy_protocol on;
        proxy_buffer_size {EDGE_BUFFER_KIB}k;
    }}
}}
"""


# The pre-check's shape: a Bearer credential of printable token characters (the server's own
# check decides; this only turns away what can never be one, as a terminate route's shape check).
BEARER_SHAPE = "^Bearer [A-Za-z0-9._~+/=-]{1,4096}$"


def http_conf(root: Path, workers: int, port: int, cert: Path, key: Path, sock: Path) -> str:
    # Unbuffered: each read from the server (64 KiB) goes out to the node at once. Buffered in
    # memory (8 x 64 KiB, no temp file) measured no better: 0.73 against 0.62-0.71 ms a storm
    # connection, 0.30-0.42 against 0.31-0.33 kept alive (two rounds, load 11-19).
    return head(root, workers) + f"""http {{
{http_head(root)}    upstream serving {{
        server unix:{sock};
        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} ssl;
{tls_lines(cert, key)}        location / {{
            if ($http_authorization !~ "{BEARER_SHAPE}") {{ return 401; }}
            proxy_pass http://serving;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Real-IP $remote_addr;
            proxy_buffering off;
            proxy_buffer_size 64k;
            proxy_buffers 4 64k;  # unused unbuffered, but nginx checks the busy size against them
        }}
    }}
}}
"""


def static_conf(root: Path, workers: int, port: int, cert: Path, key: Path, payload: Path) -> str:
    """nginx static: the payload the server answered, as a file."""
    return head(root, workers) + f"""http {{
{http_head(root)}    server {{
        listen 127.0.0.1:{port} ssl;
{tls_lines(cert, key)}        location = /ignition {{
            default_type application/json;
            add_header Cache-Control no-store;
            alias {payload};
        }}
    }}
}}
"""
