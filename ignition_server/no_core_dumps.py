"""No core dumps from a serving process.

A core dump of this server holds what it keeps in memory: the cache keys, tokens, pull
secrets, bootstrap kubeconfigs (one found in a review held all of these). Each process turns
them off for itself at start, wherever it runs (a container whose image or runtime allows
cores, a host with systemd-coredump): RLIMIT_CORE 0, which its children inherit, and
PR_SET_DUMPABLE 0, which also keeps other processes of the same user from ptrace-attaching
or reading its /proc/<pid>/mem and environ (an execve resets it, so every process of ours
calls this). A profiler that attaches by pid (py-spy) then needs root or CAP_SYS_PTRACE.
"""

from __future__ import annotations

import ctypes
import logging
import resource

PR_SET_DUMPABLE = 4

log = logging.getLogger("ignition_server")


def disable_core_dumps() -> bool:
    """Turn core dumps off for this process (and RLIMIT_CORE for its children); False when
    the platform would not (the log says so)."""
    done = True
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError) as exc:
        log.warning("could not set RLIMIT_CORE to 0: %s", exc)
        done = False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    except (OSError, AttributeError) as exc:
        log.warning("could not mark the process non-dumpable: %s", exc)
        done = False
    return done
