"""Who held a contested claim first: a service-account key, or a token, that two objects claim.

A key or a token belongs to whoever claimed it first. A running replica sees who came first;
a listing does not (it is applied oldest `creationTimestamp` first, and a tenant may have
created an object long ago and edited it to claim a victim's key or token since). So every
contest a replica decides is recorded here, incumbent by claim, and the record outlives the
process: sealed in the cache dir (a restart), and in Kubernetes mode published by the writer
as a Secret in the server's own namespace, which no tenant writes and every replica reads (a
new replica with an empty cache). A newcomer never outranks a recorded incumbent, whatever
its creation time; with nothing recorded, the first in the listing holds it.

Only contests are recorded, not every claim (5,280 NodePools' tokens would not fit one Secret):
a claim nobody contests needs no arbiter.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..model.objects import ObjectKey, annotations_of, secret_value
from ..sources.events import Source

log = logging.getLogger("ignition_server.reconcile")

SEALED_NAME = "claims"
# Recorded contests whose holder is in one namespace: real contests are rare, and a tenant able to
# stage contests among its own objects must not grow the record past what one Secret holds.
MAX_PER_NAMESPACE = 32
CLAIMS_SECRET = "ignition-server-claims"  # in the server's own namespace (Kubernetes mode)
CLAIMS_KEY = "claims.json"
ANNOTATION_CLAIMS = "ignition-server.openshift.io/claims"


def key_claim(fingerprint: str) -> str:
    return f"key:{fingerprint}"


def token_claim(token: str) -> str:
    """A token's claim, named by its SHA-256 (never the token): the same on every replica, whose
    caches key their own index differently; the edge's token map publishes the same digest."""
    return f"token:{hashlib.sha256(token.encode()).hexdigest()}"


@dataclass(frozen=True)
class Claim:
    holder: str  # a cluster (namespace) for a key, a token Secret's ref for a token
    since: float  # when the contest was first decided for `holder`


def _namespace(holder: str) -> str:
    """A token Secret's ref is namespace/name; a key's holder is its cluster's namespace."""
    return holder.partition("/")[0]


def is_claims_object(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") == "Secret" and str(annotations_of(obj).get(ANNOTATION_CLAIMS, "")).lower() == "true"


def encode(claims: Mapping[str, Claim]) -> bytes:
    return json.dumps({name: [c.holder, c.since] for name, c in sorted(claims.items())},
                      separators=(",", ":")).encode()


def decode(raw: bytes) -> dict[str, Claim]:
    """What `encode` made; ValueError when it is not."""
    try:
        return {str(name): Claim(str(holder), float(since)) for name, (holder, since) in json.loads(raw).items()}
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a claims record: {exc}") from None


@dataclass
class Claims:
    seal: Callable[[str, bytes], None]  # the cache's sealed records: kept across restarts
    clock: Callable[[], float] = time.time
    on_changed: Callable[[], None] = lambda: None  # the writer publishes (Kubernetes mode)
    _claims: dict[str, Claim] = field(default_factory=dict)

    @classmethod
    def restored(cls, unseal: Callable[[str], bytes | None], seal: Callable[[str, bytes], None],
                 clock: Callable[[], float] = time.time) -> Claims:
        claims = cls(seal=seal, clock=clock)
        raw = unseal(SEALED_NAME)
        if raw is not None:
            try:
                claims._claims = decode(raw)
            except ValueError as exc:
                log.error("the recorded claims are unreadable, starting without them: %s", exc)
        return claims

    def holder(self, claim: str) -> str | None:
        found = self._claims.get(claim)
        return found.holder if found is not None else None

    def record(self, claim: str, holder: str) -> None:
        """A contest decided for `holder`; an earlier record for someone else stands."""
        if claim in self._claims:
            return
        namespace = _namespace(holder)
        if sum(1 for c in self._claims.values() if _namespace(c.holder) == namespace) >= MAX_PER_NAMESPACE:
            log.warning("not recording another contest won by %s: %s holds %d already (decided by the running "
                        "replica only)", holder, namespace, MAX_PER_NAMESPACE)
            return
        self._claims[claim] = Claim(holder, self.clock())
        self._changed()

    def release(self, holder: str, keep: frozenset[str] = frozenset()) -> None:
        """`holder` no longer claims anything but `keep` (its object is gone, or claims less)."""
        gone = [name for name, c in self._claims.items() if c.holder == holder and name not in keep]
        for name in gone:
            del self._claims[name]
        if gone:
            self._changed()

    def merge(self, others: Mapping[str, Claim]) -> bool:
        """Another replica's record: the earlier decision of each claim stands. True if anything changed."""
        changed = False
        for name, theirs in others.items():
            ours = self._claims.get(name)
            if ours is None or (theirs.since, theirs.holder) < (ours.since, ours.holder):
                if ours != theirs:
                    self._claims[name] = theirs
                    changed = True
        if changed:
            self.seal(SEALED_NAME, encode(self._claims))
        return changed

    def published(self, obj: Mapping[str, Any]) -> bool:
        """The writer's published record (its Secret): merged. True if anything changed."""
        raw = secret_value(dict(obj), CLAIMS_KEY)
        if not raw:
            return False
        try:
            return self.merge(decode(raw))
        except ValueError as exc:
            log.error("the published claims %s are unreadable, ignored: %s", CLAIMS_SECRET, exc)
            return False

    def snapshot(self) -> dict[str, Claim]:
        return dict(self._claims)

    def _changed(self) -> None:
        self.seal(SEALED_NAME, encode(self._claims))
        self.on_changed()


def claims_secret(namespace: str, claims: Mapping[str, Claim]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": CLAIMS_SECRET, "namespace": namespace, "annotations": {ANNOTATION_CLAIMS: "true"}},
            "data": {CLAIMS_KEY: base64.b64encode(encode(claims)).decode()}}


@dataclass
class ClaimsPublisher:
    """The writer publishes the record for the other replicas (Kubernetes mode), soon after a
    change, one write for a burst; a failed write (or a change while not the writer) is written
    with the next change the writer records."""

    claims: Claims
    source: Source
    namespace: str
    writer: Callable[[], bool]
    delay: float = 0.5
    _task: asyncio.Task[None] | None = None
    _dirty: bool = False

    def changed(self) -> None:
        self._dirty = True
        if self.writer() and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._publish_soon(), name="publish claims")

    async def _publish_soon(self) -> None:
        await asyncio.sleep(self.delay)
        while self._dirty and self.writer():
            self._dirty = False
            obj = claims_secret(self.namespace, self.claims.snapshot())
            try:
                await self.source.put(obj, beside=ObjectKey("Secret", self.namespace, CLAIMS_SECRET))
            except Exception as exc:  # the record stays sealed here; the next change publishes it
                self._dirty = True
                log.error("could not publish the claims record %s/%s: %s", self.namespace, CLAIMS_SECRET, exc)
                return
