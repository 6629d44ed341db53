"""HAProxy's runtime API (the stats socket) and master CLI, from asyncio.

One command per connection (the socket's non-interactive mode: HAProxy answers and closes).
What can change without a reload on HAProxy 2.6, and is changed here:

- a server's address and state: `set server <b>/<s> addr <ip> port <p>`, `... state ready|maint`;
- a map's contents, atomically: `prepare map` (a new version), `add map @<ver> <map>` with a
  payload of `key value` lines, `commit map @<ver>` (old entries stay until the commit, so a
  token valid before and after a rotation is never missing in between);
- a certificate: `set ssl cert <file>` with the PEM as payload, then `commit ssl cert <file>`.

What cannot: `jwt_verify` key files are loaded when the configuration is parsed (2.6 keeps
them outside the certificate store the `ssl cert` commands reach), so new or dropped
service-account keys take a reload: `reload` on the master CLI (the master re-executes, the new
worker takes over the listening sockets, the old one finishes its connections).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

_ERROR_MARKS = ("unknown", "no such", "error", "failed", "not found", "invalid", "unable", "can't", "cannot", "missing", "require")


class RuntimeApiError(RuntimeError):
    """HAProxy refused a runtime command (or could not be reached)."""


@dataclass(frozen=True)
class Runtime:
    socket: Path  # the worker's stats socket (level admin)
    timeout: float = 5.0

    async def command(self, line: str, payload: str | None = None) -> str:
        """Send one command (with an optional `<<` payload) and return HAProxy's answer."""
        if "\n" in line:
            raise ValueError("one command per call")
        text = f"{line} <<\n{payload.rstrip(chr(10))}\n\n" if payload is not None else line + "\n"
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(self.socket)), self.timeout)
        except (OSError, asyncio.TimeoutError) as error:
            raise RuntimeApiError(f"stats socket {self.socket}: {error}") from None
        try:
            writer.write(text.encode())
            await writer.drain()
            writer.write_eof()  # the master CLI answers once the client is done writing
            answer = await asyncio.wait_for(reader.read(), self.timeout)
        except (OSError, asyncio.TimeoutError) as error:
            raise RuntimeApiError(f"{line.split(' ', 1)[0]}: {error}") from None
        finally:
            writer.close()
        return answer.decode(errors="replace")

    async def checked(self, line: str, payload: str | None = None) -> str:
        answer = await self.command(line, payload)
        first = answer.strip().splitlines()[0].lower() if answer.strip() else ""
        if any(mark in first for mark in _ERROR_MARKS):
            # The command names a map or server, never a token: safe to report.
            raise RuntimeApiError(f"{line.split(' <<')[0][:120]!r}: {answer.strip()[:300]}")
        return answer

    async def set_server(self, backend: str, server: str, ip: str | None, port: int | None, ready: bool) -> None:
        if ip is not None and port is not None:
            await self.checked(f"set server {backend}/{server} addr {ip} port {port}")
        await self.checked(f"set server {backend}/{server} state {'ready' if ready else 'maint'}")

    async def replace_map(self, map_file: Path, entries: dict[str, str]) -> None:
        """The map's whole contents, swapped in at once."""
        answer = await self.checked(f"prepare map {map_file}")
        version = answer.strip().rsplit(" ", 1)[-1].strip(".")
        if not version.isdigit():
            raise RuntimeApiError(f"prepare map: unexpected answer {answer.strip()[:100]!r}")
        if entries:
            payload = "\n".join(f"{key} {value}" for key, value in sorted(entries.items()))
            await self.checked(f"add map @{version} {map_file}", payload)
        await self.checked(f"commit map @{version} {map_file}")

    async def map_entries(self, map_file: Path) -> dict[str, str]:
        answer = await self.checked(f"show map {map_file}")
        out = {}
        for line in answer.splitlines():
            parts = line.split()
            if len(parts) == 3:  # <ref> <key> <value>
                out[parts[1]] = parts[2]
        return out

    async def replace_cert(self, cert_file: Path, pem: str) -> None:
        await self.checked(f"set ssl cert {cert_file}", pem)
        answer = await self.command(f"commit ssl cert {cert_file}")
        if "success" not in answer.lower():
            await self.command(f"abort ssl cert {cert_file}")
            raise RuntimeApiError(f"commit ssl cert {cert_file}: {answer.strip()[:300]}")


@dataclass(frozen=True)
class Master:
    """The master CLI (`haproxy -W -S <socket>`)."""

    socket: Path
    timeout: float = 5.0

    async def command(self, line: str) -> str:
        return await Runtime(self.socket, self.timeout).command(line)

    async def reload(self) -> None:
        await self.command("reload")

