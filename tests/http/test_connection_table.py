"""The shared connection table: rows written apart, checked together, shared across processes."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from ignition_server.http.connection_table import ConnectionTable, source_bucket


@pytest.fixture
def table():
    made = ConnectionTable.create(2, buckets=64)
    yield made
    made.close()


def colliding(table: ConnectionTable, source: str) -> str:
    """Another address in the same bucket as `source` (this table's key known)."""
    mask = table.buckets - 1
    for n in itertools.count(1):
        other = f"10.0.{n // 256}.{n % 256}"
        if source_bucket(other, mask, table.key) == source_bucket(source, mask, table.key):
            return other
    raise AssertionError


def apart(table: ConnectionTable, source: str, candidates: list[str]) -> str:
    """The first candidate in another bucket than `source`: buckets are keyed at random per
    table, so a fixed second address shares the first's bucket once in `table.buckets` runs."""
    mask = table.buckets - 1
    taken = source_bucket(source, mask, table.key)
    return next(c for c in candidates if source_bucket(c, mask, table.key) != taken)


def test_limits_hold_over_the_sum_of_rows(table: ConnectionTable) -> None:
    one, two = table.row(0), table.row(1)
    held = [one.admit("192.0.2.1", 3, 100), two.admit("192.0.2.1", 3, 100), one.admit("192.0.2.1", 3, 100)]
    assert min(held) >= 0
    assert two.admit("192.0.2.1", 3, 100) == -1 and one.admit("192.0.2.1", 3, 100) == -1  # 3 across both rows
    assert table.counts().open == (2, 1) and table.counts().refused == 2
    ipv6 = apart(table, "192.0.2.1", [f"2001:db8::{n:x}" for n in range(1, 64)])
    assert two.admit(ipv6, 3, 100) >= 0  # another address (IPv6 alike) has its own count
    two.release(held[1])
    assert two.admit("192.0.2.1", 3, 100) >= 0  # a place freed on one row is free on the other
    assert table.counts().open == (2, 2)


def test_the_total_is_summed_too(table: ConnectionTable) -> None:
    one, two = table.row(0), table.row(1)
    assert one.admit("192.0.2.1", 10, 3) >= 0 and two.admit("192.0.2.2", 10, 3) >= 0
    assert one.admit("192.0.2.3", 10, 3) >= 0
    assert two.admit("192.0.2.4", 10, 3) == -1
    assert table.counts().open == (2, 1)  # the refused one is not left counted


def test_a_bucket_collision_only_over_counts(table: ConnectionTable) -> None:
    one, two = table.row(0), table.row(1)
    other = colliding(table, "192.0.2.1")
    assert one.admit("192.0.2.1", 2, 100) >= 0 and two.admit(other, 2, 100) >= 0
    # Two addresses in one bucket share its count: the third from either is refused early...
    assert one.admit("192.0.2.1", 2, 100) == -1 and two.admit(other, 2, 100) == -1
    # ...and however they interleave, neither ever holds more than its limit.
    for _ in range(20):
        one.admit("192.0.2.1", 2, 100)
        two.admit(other, 2, 100)
    assert table.counts().open == (1, 1)


def test_buckets_are_keyed_per_table() -> None:
    """Which addresses share a bucket differs with every table (every start of the server), so
    no one can work out an address that shares a victim's bucket; every process that maps one
    table agrees on it."""
    tables = [ConnectionTable.create(1) for _ in range(2)]
    try:
        attached = ConnectionTable.attach(os.dup(tables[0].fd))
        assert attached.key == tables[0].key != tables[1].key
        addresses = [f"192.0.2.{n}" for n in range(64)]
        buckets = [[source_bucket(a, t.buckets - 1, t.key) for a in addresses] for t in (*tables, attached)]
        assert buckets[0] == buckets[2] != buckets[1]
        attached.close()
    finally:
        for made in tables:
            made.close()


def test_a_cleared_row_frees_its_places_and_keeps_its_counters(table: ConnectionTable) -> None:
    one, two = table.row(0), table.row(1)
    for _ in range(2):
        assert two.admit("192.0.2.1", 2, 100) >= 0
    assert one.admit("192.0.2.1", 2, 100) == -1
    two.timed_out()
    table.clear(1)  # its process died holding both
    assert table.counts().open == (0, 0)
    assert table.counts().refused == 1 and table.counts().timed_out == 1  # counters never go back
    assert one.admit("192.0.2.1", 2, 100) >= 0


def test_another_process_sees_the_same_table(table: ConnectionTable) -> None:
    """A worker maps the fd it was passed; its row is in the owner's sums at once."""
    child = """
import sys
from ignition_server.http.connection_table import ConnectionTable
row = ConnectionTable.attach(int(sys.argv[1])).row(1)
assert row.admit("192.0.2.1", 2, 100) >= 0 and row.admit("192.0.2.1", 2, 100) >= 0
assert row.admit("192.0.2.1", 2, 100) == -1
"""
    subprocess.run([sys.executable, "-c", child, str(table.fd)], pass_fds=(table.fd,), check=True, timeout=30)
    assert table.counts().open == (0, 2) and table.counts().refused == 1
    assert table.row(0).admit("192.0.2.1", 2, 100) == -1  # the other process's two count here


def test_a_private_table_counts_alike() -> None:
    """One process serving alone: the same checks in memory no other process maps."""
    alone = ConnectionTable.create(1, shared=False)
    try:
        row = alone.row(0)
        assert alone.fd == -1 and row.admit("192.0.2.1", 1, 10) >= 0 and row.admit("192.0.2.1", 1, 10) == -1
        assert alone.counts().open == (1,) and alone.counts().refused == 1
    finally:
        alone.close()


def test_attach_refuses_what_is_not_a_table(tmp_path) -> None:
    path = tmp_path / "junk"
    path.write_bytes(b"\0" * 4096)
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(ValueError):
            ConnectionTable.attach(fd)
    finally:
        os.close(fd)
