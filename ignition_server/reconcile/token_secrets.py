"""The token Secrets every replica serves, and what each of their tokens opens.

The dispatcher (reconciler.py) `put`s each token Secret it reads and `remove`s the gone
ones; rotation (rotation.py) `expect`s a new token before writing it and hands the rotated
Secret back (`rotated`). Each token's record goes into the payload cache's token index
(payload_cache), which the serving side reads (auth/tokens.py): CURRENT or PREVIOUS while
its Secret lists it, then RETIRED for one TTL, so a stale pointer config fails fast (403)
instead of retrying for ever (511). Service-account tokens name a cluster, not a NodePool:
`grant_for` picks the NodePool's newest live Secret. A token belongs to the Secret that held
it first: `holds_anothers_token` refuses a newcomer holding it (a leaked token pasted into
another Secret).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

from payload_cache import PayloadCache, TokenRecord, TokenState

from ..auth.tokens import Grant
from ..model.objects import ObjectKey, shared
from ..model.token_secret import TokenSecret, newest_live
from .claims import Claims, token_claim
from .outputs import TokenOutputs
from .tenancy import generation_group

log = logging.getLogger("ignition_server.reconcile")


def _pool_of(secret: TokenSecret) -> tuple[str, str]:
    return (secret.key.namespace, shared(secret.nodepool.partition("/")[2]))


@dataclass
class TokenSecrets:
    cache: PayloadCache  # whose token index the serving side reads
    ttl: float  # a retired token is remembered (refused with 403) this long
    clock: Callable[[], float] = time.time
    outputs: TokenOutputs | None = None  # user-data and the edge map, told of every Secret's tokens
    on_refused: Callable[[], None] = lambda: None  # counts a Secret refused for another's token
    claims: Claims | None = None  # contests decided before (this process, an earlier one, another replica)
    _secrets: dict[ObjectKey, TokenSecret] = field(default_factory=dict)
    _order: dict[ObjectKey, int] = field(default_factory=dict)  # first-seen order, for ties
    _seq: int = 0
    _source_tokens: dict[ObjectKey, str | None] = field(default_factory=dict)  # token as the source holds it
    # Tuples, not sets: a NodePool mostly has one Secret (a one-key set is 216 B, the tuple 48;
    # two of them for each of 5,280 NodePools).
    _pools: dict[tuple[str, str], tuple[ObjectKey, ...]] = field(default_factory=dict)  # (namespace, pool name) -> Secrets
    _by_nodepool: dict[tuple[str, str], tuple[ObjectKey, ...]] = field(default_factory=dict)  # generation_group -> its Secrets
    _duplicates: set[ObjectKey] = field(default_factory=set)  # token Secrets refused for another's token

    @property
    def secrets(self) -> Mapping[ObjectKey, TokenSecret]:
        """The token Secrets indexed, as they are now (a read-only view)."""
        return MappingProxyType(self._secrets)

    def get(self, key: ObjectKey) -> TokenSecret | None:
        return self._secrets.get(key)

    def source_token(self, key: ObjectKey) -> str | None:
        """The current token as the source last held it (before any rotation kept in the cache dir)."""
        return self._source_tokens.get(key)

    # -- what the dispatcher does with a token Secret it read ---------------------------

    def seen(self, secret: TokenSecret) -> None:
        """The source holds `secret` now: its first-seen order (for ties) and its token as the source holds it."""
        if secret.key not in self._order:
            self._seq += 1
            self._order[secret.key] = self._seq
        self._source_tokens[secret.key] = secret.token

    def holds_anothers_token(self, secret: TokenSecret) -> bool:
        """A token of `secret` is held by another Secret: refused, logged once. Who holds it is
        what the index remembers (across restarts, retired tokens for one TTL), and before that
        the contests recorded in `claims`, which a replica with an empty cache also reads: a
        Secret that starts to hold a token later never outranks the holder, whatever its age."""
        holders: dict[str, str] = {}  # claim -> holder
        for token in secret.tokens():
            record = self.cache.lookup_token_key(self.cache.token_key(token))
            holder = record.secret if record is not None else None
            recorded = self.claims.holder(token_claim(token)) if self.claims is not None else None
            if recorded is not None:
                holder = recorded  # a contest decided before: its word stands
            if holder is not None and holder != secret.ref:
                holders[token_claim(token)] = holder
        if not holders:
            self._duplicates.discard(secret.key)
            return False
        if self.claims is not None:
            for claim, holder in holders.items():
                self.claims.record(claim, holder)
        if secret.key not in self._duplicates:
            self._duplicates.add(secret.key)
            self.on_refused()
            log.error("token Secret %s holds a token that %s already holds: refused (not indexed, not rendered, "
                      "not rotated); give it a token of its own", secret.ref, ", ".join(sorted(set(holders.values()))))
        return True

    def forget_refusal(self, key: ObjectKey) -> bool:
        """The Secret is gone, or no longer a token Secret: if it was refused, it is judged afresh
        should it come back. True when it was refused."""
        refused = key in self._duplicates
        self._duplicates.discard(key)
        return refused

    def put(self, secret: TokenSecret) -> None:
        """Index `secret` (new or changed): its tokens open its NodePool's payload, the ones it no longer lists retire."""
        self._unlist(secret.key)
        self._secrets[secret.key] = secret
        for index, name in ((self._pools, _pool_of(secret)), (self._by_nodepool, generation_group(secret))):
            index[name] = index.get(name, ()) + (secret.key,)  # not there: `_unlist` took it out
        self.refresh(secret)
        if self.outputs is not None:
            self.outputs.tokens_changed(secret)

    def remove(self, key: ObjectKey) -> TokenSecret | None:
        """The token Secret is gone: every token of it retires. Returns it as it was indexed."""
        now = self.clock()
        self._unlist(key)
        gone = self._secrets.pop(key, None)
        if gone is not None and self.outputs is not None:
            self.outputs.secret_gone(gone)
        for token_key, record in self.cache.tokens_of_secret(key.ref).items():
            if record.state is not TokenState.RETIRED:
                self._retire(token_key, record, now)
        return gone

    def refresh(self, secret: TokenSecret) -> None:
        """Write the records of `secret`'s tokens as they stand now (those of an expired Secret retire)."""
        now = self.clock()
        known = self.cache.tokens_of_secret(secret.ref)
        wanted: dict[bytes, TokenState] = {}
        if secret.expired(now):
            pass  # every token of an expired Secret retires: refused (403) for one more TTL
        elif secret.token:
            wanted[self.cache.token_key(secret.token)] = TokenState.CURRENT
        if secret.old_token and not secret.expired(now):
            wanted.setdefault(self.cache.token_key(secret.old_token), TokenState.PREVIOUS)
        for token_key, state in wanted.items():
            record = TokenRecord(secret.nodepool, secret.ref, state, secret.expiration)
            if known.get(token_key) != record:
                self.cache.put_token_key(token_key, record)
        for token_key, record in known.items():
            if token_key not in wanted and record.state is not TokenState.RETIRED:
                self._retire(token_key, record, now)

    # -- what rotation does -------------------------------------------------------------

    def expect(self, secret: TokenSecret, token: str) -> None:
        """Know a rotation's new token before writing it: nobody holds it yet, so this refuses
        no one, and a node given it as soon as the source holds it (a file is read at its
        rename, before the handler has taken the write back) is not answered 511 by the
        writer. Nothing is retired here: the Secret still lists its tokens until the write lands."""
        self.cache.put_token_key(self.cache.token_key(token),
                                 TokenRecord(secret.nodepool, secret.ref, TokenState.CURRENT, secret.expiration))

    def unexpect(self, key: ObjectKey, token: str) -> None:
        """A rotation not written: its token was handed to no one, unless the source holds it
        after all (a write that landed although its answer was lost)."""
        newest = self._secrets.get(key)
        if newest is None or token not in (newest.token, newest.old_token):
            self.cache.drop_token_key(self.cache.token_key(token))

    def rotated(self, secret: TokenSecret) -> None:
        """`secret` with its new tokens (same Secret, same NodePool): indexed as it is now."""
        self._secrets[secret.key] = secret
        self.refresh(secret)
        if self.outputs is not None:
            self.outputs.tokens_changed(secret)

    def outdated(self, groups: set[tuple[str, str]]) -> list[TokenSecret]:
        """The Secrets of these generation groups that a newer one of the same NodePool outdates
        (those without an expiration yet; the newest by creation time, then first seen, stays)."""
        found = []
        for group in groups:
            live = [s for s in (self._secrets[k] for k in self._by_nodepool.get(group, ())) if s.expiration is None]
            if len(live) < 2:
                continue
            live.sort(key=lambda s: (s.creation_time or 0.0, self._order.get(s.key, 0)))
            found.extend(live[:-1])
        return found

    # -- what the serving side asks -----------------------------------------------------

    def grant_for(self, namespace: str, pool_name: str) -> Grant | None:
        """The NodePool `pool_name` of the hosted cluster in `namespace`: its newest live generation.

        Service-account tokens name a cluster, not a NodePool, so the request's NodePool
        picks the token Secret (and so the payload) among that cluster's.
        """
        newest = newest_live((self._secrets[k] for k in self._pools.get((namespace, pool_name), ())), self.clock(),
                             seen_order=lambda s: self._order.get(s.key, 0))
        return None if newest is None else Grant(nodepool=newest.nodepool, secret=newest.ref)

    def _retire(self, token_key: bytes, record: TokenRecord, now: float) -> None:
        self.cache.put_token_key(
            token_key, TokenRecord(record.nodepool, record.secret, TokenState.RETIRED, now + self.ttl)
        )

    def _unlist(self, key: ObjectKey) -> None:
        previous = self._secrets.get(key)
        if previous is None:
            return
        for index, name in ((self._pools, _pool_of(previous)), (self._by_nodepool, generation_group(previous))):
            keys = tuple(k for k in index.get(name, ()) if k != key)
            if keys:
                index[name] = keys
            else:
                index.pop(name, None)
