"""Offline verification of Kubernetes service-account JWTs (the IBM / MCS token shape).

A node sends the hosted cluster's ``node-bootstrapper`` service-account token, a JWT
(``GET /config/<pool>?token=<base64(jwt)>`` or ``Authorization: Bearer <base64(jwt)>``;
:mod:`.tokens` takes it out of the request).
:class:`ServiceAccountVerifier` checks it with no API call per request:

1. the JOSE header: ``alg`` must be RS256 or ES256 (never ``none``/HS*), ``kid`` selects keys;
2. the signature, with PyJWT and ``algorithms=[<the key's own alg>]``, against the public
   signing keys of each hosted cluster whose keys carry that ``kid`` (current keys, and keys
   replaced less than ``overlap_seconds`` ago). Tokens that verify under the keys of two
   clusters are ambiguous and refused;
3. the named claim checks of :mod:`.claims` (issuer, namespace, service account, subject,
   expiry, not-before, audience, accepted token Secret), against the trust configuration
   of the cluster whose key verified the signature.

The keys and policy are held per cluster by :class:`.cluster_keys.ClusterKeys`; this
module verifies against them and caches what it verified (bounded LRU keyed by sha256 of
the token). A cached entry is used only while ``now`` is before the earliest deadline it
relied on (token ``exp`` plus leeway, a retired key's or token Secret's overlap end) and
while the generation of its cluster is unchanged: every ``set_keys``/``set_token_secrets``/
``configure`` bumps it, so a change that withdraws acceptance is seen by the next request.

Refusal reasons (:class:`JwtRefused.reason`) never contain the token.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache

from .claims import (
    DEFAULT_ALLOWED_ACCOUNTS,
    DEFAULT_CHECKS,
    MAX_TOKEN_BYTES,
    ClaimCheck,
    JwtRefused,
    read_account,
)
from .cluster_keys import Candidate, ClusterKeys, JwtUnknownKey
from .jwks import PrivateKeyRefused, PublicKey

if TYPE_CHECKING:  # the options' TypedDict: only the type checker needs it, and older PyJWTs lack jwt.types
    from jwt.types import Options

__all__ = [
    "ALGORITHMS",
    "JwtUnknownKey",
    "PrivateKeyRefused",
    "PublicKey",
    "ServiceAccountVerifier",
    "VerifiedToken",
    "VerifierStats",
]

ALGORITHMS: tuple[str, ...] = ("RS256", "ES256")

# PyJWT checks only the signature (and the alg against the allowed list); every claim is
# checked by the named checks of .claims so each one can be shown to matter on its own.
_PYJWT_OPTIONS: Options = {
    "verify_signature": True,
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
    "verify_aud": False,
    "verify_iss": False,
    "verify_sub": False,
    "verify_jti": False,
    "require": [],
}


@dataclass(frozen=True)
class VerifiedToken:
    cluster: str
    namespace: str
    service_account: str
    secret_name: str | None
    expires_at: float | None
    uid: str | None = None
    bound: bool = False  # True for a TokenRequest (bound) token, False for a legacy Secret token


@dataclass
class VerifierStats:
    cache_hits: int = 0
    cache_misses: int = 0
    signature_checks: int = 0
    refused: int = 0


@dataclass(frozen=True)
class _CacheEntry:
    token: VerifiedToken
    generation: int
    valid_until: float


class ServiceAccountVerifier:
    """Verifies service-account JWTs of many hosted clusters (identified by a string id,
    e.g. the hosted control plane namespace ``clusters-foo``) against their public keys,
    held and configured in :attr:`keys` (``verifier.keys.set_keys(...)``)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        cache_size: int = 10000,
        overlap_seconds: float = 3600.0,
        leeway_seconds: float = 60.0,
        allowed_accounts: Iterable[tuple[str, str]] = DEFAULT_ALLOWED_ACCOUNTS,
        max_untargeted_keys: int = 16,
        checks: Sequence[ClaimCheck] = DEFAULT_CHECKS,
    ) -> None:
        self.keys = ClusterKeys(clock=clock, overlap_seconds=overlap_seconds, allowed_accounts=allowed_accounts,
                                max_untargeted_keys=max_untargeted_keys)
        self._clock = clock
        self._leeway = float(leeway_seconds)
        self._checks = tuple(checks)
        self._cache: LRUCache[bytes, _CacheEntry] = LRUCache(maxsize=cache_size)
        self._lock = threading.Lock()  # the cache's (taken before the keys' own, never after)
        self.stats = VerifierStats()

    # ----------------------------------------------------------------- verification
    def verify(self, token: str) -> VerifiedToken:
        """The verified token (its cluster decided by the keys that verify it), or JwtRefused."""
        try:
            return self._verify(token)
        except JwtRefused:
            self.stats.refused += 1
            raise

    def _verify(self, token: str) -> VerifiedToken:
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_BYTES:
            raise JwtRefused(401, "token missing or too long")
        digest = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        with self._lock:
            entry = self._cache.get(digest)
            if entry is not None:
                if self.keys.generation(entry.token.cluster) == entry.generation and now < entry.valid_until:
                    self.stats.cache_hits += 1
                    return entry.token
                self._cache.pop(digest, None)
            self.stats.cache_misses += 1
        candidates, named = self._candidates(token, now)

        import jwt as pyjwt  # here, not at the top: a serving worker starts (and gets ready) without PyJWT

        verified: list[tuple[Candidate, dict[str, Any]]] = []
        for candidate in candidates:
            self.stats.signature_checks += 1
            key = candidate.key
            try:
                claims = pyjwt.decode(token, key=key.key, algorithms=[key.alg], options=_PYJWT_OPTIONS)
            except pyjwt.PyJWTError:
                continue
            if not isinstance(claims, dict):
                continue
            verified.append((candidate, claims))
        if not verified:
            if named:  # its kid names a key held here, and that key says no: forged
                raise JwtRefused(401, "token signature not valid for its key")
            raise JwtUnknownKey("no trusted key verifies the token (its key may not be loaded yet)")
        if len({id(candidate.cluster) for candidate, _ in verified}) > 1:
            raise JwtRefused(403, "token verifies under keys of more than one cluster")
        chosen, claims = max(verified, key=lambda v: v[0].until)
        st, generation = chosen.cluster, chosen.generation

        bound, namespace, name, secret_name, uid = read_account(claims)
        ctx = self.keys.context(
            st,
            claims=claims,
            bound=bound,
            namespace=namespace,
            service_account=name,
            secret_name=secret_name,
            uid=uid,
            token_sha256=digest.hex(),
            now=now,
            leeway=self._leeway,
        )
        valid_until = chosen.until
        for check in self._checks:
            deadline = check.fn(ctx)
            if deadline is not None:
                valid_until = min(valid_until, deadline)
        exp = claims.get("exp")
        result = VerifiedToken(
            cluster=st.name,
            namespace=namespace,
            service_account=name,
            secret_name=secret_name,
            expires_at=float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None,
            uid=uid,
            bound=bound,
        )
        with self._lock:
            # Only while nothing it relied on changed meanwhile (generations are never reused).
            if self.keys.generation(st.name) == generation:
                self._cache[digest] = _CacheEntry(result, generation, valid_until)
        return result

    def _candidates(self, token: str, now: float) -> tuple[list[Candidate], bool]:
        """The keys to try, and whether the token's kid named them."""
        import jwt as pyjwt  # as in `verify`

        try:
            header = pyjwt.get_unverified_header(token)
        except pyjwt.PyJWTError:
            raise JwtRefused(401, "malformed token") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise JwtRefused(401, "token algorithm not allowed (RS256 or ES256 only)")
        return self.keys.candidates(alg, header.get("kid"), now)
