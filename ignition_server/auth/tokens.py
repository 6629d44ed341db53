"""Where tokens are checked: from the request's credential to the NodePool it opens.

Tokens are never compared as strings: the presented token is hashed with the index's
HMAC key and looked up, so timing reveals nothing about stored tokens, and the index on
disk never holds one.
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from payload_cache import PayloadCache, TokenRecord, TokenState

from .claims import MAX_TOKEN_BYTES, JwtRefused

if TYPE_CHECKING:  # handed in by the owner; a serving worker (no verifier) never imports the JWT checks
    from .jwt import ServiceAccountVerifier


class Refusal(Exception):
    """A request the server answers without a payload. `reason` is safe to show: no token in it."""

    def __init__(self, status: int, reason: str, *, retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


@dataclass(frozen=True)
class Grant:
    """What an authenticated token opens."""

    nodepool: str  # "<namespace>/<name>"
    secret: str  # "<namespace>/<name>" of the token Secret


def credential(*, header: str | None = None, query_value: str | None = None) -> tuple[str, bool]:
    """The presented token and whether it is a service-account JWT, from either request shape.

    Header shape: the Bearer value is base64 of the token, whatever its kind. URL shape: an
    opaque token as it is, a JWT as base64 of the JWT (as in IBM's design).
    """
    if query_value is not None:
        value = query_token(query_value)
        if is_transport_jwt(value):
            try:
                return decode_transport_token(value), True
            except JwtRefused as refused:
                raise Refusal(401, refused.reason) from None
        return value, False
    token = bearer_token(header)
    return token, looks_like_jwt(token)


def bearer_token(header: str | None) -> str:
    """HyperShift's shape: `Authorization: Bearer <base64(token)>`."""
    if not header:
        raise Refusal(401, "missing Authorization header")
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value:
        raise Refusal(401, "Authorization must be 'Bearer <base64 token>'")
    try:
        # base64.b64decode(value, validate=True) without its two Python frames (every request):
        # a2b_base64 refuses a non-ASCII str with ValueError as b64decode does.
        token = binascii.a2b_base64(value, strict_mode=True).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise Refusal(401, "Authorization bearer value is not base64 of a token") from None
    if not token or not token.isprintable():
        raise Refusal(401, "Authorization bearer value is not base64 of a token")
    return token


def query_token(value: str | None) -> str:
    """MCS/IBM shape: `?token=<token>` (aiohttp has already URL-decoded it)."""
    if not value or not value.isprintable():
        raise Refusal(401, "missing or malformed token parameter")
    return value


def looks_like_jwt(text: str) -> bool:
    """Compact JWS shape: three base64url segments, header starting ``{"`` (``eyJ``)."""
    return text.startswith("eyJ") and text.count(".") == 2 and len(text) <= MAX_TOKEN_BYTES


def is_transport_jwt(value: str) -> bool:
    """Whether a ``token=`` / Bearer value is base64 of a JWT (base64 of ``eyJ`` is ``ZXlK``)
    rather than an opaque HyperShift token: how the HTTP layer picks the verifier."""
    return value.lstrip().startswith("ZXlK")


def decode_transport_token(value: str) -> str:
    """The JWT inside a ``token=`` parameter or Bearer value (base64, standard or url-safe,
    padding optional; URL decoding is the HTTP layer's job). Refuses (401) anything else."""
    # A query parser may have turned base64's '+' into ' ' (form decoding); base64 has no spaces.
    value = value.strip().replace(" ", "+")
    if not value or len(value) > MAX_TOKEN_BYTES * 2:
        raise JwtRefused(401, "token missing or too long")
    if looks_like_jwt(value):
        raise JwtRefused(401, "token must be base64 of the JWT")
    try:
        padded = value + "=" * (-len(value) % 4)
        raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
        text = raw.decode("ascii")
    except (binascii.Error, ValueError):
        raise JwtRefused(401, "token is not base64 of a JWT") from None
    if not looks_like_jwt(text):
        raise JwtRefused(401, "token is not base64 of a JWT")
    return text


class NodePoolDirectory(Protocol):
    def grant_for(self, namespace: str, pool_name: str) -> Grant | None: ...


class TokenAuthenticator:
    """Opaque per-NodePool tokens (HyperShift) via the token index; service-account JWTs
    (IBM's design) via the offline verifier, when one is configured."""

    def __init__(
        self,
        cache: PayloadCache,
        clock: Callable[[], float] = time.time,
        *,
        verifier: ServiceAccountVerifier | None = None,
        directory: NodePoolDirectory | None = None,
    ) -> None:
        self._cache = cache
        self._clock = clock
        self._verifier = verifier
        self._directory = directory

    def service_account(self, jwt: str, pool_name: str | None) -> Grant:
        """A hosted cluster's node-bootstrapper JWT opens only that cluster's NodePools."""
        if self._verifier is None or self._directory is None:
            raise Refusal(403, "service-account tokens are not accepted here")
        try:
            verified = self._verifier.verify(jwt)
        except JwtRefused as refused:
            raise Refusal(refused.status, refused.reason) from None
        if not pool_name:
            raise Refusal(403, "a service-account token needs the NodePool (header or path)")
        grant = self._directory.grant_for(verified.cluster, pool_name)
        if grant is None:
            raise Refusal(403, "the token's cluster has no such NodePool")
        return grant

    def authenticate(self, token: str) -> Grant:
        record = self._cache.lookup_token(token)
        if record is None:
            # Maybe a token this replica has not seen yet: the client retries 5xx.
            raise Refusal(511, "token not recognised (yet)")
        return self._grant(record)

    def _grant(self, record: TokenRecord) -> Grant:
        if record.state is TokenState.RETIRED:
            raise Refusal(403, "token was rotated out")
        if record.expires_at is not None and self._clock() >= record.expires_at:
            raise Refusal(403, "token Secret has expired")
        return Grant(nodepool=record.nodepool, secret=record.secret)


def check_nodepool(grant: Grant, *, header: str | None = None, path_name: str | None = None) -> None:
    """A NodePool named by the request must be the one the token opens (never the other way round)."""
    if header is not None and header.strip() != grant.nodepool:
        raise Refusal(403, "NodePool header does not match the token")
    if path_name is not None and path_name != grant.nodepool.partition("/")[2]:
        raise Refusal(403, "NodePool in the path does not match the token")
