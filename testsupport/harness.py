"""Test harness: the real server and the real front proxy as processes, the waits and ports around them
(the real Ignition client is ignition_client.py)."""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testsupport import REPO

EXAMPLE_MACHINECONFIG = """\
apiVersion: machineconfiguration.openshift.io/v1
kind: MachineConfig
metadata:
  name: 50-{name}
  labels:
    machineconfiguration.openshift.io/role: worker
spec:
  config:
    ignition:
      version: 3.2.0
    storage:
      files:
      - path: /etc/{name}.conf
        mode: 420
        overwrite: true
        contents:
          source: data:,hello%20from%20{name}%0A
    systemd:
      units:
      - name: {name}.service
        enabled: true
        contents: |
          [Unit]
          Description={name}
          [Service]
          Type=oneshot
          ExecStart=/usr/bin/true
          [Install]
          WantedBy=multi-user.target
"""


_GIVEN_PORTS: set[int] = set()  # handed out in this test session: the kernel may offer a port again


def free_port() -> int:
    """A port nothing listens on now and this session has not handed out before (two picks in
    a row, a server's serving and metrics ports, could otherwise be the same port)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


class Listener:
    """A TCP port on 127.0.0.1 that accepts and at once closes every connection, counting them:
    something answers there, but nothing a client could talk to (a registry, an API)."""

    def __init__(self) -> None:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def stop(self) -> None:
        self.sock.close()


def status_over_tls(port: int, host: str, context: ssl.SSLContext, target: str, headers: str = "") -> int:
    """One `GET target` on a connection of its own to 127.0.0.1:`port`, SNI and Host `host`, with
    `headers` (lines ending in CRLF), as a node asks; the status of the answer read to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        tls.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.1, what: str = "condition") -> Any:
    """Poll `predicate` until it returns something true, and return that (tests wait on
    conditions, never on sleeps). Fails the test after `timeout` seconds: generous, since a
    condition met costs nothing more and a loaded CI machine is slow."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not met within {timeout}s")
        time.sleep(interval)


def raw_status(connection: http.client.HTTPConnection, target: str, headers: list[tuple[str, str]]) -> int:
    """The status of one request sent exactly as written: urllib would tidy the target, and a dict
    cannot carry two headers of one name. Closes the connection."""
    try:
        connection.putrequest("GET", target, skip_accept_encoding=True)
        for name, value in headers:
            connection.putheader(name, value)
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


def seconds_until_closed(conn: socket.socket, limit: float = 30.0) -> float:
    """How long the peer keeps `conn` open from now (reading and dropping what it sends)."""
    started = time.monotonic()
    conn.settimeout(limit)
    with contextlib.suppress(OSError):
        while conn.recv(65536):
            pass
    return time.monotonic() - started


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def write_manifests(path: Path, *objects: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(list(objects), sort_keys=False))
    return path


STARTED: list["ServerProcess"] = []  # what conftest kills after each test, whatever the test did


@dataclass
class ServerProcess:
    source: Path
    cache_dir: Path
    token_ttl: str = "11h"
    extra: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    ca: Path | None = None  # the CA to trust, when the server is given its certificate
    env: dict[str, str] | None = None  # the server's environment (None: this process's)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.ca or self.cache_dir / "tls" / "ca.crt"

    def start(self, wait: bool = True) -> "ServerProcess":
        STARTED.append(self)
        self.log_path = self.cache_dir.parent / f"server-{self.port}.log"
        self.cache_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "ignition_server", "serve",
                "--source", str(self.source), "--cache-dir", str(self.cache_dir),
                "--listen", f"127.0.0.1:{self.port}", "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
                "--token-ttl", self.token_ttl, "--public-url", f"https://127.0.0.1:{self.port}",
                "--log-format", "json", *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.05) -> float:
        """Seconds until /readyz answers 200 (from this call)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if self.get("/readyz")[0] == 200:
                    return time.monotonic() - started
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(interval)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def tls_password(self) -> bytes:
        """What the self-made CA's and serving keys in its cache dir are encrypted under (derived
        from the cache key beside the cache dir, `<cache-dir>.key`, as server.py derives it)."""
        from ignition_server.tls.certificates import PASSWORD_PURPOSE
        from payload_cache.keys import load_key_file

        return base64.b64encode(load_key_file(Path(str(self.cache_dir) + ".key")).derived(PASSWORD_PURPOSE))

    def serving_key(self, to: Path) -> Path:
        """Its serving key in the clear at `to` (0600): for another process given the same pair."""
        from ignition_server.tls.certificates import TLSFiles

        tls = self.cache_dir / "tls"
        to.unlink(missing_ok=True)
        to.touch(mode=0o600)
        to.write_bytes(TLSFiles(tls / "serving.crt", tls / "serving.key", None, self.tls_password()).key_pem())
        return to

    def get(self, path: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path, headers=headers or {}, method=method)
        try:
            with urllib.request.urlopen(request, context=self.ssl_context(), timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def get_metrics_text(self) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            return response.read()

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values


def openssl_client(port: int, ca_file: Path, *args: str, servername: str | None = None,
                   request: str = "") -> subprocess.CompletedProcess[str]:
    """The real OpenSSL client (`openssl s_client`) against 127.0.0.1:`port` with these options;
    with a `request`, it also reads the answer to the end (and so what the server sends after
    the handshake: TLS 1.3 session tickets)."""
    from testsupport.realtools import require_tool

    binary = require_tool("openssl", "apt-get install openssl")
    command = [binary, "s_client", "-connect", f"127.0.0.1:{port}", "-CAfile", str(ca_file), *args]
    if servername is not None:
        command += ["-servername", servername]
    if request:
        command.append("-ign_eof")  # read until the server closes, not until stdin ends
    return subprocess.run(command, input=request, capture_output=True, text=True, timeout=30)


def handshakes(port: int, ca_file: Path, *args: str, servername: str | None = None) -> bool:
    """Whether the real OpenSSL client completes a handshake with these options."""
    result = openssl_client(port, ca_file, *args, servername=servername)
    return result.returncode == 0 and "Cipher is (NONE)" not in result.stdout


def sni_handshake(port: int, servername: str, ca: Path) -> tuple[str, str]:
    """What `openssl s_client` says of the chain served for `servername`, verified with `ca` and for
    that hostname (`-verify_hostname`, as a node's Ignition checks it): (its verdict, the leaf's subjectAltName)."""
    result = openssl_client(port, ca, "-verify_hostname", servername, "-showcerts", servername=servername)
    out = result.stdout
    verdict = next((line.strip() for line in out.splitlines() if "Verify return code" in line), out[-500:])
    if "-----BEGIN CERTIFICATE-----" not in out:
        return verdict, ""
    leaf = out[out.index("-----BEGIN CERTIFICATE-----"):out.index("-----END CERTIFICATE-----") + 25]
    san = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"], input=leaf,
                         capture_output=True, text=True, timeout=30).stdout
    return verdict, san


