"""No server outlives its test: a test that fails before its own clean-up would leave a
server (and its workers) running through the rest of the suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import harness


@pytest.fixture(autouse=True)
def _no_server_left_behind() -> Iterator[None]:
    yield
    while harness.STARTED:
        harness.STARTED.pop().kill()
