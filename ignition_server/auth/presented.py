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

import re
from dataclasses import dataclass
from urllib.parse import unquote_plus

from .tokens import Grant, Refusal, TokenAuthenticator, check_nodepool, credential

_QUERY_PARTS = re.compile(r"[&;]")


@dataclass(frozen=True, slots=True)
class Presented:
    authorization: str | None = None  # HyperShift: `Authorization: Bearer <base64(token)>`
    nodepool_header: str | None = None  # HyperShift: optional `NodePool: <ns>/<name>`
    path_pool: str | None = None  # MCS/IBM: /config/<nodepool>
    query_token: str | None = None  # MCS/IBM: ?token=
    ambiguity: str | None = None  # why the request's credential could be read two ways (`ambiguity`)

    def __repr__(self) -> str:  # never a token in a traceback or a log line
        return f"Presented(path_pool={self.path_pool!r}, nodepool_header={self.nodepool_header!r})"


def ambiguity(raw_query: str, authorizations: int, *, url_shape: bool) -> str | None:
    """Why a request with this raw (still percent-encoded) query string and this many
    Authorization headers presents more than one credential, or one in a spelling readers may
    disagree on; None when it presents at most one, plainly."""
    if authorizations > 1:
        return "more than one Authorization header"
    if ";" in raw_query:
        return "';' in the query string (a separator to some readers): one token=, '&'-separated"
    named = 0
    for part in _QUERY_PARTS.split(raw_query):
        name = part.partition("=")[0]
        plain = unquote_plus(name).strip().lower()
        if plain == "token" or plain.startswith("token["):
            if name != "token":
                return "the token parameter's name spelled otherwise than 'token='"
            named += 1
    if named > 1:
        return "more than one token parameter"
    if url_shape and authorizations:
        return "both a token parameter and an Authorization header: present one"
    if not url_shape and named:
        return "both an Authorization header and a token parameter: present one"
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
