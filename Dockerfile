# Build stage: compilers live here only.
FROM python:3.11-slim-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ignition_server ignition_server
COPY payload_cache payload_cache
COPY proxy proxy
RUN python -m venv /opt/ignition-server && /opt/ignition-server/bin/pip install --no-cache-dir .

# The front proxy (`docker build --target proxy`): the same venv (its `ignition-proxy` command)
# and Debian's HAProxy 2.6, the version proxy/ drives through its runtime API. Same uid as the
# server: as a sidecar for a terminate route it reads the server's 0600 edge.pem (deploy/proxy/table.yaml).
FROM python:3.11-slim-bookworm AS proxy
RUN apt-get update && apt-get install -y --no-install-recommends haproxy && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/ignition-proxy --create-home ignition-proxy
COPY --from=build /opt/ignition-server /opt/ignition-server
ENV PATH=/opt/ignition-server/bin:$PATH \
    IGNITION_PROXY_CONFIG=/etc/ignition-proxy/table.yaml \
    IGNITION_PROXY_HAPROXY=/usr/sbin/haproxy
USER 10001:10001
EXPOSE 8443 9101 8405
ENTRYPOINT ["ignition-proxy"]
CMD ["run"]

# Final stage (the default target, the server): the interpreter, the venv, no compilers, a non-root user.
FROM python:3.11-slim-bookworm
RUN useradd --system --uid 10001 --home-dir /var/lib/ignition-server --create-home ignition
COPY --from=build /opt/ignition-server /opt/ignition-server
COPY examples /usr/share/ignition-server/examples
ENV PATH=/opt/ignition-server/bin:$PATH \
    IGNITION_SERVER_LOG_FORMAT=json \
    IGNITION_SERVER_CACHE_DIR=/var/lib/ignition-server/cache \
    IGNITION_SERVER_SOURCE=/usr/share/ignition-server/examples
USER 10001:10001
EXPOSE 9090 8080
ENTRYPOINT ["ignition-server"]
CMD ["serve", "--source-read-only"]
