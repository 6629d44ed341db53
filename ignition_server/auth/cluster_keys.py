"""What each hosted cluster's service-account tokens are checked against, held per cluster.

Per cluster: its public signing keys (current, and replaced ones until their overlap ends),
the kids of keys gone for good, its claims policy (issuers, audiences, allowed accounts) and
its accepted token Secrets (current, and replaced ones until their overlap ends). Across
clusters: an index from ``kid`` to the keys carrying it, and a generation per cluster that
every change bumps (globally unique, so a removed and re-added cluster never reuses one):
the verifier's cache (:mod:`.jwt`) keeps an entry only while its cluster's generation holds.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .claims import DEFAULT_ALLOWED_ACCOUNTS, JwtRefused, TokenContext, TokenSecretRef, account_table
from .jwks import KeySource, TrustedKey, load_public_keys

_DROPPED_KIDS_KEPT = 16  # per cluster: a few rotations' worth
_DROPPED = ""  # the kid index's fingerprint for a dropped key: names it, verifies nothing


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


@dataclass
class ClusterState:
    name: str
    keys: dict[str, TrustedKey] = field(default_factory=dict)  # fingerprint -> current key
    retired_keys: dict[str, tuple[TrustedKey, float]] = field(default_factory=dict)  # fp -> (key, until)
    # Kids of keys dropped after their overlap, newest last (bounded): a token naming one was
    # signed by a key that left for good (403), not by one this replica has yet to read (511).
    dropped_kids: dict[str, None] = field(default_factory=dict)
    issuers: frozenset[str] = frozenset()
    audiences: frozenset[str] = frozenset()
    accounts: Mapping[str, frozenset[str]] | None = None  # None: the default
    secrets_configured: bool = False
    secret_current: TokenSecretRef | None = None
    secret_previous: list[tuple[TokenSecretRef, float]] = field(default_factory=list)
    generation: int = 0

    def fingerprints(self) -> set[str]:
        """Every key it holds, current or retired (still in its overlap)."""
        return set(self.keys) | set(self.retired_keys)


@dataclass(frozen=True)
class Candidate:
    """A key a token may have been signed with: its cluster, until when it is accepted, and
    the cluster's generation when it was picked."""

    cluster: ClusterState
    key: TrustedKey
    until: float
    generation: int


class ClusterKeys:
    """The keys and policy of many hosted clusters (identified by a string id, e.g. the
    hosted control plane namespace ``clusters-foo``). Thread-safe."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        overlap_seconds: float = 3600.0,
        allowed_accounts: Iterable[tuple[str, str]] = DEFAULT_ALLOWED_ACCOUNTS,
        max_untargeted_keys: int = 16,
    ) -> None:
        self._clock = clock
        self._overlap = float(overlap_seconds)
        self._default_accounts = account_table(allowed_accounts)
        self._max_untargeted = max_untargeted_keys
        self._clusters: dict[str, ClusterState] = {}
        self._kid_index: dict[str, list[tuple[str, str]]] = {}  # kid -> [(cluster, fingerprint)]
        self._lock = threading.RLock()
        self._generation_counter = 0

    # ----------------------------------------------------------------- configuration
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
        and the allowed (namespace, service account) pairs (None: the default)."""
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
                if other is not st and touched & other.fingerprints():
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
                if name != besides and wanted & st.fingerprints()
            }

    def remove_cluster(self, cluster: str) -> None:
        with self._lock:
            st = self._clusters.pop(cluster, None)
            if st is not None:
                for other in self._clusters.values():
                    if st.fingerprints() & other.fingerprints():
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

    # ----------------------------------------------------------------- what verification reads
    def candidates(self, alg: str, kid: Any, now: float) -> tuple[list[Candidate], bool]:
        """The keys to try for a token of `alg` naming `kid`, and whether its kid named them (a
        failure is then forged, not a key this replica may not have loaded yet)."""
        with self._lock:
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
                    out.append(Candidate(st, key, until, st.generation))
            if not out:
                if named:  # its key is held here, for another alg or past its overlap: never valid
                    raise JwtRefused(403, "the token's key does not accept it (alg or key retired)")
                raise JwtUnknownKey("no trusted key matches the token")
            return out, named

    def context(self, cluster: ClusterState, **reading: Any) -> TokenContext:
        """What the claim checks see of a token a candidate of `cluster` verified: `reading`
        (its claims and their service-account reading, the time, the leeway) and the
        cluster's policy as it is now."""
        with self._lock:
            return TokenContext(
                cluster=cluster.name,
                issuers=cluster.issuers,
                audiences=cluster.audiences,
                accounts=cluster.accounts if cluster.accounts is not None else self._default_accounts,
                secrets_configured=cluster.secrets_configured,
                secret_current=cluster.secret_current,
                secret_previous=tuple(cluster.secret_previous),
                **reading,
            )

    def generation(self, cluster: str) -> int | None:
        """The cluster's generation now (None: not held); any change bumps it."""
        with self._lock:
            st = self._clusters.get(cluster)
            return st.generation if st is not None else None

    # ----------------------------------------------------------------- internals
    def _state(self, cluster: str) -> ClusterState:
        if not isinstance(cluster, str) or not cluster:
            raise ValueError("cluster id must be a non-empty string")
        st = self._clusters.get(cluster)
        if st is None:
            st = self._clusters[cluster] = ClusterState(cluster)
            self._bump(st)
        return st

    def _bump(self, st: ClusterState) -> None:
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
