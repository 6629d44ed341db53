"""Where rotation happens: token Secrets rotated when due, and outdated ones given an expiry.

`rotate_due` (on the housekeeping tick) rotates every Secret whose current token has lived
TTL/2 (auth/rotation_policy.py decides; this writes): the new token is written into the
source through the WriteBacks (write_backs.py) and the token Secrets (token_secrets.py) learn
it. `expire_outdated` (after each batch of source changes) gives a NodePool's older token
Secrets an expiry 2 h away once a newer one exists. Only the writing replica does either
(with several replicas, the Lease holder); every replica learns the result from the source.

A read-only source cannot take rotations: they live in the cache dir instead, sealed
(encrypted) with the index, and apply for as long as the source keeps its own token
(`restore`, when the dispatcher reads the Secret). So does a manifest that cannot be
written (a symlink into a read-only mount), which must survive a restart too.
"""

from __future__ import annotations

import errno
import json
import logging
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Awaitable, Callable

from payload_cache import PayloadCache

from ..auth.rotation_policy import RotationPolicy, new_token, rotation_mutation
from ..config import SUPERSEDED_GRACE
from ..metrics import ServerMetrics
from ..model.objects import ObjectKey, set_annotation
from ..model.token_secret import ANNOTATION_TOKEN_EXPIRATION, TokenSecret, format_time
from .faults import Faults
from .object_work import ObjectWork
from .token_secrets import TokenSecrets
from .write_backs import WriteBacks

log = logging.getLogger("ignition_server.reconcile")


def rotation_name(secret_ref: str) -> str:
    """Where a Secret's rotation state is sealed in the cache dir (a read-only source)."""
    return f"rotation/{secret_ref}"


