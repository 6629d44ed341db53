"""The controller's start is dependable under load (issue 32): it waits for HAProxy's own
READY=1 for as long as HAProxy lives, instead of polling its stats socket for 10 s and then
stopping a HAProxy that was merely slow (proxy/notify.py)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from testsupport.harness import ProxyProcess, wait_for
from testsupport.realtools import require_tool


def slow_haproxy(tmp_path: Path, haproxy: str, seconds: float) -> Path:
    """HAProxy whose start (not its config check) takes `seconds` longer, as on a loaded machine."""
    wrapper = tmp_path / "slow-haproxy"
    wrapper.write_text(f"""#!/bin/sh
case " $* " in *" -c "*) ;; *) sleep {seconds} ;; esac
exec {haproxy} "$@"
""")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def test_a_slow_haproxy_start_is_waited_for_not_killed(tmp_path: Path) -> None:
    haproxy = require_tool("haproxy", "apt-get install haproxy")
    proxy = ProxyProcess(tmp_path / "state")
    # A passthrough route needs no publication: the start alone is under test.
    proxy.write_table([{"host": "ignition.example.com", "mode": "passthrough", "backends": ["127.0.0.1:9"]}])
    started = time.monotonic()
    try:
        proxy.start(str(slow_haproxy(tmp_path, haproxy, 11)))  # past the 10 s the controller used to allow
        assert time.monotonic() - started >= 11
        assert "Uptime" in proxy.runtime_command("show info")
        assert proxy.proc is not None and proxy.proc.poll() is None
        # The harness returns once the stats socket answers; the controller removes its notify
        # socket only when HAProxy's READY=1 arrives, a moment later.
        wait_for(lambda: not (tmp_path / "state" / "notify.sock").exists(), timeout=10, what="the notify socket removed")
    finally:
        proxy.stop()
    log = (tmp_path / "controller.log").read_text()
    assert "HAProxy started" in log and "Traceback" not in log, log
    assert os.path.exists(tmp_path / "state" / "haproxy.cfg")


def test_a_publication_written_after_the_start_is_waited_for_not_fatal(tmp_path: Path) -> None:
    """The in-pod edge starts with the server (one pod): the server's --edge-dir publication may
    not exist yet. The controller waits for it (it used to exit 2, and the kubelet restarted it
    with a growing back-off), then serves the route from it."""
    import threading

    from testsupport.harness import ServerProcess, write_manifests
    from testsupport.manifests import build_token_secret

    haproxy = require_tool("haproxy", "apt-get install haproxy")
    edge = tmp_path / "edge"
    proxy = ProxyProcess(tmp_path / "state")
    server = ServerProcess(write_manifests(tmp_path / "src" / "a.yaml", build_token_secret(
        namespace="ns", nodepool="ns/workers", token="t-1", generation_time=time.time())).parent,
        tmp_path / "server" / "cache", extra=["--edge-dir", str(edge)])
    proxy.write_table([{"host": "localhost", "mode": "terminate", "publication": str(edge),
                        "backends": [f"127.0.0.1:{server.port}"]}])
    starting = threading.Thread(target=proxy.start, args=(haproxy,))  # returns once HAProxy answers
    try:
        starting.start()
        log_file = tmp_path / "controller.log"
        wait_for(lambda: log_file.exists() and "waiting for the server's publication" in log_file.read_text(errors="replace"),
                 timeout=20, what="the controller waiting")
        assert proxy.proc is not None and proxy.proc.poll() is None  # waiting, not exited
        server.start()
        starting.join(60)
        wait_for(proxy.servers_up, timeout=20, what="the server healthy behind the proxy")
    finally:
        starting.join(60)
        proxy.stop()
        server.kill()
    log = (tmp_path / "controller.log").read_text()
    assert "HAProxy started" in log and "Traceback" not in log, log
