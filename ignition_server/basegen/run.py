"""One bootstrap step in a subprocess: its own session, a time limit, an address-space limit.

The step's output (stdout and stderr together) is kept only as its last `TAIL_BYTES`,
which is what an error names; a step past its time limit is killed with its whole process
group (SIGKILL), so a stuck binary leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

TAIL_BYTES = 8 << 10


class StepFailed(Exception):
    """The step exited non-zero, was killed, or could not start; the message ends with its output's tail."""


@dataclass(frozen=True)
class Limits:
    timeout: float = 300.0
    memory_bytes: int = 4 << 30  # RLIMIT_AS: MCO's Go binaries reserve address space generously


def _limit(memory_bytes: int) -> None:
    # In the child, before exec: only async-signal-safe work (setrlimit is a system call).
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def tail(data: bytes, limit: int = TAIL_BYTES) -> str:
    text = data[-limit:].decode(errors="replace")
    return ("…" + text) if len(data) > limit else text


async def run_step(argv: Sequence[str], cwd: Path, limits: Limits, env: dict[str, str]) -> str:
    """Run `argv`; its output's tail on success. Raises StepFailed."""
    name = Path(argv[0]).name
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
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
        raise StepFailed(f"{name} did not finish within {limits.timeout:g} s and was killed; its output:\n{tail(bytes(kept))}") from None
    except asyncio.CancelledError:
        _kill(proc.pid)
        raise
    if proc.returncode != 0:
        how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with {proc.returncode}"
        raise StepFailed(f"{name} {how}; its output:\n{tail(bytes(kept))}")
    return tail(bytes(kept))


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # its own session: the group is the step and its children
    except ProcessLookupError:
        pass
