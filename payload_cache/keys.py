"""The key file: one index key (HMAC) and AES-256-GCM keys, newest first.

Format (UTF-8 text, one entry per line, ``#`` comments and blank lines ignored)::

    # ignition-server payload cache keys
    index <base64 of 32 random bytes>
    aes <base64 of 32 random bytes>     <- newest: encrypts everything written
    aes <base64 of 32 random bytes>     <- older: still decrypts

* ``index`` (exactly one) keys the HMAC-SHA256 that names blobs and token
  index entries. It must never change: a new index key orphans every blob id
  and token digest.
* ``aes`` (one or more) are AES-256-GCM keys. The first line encrypts; every
  listed key decrypts. A ciphertext names its key by key id = the first 8
  bytes of sha256(key), shown in hex by the admin functions.

Rotating the AES key:
  1. ``add_key(key_file)`` (or prepend an ``aes <base64>`` line by hand,
     keeping mode 0600). A running server notices the changed file on its
     next write and starts encrypting with the new key.
  2. ``rekey(cache)`` re-encrypts every blob and the index under the newest key.
  3. ``prune_keys(key_file)`` drops all but the newest ``aes`` line. Anything
     still under a dropped key becomes unreadable (and is quarantined and
     re-rendered), so only prune after rekey reported success.

The file lives outside the cache directory (default ``<cache_dir>.key``) so a
copy of the directory alone reveals no payload, token or rotation state, nor the
server's TLS private keys beside them: those are encrypted under a password derived
from the index key (``KeyRing.derived``), which never changes, so a rotation of the
``aes`` keys leaves them readable.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ignition_server.fsio import atomic_write, fsync_dir, make_dir, temp_path_for, write_exclusive

from .errors import CacheKeyError

KEY_BYTES = 32
KEY_ID_BYTES = 8
_HEADER = (
    "# ignition-server payload cache keys. Secret: keep mode 0600, outside the cache directory.\n"
    "# 'index' keys blob ids and token digests: never change it.\n"
    "# 'aes' keys are AES-256-GCM, newest first: the first encrypts, all decrypt.\n"
)

log = logging.getLogger("payload_cache")


def key_id(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()[:KEY_ID_BYTES]


class KeyRing:
    """Immutable view of one key file's contents, with ready-made ciphers."""

    __slots__ = ("index_key", "_index_mac", "aes_keys", "_ciphers", "newest_id")

    def __init__(self, index_key: bytes, aes_keys: tuple[bytes, ...]) -> None:
        if len(index_key) != KEY_BYTES:
            raise CacheKeyError(f"index key must be {KEY_BYTES} bytes, got {len(index_key)}")
        if not aes_keys:
            raise CacheKeyError("at least one 'aes' key is required")
        for key in aes_keys:
            if len(key) != KEY_BYTES:
                raise CacheKeyError(f"aes keys must be {KEY_BYTES} bytes (AES-256), got {len(key)}")
        self.index_key = index_key
        # Keyed once: each lookup copies it (a token check per request; copying is read-only,
        # so threads may share it).
        mac = hmac.new(index_key, digestmod=hashlib.sha256)
        # OpenSSL's own HMAC object where the stdlib wraps one (CPython 3.11-3.13), with the same
        # copy/update/digest: the wrapper's are three Python frames on every request's token check.
        self._index_mac = getattr(mac, "_hmac", None) or mac
        self.aes_keys = aes_keys
        self._ciphers = {key_id(key): AESGCM(key) for key in aes_keys}
        self.newest_id = key_id(aes_keys[0])

    @classmethod
    def generate(cls) -> KeyRing:
        return cls(os.urandom(KEY_BYTES), (AESGCM.generate_key(bit_length=256),))

    def hmac(self, data: bytes) -> bytes:
        mac = self._index_mac.copy()
        mac.update(data)
        return mac.digest()

    def derived(self, purpose: str) -> bytes:
        """A secret for `purpose` (32 bytes), from the index key: the same as long as the key file
        lasts, and unrelated to any HMAC the cache computes (HKDF, not HMAC of a chosen text:
        a token or payload cannot be made to hash to it)."""
        return HKDF(hashes.SHA256(), KEY_BYTES, salt=b"ignition-server derived secrets",
                    info=purpose.encode()).derive(self.index_key)

    def cipher(self, kid: bytes) -> AESGCM | None:
        return self._ciphers.get(kid)

    @property
    def newest_cipher(self) -> AESGCM:
        return self._ciphers[self.newest_id]

    def key_ids(self) -> list[str]:
        return [key_id(key).hex() for key in self.aes_keys]

    def serialize(self) -> bytes:
        lines = [_HEADER, f"index {base64.b64encode(self.index_key).decode()}\n"]
        lines += [f"aes {base64.b64encode(key).decode()}\n" for key in self.aes_keys]
        return "".join(lines).encode()


