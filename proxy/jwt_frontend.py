"""An HAProxy (2.6+) frontend that checks service-account JWTs at the edge.

IBM's design puts a token-checking HAProxy in front of the payload server:
``GET /config/<pool>?token=<base64(jwt)>``. This module renders that check, the
``http-request`` lines an HTTP frontend runs (:func:`token_check_lines`; ``proxy.render``
puts them in the front proxy's TLS-terminating frontend), so forged tokens are
answered ``403`` by HAProxy and never reach the server. The server verifies again with
:class:`ignition_server.auth.jwt.ServiceAccountVerifier` (token Secret, cluster, cache);
the edge checks what HAProxy can check without state:

* the token: URL parameter ``token`` → ``url_dec,b64dec`` (optionally the Bearer value,
  ``http_auth_bearer,b64dec``), compact-JWS shaped;
* ``alg`` from the JOSE header is RS256 or ES256, and it is the alg of the key file used:
  one ``jwt_verify("<alg>","<key file>")`` per key file (current key and previous keys
  within their overlap window), accepted when any of them returns exactly 1;
* ``iss`` is one of the accepted issuers, ``sub`` is ``system:serviceaccount:<ns>:<name>``
  for an allowed pair (both token forms carry ``sub``);
* ``exp`` (when present) is after ``date()`` minus leeway, ``nbf`` (when present) before
  ``date()`` plus leeway; a present but non-integer ``exp``/``nbf`` is refused.

Refusals use ``http-request return status 403``: a forged token can never succeed, so 4xx
is right. One exception, as at the server (:class:`ignition_server.auth.jwt.JwtUnknownKey`):
a well-formed JWT that no key file verifies and whose ``kid`` (``jwt_header_query('$.kid')``)
names no key the edge holds, or that has no ``kid``, is answered ``511`` + ``Retry-After``:
the hosted cluster may have rotated its signing key before the edge was reloaded with the
new one, and Ignition retries a 5xx but gives up on a 4xx. A ``kid`` naming a held key whose
signature fails is forged: ``403``. The held kids are written into the rules beside the key
files (a key change takes a reload anyway, ``jwt_verify`` reads key files at start-up).
Bodies never echo the token, and the optional log format logs the path without the query string.

:func:`token_check_lines` is pure: re-render when keys rotate (the set of key files
changes) and reload HAProxy. :func:`write_key_files` writes the PEM public key files
(HAProxy 2.6 ``jwt_verify`` reads a SubjectPublicKeyInfo PEM, loaded at start-up).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ignition_server.auth.claims import DEFAULT_ALLOWED_ACCOUNTS, LEGACY_ISSUER

# The server publishes its key files (ignition_server.edge_publisher); the proxy reads them.
from ignition_server.edge_publication import PublishedKey as EdgeKey, write_key_files

__all__ = ["EdgeKey", "TokenCheck", "token_check_lines", "write_key_files"]

EDGE_ALGORITHMS = ("RS256", "ES256")

# Words HAProxy takes verbatim in ACL patterns, quoted arguments, and server lines.
_SAFE_WORD = re.compile(r"^[A-Za-z0-9._:/@%+=~\[\]-]+$")
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+@=~-]*$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_JWS_REGEX = "'^eyJ[A-Za-z0-9_-]+[.][A-Za-z0-9_-]+[.][A-Za-z0-9_-]+$'"
_OPAQUE_REGEX = "'^[A-Za-z0-9._~+/=-]{1,512}$'"  # a UUID and the like: printable, no spaces


def _word(value: str, what: str) -> str:
    if not isinstance(value, str) or not _SAFE_WORD.match(value):
        raise ValueError(f"{what} {value!r} cannot be written into the HAProxy config safely")
    return value


def _keys(key_files: Sequence[str | EdgeKey], *, required: bool = True) -> list[EdgeKey]:
    out: list[EdgeKey] = []
    for item in key_files:
        if isinstance(item, EdgeKey):
            if item.alg not in EDGE_ALGORITHMS:
                raise ValueError(f"key alg {item.alg!r} not allowed (RS256 or ES256)")
            candidates = [item]
        else:
            # Type unknown without reading the file: verify under both algs; jwt_verify with
            # the wrong alg for the key type fails, and the header alg must match either way.
            candidates = [EdgeKey(item, alg) for alg in EDGE_ALGORITHMS]
        for key in candidates:
            if not _SAFE_PATH.match(key.path):
                raise ValueError(f"key file path {key.path!r} must be absolute and plain")
            if key not in out:
                out.append(key)
    if not out and required:
        raise ValueError("at least one key file is needed")
    return out


# One credential per request, spelled one way: HAProxy and the server must read the same one.
# Refused with 400 (it can never succeed) before any token is read, exactly the requests the
# server refuses (ignition_server.auth.presented.ambiguity): a ';' anywhere in the target
# (url_param takes it for a separator, the server does not), two Authorization headers, a
# percent-encoded parameter name (`tok%65n=`: one reader decodes it, the other does not), the
# name spelled in another case, `token` twice, a token parameter beside a header or on /ignition.
_TOKEN_NAME = "(^|&)token(=|&|$)"
_TOKEN_OTHER_CASE = "(^|&)(T[oO][kK][eE][nN]|t(O[kK][eE][nN]|o(K[eE][nN]|k(E[nN]|eN))))(=|&|$)"
ONE_CREDENTIAL_RULES = (
    ("one credential per request: no ';' in the target", "{ url -m sub ; }"),
    ("one credential per request: one Authorization header", "{ req.hdr_cnt(authorization) gt 1 }"),
    ("one credential per request: no percent-encoded parameter name", "{ query -m reg '(^|&)[^&=]*%' }"),
    ("one credential per request: the parameter is token=", f"{{ query -m reg '{_TOKEN_OTHER_CASE}' }}"),
    ("one credential per request: one token parameter", f"{{ query -m reg '{_TOKEN_NAME}.*&token(=|&|$)' }}"),
    ("one credential per request: a header or a parameter, not both",
     f"{{ req.hdr_cnt(authorization) gt 0 }} {{ query -m reg '{_TOKEN_NAME}' }}"),
    ("one credential per request: /ignition takes its token in the Authorization header",
     f"{{ path /ignition }} {{ query -m reg '{_TOKEN_NAME}' }}"),
)


def _bad_request(reason: str, condition: str) -> str:
    return (
        f'    http-request return status 400 content-type "text/plain" '
        f'string "{reason}\\n" hdr Cache-Control no-store if {condition}'
    )


def _refuse(reason: str, condition: str) -> str:
    return (
        f'    http-request return status 403 content-type "text/plain" '
        f'string "{reason}\\n" hdr Cache-Control no-store {condition}'
    )


@dataclass(frozen=True)
class TokenCheck:
    """What the edge checks a token against (the module doc): the server's published trust."""

    key_files: Sequence[str | EdgeKey]
    issuers: Sequence[str] = (LEGACY_ISSUER,)
    allowed_accounts: Iterable[tuple[str, str]] = DEFAULT_ALLOWED_ACCOUNTS
    token_param: str = "token"
    bearer: bool = False
    open_paths: Sequence[str] = ()
    leeway_seconds: int = 60
    token_map: str | None = None
    require_keys: bool = True  # False: no key files means every JWT is refused, opaque tokens still checked


