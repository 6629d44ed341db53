"""AES-256-GCM envelope shared by blob files and the index snapshot.

Layout: ``MAGIC (4) | key id (8) | nonce (12) | ciphertext + GCM tag (16)``.
The associated data is the header plus a context naming what the bytes are
(``blob:<id>`` or ``index``), so a ciphertext moved onto another blob id, or a
blob renamed to the index, fails authentication like any other tampering.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag

from .keys import KEY_ID_BYTES, KeyRing

MAGIC = b"IGC\x01"
NONCE_BYTES = 12
TAG_BYTES = 16
HEADER_BYTES = len(MAGIC) + KEY_ID_BYTES + NONCE_BYTES


class EnvelopeError(Exception):
    """The bytes are not an authentic envelope (torn, tampered, foreign)."""


class UnknownKeyError(EnvelopeError):
    """The envelope names a key id not in the key ring."""

    def __init__(self, kid: bytes) -> None:
        super().__init__(f"encrypted with key id {kid.hex()}, which is not in the key file")
        self.kid = kid


def blob_context(blob_id: str) -> bytes:
    return b"blob:" + blob_id.encode("ascii")


INDEX_CONTEXT = b"index"


def seal(ring: KeyRing, plaintext: bytes, context: bytes) -> bytes:
    # Random 96-bit nonces: safe for far more than the 2^32 messages one key will see here.
    header = MAGIC + ring.newest_id + os.urandom(NONCE_BYTES)
    return header + ring.newest_cipher.encrypt(header[-NONCE_BYTES:], plaintext, header + context)


def envelope_key_id(data: bytes) -> bytes | None:
    if len(data) < HEADER_BYTES + TAG_BYTES or not data.startswith(MAGIC):
        return None
    return data[len(MAGIC) : len(MAGIC) + KEY_ID_BYTES]


def open_envelope(ring: KeyRing, data: bytes, context: bytes) -> bytes:
    kid = envelope_key_id(data)
    if kid is None:
        raise EnvelopeError("not an encrypted cache file (bad magic or truncated header)")
    cipher = ring.cipher(kid)
    if cipher is None:
        raise UnknownKeyError(kid)
    header = data[:HEADER_BYTES]
    try:
        return cipher.decrypt(header[-NONCE_BYTES:], data[HEADER_BYTES:], header + context)
    except InvalidTag:
        raise EnvelopeError("authentication failed (torn, tampered or moved file)") from None