def session_tickets(port: int, ca_file: Path, version: str, servername: str | None = None) -> bool:
    """Whether the server issues a session ticket to a client of `version` (`-tls1_2`, `-tls1_3`)
    that asks for one and reads its answer to the end."""
    result = openssl_client(port, ca_file, version, servername=servername,
                            request="GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert "Verify return code: 0 (ok)" in result.stdout, result.stdout + result.stderr
    return "TLS session ticket lifetime hint" in result.stdout or "New Session Ticket arrived" in result.stdout


def run_bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`python -m bench ARGS` as a user runs it (from the repository's root), output captured.
    It runs in a session of its own: past `timeout` the whole group is killed, with the servers
    it started (they are its children, not the test's, so conftest's clean-up cannot see them)."""
    proc = subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"python -m bench {' '.join(args)} still ran after {timeout} s\n{out}\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def bearer(token: str) -> dict[str, str]:
    """The Authorization header the Ignition client sends: the token base64-encoded."""
    return {"Authorization": "Bearer " + base64.b64encode(token.encode()).decode()}


class Started:
    """Makes servers, registries and the like through `started(factory, *args)`, and stops them
    all, newest first (`stop_all`), from a test's fixture."""

    def __init__(self) -> None:
        self.made: list[Any] = []

    def __call__(self, factory: Any, *args: Any, **kwargs: Any) -> Any:
        thing = factory(*args, **kwargs)
        self.made.append(thing)
        return thing

    def stop_all(self) -> None:
        for thing in reversed(self.made):
            thing.kill() if isinstance(thing, ServerProcess) else thing.stop()


def worker_pids(proc: ServerProcess) -> dict[int, int]:
    """Worker number -> pid of the newest process of that number, from the owner's log."""
    found: dict[int, int] = {}
    for number, pid in re.findall(r"worker (\d+) \(pid (\d+)\) is serving", proc.logs()):
        found[int(number)] = int(pid)
    return found


@dataclass
class ProxyProcess:
    """`ignition-proxy run` (the controller, which runs the real HAProxy) on a routing table."""

    state_dir: Path
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def table_path(self) -> Path:
        return self.state_dir.parent / "table.yaml"

    def write_table(self, routes: list[dict[str, Any]], **extra: Any) -> None:
        table = {"listen": self.port, "state_dir": str(self.state_dir), "slots": 4, "check_interval": "300ms",
                 "metrics_listen": f"127.0.0.1:{self.metrics_port}", "routes": routes, **extra}
        self.table_path.parent.mkdir(parents=True, exist_ok=True)
        self.table_path.write_text(yaml.safe_dump(table))

    def start(self, haproxy: str, *extra: str) -> "ProxyProcess":
        log = open(self.state_dir.parent / "controller.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "run", "--config", str(self.table_path), "--haproxy", haproxy, "--interval", "0.2",
             *extra],
            stdout=log, stderr=subprocess.STDOUT)
        proc = self.proc
        # The controller answers once HAProxy said READY=1 (proxy/notify.py); one that exits
        # is reported at once, with its log, rather than waited for.
        wait_for(lambda: self.runtime_command("show info") or proc.poll() is not None, timeout=20,
                 what="HAProxy's stats socket")
        if proc.poll() is not None:
            raise AssertionError(f"ignition-proxy exited with {proc.returncode}:\n"
                                 f"{(self.state_dir.parent / 'controller.log').read_text(errors='replace')[-3000:]}")
        return self

    def runtime_command(self, line: str, master: bool = False) -> str:
        path = self.state_dir / ("master.sock" if master else "haproxy.sock")
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(5)
                sock.connect(str(path))
                sock.sendall(line.encode() + b"\n")
                sock.shutdown(socket.SHUT_WR)
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
                return data.decode()
        except OSError:
            return ""

    def reloads(self) -> int:
        for line in self.runtime_command("show proc", master=True).splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "master":
                return int(parts[2])
        raise AssertionError("no master line in show proc")

    def servers_up(self) -> bool:
        rows = [r.split(",") for r in self.runtime_command("show stat -1 4 -1").splitlines() if r and not r.startswith("#")]
        # Slots (s0, s1, ...) not in maintenance; the terminate loop server has no check.
        live = [r for r in rows if len(r) > 17 and r[1].startswith("s") and r[17] != "MAINT"]
        return bool(live) and all(r[17] == "UP" for r in live)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2]) for line in text.splitlines()
                if line and not line.startswith("#")}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