def token_check_lines(check: TokenCheck) -> list[str]:
    """The ``http-request`` lines of the token check (module doc), for any HTTP frontend."""
    key_files, issuers, allowed_accounts = check.key_files, check.issuers, check.allowed_accounts
    token_param, bearer, open_paths = check.token_param, check.bearer, check.open_paths
    leeway_seconds, token_map, require_keys = check.leeway_seconds, check.token_map, check.require_keys
    keys = _keys(key_files, required=require_keys)
    iss = [_word(i, "issuer") for i in issuers]
    if not iss:
        raise ValueError("at least one issuer is needed")
    subs = []
    for ns, sa in allowed_accounts:
        sub = f"system:serviceaccount:{_word(ns, 'namespace')}:{_word(sa, 'service account')}"
        if sub not in subs:
            subs.append(sub)
    if not subs:
        raise ValueError("at least one allowed (namespace, service account) pair is needed")
    if token_map is not None and not _SAFE_PATH.match(token_map):
        raise ValueError(f"token map path {token_map!r} must be absolute and plain")
    if not _SAFE_NAME.match(token_param):
        raise ValueError("token_param must be a plain identifier")
    for p in open_paths:
        if not _SAFE_PATH.match(p):
            raise ValueError(f"open path {p!r} must be a plain absolute path")
    leeway = int(leeway_seconds)
    if leeway < 0:
        raise ValueError("leeway_seconds must be >= 0")

    out: list[str] = [_bad_request(reason, condition) for reason, condition in ONE_CREDENTIAL_RULES]
    if token_param != "token":
        raise ValueError("token_param must be 'token': the server reads no other")
    out += [
        "    http-request set-var(txn.jwt_open) bool(true) if { path "
        + " ".join(open_paths)
        + " }"
        if open_paths
        else "    # no open paths: every request needs a token",
        "    # The token: base64 of the JWT in the URL parameter (MCS / IBM shape).",
        f"    http-request set-var(txn.tok_raw) url_param({token_param}),url_dec"
        " unless { var(txn.jwt_open) -m bool }",
        "    http-request set-var(txn.jwt) var(txn.tok_raw),b64dec if { var(txn.tok_raw) -m found }",
    ]
    if token_map is not None:
        out.append(  # an opaque token travels in the URL as it is
            f"    http-request set-var(txn.opaque) var(txn.tok_raw) if {{ var(txn.tok_raw) -m found }}"
            f" !{{ var(txn.jwt) -m reg {_JWS_REGEX} }}"
        )
    if bearer:
        out += [
            "    # Or the Bearer value (HyperShift shape): base64 of the token, JWT or opaque.",
            "    http-request set-var(txn.bearer) http_auth_bearer,b64dec"
            " if !{ var(txn.tok_raw) -m found } !{ var(txn.jwt_open) -m bool }",
            f"    http-request set-var(txn.jwt) var(txn.bearer) if {{ var(txn.bearer) -m reg {_JWS_REGEX} }}",
        ]
        if token_map is not None:
            out.append(
                f"    http-request set-var(txn.opaque) var(txn.bearer) if {{ var(txn.bearer) -m found }}"
                f" !{{ var(txn.bearer) -m reg {_JWS_REGEX} }}"
            )
    if token_map is not None:
        out += [
            "    # Opaque tokens: known (current or previous) -> forwarded; unknown -> 511, it may be",
            "    # newer than this map and the client retries a 5xx; malformed -> 403.",
            _refuse("token malformed", f"if {{ var(txn.opaque) -m found }} !{{ var(txn.opaque) -m reg {_OPAQUE_REGEX} }}"),
            "    http-request set-var(txn.jwt_open) bool(true) if { var(txn.opaque) -m found }"
            f" {{ var(txn.opaque),sha2(256),hex,lower,map({token_map}) -m found }}",
            '    http-request return status 511 content-type "text/plain" string "token not known yet\\n"'
            " hdr Cache-Control no-store hdr Retry-After 5"
            " if { var(txn.opaque) -m found } !{ var(txn.jwt_open) -m bool }",
        ]
    guard = "!{ var(txn.jwt_open) -m bool }"
    out += [
        _refuse("token missing or not base64 of a JWT",
                f"if {guard} !{{ var(txn.jwt) -m reg {_JWS_REGEX} }}"),
        "    http-request set-var(txn.jwt_alg) var(txn.jwt),jwt_header_query('$.alg') if " + guard,
        _refuse("token algorithm not allowed",
                f"if {guard} !{{ var(txn.jwt_alg) -m str -- {' '.join(EDGE_ALGORITHMS)} }}"),
        "    # One jwt_verify per key file (current and previous keys); any exact 1 accepts.",
    ]
    for key in keys:
        out.append(
            f"    http-request set-var(txn.jwt_ok) bool(true) if {guard}"
            f" {{ var(txn.jwt_alg) -m str -- {key.alg} }}"
            f' {{ var(txn.jwt),jwt_verify("{key.alg}","{key.path}") -m int 1 }}'
        )
    # A kid that is not a plain word cannot be matched safely: left out, its key's forgeries get 511.
    kids = sorted({k.kid for k in keys if k.kid and _SAFE_WORD.match(k.kid)})
    out.append("    http-request set-var(txn.jwt_kid) var(txn.jwt),jwt_header_query('$.kid') if " + guard)
    if kids:
        out.append(_refuse("token signature not valid",
                           f"if {guard} !{{ var(txn.jwt_ok) -m bool }} {{ var(txn.jwt_kid) -m str -- {' '.join(kids)} }}"))
    out += [
        "    # No held key verifies it and its kid names none (or it has none): the cluster may have",
        "    # rotated its key before this edge was reloaded. 511: the client retries, nothing is served.",
        '    http-request return status 511 content-type "text/plain" string "token signing key not known yet\\n"'
        f" hdr Cache-Control no-store hdr Retry-After 5 if {guard} !{{ var(txn.jwt_ok) -m bool }}",
        "    http-request set-var(txn.jwt_iss) var(txn.jwt),jwt_payload_query('$.iss') if " + guard,
        _refuse("token issuer not accepted", f"if {guard} !{{ var(txn.jwt_iss) -m str -- {' '.join(iss)} }}"),
        "    http-request set-var(txn.jwt_sub) var(txn.jwt),jwt_payload_query('$.sub') if " + guard,
        _refuse("service account not allowed", f"if {guard} !{{ var(txn.jwt_sub) -m str -- {' '.join(subs)} }}"),
        "    # exp / nbf when present, against date() with a leeway.",
        "    http-request set-var(txn.jwt_now) date() if " + guard,
    ]
    for claim, sign_expr, reason in (
        ("exp", f"var(txn.jwt_exp),add({leeway}),sub(txn.jwt_now)", "token expired"),
        ("nbf", f"var(txn.jwt_now),add({leeway}),sub(txn.jwt_nbf)", "token not valid yet"),
    ):
        out += [
            f"    http-request set-var(txn.jwt_{claim}_raw) var(txn.jwt),jwt_payload_query('$.{claim}') if {guard}",
            f"    http-request set-var(txn.jwt_{claim}) var(txn.jwt),jwt_payload_query('$.{claim}','int') if {guard}",
            _refuse(f"token {claim} is not an integer",
                    f"if {guard} {{ var(txn.jwt_{claim}_raw) -m found }} !{{ var(txn.jwt_{claim}) -m found }}"),
            f"    http-request set-var(txn.jwt_{claim}_margin) {sign_expr} if {guard} {{ var(txn.jwt_{claim}) -m found }}",
            _refuse(reason, f"if {guard} {{ var(txn.jwt_{claim}) -m found }} {{ var(txn.jwt_{claim}_margin) -m int le 0 }}"),
        ]
    return out
