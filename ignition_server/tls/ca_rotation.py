"""The self-made CA is renewed the way tokens rotate: with an overlap, so a machine booting
from an old pointer config never meets a certificate it cannot verify.

    steady    ca.crt = [CA]                     serving cert signed by CA
    adding    ca.crt = [CA, next]               at 80% of CA's life (MCO renews its CA then):
                                                every pointer config is rewritten to trust both
    retiring  ca.crt = [next, CA]               `overlap` later: the serving cert is signed by
                                                next; a pointer config still trusting CA alone
                                                is one whose token has been retired since
    steady    ca.crt = [next]                   `overlap` later again: CA dropped

`overlap` is the token TTL: a pointer config's token stays accepted at most that long after a
newer pointer config replaced it. `plan` is pure (a CA maker is passed in); `CARotation` runs
it where the material lives (a directory, or the Secret the replicas share) and only on the
writer; every process installs what the material says. A CAState holds its keys in plaintext
(in memory, and in the replicas' Secret); in a directory they are encrypted under the cache
key's password (certificates.py), read and written through `password`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, Mapping, Protocol

from cryptography import x509

from ..fsio import atomic_write
from .certificates import ensure_self_signed, plaintext_key_pem, write_private_key

log = logging.getLogger("ignition_server.tls")

RENEW_AT = 0.8
FILES = ("ca.crt", "ca.key", "next-ca.key", "ca-rotation.json")
_PEM_END = b"-----END CERTIFICATE-----"


def split_pem(bundle: bytes) -> tuple[bytes, ...]:
    """The certificates of a PEM bundle, each as its own PEM block."""
    blocks = []
    for part in bundle.split(_PEM_END):
        start = part.find(b"-----BEGIN CERTIFICATE-----")
        if start >= 0:
            blocks.append(part[start:] + _PEM_END + b"\n")
    return tuple(blocks)


@dataclass(frozen=True)
class CAState:
    bundle: tuple[bytes, ...]  # PEM certificates; the first signs
    key: bytes  # the signing CA's key (PEM)
    next_key: bytes | None = None  # the key of the CA being added (bundle[1]) while `adding`
    phase: str = "steady"
    since: float = 0.0

    def files(self) -> dict[str, bytes]:
        out = {"ca.crt": b"".join(self.bundle), "ca.key": self.key,
               "ca-rotation.json": json.dumps({"phase": self.phase, "since": self.since}).encode()}
        if self.next_key is not None:
            out["next-ca.key"] = self.next_key
        return out

    @classmethod
    def from_files(cls, files: Mapping[str, bytes]) -> "CAState":
        meta = json.loads(files.get("ca-rotation.json") or b'{"phase": "steady", "since": 0}')
        return cls(split_pem(files["ca.crt"]), files["ca.key"], files.get("next-ca.key"), meta["phase"], float(meta["since"]))


def plan(state: CAState, now: float, overlap: float, make_ca: Callable[[], tuple[bytes, bytes]]) -> CAState | None:
    """The next step of the rotation, or None when there is nothing to do now."""
    signing = x509.load_pem_x509_certificate(state.bundle[0])
    born, dies = signing.not_valid_before_utc.timestamp(), signing.not_valid_after_utc.timestamp()
    if state.phase == "steady":
        if len(state.bundle) > 1 or now < born + RENEW_AT * (dies - born):
            return None
        cert, key = make_ca()
        return CAState((state.bundle[0], cert), state.key, key, "adding", now)
    if state.phase == "adding" and now >= state.since + overlap and state.next_key is not None:
        return CAState((state.bundle[1], state.bundle[0]), state.next_key, None, "retiring", now)
    if state.phase == "retiring" and now >= state.since + overlap:
        return CAState((state.bundle[0],), state.key, None, "steady", now)
    return None


class CAStore(Protocol):
    async def load(self) -> tuple[CAState | None, str | None]: ...

    async def save(self, state: CAState, version: str | None) -> bool: ...


@dataclass
class DirectoryStore:
    """The material in the TLS directory itself (one server, or one writer per directory)."""

    directory: Path
    password: bytes | None = field(default=None, repr=False)  # what the keys are encrypted under

    async def load(self) -> tuple[CAState | None, str | None]:
        files = {name: (self.directory / name).read_bytes() for name in FILES if (self.directory / name).exists()}
        files = {name: plaintext_key_pem(content, self.password) if name.endswith(".key") else content
                 for name, content in files.items()}
        return (CAState.from_files(files) if "ca.crt" in files and "ca.key" in files else None), None

    async def save(self, state: CAState, version: str | None) -> bool:
        install_files(self.directory, state, self.password)
        return True


def install_files(directory: Path, state: CAState, password: bytes | None = None) -> None:
    for name, content in state.files().items():
        path = directory / name
        if name.endswith(".key"):
            write_private_key(path, content, password)  # encrypted; only if the key differs
        elif not path.exists() or path.read_bytes() != content:
            atomic_write(path, content, 0o644)
    if state.next_key is None and (directory / "next-ca.key").exists():
        (directory / "next-ca.key").unlink()


@dataclass
class CARotation:
    store: CAStore
    directory: Path  # where this process's serving certificate and trust bundle live
    public_url: str | None
    overlap: float
    make_ca: Callable[[], tuple[bytes, bytes]]
    is_writer: Callable[[], bool] = lambda: True
    on_bundle: Callable[[bytes], Awaitable[None] | None] = lambda _bundle: None
    interval: float = 60.0
    clock: Callable[[], float] = time.time
    password: bytes | None = field(default=None, repr=False)  # the directory's keys are encrypted under it
    _installed: CAState | None = None

    async def run(self) -> None:
        failing: str | None = None
        while True:
            try:
                await self.step()
                failing = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the current certificate keeps serving
                if str(exc) != failing:
                    log.warning("CA rotation: %s (trying again)", exc)
                failing = str(exc)
            await asyncio.sleep(self.interval)

    async def step(self) -> None:
        state, version = await self.store.load()
        if state is None:
            return
        if self.is_writer():
            planned = plan(state, self.clock(), self.overlap, self.make_ca)
            if planned is not None and await self.store.save(planned, version):
                log.info("CA rotation: %s -> %s", state.phase, planned.phase)
                state = planned
        if state != self._installed:
            await asyncio.to_thread(self._install, state)
            if self._installed is None or state.bundle != self._installed.bundle:
                result = self.on_bundle(b"".join(state.bundle))
                if asyncio.iscoroutine(result):
                    await result
            self._installed = state

    def _install(self, state: CAState) -> None:
        install_files(self.directory, state, self.password)
        # A serving certificate not signed by the CA that signs now is made again (and the
        # running server reloads it from disk).
        ensure_self_signed(self.directory, self.public_url, password=self.password)
