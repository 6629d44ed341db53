"""What the reconciler derives from tokens, written on every rotation (DESIGN §4, items 2 and 3):

- the pointer config / user-data per NodePool, as HyperShift's `user-data-<nodepool>-<hash>`
  Secret next to the token Secret (keys `value`, `disableTemplating`);
- the edge token map for the front proxy: `sha256(token) NodePool` per valid token (current
  and previous), never a token itself, in an HAProxy map file.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ..fsio import atomic_write, make_dir
from ..model.objects import ObjectKey, object_key, value_digest
from ..model.token_secret import TokenSecret
from ..render.userdata import pointer_user_data, user_data_secret
from ..sources.events import Source
from .faults import Faults

log = logging.getLogger("ignition_server.reconcile.outputs")


@dataclass(frozen=True)
class PointerSettings:
    public_url: str  # https://host:port that nodes reach
    ca_pem: bytes  # what pointer configs trust
    shape: str = "hypershift"
    proxy: tuple[tuple[str, Any], ...] = ()  # `ignition.proxy` items (httpProxy, httpsProxy, noProxy); () none


def edge_token_map(secrets: list[TokenSecret], now: float) -> bytes:
    """HAProxy map lines `<sha256 hex of the token> <namespace>/<nodepool>`, sorted. Pure."""
    lines = set()
    for secret in secrets:
        if secret.expired(now):
            continue
        for token in secret.tokens():
            lines.add(f"{hashlib.sha256(token.encode()).hexdigest()} {secret.nodepool}\n")
    return "".join(sorted(lines)).encode()


def user_data_object(secret: TokenSecret, pointer: PointerSettings) -> dict[str, Any] | None:
    if not secret.token:
        return None
    user_data = pointer_user_data(
        source_url=pointer.public_url, token=secret.token, ca_pem=pointer.ca_pem, shape=pointer.shape,
        proxy=dict(pointer.proxy) or None,
        nodepool=secret.nodepool,
    )
    return user_data_secret(
        nodepool_name=secret.nodepool.partition("/")[2],
        namespace=secret.key.namespace,
        token_secret_name=secret.key.name,
        user_data=user_data,
        nodepool_namespace=secret.nodepool.partition("/")[0],
    )


@dataclass
class TokenOutputs:
    source: Source
    edge_map_path: Path
    pointer: PointerSettings | None = None
    delay: float = 0.1
    _dirty: set[ObjectKey] = field(default_factory=set)
    _secrets: dict[ObjectKey, TokenSecret] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _last_map: bytes | None = None
    faults: Faults = field(default_factory=Faults)  # the reconciler's, once it owns these outputs
    writer: Callable[[], bool] = lambda: True  # the reconciler's: only the writing replica puts user-data

    def trust_changed(self, ca_pem: bytes) -> None:
        """The CAs pointer configs must trust changed (a CA rotation): every user-data again."""
        if self.pointer is None or self.pointer.ca_pem == ca_pem:
            return
        self.pointer = replace(self.pointer, ca_pem=ca_pem)
        self._dirty.update(self._secrets)
        self._kick()

    def tokens_changed(self, secret: TokenSecret) -> None:
        self._secrets[secret.key] = secret
        self._dirty.add(secret.key)
        self._kick()

    def secret_gone(self, secret: TokenSecret) -> None:
        self._secrets.pop(secret.key, None)
        self._kick()

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._write_soon(), name="token-outputs")

    async def _write_soon(self) -> None:
        await asyncio.sleep(self.delay)  # a burst of rotations writes once
        content = edge_token_map(list(self._secrets.values()), time.time())
        if content != self._last_map:
            try:
                await asyncio.to_thread(self._write_map, content)
            except Exception as exc:  # the map is written again with the next change or retry
                self._retry_in(self.faults.failed("edge", str(self.edge_map_path), exc))
            else:
                self._last_map = content
                self.faults.succeeded("edge", str(self.edge_map_path))
        if self.pointer is None or not self.source.writable or not self.writer():
            self._dirty.clear()
            return
        dirty, self._dirty = self._dirty, set()
        for key in sorted(dirty):
            secret = self._secrets.get(key)
            if secret is None:
                continue
            if self.faults.waiting("user-data", secret.ref):
                self._dirty.add(key)  # its retry timer comes back to it
                continue
            try:
                await self._write_user_data(secret, self.pointer)
            except Exception as exc:  # one NodePool's user-data must not stop the others'
                self._dirty.add(key)
                self._retry_in(self.faults.failed("user-data", secret.ref, exc))
            else:
                self.faults.succeeded("user-data", secret.ref)

    def _retry_in(self, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self._kick)

    def _write_map(self, content: bytes) -> None:
        make_dir(self.edge_map_path.parent)
        atomic_write(self.edge_map_path, content, 0o600)

    async def _write_user_data(self, secret: TokenSecret, pointer: PointerSettings) -> None:
        try:
            wanted = user_data_object(secret, pointer)
        except ValueError as exc:
            log.error("user-data for %s not written: %s", secret.nodepool, exc)
            return
        if wanted is None:
            return
        key = object_key(wanted)
        assert key is not None
        current = self.source.get(key)
        # Compared by digest: the source holds a large pointer config (a big CA) as one.
        if current is not None and all(value_digest(current, k) == value_digest(wanted, k) for k in wanted["data"]) \
                and set(current.get("data") or {}) == set(wanted["data"]):
            return
        await self.source.put(wanted, beside=secret.key)
        log.info("wrote user-data Secret %s for %s", key.ref, secret.nodepool)
