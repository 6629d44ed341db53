"""`ignition-proxy run`: HAProxy in master-worker mode, kept in step with the routing table and
with what each cluster's server publishes.

Every `interval` the controller reads the table and the publications (files: a ConfigMap or
a shared volume in a cluster) and compares them with what HAProxy holds:

- backends added, removed or moved: `set server addr` / `state` on the route's slots;
- a token map changed (a rotation: old and new hashes during the overlap): the controller's
  copy is rewritten (what a future reload loads) and the map swapped in with one commit;
- a certificate changed (the server's own, or a published hostname's): `set ssl cert` + `commit ssl cert`;
- anything else (routes, modes, allow-lists, service-account key files, issuers, the set of
  published hostnames: the ingress routes them and the crt-list names them): the config is
  re-rendered and HAProxy reloaded through the master CLI; counted in `reloads`.

A table or publication that cannot be read is logged and counted; the last good one stays. At
the start there is none: a publication not written yet is waited for (the server beside the
edge in its pod starts at the same time), a table that cannot be used stops the controller.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ignition_server.fsio import atomic_write, make_dir
from ignition_server.sources.kube.client import KubeClient, KubeError

from .endpoints import list_backends
from .metrics import ProxyMetrics
from .notify import notify_socket, wait_ready
from .publication import Publication, PublicationError, parse_token_map, read_publication
from .render import (
    cert_path,
    crt_list,
    crt_list_path,
    host_cert_path,
    host_certs_dir,
    map_path,
    master_socket,
    render_config,
    server_name,
    sni_names,
    sni_names_path,
    stats_socket,
)
from .runtime import Master, Runtime, RuntimeApiError
from .table import Backend, Route, Table, TableError, read_table

log = logging.getLogger("ignition_proxy")
# No TLS 1.3 session tickets at the edge (the file says why): HAProxy has no setting of its own for it.
HAPROXY_OPENSSL_CONF = Path(__file__).with_name("haproxy-openssl.cnf")


def haproxy_env() -> dict[str, str]:
    """HAProxy's environment: ours, under the edge's OpenSSL configuration."""
    return {**os.environ, "OPENSSL_CONF": str(HAPROXY_OPENSSL_CONF)}


@dataclass(frozen=True)
class Desired:
    table: Table
    publications: dict[str, Publication]
    maps: dict[str, dict[str, str]]  # route name -> token map
    certs: dict[str, bytes]  # route name -> PEM chain + key
    host_certs: dict[str, dict[str, bytes]] = dataclasses.field(default_factory=dict)  # route -> published host -> PEM

    def structure(self) -> str:
        """The config with every route's backends left out, and the crt-lists: when it changes,
        HAProxy reloads; when only backends or certificates' contents change, the runtime API does it."""
        bare = dataclasses.replace(
            self.table, routes=tuple(
                # A unix socket's path cannot be set through the runtime API: it is structure.
                dataclasses.replace(r, backends=tuple(b for b in r.backends if b.unix)) for r in self.table.routes))
        lists = [crt_list(self.table, r, self.publications[r.name]) for r in self.table.routes if r.name in self.host_certs]
        return render_config(bare, self.publications) + "".join(lists)


def read_desired(config: Path) -> Desired:
    """Everything the controller acts on, read from disk (raises TableError/PublicationError)."""
    table = read_table(config)
    publications: dict[str, Publication] = {}
    maps: dict[str, dict[str, str]] = {}
    certs: dict[str, bytes] = {}
    host_certs: dict[str, dict[str, bytes]] = {}
    for route in table.routes:
        if route.publication is None:
            continue
        publication = read_publication(route.publication)
        publications[route.name] = publication
        if route.mode == "terminate":
            try:
                maps[route.name] = parse_token_map(publication.token_map.read_text()) if publication.token_map else {}
                certs[route.name] = publication.cert.read_bytes()
                host_certs[route.name] = {host: path.read_bytes() for host, path in publication.hosts}
            except OSError as error:
                raise PublicationError(f"route {route.host}: {error}") from None
    return Desired(table, publications, maps, certs, host_certs)


async def resolve(backend: Backend) -> str:
    """An IP for `set server addr` (the table may name backends by DNS name)."""
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in backend.host else socket.AF_INET, backend.host)
        return backend.host
    except OSError:
        infos = await asyncio.get_running_loop().getaddrinfo(backend.host, backend.port, type=socket.SOCK_STREAM)
        return str(infos[0][4][0])


