"""http.deadlines: many connections' deadlines of one length, one timer."""

from __future__ import annotations

import asyncio

from ignition_server.http.deadlines import Deadlines


async def test_each_key_expires_once_after_its_time_unless_dropped() -> None:
    # Times are measured, not assumed: on a loaded machine a 0.05 s sleep can take 0.2 s, so
    # the deadline is long beside the sleeps and each bound is taken from when its key was set.
    loop = asyncio.get_running_loop()
    expired: list[tuple[str, float]] = []
    seconds = 1.0
    due: Deadlines[str] = Deadlines(seconds, lambda key: expired.append((key, loop.time())))
    due.set("a")
    await asyncio.sleep(0.1)
    due.set("b")
    due.set("c")
    c_set = loop.time()
    due.drop("b")
    await asyncio.sleep(0.05)
    due.drop("a")  # before its time: never expires
    for _ in range(300):  # until c has expired, 3 s at most
        if expired:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # and nothing after it
    assert [key for key, _ in expired] == ["c"]
    assert c_set + seconds - 0.01 <= expired[0][1] < c_set + seconds + 0.5
    assert len(due) == 0


async def test_a_key_set_again_does_not_hold_back_the_keys_behind_it() -> None:
    """A re-set key moves to the back of the order with its later deadline: left in its old
    place, the pass stopped at it and a key set after it, due, expired late (fails before)."""
    loop = asyncio.get_running_loop()
    expired: dict[str, float] = {}
    due: Deadlines[str] = Deadlines(0.3, lambda key: expired.setdefault(key, loop.time()))
    due.set("a")
    await asyncio.sleep(0.05)
    due.set("b")
    b_due = loop.time() + 0.3
    await asyncio.sleep(0.15)
    due.set("a")  # again: due 0.3 s from now, after b
    a_due = loop.time() + 0.3
    await asyncio.sleep(0.6)
    assert list(expired) == ["b", "a"]
    assert expired["b"] < b_due + 0.1  # on time, not held back until a's new deadline
    assert expired["a"] >= a_due - 0.01
    assert len(due) == 0


async def test_one_timer_at_a_time_however_many_keys() -> None:
    expired: list[int] = []
    due: Deadlines[int] = Deadlines(0.05, expired.append)
    timers = []
    real_call_at = asyncio.get_running_loop().call_at

    def counting(when, callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        if getattr(callback, "__self__", None) is due:
            timers.append(when)
        return real_call_at(when, callback, *args, **kwargs)

    asyncio.get_running_loop().call_at = counting  # type: ignore[method-assign]
    try:
        for key in range(1000):
            due.set(key)
        await asyncio.sleep(0.2)
    finally:
        del asyncio.get_running_loop().call_at  # type: ignore[attr-defined]
    assert expired == list(range(1000))
    assert len(timers) <= 3


class _Transport:
    def __init__(self) -> None:
        self.closes = self.aborts = 0

    def close(self) -> None:
        self.closes += 1

    def abort(self) -> None:
        self.aborts += 1

    def get_write_buffer_size(self) -> int:
        return 0

    write = writelines = close

    def is_closing(self) -> bool:
        return self.closes > 0


async def test_a_close_after_the_connection_is_gone_arms_no_cut() -> None:
    """aiohttp closes its transport once more after connection_lost: in a boot storm every
    connection then kept a cut armed, and fired, a second after it was gone (fails before)."""
    from ignition_server.http.guard import ConnectionGuard, _NoLingerClose

    guard = ConnectionGuard()
    transport = _Transport()
    closing = _NoLingerClose(transport, guard.cuts_due)  # type: ignore[arg-type]
    closing.close()  # the server's close, nothing queued: cut if the client does not close
    assert len(guard.cuts_due) == 1
    closing.closed()  # the client closed
    closing.close()  # aiohttp's late close
    assert len(guard.cuts_due) == 0
    assert transport.aborts == 0
