"""No server outlives its test: a test that fails before its own clean-up would leave a
server (and its workers) running through the rest of the suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testsupport import harness


@pytest.fixture(autouse=True)
def _no_server_left_behind() -> Iterator[None]:
    yield
    while harness.STARTED:
        harness.STARTED.pop().kill()


@pytest.fixture
def serving_client(aiohttp_raw_server, aiohttp_client):
    """connect(handlers): an aiohttp test client on the serving port's dispatch, as served."""
    from ignition_server.http.app import IgnitionHandlers, build_dispatch

    async def connect(handlers: IgnitionHandlers):
        return await aiohttp_client(await aiohttp_raw_server(build_dispatch(handlers)))

    return connect