def parse_key_file(text: str, path: Path) -> KeyRing:
    index_keys: list[bytes] = []
    aes_keys: list[bytes] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or parts[0] not in ("index", "aes"):
            raise CacheKeyError(f"{path}:{lineno}: expected 'index <base64>' or 'aes <base64>'")
        try:
            key = base64.b64decode(parts[1], validate=True)
        except binascii.Error as exc:
            raise CacheKeyError(f"{path}:{lineno}: invalid base64 ({exc})") from None
        (index_keys if parts[0] == "index" else aes_keys).append(key)
    if len(index_keys) != 1:
        raise CacheKeyError(f"{path}: expected exactly one 'index' line, found {len(index_keys)}")
    # A key listed twice is harmless; keep the first (newest) position.
    unique = tuple(dict.fromkeys(aes_keys))
    try:
        return KeyRing(index_keys[0], unique)
    except CacheKeyError as exc:
        raise CacheKeyError(f"{path}: {exc}") from None


def load_key_file(path: Path) -> KeyRing:
    try:
        text = path.read_text(encoding="utf-8")
        st = path.stat()
    except FileNotFoundError:
        raise CacheKeyError(f"key file {path} does not exist") from None
    if _readable_by_others(st):
        log.warning("key file %s is accessible by other users (mode %o); chmod 600 it", path, stat.S_IMODE(st.st_mode))
    return parse_key_file(text, path)


def _readable_by_others(st: os.stat_result) -> bool:
    """True when a user other than this process's may read the key.

    A group bit is fine when the group is one of this process's own: a Kubernetes Secret
    volume is root-owned and reaches a non-root pod only through fsGroup (mode 0440)."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o007:
        return True
    return bool(mode & 0o070) and st.st_gid not in {os.getgid(), *os.getgroups()}


def create_key_file(path: Path) -> KeyRing:
    """Create a fresh key file, or load the one a concurrent process just created.

    The keys are written to an O_EXCL 0600 temp file and published with link(),
    which fails if the name exists: a racing process never sees a half-written
    key file and never overwrites one.
    """
    ring = KeyRing.generate()
    make_dir(path.parent)
    tmp = temp_path_for(path)
    write_exclusive(tmp, ring.serialize(), 0o600)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return load_key_file(path)
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)
    log.info("created key file %s", path)
    return ring


def add_key(key_file: Path) -> str:
    """Prepend a new AES key (the one that will encrypt from now on); returns its key id in hex."""
    key_file = Path(key_file)
    ring = load_key_file(key_file)
    new = AESGCM.generate_key(bit_length=256)
    atomic_write(key_file, KeyRing(ring.index_key, (new, *ring.aes_keys)).serialize(), 0o600)
    return key_id(new).hex()


def prune_keys(key_file: Path, keep: int = 1) -> list[str]:
    """Drop all but the newest ``keep`` AES keys; returns the dropped key ids. Run rekey first."""
    if keep < 1:
        raise ValueError("keep must be >= 1")
    key_file = Path(key_file)
    ring = load_key_file(key_file)
    dropped = [key_id(key).hex() for key in ring.aes_keys[keep:]]
    if dropped:
        atomic_write(key_file, KeyRing(ring.index_key, ring.aes_keys[:keep]).serialize(), 0o600)
    return dropped


class KeySource:
    """The key file of a running cache, re-read when an operator changes it.

    Re-reading lets ``add_key`` + ``rekey`` from another process work against a
    live server: the server adopts the new key before its next write and can
    read blobs the other process re-encrypted.
    """

    def __init__(self, path: Path, ring: KeyRing) -> None:
        self.path = path
        self.ring = ring
        self._signature = self._stat_signature()

    def _stat_signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def refresh(self) -> KeyRing:
        """Return the current ring, reloading it if the file changed since last read."""
        signature = self._stat_signature()
        if signature is None or signature == self._signature:
            return self.ring
        try:
            ring = load_key_file(self.path)
        except CacheKeyError as exc:
            # Remember the signature anyway so a broken edit is reported once, not per write.
            self._signature = signature
            log.error("key file changed but cannot be loaded, keeping previous keys: %s", exc)
            return self.ring
        self._signature = signature
        if ring.index_key != self.ring.index_key:
            # Adopting it would silently invalidate every blob id and token digest.
            log.error("key file %s changed its index key; ignoring the change", self.path)
            return self.ring
        self.ring = ring
        log.info("reloaded key file %s (aes keys: %s)", self.path, ", ".join(ring.key_ids()))
        return ring
