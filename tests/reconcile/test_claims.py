"""The record of contested claims on its own: kept across restarts, merged between replicas
(the earlier decision stands), bounded per namespace, released with its holder."""

from __future__ import annotations

import base64

import pytest

from ignition_server.reconcile.claims import (
    MAX_PER_NAMESPACE,
    SEALED_NAME,
    Claim,
    Claims,
    claims_secret,
    decode,
    encode,
    key_claim,
    token_claim,
)
from testsupport.clock import T0, Clock


def test_kept_across_a_restart_and_unreadable_records_are_not_fatal() -> None:
    sealed: dict[str, bytes] = {}
    clock = Clock()
    claims = Claims.restored(sealed.get, sealed.__setitem__, clock)
    claims.record(key_claim("f1"), "clusters-victim")
    claims.record(key_claim("f1"), "clusters-evil")  # decided already: the first decision stands
    again = Claims.restored(sealed.get, sealed.__setitem__, clock)
    assert again.holder(key_claim("f1")) == "clusters-victim"
    sealed[SEALED_NAME] = b"not json"
    assert Claims.restored(sealed.get, sealed.__setitem__, clock).snapshot() == {}


def test_replicas_agree_on_the_earlier_decision() -> None:
    clock = Clock()
    ours = Claims(seal=lambda _n, _d: None, clock=clock)
    clock.now = T0 + 10
    ours.record(token_claim("t"), "clusters-evil/token-x")
    theirs = {token_claim("t"): Claim("clusters-victim/token-y", T0), key_claim("k"): Claim("clusters-a", T0 + 5)}
    assert ours.merge(theirs)
    assert ours.holder(token_claim("t")) == "clusters-victim/token-y"
    assert ours.holder(key_claim("k")) == "clusters-a"
    assert not ours.merge(theirs)  # nothing new


def test_the_published_secret_round_trips_and_names_no_token() -> None:
    record = {token_claim("secret-token"): Claim("clusters-a/token-1", T0)}
    obj = claims_secret("ignition", record)
    raw = base64.b64decode(obj["data"]["claims.json"])
    assert b"secret-token" not in raw and decode(raw) == record
    fresh = Claims(seal=lambda _n, _d: None)
    assert fresh.published(obj) and fresh.holder(token_claim("secret-token")) == "clusters-a/token-1"
    with pytest.raises(ValueError):
        decode(encode(record)[:-3])


def test_bounded_per_namespace_and_released_with_the_holder() -> None:
    claims = Claims(seal=lambda _n, _d: None)
    for i in range(MAX_PER_NAMESPACE + 5):
        claims.record(token_claim(f"t{i}"), f"clusters-evil/token-{i}")
    claims.record(token_claim("v"), "clusters-victim/token-1")
    namespaces = [c.holder.partition("/")[0] for c in claims.snapshot().values()]
    assert namespaces.count("clusters-evil") == MAX_PER_NAMESPACE and "clusters-victim" in namespaces
    claims.release("clusters-victim/token-1")
    assert claims.holder(token_claim("v")) is None
