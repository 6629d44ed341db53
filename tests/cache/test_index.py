"""Token index, render records, sealed state, expiry, persistence and load time."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest

from payload_cache import CacheConfig, PayloadCache, RenderRecord, TokenRecord, TokenState, index as index_module
from payload_cache.index import INDEX_FORMAT, INDEX_VERSION, TokenIndex


def open_cache(tmp_path: Path) -> PayloadCache:
    return PayloadCache.open(CacheConfig(tmp_path / "cache"))


def rec(secret: str = "ns/s1", state: TokenState = TokenState.CURRENT, expires_at: float | None = None) -> TokenRecord:
    return TokenRecord("ns/np", secret, state, expires_at)


def test_token_lookup_by_token_and_key(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    cache.put_token("secret-token", rec())
    key = cache.token_key("secret-token")
    assert len(key) == 32
    assert cache.lookup_token("secret-token") == rec()
    assert cache.lookup_token_key(key) == rec()
    assert cache.lookup_token("other-token") is None
    cache.drop_token_key(key)
    assert cache.lookup_token("secret-token") is None


def test_token_key_is_keyed(tmp_path: Path) -> None:
    a = PayloadCache.open(CacheConfig(tmp_path / "a"))
    b = PayloadCache.open(CacheConfig(tmp_path / "b"))
    assert a.token_key("t") == a.token_key("t") != b.token_key("t")


def test_token_key_is_hmac_sha256_of_the_index_key_whichever_object_computes_it() -> None:
    import hashlib
    import hmac

    from payload_cache.keys import KeyRing

    ring = KeyRing.generate()
    for token in (b"t", b"secret-token", b"x" * 5000):  # past SHA-256's block: copies stay independent
        assert ring.hmac(token) == hmac.new(ring.index_key, token, hashlib.sha256).digest()
    assert ring.hmac(b"t") == ring.hmac(b"t")  # the keyed state is copied, never updated


def test_tokens_of_secret_tracks_moves_and_drops(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    k1, k2, k3 = (cache.token_key(t) for t in ("t1", "t2", "t3"))
    cache.put_token_key(k1, rec("ns/a"))
    cache.put_token_key(k2, rec("ns/a", TokenState.PREVIOUS))
    cache.put_token_key(k3, rec("ns/b"))
    assert cache.tokens_of_secret("ns/a") == {k1: rec("ns/a"), k2: rec("ns/a", TokenState.PREVIOUS)}
    cache.put_token_key(k2, rec("ns/b"))  # re-pointed to another Secret
    assert set(cache.tokens_of_secret("ns/a")) == {k1}
    assert set(cache.tokens_of_secret("ns/b")) == {k2, k3}
    cache.drop_token_key(k1)
    assert cache.tokens_of_secret("ns/a") == {}
    assert cache.tokens_of_secret("ns/none") == {}
    with pytest.raises(ValueError):
        cache.put_token_key(b"short", rec())


def test_dirty_and_flush(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    assert not cache.dirty
    cache.put_token("t", rec())
    assert cache.dirty
    cache.flush()
    assert not cache.dirty
    cache.put_token("t", rec())  # same record again: nothing to write
    assert not cache.dirty
    cache.put_render(RenderRecord("ns/s1", "ns/np", "d", "a" * 64, "3.2.0", 1.0))
    assert cache.dirty
    cache.flush()
    assert not cache.dirty
    cache.drop_render("ns/s1")
    assert cache.dirty and cache.get_render("ns/s1") is None


def test_index_persists_across_restart(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    cache.put_token("t-current", rec("ns/a", TokenState.CURRENT, 2_000_000_000.5))
    cache.put_token("t-retired", rec("ns/a", TokenState.RETIRED, 1_900_000_000.0))
    render = RenderRecord("ns/a", "ns/np", "sha256:abc", "b" * 64, "3.4.0", 1_700_000_000.25)
    cache.put_render(render)
    cache.flush()
    unflushed = "t-never-flushed"
    cache.put_token(unflushed, rec("ns/z"))

    reopened = open_cache(tmp_path)
    assert reopened.lookup_token("t-current") == rec("ns/a", TokenState.CURRENT, 2_000_000_000.5)
    assert reopened.lookup_token("t-retired").state is TokenState.RETIRED
    assert reopened.lookup_token(unflushed) is None
    assert reopened.renders() == [render]
    assert set(reopened.tokens_of_secret("ns/a")) == {reopened.token_key("t-current"), reopened.token_key("t-retired")}
    assert not reopened.dirty


def test_no_tokens_stored_in_clear(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    cache.put_token("plaintext-token-value", rec())
    cache.flush()
    for path in (tmp_path / "cache").rglob("*"):
        if path.is_file():
            assert b"plaintext-token-value" not in path.read_bytes()


def test_forget_expired(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    now = 1_000_000.0
    cache.put_token("retired-past", rec("ns/a", TokenState.RETIRED, now - 10))
    cache.put_token("retired-future", rec("ns/a", TokenState.RETIRED, now + 10))
    cache.put_token("current-expired", rec("ns/b", TokenState.CURRENT, now - 100))
    cache.put_token("current-forever", rec("ns/b", TokenState.CURRENT, None))
    cache.flush()

    assert cache.forget_expired(now, grace=50) == 1  # only the one 100 s past
    assert cache.lookup_token("current-expired") is None
    assert cache.lookup_token("retired-past") is not None
    assert cache.forget_expired(now) == 1
    assert cache.lookup_token("retired-past") is None
    assert cache.lookup_token("retired-future") is not None
    assert cache.lookup_token("current-forever") is not None
    assert set(cache.tokens_of_secret("ns/a")) == {cache.token_key("retired-future")}
    assert cache.dirty
    assert cache.forget_expired(now) == 0


def test_sealed_state_round_trip_across_restart(tmp_path: Path) -> None:
    cache = open_cache(tmp_path)
    blob = os.urandom(200)
    cache.seal("rotation/ns/np", blob)
    cache.seal("other", b"")
    assert cache.unseal("rotation/ns/np") == blob
    assert cache.dirty
    cache.flush()
    reopened = open_cache(tmp_path)
    assert reopened.unseal("rotation/ns/np") == blob
    assert reopened.unseal("other") == b""
    assert reopened.unseal("missing") is None
    assert reopened.unseal_names() == ["other", "rotation/ns/np"]
    reopened.seal("rotation/ns/np", b"v2")
    reopened.flush()
    assert open_cache(tmp_path).unseal("rotation/ns/np") == b"v2"


def test_large_index_loads_fast(tmp_path: Path) -> None:
    nodepools = 5280
    cache = open_cache(tmp_path)
    states = (TokenState.CURRENT, TokenState.PREVIOUS, TokenState.RETIRED)
    for n in range(nodepools):
        nodepool = f"clusters-{n % 400}/nodepool-{n}"
        secret = f"clusters-{n % 400}/token-nodepool-{n}-{n:08x}"
        for i, state in enumerate(states):
            key = os.urandom(32)
            cache.put_token_key(key, TokenRecord(nodepool, secret, state, 1_800_000_000.0 + n + i))
        cache.put_render(RenderRecord(secret, nodepool, f"sha256:{n:064x}", f"{n:064x}", "3.2.0", 1_700_000_000.0 + n))
    started = time.perf_counter()
    cache.flush()
    flush_seconds = time.perf_counter() - started
    size = (tmp_path / "cache" / "index.bin").stat().st_size

    started = time.perf_counter()
    reopened = open_cache(tmp_path)
    load_seconds = time.perf_counter() - started
    print(
        f"\nindex: {nodepools * 3} tokens + {nodepools} renders, {size / 1e6:.2f} MB; "
        f"flush {flush_seconds * 1000:.0f} ms, open {load_seconds * 1000:.0f} ms"
    )
    stats = reopened.stats()
    assert (stats.tokens, stats.renders) == (nodepools * 3, nodepools)
    assert len(reopened.tokens_of_secret("clusters-7/token-nodepool-7-00000007")) == 3
    assert load_seconds < 2.0


def test_state_files_are_encrypted_and_survive_a_restart(tmp_path):
    from payload_cache import CacheConfig, PayloadCache

    cache = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "c"))
    assert cache.load_state("listing") is None
    cache.save_state("listing", b"secret-listing-marker" * 10)
    again = PayloadCache.open(CacheConfig(cache_dir=tmp_path / "c"))
    assert again.load_state("listing") == b"secret-listing-marker" * 10
    raw = (tmp_path / "c" / "state" / "listing.bin").read_bytes()
    assert b"secret-listing-marker" not in raw
    # Bound to its name: a state file renamed onto another name does not open.
    (tmp_path / "c" / "state" / "other.bin").write_bytes(raw)
    assert again.load_state("other") is None
    import pytest

    with pytest.raises(ValueError):
        again.save_state("../escape", b"x")


def _whole_document(index: TokenIndex) -> bytes:
    """The snapshot as a whole-document json.dumps writes it (the on-disk format, version 1)."""
    generation, tokens, renders = index.rows()
    sealed = {name: base64.b64encode(index.unseal(name) or b"").decode("ascii") for name in index.unseal_names()}
    doc = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "tokens": tokens, "renders": renders, "sealed": sealed}
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def test_a_flush_encodes_only_the_rows_that_changed_into_the_same_bytes() -> None:
    index = TokenIndex()
    for i in range(200):
        index.put_token(bytes([i]) * 32, TokenRecord(f"clusters/p{i}", f"ns/s{i}", TokenState.CURRENT, 1.5e9 + i + 0.25))
        index.put_render(RenderRecord(f"ns/s{i}", f"clusters/p{i}", "d" * 64, "b" * 64, "3.2.0", 1.5e9 + i))
    index.seal("state", b"\x00sealed\xff")
    assert index.encode()[0] == _whole_document(index)
    rows_made = []
    real_dumps = index_module._dumps

    def counting(value):  # type: ignore[no-untyped-def]
        rows_made.append(value)
        return real_dumps(value)

    index_module._dumps = counting
    try:
        # Changes of every kind: a token moved, rotated, dropped, expired; a render replaced, dropped.
        index.put_token(bytes([1]) * 32, TokenRecord("clusters/p1", "ns/other", TokenState.PREVIOUS, 1.6e9))
        index.drop_token(bytes([2]) * 32)
        index.put_token(b"\xaa" * 32, TokenRecord("clusters/new", "ns/new\u00e9\"", TokenState.CURRENT, None))
        assert index.forget_expired(1.5e9 + 1) == 1  # p0's token (p1's moved on)
        index.put_render(RenderRecord("ns/s3", "clusters/p3", "e" * 64, "c" * 64, "3.4.0", 1.7e9))
        index.drop_render("ns/s4")
        data, generation = index.encode()
    finally:
        index_module._dumps = real_dumps
    assert data == _whole_document(index) and generation == index.generation
    rows = [row for row in rows_made if isinstance(row, list)]
    assert len(rows) == 3  # the moved and the new token, the replaced render: not 400 rows
    assert TokenIndex.decode(data).lookup(b"\xaa" * 32) == index.lookup(b"\xaa" * 32)