@dataclass
class Rotation:
    tokens: TokenSecrets
    cache: PayloadCache  # holds the sealed rotation state of Secrets rotated in the cache dir
    policy: RotationPolicy
    write_backs: WriteBacks  # every write into the source goes through it (its source; gated by its `writer`)
    work: ObjectWork  # expiries, queued per object (never awaited by the handler)
    faults: Faults
    metrics: ServerMetrics
    persist_index: Callable[[], Awaitable[None]]  # a new token is durable before it is written anywhere
    clock: Callable[[], float] = time.time
    # Secrets whose rotation lives in the cache dir although the source is writable: their
    # manifest (a symlink's target on a read-only mount) cannot be written.
    _rotated_in_cache: set[ObjectKey] = field(default_factory=set)

    def restore(self, secret: TokenSecret) -> TokenSecret:
        """`secret` as the source holds it, with the rotation kept in the cache dir applied (if the source still holds its base)."""
        sealed = self.cache.unseal(rotation_name(secret.ref))
        if sealed is None:
            self._rotated_in_cache.discard(secret.key)
            return secret
        state = json.loads(sealed)
        if state["base"] != secret.token:
            self.cache.drop_sealed(rotation_name(secret.ref))  # the source moved on by itself
            self._rotated_in_cache.discard(secret.key)
            return secret
        self._rotated_in_cache.add(secret.key)
        return replace(secret, token=state["token"], old_token=state["old_token"], generation_time=state["generation_time"])

    def forget(self, key: ObjectKey) -> None:
        """The token Secret is gone from the index."""
        self._rotated_in_cache.discard(key)

    def overdue(self, now: float) -> int:
        """Live token Secrets whose current token has outlived the TTL: rotation (due at TTL/2) is not happening."""
        return sum(
            1 for secret in self.tokens.secrets.values()
            if not secret.expired(now) and now - (secret.generation_time or 0.0) > self.policy.ttl
        )

    async def rotate_due(self) -> int:
        """Rotate every Secret whose current token has lived TTL/2. Returns how many rotated."""
        if not self.write_backs.writer():
            return 0  # the writer rotates; this replica learns the new token from the source
        now = self.clock()
        due = [
            (key, secret) for key, secret in self.tokens.secrets.items()
            if self.policy.is_due(secret, now) and not self.faults.waiting("rotation", key.ref)
        ]
        if not due:
            return 0
        in_cache = [(k, s) for k, s in due if not self.write_backs.source.writable or k in self._rotated_in_cache]
        if in_cache:
            for key, secret in in_cache:
                self._rotate_in_cache(key, secret, now)
            await self.persist_index()
            self.metrics.token_rotations.inc(len(in_cache))
            due = [(k, s) for k, s in due if self.write_backs.source.writable and k not in self._rotated_in_cache]
            if not due:
                return len(in_cache)
        planned = [(key, secret, new_token()) for key, secret in due]
        for _key, secret, token in planned:
            self.tokens.expect(secret, token)
        await self.persist_index()  # one flush for all: a crash after a write still knows its token
        rotated = 0
        for key, secret, token in planned:
            if await self._rotate_at_source(key, secret, token, now):
                rotated += 1
            else:
                self.tokens.unexpect(key, token)
        if rotated:
            await self.persist_index()
        self.metrics.token_rotations.inc(rotated)
        return rotated

    def _rotate_in_cache(self, key: ObjectKey, secret: TokenSecret, now: float, token: str | None = None) -> None:
        token = token or new_token()
        state = {
            "base": self.tokens.source_token(key),
            "token": token,
            "old_token": secret.token,
            "generation_time": now,
        }
        self.cache.seal(rotation_name(secret.ref), json.dumps(state).encode())
        self.tokens.rotated(replace(secret, token=token, old_token=secret.token, generation_time=now))

    async def _rotate_at_source(self, key: ObjectKey, secret: TokenSecret, token: str, now: float) -> bool:
        """Write one rotation back; True when the source took it.

        The index changes only once the source has accepted the write (the source hands the
        object as written to the handler, which indexes it): until then the new token is
        handed to no one and the old ones are still listed, so nothing here may retire them.
        A failed write leaves the index alone: `secret` may be older than what this replica
        has learnt meanwhile (another writer's rotation seen during our conflict), and
        indexing it again would retire the token the source now holds.
        """
        try:
            written = await self.write_backs.write(key, rotation_mutation(secret.token, token, now), "token rotation")
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                self._rotate_to_cache(key, secret, now, token, exc)
                return True
            self.faults.failed("rotation", key.ref, exc)
            return False
        except Exception as exc:  # e.g. the manifest no longer parses: it stays as the operator left it
            self.faults.failed("rotation", key.ref, exc)
            return False
        self.faults.succeeded("rotation", key.ref)
        if not written:
            return False  # someone else rotated first, or not the writer any more: nothing to learn here
        if self.tokens.get(key) is secret:
            # A source that did not hand its write over: learn what it accepted ourselves.
            self.tokens.rotated(replace(secret, token=token, old_token=secret.token, generation_time=now))
        log.info("rotated the token of %s (NodePool %s)", key.ref, secret.nodepool)
        return True

    def _rotate_to_cache(self, key: ObjectKey, secret: TokenSecret, now: float, token: str, exc: OSError) -> None:
        """The manifest cannot be written (read-only target): rotate in the cache dir from now on."""
        log.warning(
            "cannot write the manifest of %s (%s): its token rotation state is kept (encrypted) in the cache dir, "
            "as with --source-read-only", key.ref, exc,
        )
        self._rotated_in_cache.add(key)
        self._rotate_in_cache(key, secret, now, token)

    def expire_outdated(self, groups: set[tuple[str, str]]) -> None:
        """A NodePool's newer token Secret outdates the older ones of its namespace: they expire in 2 h."""
        now = self.clock()
        for outdated in self.tokens.outdated(groups):
            stamp = format_time(now + SUPERSEDED_GRACE)

            def mutate(obj: dict[str, Any], stamp: str = stamp) -> bool:
                notes = (obj.get("metadata") or {}).get("annotations") or {}
                if notes.get(ANNOTATION_TOKEN_EXPIRATION):
                    return False
                set_annotation(obj, ANNOTATION_TOKEN_EXPIRATION, stamp)
                return True

            log.info("%s is outdated by a newer token Secret of %s: expires at %s", outdated.ref, outdated.nodepool, stamp)
            # Queued per object, not awaited: the write-back re-enters the handler, and
            # a failure to write this one (a manifest broken by hand) must reach no other.
            self.work.submit(outdated.key.ref, "expiry", partial(self.write_backs.write, outdated.key, mutate, "expiration"))
