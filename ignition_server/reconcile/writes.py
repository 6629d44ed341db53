"""What only the writing replica does about tokens: rotation, expiry of outdated Secrets, and
the rotation state kept in the cache dir for a source that cannot be written (status,
`ignition-reached` and deletions are the WriteBacks, write_backs.py). With several replicas
(Kubernetes mode) only the Lease holder writes; every replica indexes tokens, renders and
serves (reconcile/reconciler.py). Each write-back goes through `write_backs.write` (gated by
`writer()`); an expiry is queued per object (`work`), never awaited by the event handler.
"""

from __future__ import annotations

import errno
import json
import logging
from dataclasses import replace
from typing import Any

from payload_cache import TokenRecord, TokenState

from ..auth.rotation_policy import new_token, rotation_mutation
from ..config import SUPERSEDED_GRACE
from ..model.objects import ObjectKey, set_annotation
from ..model.token_secret import ANNOTATION_TOKEN_EXPIRATION, TokenSecret, format_time

log = logging.getLogger("ignition_server.reconcile")


def rotation_name(secret_ref: str) -> str:
    """Where a Secret's rotation state is sealed in the cache dir (a read-only source)."""
    return f"rotation/{secret_ref}"


class WriterDuties:
    """Mixed into the Reconciler, whose state it uses (secrets, cache, source, work, faults, write_backs)."""

    # A read-only source cannot take rotations: they live in the cache dir instead, sealed
    # (encrypted) with the index, and apply for as long as the source keeps its own token.

    def _with_rotation_state(self, secret: TokenSecret) -> TokenSecret:
        # Also with a writable source: a manifest that cannot be written (a symlink into a
        # read-only mount) rotates in the cache dir too, and that must survive a restart.
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

    def _rotate_in_cache(self, key: ObjectKey, secret: TokenSecret, now: float, token: str | None = None) -> None:
        state = {
            "base": self._source_tokens.get(key),
            "token": token or new_token(),
            "old_token": secret.token,
            "generation_time": now,
        }
        self.cache.seal(rotation_name(secret.ref), json.dumps(state).encode())
        self._apply_rotation(key, replace(secret, token=state["token"], old_token=secret.token, generation_time=now))

    async def rotate_due(self) -> int:
        """Rotate every Secret whose current token has lived TTL/2. Returns how many rotated."""
        if not self.writer():
            return 0  # the writer rotates; this replica learns the new token from the source
        now = self.clock()
        due = [
            (key, secret) for key, secret in self.secrets.items()
            if self.policy.is_due(secret, now) and not self.faults.waiting("rotation", key.ref)
        ]
        if not due:
            return 0
        in_cache = [(k, s) for k, s in due if not self.source.writable or k in self._rotated_in_cache]
        if in_cache:
            for key, secret in in_cache:
                self._rotate_in_cache(key, secret, now)
            await self.persist_index()
            self.metrics.token_rotations.inc(len(in_cache))
            due = [(k, s) for k, s in due if self.source.writable and k not in self._rotated_in_cache]
            if not due:
                return len(in_cache)
        planned = [(key, secret, new_token()) for key, secret in due]
        for _key, secret, token in planned:
            self._expect_token(secret, token)
        await self.persist_index()  # one flush for all: a crash after a write still knows its token
        rotated = 0
        for key, secret, token in planned:
            if await self._rotate_at_source(key, secret, token, now):
                rotated += 1
            else:
                self._unexpect_token(key, token)
        if rotated:
            await self.persist_index()
        self.metrics.token_rotations.inc(rotated)
        return rotated

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
        if self.secrets.get(key) is secret:
            # A source that did not hand its write over: learn what it accepted ourselves.
            self._apply_rotation(key, replace(secret, token=token, old_token=secret.token, generation_time=now))
        log.info("rotated the token of %s (NodePool %s)", key.ref, secret.nodepool)
        return True

    def _expect_token(self, secret: TokenSecret, token: str) -> None:
        """Know a rotation's new token before writing it: nobody holds it yet, so this refuses
        no one, and a node given it as soon as the source holds it (a file is read at its
        rename, before our handler has taken the write back) is not answered 511 by the
        writer. Nothing is retired here: the Secret still lists its tokens until the write lands."""
        self.cache.put_token_key(self.cache.token_key(token),
                                 TokenRecord(secret.nodepool, secret.ref, TokenState.CURRENT, secret.expiration))

    def _unexpect_token(self, key: ObjectKey, token: str) -> None:
        """A rotation not written: its token was handed to no one, unless the source holds it
        after all (a write that landed although its answer was lost)."""
        newest = self.secrets.get(key)
        if newest is None or token not in (newest.token, newest.old_token):
            self.cache.drop_token_key(self.cache.token_key(token))

    def _apply_rotation(self, key: ObjectKey, rotated: TokenSecret) -> None:
        self.secrets[key] = rotated
        self._index_tokens(rotated)
        if self.outputs is not None:
            self.outputs.tokens_changed(rotated)

    def _rotate_to_cache(self, key: ObjectKey, secret: TokenSecret, now: float, token: str, exc: OSError) -> None:
        """The manifest cannot be written (read-only target): rotate in the cache dir from now on."""
        log.warning(
            "cannot write the manifest of %s (%s): its token rotation state is kept (encrypted) in the cache dir, "
            "as with --source-read-only", key.ref, exc,
        )
        self._rotated_in_cache.add(key)
        self._rotate_in_cache(key, secret, now, token)

    def _supersede_outdated(self, groups: set[tuple[str, str]]) -> None:
        """A NodePool's newer token Secret outdates the older ones of its namespace: they expire in 2 h."""
        now = self.clock()
        by_pool: dict[tuple[str, str], list[TokenSecret]] = {}
        for group in groups:
            live = [self.secrets[k] for k in self._by_nodepool.get(group, ())]
            by_pool[group] = [s for s in live if s.expiration is None]
        for secrets in by_pool.values():
            if len(secrets) < 2:
                continue
            secrets.sort(key=lambda s: (s.creation_time or 0.0, self._order.get(s.key, 0)))
            for outdated in secrets[:-1]:
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
                self.work.submit(
                    outdated.key.ref, "expiry",
                    lambda key=outdated.key, mutate=mutate: self.write_backs.write(key, mutate, "expiration"),
                )
