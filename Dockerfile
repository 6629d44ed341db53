# Build stage: compilers live here only.
FROM python:3.11-slim-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ignition_server ignition_server
COPY payload_cache payload_cache
COPY proxy proxy
RUN python -m venv /opt/ignition-server && /opt/ignition-server/bin/pip install --no-cache-dir .

# Final stage: the interpreter, the venv, no compilers, a non-root user.
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
