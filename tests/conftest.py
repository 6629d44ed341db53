"""For every test under tests/ (each folder's tests included): no server outlives its test (a
test that fails before its own clean-up would leave a server and its workers running through
the rest of the suite), and a test marked `last` runs after all the others, wherever its file sorts."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The helpers' asserts (testsupport.deploy.check_unprivileged_pod, ...) say their values as a test's do;
# registered before the first import of testsupport.
pytest.register_assert_rewrite("testsupport")

from testsupport import harness  # noqa: E402


@pytest.hookimpl(trylast=True)  # after any plugin that reorders: the order it leaves is final
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    last = [item for item in items if item.get_closest_marker("last")]
    items[:] = [item for item in items if not item.get_closest_marker("last")] + last


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


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A server's state dir (a pod's volume) that another user can reach, outside /tmp: the
    base-generation sandbox puts a tmpfs over /tmp, /var/tmp and /run whatever it hides, so a
    world under them would prove nothing of what it hides."""
    path = Path(tempfile.mkdtemp(prefix="ignition-server-test-", dir="/var/lib"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
