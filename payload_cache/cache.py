"""PayloadCache: the persistent, encrypted, crash-safe payload store.

Two tiers for payload blobs — a byte-bounded LRU in memory in front of
encrypted files on disk — plus the token index, which is held entirely in
memory and persisted as one encrypted snapshot by ``flush()``. Its upkeep (gc, verify,
rekey) is ``upkeep.py``'s; the methods here forward to it.

Threads: ``get_blob``/``put_blob``/``flush``/``gc``/``verify``/``rekey`` may run
on worker threads while the event loop reads the index; shared structures are
guarded by locks, single-key index reads are lock-free.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType

from cachetools import LRUCache

from ignition_server.fsio import atomic_write, make_dir

from .blobstore import BlobStore, open_with_reload, quarantine_file
from .config import CacheConfig
from .envelope import INDEX_CONTEXT, EnvelopeError, seal
from .errors import CacheKeyError
from .index import IndexChange, IndexDecodeError, TokenIndex
from .keys import KeySource, create_key_file, load_key_file
from .layout import FORMAT_LINE, Layout
from .records import RenderRecord, TokenRecord
from .reports import GcReport, VerifyReport
from .stats import CacheStats, Counters
from .upkeep import CacheUpkeep

log = logging.getLogger("payload_cache")


class PayloadCache:
    """Use ``PayloadCache.open(config)``; the constructor wires already-loaded parts."""

    def __init__(self, config: CacheConfig, layout: Layout, keys: KeySource, index: TokenIndex, counters: Counters) -> None:
        self.config = config
        self.layout = layout
        self._keys = keys
        self._index = index
        self._blobs = BlobStore(layout, keys)
        self._counters = counters
        # Guards the memory tier and the counters (LRUCache reorders on every read).
        self._lock = threading.Lock()
        # Serialises "is this blob on disk / keep it" (put_blob) against gc deleting it.
        self._disk_lock = threading.Lock()
        # One snapshot writer at a time, so an older snapshot never replaces a newer one.
        self._flush_lock = threading.Lock()
        self._memory: LRUCache[str, bytes] = LRUCache(maxsize=config.memory_bytes, getsizeof=len)
        self._flushed_generation = index.generation
        self._upkeep = CacheUpkeep(
            config, self._blobs, keys, index, counters, self._lock, self._disk_lock,
            quarantine=self._quarantine, forget=self._forget, rewrite_index=self._rewrite_index,
        )

    # -- opening ----------------------------------------------------------
    @classmethod
    def open(cls, config: CacheConfig) -> PayloadCache:
        """Create directories and the key file as needed, check the format, load the index.

        No blob is read: start-up cost is one directory listing plus the index.
        """
        layout = Layout(config.cache_dir)
        key_path = config.resolved_key_file
        _ensure_outside(key_path, config.cache_dir)
        layout.prepare()
        if key_path.exists():
            ring = load_key_file(key_path)
        else:
            if layout.index_file.exists():
                # Not fatal: the cache is rebuilt from the sources. The old index is
                # quarantined below (it cannot be decrypted), so it can be recovered
                # if the original key file turns up.
                log.error(
                    "key file %s is missing but %s holds an index; creating new keys, the old "
                    "contents cannot be read and will be re-rendered", key_path, layout.root,
                )
            ring = create_key_file(key_path)
        keys = KeySource(key_path, ring)
        counters = Counters()
        counters.on_disk = BlobStore(layout, keys).scan()
        counters.disk_bytes = sum(counters.on_disk.values())
        index = _load_index(layout, keys, counters)
        return cls(config, layout, keys, index, counters)

    @classmethod
    def replica(cls, config: CacheConfig, tokens: list[list], renders: list[list]) -> PayloadCache:
        """A serving process's view of a cache another process owns: the same key file and
        blobs, and an index that starts from the owner's rows and follows its changes
        (`apply`). It never writes the index; it only reads blobs."""
        key_path = config.resolved_key_file
        keys = KeySource(key_path, load_key_file(key_path))
        return cls(config, Layout(config.cache_dir), keys, TokenIndex.from_rows(tokens, renders), Counters())

    def follow(self, listener: Callable[[int, IndexChange], None]) -> tuple[int, list[list], list[list]]:
        """Tell `listener` of every token and render change from now on; returns the rows
        (and generation) those changes start from."""
        self._index.listener = listener
        return self._index.rows()

    def index_rows(self) -> tuple[int, list[list], list[list]]:
        """A consistent snapshot of tokens and renders, with its generation."""
        return self._index.rows()

    def apply(self, changes: Iterable[IndexChange]) -> None:
        for change in changes:
            self._index.apply(change)

    @property
    def key_file(self) -> Path:
        return self._keys.path

    def derived_secret(self, purpose: str) -> bytes:
        """A secret for `purpose` derived from the cache key (keys.KeyRing.derived), printable."""
        return base64.b64encode(self._keys.ring.derived(purpose))

    def key_ids(self) -> list[str]:
        """AES key ids (hex), newest (encrypting) first."""
        return self._keys.ring.key_ids()

    # -- blobs ------------------------------------------------------------
    def put_blob(self, payload: bytes) -> str:
        """Store a payload (idempotent) and return its blob id."""
        payload = bytes(payload)
        ring = self._keys.refresh()
        blob_id = ring.hmac(payload).hex()
        with self._disk_lock:
            present = self._blobs.touch(blob_id)
        if present:
            if blob_id not in self._counters.on_disk:
                stat = self._blobs.mtime_and_size(blob_id)
                if stat is not None:
                    with self._lock:
                        self._counters.disk_added(blob_id, stat[1])
        else:
            ciphertext = self._blobs.encrypt(blob_id, payload, ring)
            self._blobs.write(blob_id, ciphertext)
            with self._lock:
                self._counters.disk_added(blob_id, len(ciphertext))
                self._counters.blobs_written += 1
        self._remember(blob_id, payload)
        return blob_id

    def get_blob_from_memory(self, blob_id: str) -> bytes | None:
        """The payload if the memory tier holds it; never touches the disk (safe on an event loop)."""
        with self._lock:
            cached = self._memory.get(blob_id)
            if cached is not None:
                self._counters.memory_hits += 1
            return cached

    def get_blob(self, blob_id: str) -> bytes | None:
        """The payload, or None if absent or unreadable (then the caller re-renders)."""
        path = self._blobs.path(blob_id)  # validates the id before it reaches the filesystem
        cached = self.get_blob_from_memory(blob_id)
        if cached is not None:
            return cached
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            with self._lock:
                self._counters.misses += 1
                self._counters.disk_removed(blob_id)
            return None
        try:
            payload, _ = self._blobs.decrypt(blob_id, raw)
        except EnvelopeError as exc:
            self._quarantine(blob_id, str(exc))
            with self._lock:
                self._counters.misses += 1
            return None
        with self._lock:
            self._counters.disk_hits += 1
        self._remember(blob_id, payload)
        return payload

    def has_blob(self, blob_id: str) -> bool:
        """Whether the blob file exists (not whether it would decrypt)."""
        return self._blobs.exists(blob_id)

    def _remember(self, blob_id: str, payload: bytes) -> None:
        # LRUCache refuses items larger than the whole budget; such payloads just stay on disk.
        if len(payload) > self._memory.maxsize:
            return
        with self._lock:
            self._memory[blob_id] = payload

    def _forget(self, blob_id: str) -> None:
        with self._lock:
            self._memory.pop(blob_id, None)
            self._counters.disk_removed(blob_id)

    def _quarantine(self, blob_id: str, reason: str) -> None:
        moved = self._blobs.quarantine(blob_id, reason)
        self._forget(blob_id)
        if moved:
            with self._lock:
                self._counters.quarantined += 1

    # -- token index ------------------------------------------------------
    def token_key(self, token: str) -> bytes:
        """HMAC-SHA256(index key, token): the only form in which a token is stored."""
        return self._keys.ring.hmac(token.encode("utf-8"))

    def lookup_token(self, token: str) -> TokenRecord | None:
        return self._index.lookup(self.token_key(token))

    def lookup_token_key(self, key: bytes) -> TokenRecord | None:
        return self._index.lookup(key)

    def put_token(self, token: str, record: TokenRecord) -> None:
        self._index.put_token(self.token_key(token), record)

    def put_token_key(self, key: bytes, record: TokenRecord) -> None:
        if len(key) != 32:
            raise ValueError("token keys are 32-byte HMAC-SHA256 digests; use token_key()")
        self._index.put_token(bytes(key), record)

    def drop_token_key(self, key: bytes) -> None:
        self._index.drop_token(key)

    def tokens_of_secret(self, secret: str) -> dict[bytes, TokenRecord]:
        return self._index.tokens_of_secret(secret)

    def get_render(self, secret: str) -> RenderRecord | None:
        return self._index.get_render(secret)

    def put_render(self, record: RenderRecord) -> None:
        self._index.put_render(record)

    def drop_render(self, secret: str) -> None:
        self._index.drop_render(secret)

    def renders(self) -> list[RenderRecord]:
        return self._index.renders()

    def render_count(self) -> int:
        return self._index.render_count()

    def seal(self, name: str, data: bytes) -> None:
        """Keep a small secret record; persisted (encrypted) with the index on flush."""
        self._index.seal(name, data)

    def unseal(self, name: str) -> bytes | None:
        return self._index.unseal(name)

    def unseal_names(self) -> list[str]:
        return self._index.unseal_names()

    def drop_sealed(self, name: str) -> None:
        self._index.drop_sealed(name)

    # -- state files: larger records than sealed index entries, each its own encrypted file
    def save_state(self, name: str, data: bytes) -> None:
        """Keep `data` under `name`, encrypted like a blob, replaced atomically."""
        path = self._state_path(name)
        make_dir(path.parent)
        atomic_write(path, seal(self._keys.refresh(), data, b"state:" + name.encode()), 0o600)

    def load_state(self, name: str) -> bytes | None:
        """What `save_state` kept, or None when absent or unreadable (state is always re-derivable)."""
        path = self._state_path(name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return open_with_reload(self._keys, raw, b"state:" + name.encode())[0]
        except EnvelopeError as exc:
            log.warning("state %s unreadable, ignoring it: %s", name, exc)
            return None

    def _state_path(self, name: str) -> Path:
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            raise ValueError(f"state names are plain words, got {name!r}")
        return self.layout.state_dir / f"{name}.bin"

    def forget_expired(self, now: float, grace: float = 0.0) -> int:
        """Drop token records whose expires_at is before now - grace; returns how many."""
        return self._index.forget_expired(now - grace)

    @property
    def dirty(self) -> bool:
        """Whether the index changed since the last flush."""
        return self._index.generation != self._flushed_generation

    def flush(self) -> None:
        """Persist the index snapshot if it changed (temp file, fsync, rename, fsync dir)."""
        with self._flush_lock:
            if self.dirty:
                self._write_index()

    def _write_index(self) -> None:
        data, generation = self._index.encode()
        atomic_write(self.layout.index_file, seal(self._keys.refresh(), data, INDEX_CONTEXT), 0o600)
        self._flushed_generation = generation

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> PayloadCache:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _rewrite_index(self) -> None:
        with self._flush_lock:
            self._write_index()

    # -- upkeep (upkeep.py) -----------------------------------------------
    def gc(self, now: float | None = None) -> GcReport:
        """Delete blobs no render record references whose file is older than the grace period."""
        return self._upkeep.gc(now)

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """Decrypt every blob and check it is named by the HMAC of its content; quarantine bad ones."""
        return self._upkeep.verify(progress)

    def rekey(self) -> int:
        """Re-encrypt every blob and the index under the newest key; returns blobs re-encrypted."""
        return self._upkeep.rekey()

    # -- counters ---------------------------------------------------------
    def stats(self) -> CacheStats:
        """The counters' snapshot: read every second by each worker's report and by /metrics."""
        with self._lock:
            c = self._counters
            return CacheStats(
                memory_hits=c.memory_hits,
                disk_hits=c.disk_hits,
                misses=c.misses,
                memory_bytes=int(self._memory.currsize),
                memory_items=len(self._memory),
                disk_bytes=c.disk_bytes,
                blob_count=len(c.on_disk),
                quarantined=c.quarantined,
                gc_runs=c.gc_runs,
                gc_deleted=c.gc_deleted,
                blobs_written=c.blobs_written,
                tokens=self._index.token_count(),
                renders=self._index.render_count(),
            )

    def quarantine_files(self) -> int:
        return self._blobs.quarantined_count()

    @property
    def format(self) -> str:
        return FORMAT_LINE


def _ensure_outside(key_file: Path, cache_dir: Path) -> None:
    key = Path(os.path.abspath(key_file)).resolve()
    root = Path(os.path.abspath(cache_dir)).resolve()
    if key == root or key.is_relative_to(root):
        raise CacheKeyError(
            f"key file {key_file} is inside the cache directory {cache_dir}; keep it outside "
            f"(default: {str(cache_dir)}.key) so a copy of the cache reveals no payload"
        )


def _load_index(layout: Layout, keys: KeySource, counters: Counters) -> TokenIndex:
    """Load the snapshot; an unreadable one is quarantined and replaced by an empty index
    (the server re-renders from its sources) rather than stopping start-up."""
    try:
        raw = layout.index_file.read_bytes()
    except FileNotFoundError:
        return TokenIndex()
    try:
        plaintext, _ = open_with_reload(keys, raw, INDEX_CONTEXT)
        return TokenIndex.decode(plaintext)
    except (EnvelopeError, IndexDecodeError) as exc:
        reason = f"index unreadable, starting with an empty index: {exc}"
    if quarantine_file(layout.index_file, layout.quarantine_dir, reason) is not None:
        counters.quarantined += 1
    return TokenIndex()
