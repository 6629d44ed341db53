"""One bootstrap step in a subprocess: its own session, a time limit, an address-space limit,
and (`Limits.sandbox`) namespaces that show it nothing of the server's (sandbox.py).

The step's output (stdout and stderr together) is kept only as its last `TAIL_BYTES`. It is
foreign text, and only the server's log gets it (quoted, so it cannot forge log lines). An
error's message (for `data.message`, which the token Secret's author reads) says which step
failed and points to that log, and holds nothing the binary wrote: not even its error lines,
redacted: a hostile binary carried 241 bytes of the cache key out through `data.message` as
klog `E` lines of lower-case hex that no redaction could tell from an error. A step past its
time limit is killed with its whole process group (SIGKILL), so a stuck binary leaves nothing
behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .sandbox import Sandbox

log = logging.getLogger("ignition_server.basegen")

TAIL_BYTES = 8 << 10
SEE_LOG = "its output is in the server's log (logger ignition_server.basegen)"


class StepFailed(Exception):
    """The step exited non-zero, was killed, or could not start, or what it wrote cannot be used.
    The message names the step and never holds what the binary wrote (the log has that)."""


@dataclass(frozen=True)
class Limits:
    timeout: float = 300.0
    memory_bytes: int = 4 << 30  # RLIMIT_AS: MCO's Go binaries reserve address space generously
    sandbox: Sandbox | None = None  # None: the step runs beside the server (--base-sandbox none)


def _limit(memory_bytes: int) -> None:
    # In the child, before exec: only async-signal-safe work (setrlimit is a system call).
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def tail(data: bytes, limit: int = TAIL_BYTES) -> str:
    text = data[-limit:].decode(errors="replace")
    return ("…" + text) if len(data) > limit else text


async def run_step(argv: Sequence[str], cwd: Path, limits: Limits, env: dict[str, str]) -> str:
    """Run `argv`; its output's tail on success. Raises StepFailed."""
    name = Path(argv[0]).name
    if limits.sandbox is not None:
        await asyncio.to_thread(limits.sandbox.prepare, cwd)
        argv = limits.sandbox.wrap(argv, cwd)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=env, close_fds=True, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True, preexec_fn=lambda: _limit(limits.memory_bytes),
        )
    except OSError as exc:
        raise StepFailed(f"{name} could not start: {exc}") from None
    kept = bytearray()

    async def read() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(64 << 10):
            kept.extend(chunk)
            del kept[:-2 * TAIL_BYTES]  # bounded, however much it writes

    reader = asyncio.ensure_future(read())
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.gather(reader, proc.wait())), limits.timeout)
    except asyncio.TimeoutError:
        _kill(proc.pid)
        await proc.wait()
        reader.cancel()
        _log_tail(name, "was killed after its time limit", kept)
        raise StepFailed(f"{name} did not finish within {limits.timeout:g} s and was killed; {SEE_LOG}") from None
    except asyncio.CancelledError:
        _kill(proc.pid)
        raise
    code = proc.returncode
    assert code is not None  # waited for above
    if code != 0:
        # How it ended goes to the log only: an exit status is a byte the binary chooses.
        how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
        _log_tail(name, how, kept)
        raise StepFailed(f"{name} failed; {SEE_LOG}")
    return tail(bytes(kept))


def _log_tail(name: str, how: str, kept: bytearray) -> None:
    # %r: the binary's text cannot start a line of the server's log of its own.
    log.warning("%s %s; the tail of its output: %r", name, how, tail(bytes(kept)))


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # its own session: the group is the step and its children
    except ProcessLookupError:
        pass
