"""The token Secrets on their own: a real encrypted cache's token index, token Secrets as HyperShift writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from ignition_server.model.token_secret import ANNOTATION_TOKEN_EXPIRATION, TokenSecret, format_time, parse_token_secret
from ignition_server.reconcile.tenancy import generation_group
from ignition_server.reconcile.token_secrets import TokenSecrets
from payload_cache import CacheConfig, PayloadCache, TokenState
from testsupport.clock import T0, Clock
from testsupport.manifests import build_token_secret

TTL = 100.0


def token_secret(pool: str, token: str, *, old_token: str | None = None, suffix: str = "00000000",
                 created: str | None = None, expires: float | None = None) -> TokenSecret:
    obj = build_token_secret(namespace="clusters-a", nodepool=f"clusters/{pool}", token=token, old_token=old_token,
                             generation_time=T0, suffix=suffix)
    if created is not None:
        obj["metadata"]["creationTimestamp"] = created
    if expires is not None:
        obj["metadata"]["annotations"][ANNOTATION_TOKEN_EXPIRATION] = format_time(expires)
    return parse_token_secret(obj)


@pytest.fixture
def index(tmp_path: Path) -> tuple[TokenSecrets, PayloadCache, Clock, list[str]]:
    cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "cache"))
    clock = Clock()
    refused: list[str] = []
    return TokenSecrets(cache=cache, ttl=TTL, clock=clock, on_refused=lambda: refused.append("refused")), cache, clock, refused


def state(cache: PayloadCache, token: str) -> TokenState | None:
    record = cache.lookup_token(token)
    return record.state if record is not None else None


def test_put_indexes_current_and_previous_and_retires_what_a_secret_no_longer_lists(index) -> None:
    tokens, cache, clock, _ = index
    first = token_secret("p", "tok-1", old_token="tok-0")
    tokens.seen(first)
    tokens.put(first)
    assert (state(cache, "tok-1"), state(cache, "tok-0")) == (TokenState.CURRENT, TokenState.PREVIOUS)
    assert cache.lookup_token("tok-1").nodepool == "clusters/p"
    assert tokens.get(first.key) is first and list(tokens.secrets) == [first.key]
    rotated = token_secret("p", "tok-2", old_token="tok-1")
    tokens.put(rotated)
    assert (state(cache, "tok-2"), state(cache, "tok-1"), state(cache, "tok-0")) == \
        (TokenState.CURRENT, TokenState.PREVIOUS, TokenState.RETIRED)
    assert cache.lookup_token("tok-0").expires_at == T0 + TTL  # refused (403) for one TTL, then forgotten
    gone = tokens.remove(first.key)
    assert gone is rotated and tokens.get(first.key) is None
    assert state(cache, "tok-2") is state(cache, "tok-1") is TokenState.RETIRED


def test_an_expired_secrets_tokens_retire_on_refresh(index) -> None:
    tokens, cache, clock, _ = index
    secret = token_secret("p", "tok-1", old_token="tok-0", expires=T0 + 10)
    tokens.put(secret)
    assert state(cache, "tok-1") is TokenState.CURRENT
    clock.now = T0 + 11
    tokens.refresh(secret)
    assert state(cache, "tok-1") is state(cache, "tok-0") is TokenState.RETIRED


def test_a_token_belongs_to_the_secret_that_held_it_first(index) -> None:
    tokens, cache, clock, refused = index
    first = token_secret("p", "tok-shared")
    tokens.put(first)
    newcomer = token_secret("q", "tok-shared")
    assert tokens.holds_anothers_token(newcomer)
    assert tokens.holds_anothers_token(newcomer)  # asked again (a retry): refused, counted and logged once
    assert refused == ["refused"]
    assert cache.lookup_token("tok-shared").secret == first.ref
    assert not tokens.holds_anothers_token(first)  # its own tokens are no one else's
    # Gone and back: judged afresh, and counted again.
    assert tokens.forget_refusal(newcomer.key) and not tokens.forget_refusal(newcomer.key)
    assert tokens.holds_anothers_token(newcomer) and refused == ["refused", "refused"]
    # A newcomer given a token of its own is no longer refused.
    assert not tokens.holds_anothers_token(token_secret("q", "tok-own"))


def test_grant_for_picks_the_newest_live_generation_of_the_nodepool(index) -> None:
    tokens, cache, clock, _ = index
    old = token_secret("workers", "tok-old", suffix="11111111", created="2027-01-01T00:00:00Z")
    new = token_secret("workers", "tok-new", suffix="22222222", created="2027-01-02T00:00:00Z")
    other = token_secret("infra", "tok-infra", suffix="33333333", created="2027-01-03T00:00:00Z")
    for secret in (new, old, other):
        tokens.seen(secret)
        tokens.put(secret)
    assert tokens.grant_for("clusters-a", "workers").secret == new.ref
    assert tokens.grant_for("clusters-a", "infra").secret == other.ref
    assert tokens.grant_for("clusters-b", "workers") is None
    # The newest expired: the older generation serves; both expired: none.
    tokens.put(token_secret("workers", "tok-new", suffix="22222222", created="2027-01-02T00:00:00Z", expires=T0 + 1))
    clock.now = T0 + 2
    assert tokens.grant_for("clusters-a", "workers").secret == old.ref
    tokens.remove(old.key)
    assert tokens.grant_for("clusters-a", "workers") is None
    # Same creation time: the one seen first is older.
    a = token_secret("twins", "tok-a", suffix="aaaaaaaa", created="2027-01-01T00:00:00Z")
    b = token_secret("twins", "tok-b", suffix="bbbbbbbb", created="2027-01-01T00:00:00Z")
    for secret in (a, b):
        tokens.seen(secret)
        tokens.put(secret)
    assert tokens.grant_for("clusters-a", "twins").secret == b.ref


def test_outdated_names_every_older_generation_without_an_expiry(index) -> None:
    tokens, cache, clock, _ = index
    gens = [token_secret("p", f"tok-{i}", suffix=f"{i}" * 8, created=f"2027-01-0{i}T00:00:00Z") for i in (1, 2, 3)]
    for secret in gens:
        tokens.seen(secret)
        tokens.put(secret)
    group = generation_group(gens[0])
    assert [s.ref for s in tokens.outdated({group})] == [gens[0].ref, gens[1].ref]
    tokens.put(token_secret("p", "tok-1", suffix="1" * 8, created="2027-01-01T00:00:00Z", expires=T0 + 7200))
    assert [s.ref for s in tokens.outdated({group})] == [gens[1].ref]  # already given an expiry: not again
    assert tokens.outdated(set()) == []


def test_a_rotations_token_is_expected_before_its_write_and_dropped_if_never_written(index) -> None:
    tokens, cache, clock, _ = index
    secret = token_secret("p", "tok-1")
    tokens.put(secret)
    tokens.expect(secret, "tok-2")
    assert state(cache, "tok-2") is TokenState.CURRENT and state(cache, "tok-1") is TokenState.CURRENT
    tokens.unexpect(secret.key, "tok-2")
    assert state(cache, "tok-2") is None and state(cache, "tok-1") is TokenState.CURRENT
    # A write that landed although its answer was lost: the source holds it, so it stays.
    tokens.expect(secret, "tok-3")
    tokens.rotated(token_secret("p", "tok-3", old_token="tok-1"))
    tokens.unexpect(secret.key, "tok-3")
    assert (state(cache, "tok-3"), state(cache, "tok-1")) == (TokenState.CURRENT, TokenState.PREVIOUS)
