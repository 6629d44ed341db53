"""What a request presents to be let in, apart from the request itself.

Both request shapes reduce to a `Presented`; `admit` turns it into a Grant or a Refusal.
Kept apart from aiohttp's request so a serving process can hand the same question to the
process that owns the token state (workers), and get the same answer it would give itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tokens import Grant, TokenAuthenticator, check_nodepool, credential


@dataclass(frozen=True, slots=True)
class Presented:
    authorization: str | None = None  # HyperShift: `Authorization: Bearer <base64(token)>`
    nodepool_header: str | None = None  # HyperShift: optional `NodePool: <ns>/<name>`
    path_pool: str | None = None  # MCS/IBM: /config/<nodepool>
    query_token: str | None = None  # MCS/IBM: ?token=

    def __repr__(self) -> str:  # never a token in a traceback or a log line
        return f"Presented(path_pool={self.path_pool!r}, nodepool_header={self.nodepool_header!r})"


def admit(presented: Presented, auth: TokenAuthenticator) -> Grant:
    """The NodePool `presented` opens; raises Refusal otherwise."""
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
