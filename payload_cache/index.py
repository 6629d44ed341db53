"""The token index: tokens (by HMAC digest), render records and sealed state.

Held in memory as plain dicts; persisted as one JSON snapshot (then encrypted
by the caller). The snapshot is deliberately flat — lists of positional rows —
because start-up time is dominated by json.loads plus record construction.

Snapshot (version 1)::

    {"format": "ignition-server-cache-index", "version": 1,
     "tokens":  [[digest_hex, nodepool, secret, state, expires_at|null], ...],
     "renders": [[secret, nodepool, inputs_digest, blob_id, min_version, rendered_at], ...],
     "sealed":  {name: base64}}
"""

from __future__ import annotations

import base64
import json
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .errors import CacheFormatError
from .records import RenderRecord, TokenRecord, TokenState

INDEX_FORMAT = "ignition-server-cache-index"
INDEX_VERSION = 1

_STATES = {state.value: state for state in TokenState}


# ("token", key, TokenRecord) | ("untoken", key) | ("render", RenderRecord) | ("unrender", secret)
IndexChange = tuple


class IndexDecodeError(Exception):
    """The decrypted snapshot is not a well-formed index."""


class TokenIndex:
    """In-memory index. Mutations take the lock; single-key reads do not need it
    (a dict lookup is atomic in CPython), so the event loop never waits on it."""

    def __init__(self) -> None:
        self._tokens: dict[bytes, TokenRecord] = {}
        # Secondary index so a Secret's tokens are found without a scan.
        self._by_secret: dict[str, set[bytes]] = {}
        self._renders: dict[str, RenderRecord] = {}
        self._sealed: dict[str, bytes] = {}
        # Each row's JSON as the last `encode` made it, dropped when its record changes: a flush
        # re-encodes what changed, not the whole index (re-encoding 10,000 tokens on every flush
        # was ~20% of the owner's CPU in a flood of new token Secrets). Filled by `encode` only,
        # so a replica that never flushes (a serving worker's) holds none.
        self._token_json: dict[bytes, str] = {}
        self._render_json: dict[str, str] = {}
        self._lock = threading.Lock()
        # Bumped on every real change; flush compares it to what it last wrote.
        self.generation = 0
        # Told of every token and render change, under the lock, with the generation it made
        # (so a snapshot from `rows` and the changes after it never overlap or leave a gap).
        self.listener: Callable[[int, IndexChange], None] | None = None

    def _tell(self, change: IndexChange) -> None:
        if self.listener is not None:
            self.listener(self.generation, change)

    # -- tokens -----------------------------------------------------------
    def lookup(self, key: bytes) -> TokenRecord | None:
        return self._tokens.get(key)

    def put_token(self, key: bytes, record: TokenRecord) -> None:
        if not isinstance(record.state, TokenState):
            raise TypeError(f"record.state must be a TokenState, got {record.state!r}")
        with self._lock:
            old = self._tokens.get(key)
            if old == record:
                return
            if old is not None and old.secret != record.secret:
                self._unlink_secret(old.secret, key)
            self._tokens[key] = record
            self._token_json.pop(key, None)
            self._by_secret.setdefault(record.secret, set()).add(key)
            self.generation += 1
            self._tell(("token", key, record))

    def drop_token(self, key: bytes) -> None:
        with self._lock:
            old = self._tokens.pop(key, None)
            if old is None:
                return
            self._token_json.pop(key, None)
            self._unlink_secret(old.secret, key)
            self.generation += 1
            self._tell(("untoken", key))

    def _unlink_secret(self, secret: str, key: bytes) -> None:
        keys = self._by_secret.get(secret)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_secret[secret]

    def tokens_of_secret(self, secret: str) -> dict[bytes, TokenRecord]:
        with self._lock:
            return {key: self._tokens[key] for key in self._by_secret.get(secret, ())}

    def token_count(self) -> int:
        return len(self._tokens)

    def forget_expired(self, cutoff: float) -> int:
        with self._lock:
            expired = [k for k, r in self._tokens.items() if r.expires_at is not None and r.expires_at < cutoff]
            for key in expired:
                self._unlink_secret(self._tokens.pop(key).secret, key)
                self._token_json.pop(key, None)
            if expired:
                self.generation += 1
                for key in expired:
                    self._tell(("untoken", key))
            return len(expired)

    # -- renders ----------------------------------------------------------
    def get_render(self, secret: str) -> RenderRecord | None:
        return self._renders.get(secret)

    def put_render(self, record: RenderRecord) -> None:
        with self._lock:
            if self._renders.get(record.secret) == record:
                return
            self._renders[record.secret] = record
            self._render_json.pop(record.secret, None)
            self.generation += 1
            self._tell(("render", record))

    def drop_render(self, secret: str) -> None:
        with self._lock:
            if self._renders.pop(secret, None) is not None:
                self._render_json.pop(secret, None)
                self.generation += 1
                self._tell(("unrender", secret))

    def renders(self) -> list[RenderRecord]:
        with self._lock:
            return list(self._renders.values())

    def render_count(self) -> int:
        return len(self._renders)

    def referenced_blobs(self) -> set[str]:
        with self._lock:
            return {record.blob_id for record in self._renders.values()}

    # -- sealed state -----------------------------------------------------
    def seal(self, name: str, data: bytes) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("sealed state needs a non-empty str name")
        data = bytes(data)
        with self._lock:
            if self._sealed.get(name) == data:
                return
            self._sealed[name] = data
            self.generation += 1

    def unseal(self, name: str) -> bytes | None:
        return self._sealed.get(name)

    def drop_sealed(self, name: str) -> None:
        with self._lock:
            if self._sealed.pop(name, None) is not None:
                self.generation += 1

    def unseal_names(self) -> list[str]:
        with self._lock:
            return sorted(self._sealed)

    # -- replicas of the index (serving processes) -------------------------
    def rows(self) -> tuple[int, list[list], list[list]]:
        """Tokens and renders as snapshot rows, with the generation they reflect."""
        with self._lock:
            return self.generation, self._token_rows(), self._render_rows()

    @classmethod
    def from_rows(cls, tokens: Iterable[list], renders: Iterable[list]) -> TokenIndex:
        index = cls()
        index._load_rows(tokens, renders, {})
        return index

    def apply(self, change: IndexChange) -> None:
        """Replay a change another index told its listener."""
        kind = change[0]
        if kind == "token":
            self.put_token(change[1], change[2])
        elif kind == "untoken":
            self.drop_token(change[1])
        elif kind == "render":
            self.put_render(change[1])
        elif kind == "unrender":
            self.drop_render(change[1])
        else:
            raise ValueError(f"unknown index change {kind!r}")

    def _token_rows(self) -> list[list]:
        return [_token_row(k, r) for k, r in self._tokens.items()]

    def _render_rows(self) -> list[list]:
        return [_render_row(r) for r in self._renders.values()]

    def _token_json_rows(self) -> list[str]:
        """Every token row as JSON, made for the rows that changed since the last call (under the lock)."""
        made = self._token_json
        rows = []
        for key, record in self._tokens.items():
            row = made.get(key)
            if row is None:
                row = made[key] = _dumps(_token_row(key, record))
            rows.append(row)
        return rows

    def _render_json_rows(self) -> list[str]:
        made = self._render_json
        rows = []
        for secret, record in self._renders.items():
            row = made.get(secret)
            if row is None:
                row = made[secret] = _dumps(_render_row(record))
            rows.append(row)
        return rows

    # -- persistence ------------------------------------------------------
    def encode(self) -> tuple[bytes, int]:
        """Serialize a consistent snapshot; returns it with the generation it reflects."""
        with self._lock:
            tokens = self._token_json_rows()
            renders = self._render_json_rows()
            sealed = {name: base64.b64encode(data).decode("ascii") for name, data in self._sealed.items()}
            generation = self.generation
        # The same bytes json.dumps makes of the whole document (tests/cache/test_index.py holds it).
        text = "".join((
            '{"format":', _dumps(INDEX_FORMAT), ',"version":', _dumps(INDEX_VERSION),
            ',"tokens":[', ",".join(tokens), '],"renders":[', ",".join(renders), '],"sealed":', _dumps(sealed), "}",
        ))
        return text.encode("utf-8"), generation

    @classmethod
    def decode(cls, data: bytes) -> TokenIndex:
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise IndexDecodeError(f"index is not valid JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT:
            raise IndexDecodeError("index snapshot lacks its format marker")
        if doc.get("version") != INDEX_VERSION:
            raise CacheFormatError(
                f"index snapshot has version {doc.get('version')!r}; this version of ignition-server reads "
                f"version {INDEX_VERSION}. Run the release that wrote it, or move the cache directory aside."
            )
        index = cls()
        try:
            index._load_rows(doc["tokens"], doc["renders"], doc["sealed"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IndexDecodeError(f"index snapshot is malformed: {exc!r}") from None
        return index

    def _load_rows(self, tokens: Iterable[list], renders: Iterable[list], sealed: dict[str, str]) -> None:
        intern = sys.intern  # thousands of records share a few hundred names
        states = _STATES
        by_secret = self._by_secret
        token_map = self._tokens
        for key_hex, nodepool, secret, state, expires_at in tokens:
            key = bytes.fromhex(key_hex)
            secret = intern(secret)
            token_map[key] = TokenRecord(intern(nodepool), secret, states[state], expires_at)
            keys = by_secret.get(secret)
            if keys is None:
                by_secret[secret] = {key}
            else:
                keys.add(key)
        for secret, nodepool, inputs_digest, blob_id, min_version, rendered_at in renders:
            self._renders[secret] = RenderRecord(
                intern(secret), intern(nodepool), inputs_digest, blob_id, min_version, rendered_at
            )
        self._sealed = {name: base64.b64decode(value, validate=True) for name, value in sealed.items()}


def _token_row(key: bytes, record: TokenRecord) -> list:
    return [key.hex(), record.nodepool, record.secret, record.state.value, record.expires_at]


def _render_row(record: RenderRecord) -> list:
    return [record.secret, record.nodepool, record.inputs_digest, record.blob_id, record.min_version, record.rendered_at]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
