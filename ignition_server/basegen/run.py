"""One bootstrap step in a subprocess: its own session, a time limit, an address-space limit,
and (`Limits.sandbox`) namespaces that show it nothing of the server's (sandbox.py).

The step's output (stdout and stderr together) is kept only as its last `TAIL_BYTES`. It is
foreign text: the server's log gets that tail (quoted, so it cannot forge log lines), while
an error's message (for `data.message`, which the token Secret's author reads) carries only
the binary's own error lines as MCO writes them (klog `E`/`F` lines), the last few, bounded
and with anything credential-like redacted. A step past its time limit is killed with its
whole process group (SIGKILL), so a stuck binary leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import resource
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .sandbox import Sandbox

log = logging.getLogger("ignition_server.basegen")

TAIL_BYTES = 8 << 10
MESSAGE_LINES = 8  # error lines an error's message keeps (the last ones)
MESSAGE_LINE_CHARS = 400
# klog's header: severity, MMDD, time, thread id, file:line, then "] ".
_KLOG_ERROR = re.compile(r"^[EF]\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+ [^\]\s]+\] ")
# Anything that may be a credential: long runs of base64 (mixed case and digits) or hex, and
# key: value pairs that name one. A long run of lower-case words and digits is a path or a
# name (`config/cluster-network-02-config.yaml`), which a readable error needs.
_LONG_RUN = re.compile(r"[A-Za-z0-9+/_=-]{24,}")
_HEX_RUN = re.compile(r"[0-9a-fA-F]{32,}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-")  # a digest, a token, a UUID
_SECRET_FIELD = re.compile(r'(?i)("?(?:auth|password|token|secret|key)"?\s*[:=]\s*)("[^"]*"|\S+)')


class StepFailed(Exception):
    """The step exited non-zero, was killed, or could not start; the message ends with its output's tail."""


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


def redact(line: str) -> str:
    line = _SECRET_FIELD.sub(lambda m: m.group(1) + "[redacted]", line)
    return _LONG_RUN.sub(lambda m: "[redacted]" if _secretish(m.group()) else m.group(), line)


def _secretish(run: str) -> bool:
    mixed = any(c.isupper() for c in run) and any(c.islower() for c in run) and any(c.isdigit() for c in run)
    return mixed or bool(_HEX_RUN.search(run))


def error_lines(data: bytes) -> str:
    """What of a step's output may reach `data.message`: its last klog error lines, redacted and bounded."""
    found = [line for line in tail(data).splitlines() if _KLOG_ERROR.match(line)]
    if not found:
        return "no error lines (klog E/F) in its output; the server's log has its tail"
    kept = [redact(line)[:MESSAGE_LINE_CHARS] for line in found[-MESSAGE_LINES:]]
    return "its error lines:\n" + "\n".join(kept)


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
        _log_tail(name, kept)
        raise StepFailed(f"{name} did not finish within {limits.timeout:g} s and was killed; {error_lines(bytes(kept))}") from None
    except asyncio.CancelledError:
        _kill(proc.pid)
        raise
    code = proc.returncode
    assert code is not None  # waited for above
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
        _log_tail(name, kept)
        raise StepFailed(f"{name} {how}; {error_lines(bytes(kept))}")
    return tail(bytes(kept))


def _log_tail(name: str, kept: bytearray) -> None:
    # %r: the binary's text cannot start a line of the server's log of its own.
    log.warning("%s failed; the tail of its output: %r", name, tail(bytes(kept)))


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # its own session: the group is the step and its children
    except ProcessLookupError:
        pass
