"""After every other test (marked `last`: tests/conftest.py runs it after all the others): no
token in any server log the suite made.

The tests name their opaque tokens `tok-…`; secret names are `token-…`, so `tok-` in a log is
a token that leaked. A `Bearer ` value, or a `token=` query value, is one too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.last

LEAKS = re.compile(rb"tok-|Bearer [A-Za-z0-9+/=]{4}|[?&]token=(?!<redacted>|\*)[^&\s\"]")


def test_no_token_in_any_server_log_of_the_suite(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> None:
    # Run earlier, it would miss the logs of the tests after it and pass for nothing.
    assert request.session.items[-1] is request.node, "not the session's last test: see tests/conftest.py"
    logs = sorted(Path(tmp_path_factory.getbasetemp()).rglob("server-*.log"))
    if not logs:
        pytest.skip("no server ran before this test (run it with the whole suite)")
    for log in logs:
        found = LEAKS.search(log.read_bytes())
        assert found is None, f"{log}: {found.group(0)!r} in {found.string[max(0, found.start() - 80):found.end() + 40]!r}"