@dataclass
class Controller:
    config: Path
    haproxy: str = "haproxy"
    interval: float = 0.5
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    kube: KubeClient | None = None  # for routes whose backends come from EndpointSlices
    process: subprocess.Popen[bytes] | None = None
    current: Desired | None = None
    _structure: str = ""

    def _write_files(self, desired: Desired) -> None:
        """What HAProxy reads when it (re)starts: the config, the map copies, the certificates."""
        table = desired.table
        make_dir(table.state_dir)
        for route in table.routes:
            if route.name in desired.maps:
                path = map_path(table, route)
                make_dir(path.parent)
                text = "".join(f"{k} {v}\n" for k, v in sorted(desired.maps[route.name].items()))
                atomic_write(path, text.encode(), 0o600)
            if route.name in desired.certs:
                path = cert_path(table, route)
                make_dir(path.parent)
                atomic_write(path, desired.certs[route.name], 0o600)
            if route.name in desired.host_certs:
                self._write_host_certs(table, route, desired.host_certs[route.name], desired.publications[route.name])
        atomic_write(table.state_dir / "haproxy.cfg", render_config(table, desired.publications).encode(), 0o600)

    @staticmethod
    def _write_host_certs(table: Table, route: Route, pems: dict[str, bytes], publication: Publication) -> None:
        """The published hostnames' certificates and the crt-list naming them; a name no longer
        published loses its file (HAProxy holds what it loaded until the reload that drops it)."""
        directory = host_certs_dir(table, route)
        if pems:
            make_dir(directory)
        for host, pem in pems.items():
            path = host_cert_path(table, route, host)
            if not path.exists() or path.read_bytes() != pem:
                atomic_write(path, pem, 0o600)
        for stale in directory.glob("*.pem") if directory.is_dir() else ():
            if stale.name[: -len(".pem")] not in pems:
                stale.unlink(missing_ok=True)
        atomic_write(crt_list_path(table, route), crt_list(table, route, publication).encode(), 0o600)
        atomic_write(sni_names_path(table, route), "".join(f"{n}\n" for n in sni_names(route, publication)).encode(), 0o600)

    async def _read(self) -> Desired:
        desired = await asyncio.to_thread(read_desired, self.config)
        routes = []
        for route in desired.table.routes:
            if route.endpoints is not None:
                if self.kube is None:
                    raise TableError(f"route {route.host}: endpoints need a Kubernetes client (--kubeconfig or in-cluster)")
                try:
                    found = await list_backends(self.kube, route.endpoints)
                except (KubeError, OSError, asyncio.TimeoutError) as error:
                    # The API is away: keep the servers HAProxy has (health checks still eject dead ones).
                    self.metrics.input_errors.inc()
                    log.warning("route %s: EndpointSlices not read (%s); keeping its servers", route.host, error)
                    known = self.current.table.route(route.host).backends if self.current else ()
                    found = known
                merged = tuple(dict.fromkeys(route.backends + found))
                if len(merged) > desired.table.slots:
                    self.metrics.input_errors.inc()
                    log.warning("route %s: %d endpoints, %d slots: the first ones used", route.host, len(merged), desired.table.slots)
                    merged = merged[: desired.table.slots]
                route = dataclasses.replace(route, backends=merged)
            routes.append(route)
        return dataclasses.replace(desired, table=dataclasses.replace(desired.table, routes=tuple(routes)))

    async def _first_read(self, stop: asyncio.Event | None) -> Desired | None:
        """What HAProxy starts from. A publication not written yet (the server beside this edge in
        its pod still starting: both containers start at once) is waited for, not a failure: exiting
        made the kubelet restart the edge with a growing back-off, delaying the pod's readiness.
        A table that cannot be used still fails at once. None: stopped while waiting."""
        said = False
        while True:
            try:
                return await self._read()
            except PublicationError as error:
                if not said:
                    log.info("waiting for the server's publication: %s", error)
                    said = True
                self.metrics.input_errors.inc()
            if stop is None:
                await asyncio.sleep(self.interval)
            else:
                try:
                    await asyncio.wait_for(stop.wait(), self.interval)
                    return None
                except asyncio.TimeoutError:
                    pass

    async def start(self, stop: asyncio.Event | None = None) -> None:
        desired = await self._first_read(stop)
        if desired is None:
            return
        self._write_files(desired)
        for sock in (master_socket(desired.table), stats_socket(desired.table)):
            if sock.exists():
                sock.unlink()
        cfg = desired.table.state_dir / "haproxy.cfg"
        check = await asyncio.to_thread(
            subprocess.run, [self.haproxy, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True, env=haproxy_env())
        if check.returncode != 0:
            raise TableError(f"HAProxy refuses the rendered config: {check.stdout}{check.stderr}")
        # -Ws: master-worker, and the master says READY=1 once its worker serves (proxy/notify.py).
        notify_path = desired.table.state_dir / "notify.sock"
        notify = notify_socket(notify_path)
        try:
            self.process = subprocess.Popen(
                [self.haproxy, "-Ws", "-S", f"{master_socket(desired.table)},mode,600", "-f", str(cfg)],
                env={**haproxy_env(), "NOTIFY_SOCKET": str(notify_path)})
            self.current, self._structure = desired, desired.structure()
            await wait_ready(notify, self.process)
        finally:
            notify.close()  # later reloads' READY=1 go nowhere (sd_notify ignores a missing socket)
            notify_path.unlink(missing_ok=True)
        await self._wait_for_socket(stats_socket(desired.table))  # ready: answers at once
        self.metrics.last_sync.set(time.time())
        for name, entries in desired.maps.items():
            self.metrics.map_entries.labels(name).set(len(entries))
        log.info("HAProxy started (pid %s) with %d route(s)", self.process.pid, len(desired.table.routes))

    async def _wait_for_socket(self, path: Path, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                await Runtime(path).command("show info")
                return
            except RuntimeApiError:
                if time.monotonic() > deadline or (self.process and self.process.poll() is not None):
                    raise
                await asyncio.sleep(0.05)

    async def sync_once(self) -> None:
        """Read everything once and bring HAProxy in step."""
        assert self.current is not None
        try:
            desired = await self._read()
            structure = desired.structure()
        except (TableError, PublicationError, ValueError, OSError) as error:
            self.metrics.input_errors.inc()
            log.warning("keeping the last good table and publications: %s", error)
            return
        before = self.current
        if structure != self._structure:
            await self._reload(desired, structure)
            return
        runtime = Runtime(stats_socket(desired.table))
        try:
            for route in desired.table.routes:
                old = before.table.route(route.host)
                if old.backends != route.backends:
                    await self._apply_backends(runtime, desired.table, route, old)
                if before.maps.get(route.name) != desired.maps.get(route.name):
                    self._write_files(desired)
                    await runtime.replace_map(map_path(desired.table, route), desired.maps[route.name])
                    self.metrics.runtime_changes.labels("map").inc()
                    self.metrics.map_entries.labels(route.name).set(len(desired.maps[route.name]))
                if before.certs.get(route.name) != desired.certs.get(route.name):
                    self._write_files(desired)
                    await runtime.replace_cert(cert_path(desired.table, route), desired.certs[route.name].decode())
                    self.metrics.runtime_changes.labels("cert").inc()
                old_hosts = before.host_certs.get(route.name, {})
                # Re-issued (a CA rotation, near its end): same names, same set. The files are
                # written once for all of them: a CA rotation re-issues every hostname's at once.
                reissued = {host: pem for host, pem in desired.host_certs.get(route.name, {}).items() if old_hosts.get(host) != pem}
                if reissued:
                    self._write_files(desired)
                for host, pem in reissued.items():
                    await runtime.replace_cert(host_cert_path(desired.table, route, host), pem.decode())
                    self.metrics.runtime_changes.labels("cert").inc()
        except (RuntimeApiError, OSError) as error:
            # Try again next round from what HAProxy was last known to hold.
            self.metrics.runtime_errors.inc()
            log.warning("runtime API: %s", error)
            return
        self._write_files(desired)  # a later reload starts from the same state
        self.current = desired
        self.metrics.last_sync.set(time.time())

    async def _apply_backends(self, runtime: Runtime, table: Table, route: Route, old: Route) -> None:
        backend = route.name
        for slot in range(table.slots):
            want = route.backends[slot] if slot < len(route.backends) else None
            had = old.backends[slot] if slot < len(old.backends) else None
            if want == had:
                continue
            if want is None:
                await runtime.set_server(backend, server_name(slot), None, None, ready=False)
            else:
                await runtime.set_server(backend, server_name(slot), await resolve(want), want.port, ready=True)
            self.metrics.runtime_changes.labels("server").inc()

    async def _reload(self, desired: Desired, structure: str) -> None:
        try:
            self._write_files(desired)
            check = await asyncio.to_thread(
                subprocess.run, [self.haproxy, "-c", "-q", "-f", str(desired.table.state_dir / "haproxy.cfg")], env=haproxy_env(),
                capture_output=True, text=True)
            if check.returncode != 0:
                raise TableError(f"HAProxy refuses the rendered config: {(check.stdout + check.stderr)[:500]}")
            await Master(master_socket(desired.table)).reload()
        except (TableError, RuntimeApiError, OSError) as error:
            self.metrics.input_errors.inc()
            log.warning("not reloaded, the running config stays: %s", error)
            if self.current is not None:
                self._write_files(self.current)
            return
        self.metrics.reloads.inc()
        self.current, self._structure = desired, structure
        self.metrics.last_sync.set(time.time())
        for name, entries in desired.maps.items():
            self.metrics.map_entries.labels(name).set(len(entries))
        log.info("HAProxy reloaded: the routes or the trusted keys changed")

    async def run(self, stop: asyncio.Event) -> None:
        await self.start(stop)
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), self.interval)
                except asyncio.TimeoutError:
                    pass
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"HAProxy exited with {self.process.returncode}")
                await self.sync_once()
        finally:
            self.stop()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


