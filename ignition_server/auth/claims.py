"""What a service-account token's claims must say to be accepted, once its signature verified.

A list of named claim checks (:data:`DEFAULT_CHECKS`): issuer, namespace, service account,
subject consistency, expiry, not-before, audience, accepted token Secret. Each sees a
:class:`TokenContext` (the claims, their service-account reading, the trust configuration
of the cluster whose key verified the signature, the time) and either refuses or says how
long its acceptance holds, so each can be shown to matter on its own and the verifier's
cache (:mod:`.jwt`) honours the earliest deadline. Pure: no keys, no cache, no clock.

Refusal reasons (:class:`JwtRefused.reason`) never contain the token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_ALLOWED_ACCOUNTS",
    "DEFAULT_CHECKS",
    "LEGACY_ISSUER",
    "MAX_TOKEN_BYTES",
    "ClaimCheck",
    "JwtRefused",
    "TokenContext",
    "TokenSecretRef",
    "account_table",
    "read_account",
]

LEGACY_ISSUER = "kubernetes/serviceaccount"
# The longest service-account JWT looked at. Here, not in jwt.py: tokens.py tells a JWT from an
# opaque token by it, and a serving worker (which hands JWTs to its owner) never imports jwt.py.
MAX_TOKEN_BYTES = 16 * 1024
DEFAULT_ALLOWED_ACCOUNTS: tuple[tuple[str, str], ...] = (
    ("openshift-machine-config-operator", "node-bootstrapper"),
    ("openshift-infra", "node-bootstrapper"),
)

_LEGACY_NS = "kubernetes.io/serviceaccount/namespace"
_LEGACY_SA = "kubernetes.io/serviceaccount/service-account.name"
_LEGACY_SECRET = "kubernetes.io/serviceaccount/secret.name"
_LEGACY_UID = "kubernetes.io/serviceaccount/service-account.uid"
_SUB_PREFIX = "system:serviceaccount:"


class JwtRefused(Exception):
    """The token is not accepted. ``status`` is 401 (unverifiable) or 403 (verified, not allowed).

    ``reason`` is safe to show to the client and to log: it never contains the token.
    """

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class TokenSecretRef:
    """An accepted token Secret: by name (legacy ``secret.name`` claim, or the bound token's
    ``kubernetes.io.secret.name``) and/or by the sha256 (hex) of the token it holds."""

    name: str | None = None
    token_sha256: str | None = None

    def matches(self, secret_name: str | None, token_sha256: str) -> bool:
        if self.name is not None and secret_name is not None and self.name == secret_name:
            return True
        return self.token_sha256 is not None and self.token_sha256 == token_sha256


@dataclass(frozen=True)
class TokenContext:
    """What a claim check sees: the verified claims, their service-account reading, the
    trust configuration of the cluster whose key verified the signature, and the time."""

    cluster: str
    claims: Mapping[str, Any]
    bound: bool
    namespace: str
    service_account: str
    secret_name: str | None
    uid: str | None
    token_sha256: str
    now: float
    leeway: float
    issuers: frozenset[str]
    audiences: frozenset[str]
    accounts: Mapping[str, frozenset[str]]
    secrets_configured: bool
    secret_current: TokenSecretRef | None
    secret_previous: tuple[tuple[TokenSecretRef, float], ...]


@dataclass(frozen=True)
class ClaimCheck:
    """A named check. ``fn`` raises :class:`JwtRefused` or returns the time until which its
    acceptance holds (``None``: no limit of its own); the cache honours the earliest."""

    name: str
    fn: Callable[[TokenContext], float | None]


def _refuse(reason: str, status: int = 403) -> JwtRefused:
    return JwtRefused(status, reason)


def _check_issuer(ctx: TokenContext) -> float | None:
    iss = ctx.claims.get("iss")
    if ctx.bound:
        if not isinstance(iss, str) or iss not in ctx.issuers:
            raise _refuse("token issuer is not an issuer of this cluster")
    elif iss != LEGACY_ISSUER:
        raise _refuse("legacy token issuer is not kubernetes/serviceaccount")
    return None


def _check_namespace(ctx: TokenContext) -> float | None:
    if ctx.namespace not in ctx.accounts:
        raise _refuse("service account namespace not allowed")
    return None


def _check_service_account(ctx: TokenContext) -> float | None:
    # The namespace check refuses namespaces absent from the table; this one refuses names
    # not allowed in the token's namespace, so together they enforce (namespace, name) pairs.
    names = ctx.accounts.get(ctx.namespace)
    if names is not None and ctx.service_account not in names:
        raise _refuse("service account not allowed")
    return None


def _check_subject(ctx: TokenContext) -> float | None:
    sub = ctx.claims.get("sub")
    expected = f"{_SUB_PREFIX}{ctx.namespace}:{ctx.service_account}"
    if sub is None and not ctx.bound:
        return None  # very old legacy tokens may lack sub
    if sub != expected:
        raise _refuse("token subject does not match its service-account claims")
    return None


def _number(ctx: TokenContext, name: str) -> float | None:
    value = ctx.claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _refuse(f"token claim {name} is not a number", 401)
    return float(value)


def _check_expiry(ctx: TokenContext) -> float | None:
    exp = _number(ctx, "exp")
    if exp is None:
        return None
    if ctx.now >= exp + ctx.leeway:
        raise _refuse("token expired")
    return exp + ctx.leeway


def _check_not_before(ctx: TokenContext) -> float | None:
    nbf = _number(ctx, "nbf")
    if nbf is not None and ctx.now < nbf - ctx.leeway:
        raise _refuse("token not valid yet")
    return None


def _check_audience(ctx: TokenContext) -> float | None:
    if not ctx.audiences:
        return None
    aud = ctx.claims.get("aud")
    if aud is None and not ctx.bound:
        return None  # legacy Secret tokens carry no audience
    auds = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if not any(isinstance(a, str) and a in ctx.audiences for a in auds):
        raise _refuse("token audience not accepted")
    return None


def _check_token_secret(ctx: TokenContext) -> float | None:
    if not ctx.secrets_configured:
        return None
    if ctx.secret_current is not None and ctx.secret_current.matches(ctx.secret_name, ctx.token_sha256):
        return None
    for ref, until in ctx.secret_previous:
        if ref.matches(ctx.secret_name, ctx.token_sha256):
            if ctx.now < until:
                return until
            raise _refuse("token Secret was rotated out")
    raise _refuse("token is not from an accepted token Secret")


DEFAULT_CHECKS: tuple[ClaimCheck, ...] = (
    ClaimCheck("issuer", _check_issuer),
    ClaimCheck("namespace", _check_namespace),
    ClaimCheck("service_account", _check_service_account),
    ClaimCheck("subject", _check_subject),
    ClaimCheck("expiry", _check_expiry),
    ClaimCheck("not_before", _check_not_before),
    ClaimCheck("audience", _check_audience),
    ClaimCheck("token_secret", _check_token_secret),
)


def read_account(claims: Mapping[str, Any]) -> tuple[bool, str, str, str | None, str | None]:
    """(bound, namespace, name, secret name, uid) from either token form; 401 otherwise."""
    kube = claims.get("kubernetes.io")
    if isinstance(kube, Mapping):
        sa = kube.get("serviceaccount")
        ns = kube.get("namespace")
        if not isinstance(sa, Mapping) or not isinstance(ns, str) or not isinstance(sa.get("name"), str):
            raise JwtRefused(401, "bound token lacks kubernetes.io namespace/serviceaccount")
        secret = kube.get("secret")
        secret_name = secret.get("name") if isinstance(secret, Mapping) else None
        uid = sa.get("uid")
        return (
            True,
            ns,
            sa["name"],
            secret_name if isinstance(secret_name, str) else None,
            uid if isinstance(uid, str) else None,
        )
    ns = claims.get(_LEGACY_NS)
    name = claims.get(_LEGACY_SA)
    if isinstance(ns, str) and isinstance(name, str):
        secret_name = claims.get(_LEGACY_SECRET)
        uid = claims.get(_LEGACY_UID)
        return (
            False,
            ns,
            name,
            secret_name if isinstance(secret_name, str) else None,
            uid if isinstance(uid, str) else None,
        )
    raise JwtRefused(401, "not a Kubernetes service-account token")


def account_table(pairs: Iterable[tuple[str, str]]) -> dict[str, frozenset[str]]:
    table: dict[str, set[str]] = {}
    for ns, name in pairs:
        if not ns or not name:
            raise ValueError("allowed accounts are (namespace, service account name) pairs")
        table.setdefault(ns, set()).add(name)
    return {ns: frozenset(names) for ns, names in table.items()}
