"""What a request presents to be let in, apart from the request itself.

Both request shapes reduce to a `Presented`; `admit` turns it into a Grant or a Refusal.
Kept apart from aiohttp's request so a serving process can hand the same question to the
process that owns the token state (workers), and get the same answer it would give itself.

One request carries one credential, spelled one way. A request that presents two (a Bearer
header and `?token=`, `token` twice) or spells the parameter so that readers may disagree
(`tok%65n=`, `TOKEN=`, a `;` that some parsers take for a separator) is refused with 400: a
front proxy and this server, reading the same request, could otherwise check one credential
and serve another. It can never succeed, so a 4xx is the right answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tokens import Grant, Refusal, TokenAuthenticator, check_nodepool, credential


@dataclass(frozen=True, slots=True)
class Presented:
    authorization: str | None = None  # HyperShift: `Authorization: Bearer <base64(token)>`
    nodepool_header: str | None = None  # HyperShift: optional `NodePool: <ns>/<name>`
    path_pool: str | None = None  # MCS/IBM: /config/<nodepool>
    query_token: str | None = None  # MCS/IBM: ?token=
    ambiguity: str | None = None  # why the request's credential could be read two ways (`ambiguity`)

    def __repr__(self) -> str:  # never a token in a traceback or a log line
        return f"Presented(path_pool={self.path_pool!r}, nodepool_header={self.nodepool_header!r})"


def ambiguity(raw_target: str, authorizations: int, *, url_shape: bool) -> str | None:
    """Why a request with this raw target (path and query, still percent-encoded) and this many
    Authorization headers presents more than one credential, or one in a spelling readers may
    disagree on; None when it presents at most one, plainly. The front proxy refuses exactly
    the same requests (proxy.jwt_frontend.ONE_CREDENTIAL_RULES)."""
    if authorizations > 1:
        return "more than one Authorization header"
    if ";" in raw_target:
        return "';' in the request target (a separator to some readers)"
    named = 0
    for part in raw_target.partition("?")[2].split("&"):
        name = part.partition("=")[0]
        if "%" in name:
            return "a percent-encoded parameter name (readers may decode it or not)"
        if name.lower() == "token":
            if name != "token":
                return "the token parameter's name spelled otherwise than 'token'"
            named += 1
    if named > 1:
        return "more than one token parameter"
    if named and authorizations:
        return "both an Authorization header and a token parameter: present one"
    if named and not url_shape:
        return "a token parameter on /ignition: present the token in the Authorization header"
    return None


def admit(presented: Presented, auth: TokenAuthenticator) -> Grant:
    """The NodePool `presented` opens; raises Refusal otherwise."""
    if presented.ambiguity is not None:
        raise Refusal(400, f"one credential per request: {presented.ambiguity}")
    if presented.path_pool is not None:
        token, is_jwt = credential(query_value=presented.query_token or "")
        granted = auth.service_account(token, presented.path_pool) if is_jwt else auth.authenticate(token)
        check_nodepool(granted, path_name=presented.path_pool)
        return granted
    token, is_jwt = credential(header=presented.authorization)
    header = presented.nodepool_header
    if is_jwt:
        granted = auth.service_account(token, header.partition("/")[2] if header else None)
    else:
        granted = auth.authenticate(token)
    check_nodepool(granted, header=header)
    return granted
