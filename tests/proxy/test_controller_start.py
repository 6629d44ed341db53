"""The controller's start is dependable under load (issue 32): it waits for HAProxy's own
READY=1 for as long as HAProxy lives, instead of polling its stats socket for 10 s and then
stopping a HAProxy that was merely slow (proxy/notify.py)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from testsupport.harness import ProxyProcess
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
        deadline = time.monotonic() + 10
        while (tmp_path / "state" / "notify.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not (tmp_path / "state" / "notify.sock").exists()
    finally:
        proxy.stop()
    log = (tmp_path / "controller.log").read_text()
    assert "HAProxy started" in log and "Traceback" not in log, log
    assert os.path.exists(tmp_path / "state" / "haproxy.cfg")
