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

Verified tokens are cached (bounded LRU keyed by sha256 of the token). A cached entry is
used only while ``now`` is before the earliest deadline it relied on (token ``exp`` plus
leeway, a retired key's or token Secret's overlap end) and while the generation of its
cluster is unchanged: every ``set_keys``/``set_token_secrets``/``configure`` bumps it, so
a change that withdraws acceptance is seen by the next request.

Refusal reasons (:class:`JwtRefused.reason`) never contain the token.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt as pyjwt
from cachetools import LRUCache

from .claims import (
    DEFAULT_ALLOWED_ACCOUNTS,
    DEFAULT_CHECKS,
    ClaimCheck,
    JwtRefused,
    TokenContext,
    TokenSecretRef,
    account_table,
    read_account,
)
from .jwks import KeySource, PrivateKeyRefused, PublicKey, TrustedKey, load_public_keys

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
_DROPPED_KIDS_KEPT = 16  # per cluster: a few rotations' worth
_DROPPED = ""  # the kid index's fingerprint for a dropped key: names it, verifies nothing
MAX_TOKEN_BYTES = 16 * 1024

# PyJWT checks only the signature (and the alg against the allowed list); every claim is
# checked by the named checks of .claims so each one can be shown to matter on its own.
_PYJWT_OPTIONS: dict[str, Any] = {
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


class JwtUnknownKey(JwtRefused):
    """A well-formed token (allowed alg, parseable) that no key this replica holds could have
    signed: its ``kid`` names no trusted key, or it has no ``kid`` and no loaded key verifies
    it (or there are too many keys to try). A hosted cluster that has just rotated its
    signing key issues such tokens before this replica reads the new key, so it is answered
    as a token never seen (status 511: Ignition retries a 5xx and gives up on a 4xx) and
    serves nothing. A ``kid`` naming a key this replica holds whose signature fails is
    forged: that stays a 4xx (:class:`JwtRefused`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(511, reason)


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
class _ClusterState:
    name: str
    keys: dict[str, TrustedKey] = field(default_factory=dict)  # fingerprint -> current key
    retired_keys: dict[str, tuple[TrustedKey, float]] = field(default_factory=dict)  # fp -> (key, until)
    # Kids of keys dropped after their overlap, newest last (bounded): a token naming one was
    # signed by a key that left for good (403), not by one this replica has yet to read (511).
    dropped_kids: dict[str, None] = field(default_factory=dict)
    issuers: frozenset[str] = frozenset()
    audiences: frozenset[str] = frozenset()
    accounts: Mapping[str, frozenset[str]] | None = None  # None: the verifier's default
    secrets_configured: bool = False
    secret_current: TokenSecretRef | None = None
    secret_previous: list[tuple[TokenSecretRef, float]] = field(default_factory=list)
    generation: int = 0


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
    e.g. the hosted control plane namespace ``clusters-foo``) against their public keys."""

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
        self._clock = clock
        self._overlap = float(overlap_seconds)
        self._leeway = float(leeway_seconds)
        self._default_accounts = account_table(allowed_accounts)
        self._max_untargeted = max_untargeted_keys
        self._checks = tuple(checks)
        self._clusters: dict[str, _ClusterState] = {}
        self._kid_index: dict[str, list[tuple[str, str]]] = {}  # kid -> [(cluster, fingerprint)]
        self._cache: LRUCache[bytes, _CacheEntry] = LRUCache(maxsize=cache_size)
        self._lock = threading.RLock()
        self._generation_counter = 0
        self.stats = VerifierStats()

    # ----------------------------------------------------------------- configuration
    @property
    def check_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self._checks)

    def clusters(self) -> list[str]:
        with self._lock:
            return sorted(self._clusters)

    def configure(
        self,
        cluster: str,
        *,
        issuers: Iterable[str] = (),
        audiences: Iterable[str] = (),
        allowed_accounts: Iterable[tuple[str, str]] | None = None,
    ) -> None:
        """Per-cluster claims policy: the bound-token issuers (the cluster's
        ``--service-account-issuer`` values; legacy tokens always need
        ``kubernetes/serviceaccount``), the accepted audiences (empty: ``aud`` not checked),
        and the allowed (namespace, service account) pairs (None: the verifier's default)."""
        with self._lock:
            st = self._state(cluster)
            st.issuers = frozenset(issuers)
            st.audiences = frozenset(audiences)
            st.accounts = None if allowed_accounts is None else account_table(allowed_accounts)
            self._bump(st)

    def set_keys(self, cluster: str, keys: KeySource | Iterable[KeySource], *, now: float | None = None) -> list[TrustedKey]:
        """Replace the cluster's signing keys (JWKS dict/JSON, PEM, key objects, or a list of
        those). Keys no longer listed stay accepted until ``now + overlap_seconds``.
        Raises PrivateKeyRefused / ValueError for an unusable source (nothing changed then)."""
        loaded = load_public_keys(keys)
        now = self._clock() if now is None else now
        with self._lock:
            st = self._state(cluster)
            new = {k.fingerprint: k for k in loaded}
            for fp, key in st.keys.items():
                if fp not in new and fp not in st.retired_keys:
                    st.retired_keys[fp] = (key, now + self._overlap)
            for fp in list(st.retired_keys):
                if fp in new or st.retired_keys[fp][1] <= now:
                    if fp not in new:
                        st.dropped_kids[st.retired_keys[fp][0].kid] = None
                    del st.retired_keys[fp]
            for key in new.values():
                st.dropped_kids.pop(key.kid, None)
            while len(st.dropped_kids) > _DROPPED_KIDS_KEPT:
                del st.dropped_kids[next(iter(st.dropped_kids))]
            touched = set(st.keys) | set(new)
            st.keys = new
            self._bump(st)
            # A shared key makes other clusters' tokens ambiguous: re-verify theirs too.
            for other in self._clusters.values():
                if other is not st and touched & (set(other.keys) | set(other.retired_keys)):
                    self._bump(other)
            self._rebuild_kid_index()
            return list(new.values())

    def set_token_secrets(
        self, cluster: str, current: TokenSecretRef | str | None, *, now: float | None = None
    ) -> None:
        """Restrict the cluster to tokens of its current token Secret (a name, or a
        :class:`TokenSecretRef` by name and/or token hash). The replaced one stays accepted
        until ``now + overlap_seconds``. ``None``: no current Secret (only the previous one,
        within its window). Until first called, a cluster accepts any Secret's token."""
        if isinstance(current, str):
            current = TokenSecretRef(name=current)
        now = self._clock() if now is None else now
        with self._lock:
            st = self._state(cluster)
            if st.secrets_configured and st.secret_current == current:
                return
            previous = [(ref, until) for ref, until in st.secret_previous if until > now and ref != current]
            if st.secret_current is not None and st.secret_current != current:
                previous.insert(0, (st.secret_current, now + self._overlap))
            st.secret_previous = previous
            st.secret_current = current
            st.secrets_configured = True
            self._bump(st)

    def clusters_holding(self, fingerprints: Iterable[str], *, besides: str) -> set[str]:
        """The clusters other than `besides` that trust any of these keys (current or in overlap):
        a key belongs to one cluster, and a copy published for another must not make its tokens ambiguous."""
        wanted = set(fingerprints)
        with self._lock:
            return {
                name for name, st in self._clusters.items()
                if name != besides and wanted & (set(st.keys) | set(st.retired_keys))
            }

    def remove_cluster(self, cluster: str) -> None:
        with self._lock:
            st = self._clusters.pop(cluster, None)
            if st is not None:
                for other in self._clusters.values():
                    if (set(st.keys) | set(st.retired_keys)) & (set(other.keys) | set(other.retired_keys)):
                        self._bump(other)
                self._rebuild_kid_index()

    def trusted_keys(self, cluster: str, *, now: float | None = None) -> list[TrustedKey]:
        """Current keys, then keys still inside their overlap window (for the edge proxy)."""
        now = self._clock() if now is None else now
        with self._lock:
            st = self._clusters.get(cluster)
            if st is None:
                return []
            return list(st.keys.values()) + [k for k, until in st.retired_keys.values() if until > now]

    def issuers(self, cluster: str) -> frozenset[str]:
        """The bound-token issuers of `cluster` (legacy tokens are always LEGACY_ISSUER's)."""
        with self._lock:
            st = self._clusters.get(cluster)
            return st.issuers if st is not None else frozenset()

    def next_expiry(self, cluster: str) -> float | None:
        """Earliest end of an overlap window (key or token Secret) of the cluster: when the
        edge config should be re-rendered."""
        with self._lock:
            st = self._clusters.get(cluster)
            if st is None:
                return None
            ends = [u for _, u in st.retired_keys.values()] + [u for _, u in st.secret_previous]
            return min(ends) if ends else None

    # ----------------------------------------------------------------- verification
    def verify_for_cluster(self, token: str, cluster: str) -> VerifiedToken:
        """:meth:`verify`, then 403 unless the token belongs to ``cluster``."""
        verified = self.verify(token)
        if verified.cluster != cluster:
            self.stats.refused += 1
            raise JwtRefused(403, "token belongs to another cluster")
        return verified

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
                st = self._clusters.get(entry.token.cluster)
                if st is not None and st.generation == entry.generation and now < entry.valid_until:
                    self.stats.cache_hits += 1
                    return entry.token
                self._cache.pop(digest, None)
            self.stats.cache_misses += 1
            candidates, named = self._candidates(token, now)

        verified: list[tuple[_ClusterState, float, dict[str, Any], int]] = []
        for st, key, until, generation in candidates:
            self.stats.signature_checks += 1
            try:
                claims = pyjwt.decode(token, key=key.key, algorithms=[key.alg], options=_PYJWT_OPTIONS)
            except pyjwt.PyJWTError:
                continue
            if not isinstance(claims, dict):
                continue
            verified.append((st, until, claims, generation))
        if not verified:
            if named:  # its kid names a key held here, and that key says no: forged
                raise JwtRefused(401, "token signature not valid for its key")
            raise JwtUnknownKey("no trusted key verifies the token (its key may not be loaded yet)")
        if len({id(st) for st, _, _, _ in verified}) > 1:
            raise JwtRefused(403, "token verifies under keys of more than one cluster")
        st, key_until, claims, generation = max(verified, key=lambda v: v[1])

        bound, namespace, name, secret_name, uid = read_account(claims)
        with self._lock:
            ctx = TokenContext(
                cluster=st.name,
                claims=claims,
                bound=bound,
                namespace=namespace,
                service_account=name,
                secret_name=secret_name,
                uid=uid,
                token_sha256=digest.hex(),
                now=now,
                leeway=self._leeway,
                issuers=st.issuers,
                audiences=st.audiences,
                accounts=st.accounts if st.accounts is not None else self._default_accounts,
                secrets_configured=st.secrets_configured,
                secret_current=st.secret_current,
                secret_previous=tuple(st.secret_previous),
            )
        valid_until = key_until
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
            if st.generation == generation and self._clusters.get(st.name) is st:
                self._cache[digest] = _CacheEntry(result, generation, valid_until)
        return result

    def _candidates(self, token: str, now: float) -> tuple[list[tuple[_ClusterState, TrustedKey, float, int]], bool]:
        """The keys to try, and whether the token's kid named them (a failure is then forged,
        not a key this replica may not have loaded yet)."""
        try:
            header = pyjwt.get_unverified_header(token)
        except pyjwt.PyJWTError:
            raise JwtRefused(401, "malformed token") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise JwtRefused(401, "token algorithm not allowed (RS256 or ES256 only)")
        kid = header.get("kid")
        pairs: list[tuple[str, str]]
        named = isinstance(kid, str) and kid in self._kid_index
        if named:
            pairs = self._kid_index[kid]
        else:
            # No kid, or one no key here has: try every key while that stays cheap (a key
            # loaded from a PEM or a JWKS may carry another kid than the token's).
            pairs = [
                (name, fp)
                for name, st in self._clusters.items()
                for fp in list(st.keys) + list(st.retired_keys)
            ]
            if len(pairs) > self._max_untargeted:
                raise JwtUnknownKey("no trusted key has the token's key id")
        out = []
        for name, fp in pairs:
            st = self._clusters[name]
            if fp in st.keys:
                key, until = st.keys[fp], math.inf
            elif fp in st.retired_keys:
                key, until = st.retired_keys[fp]
                if until <= now:
                    continue
            else:
                continue
            if key.alg == alg:
                out.append((st, key, until, st.generation))
        if not out:
            if named:  # its key is held here, for another alg or past its overlap: never valid
                raise JwtRefused(403, "the token's key does not accept it (alg or key retired)")
            raise JwtUnknownKey("no trusted key matches the token")
        return out, named

    # ----------------------------------------------------------------- internals
    def _state(self, cluster: str) -> _ClusterState:
        if not isinstance(cluster, str) or not cluster:
            raise ValueError("cluster id must be a non-empty string")
        st = self._clusters.get(cluster)
        if st is None:
            st = self._clusters[cluster] = _ClusterState(cluster)
            self._bump(st)
        return st

    def _bump(self, st: _ClusterState) -> None:
        # Globally unique generations: a removed and re-added cluster never reuses one.
        self._generation_counter += 1
        st.generation = self._generation_counter

    def _rebuild_kid_index(self) -> None:
        index: dict[str, list[tuple[str, str]]] = {}
        for name, st in self._clusters.items():
            for fp, key in st.keys.items():
                index.setdefault(key.kid, []).append((name, fp))
            for fp, (key, _) in st.retired_keys.items():
                index.setdefault(key.kid, []).append((name, fp))
            for kid in st.dropped_kids:
                index.setdefault(kid, []).append((name, _DROPPED))
        self._kid_index = index
