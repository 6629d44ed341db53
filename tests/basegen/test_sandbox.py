"""A release's binaries run in a sandbox (basegen/sandbox.py): a hostile "machine-config-operator"
tries what issue 21's attacker's did (the cache key, the cache, other tenants' manifests, the
service-account token, the network, writing outside its work dir, the server's fds and
processes; issue 31's: the edge dir's serving key, a Secret volume's key after its `..data` swap),
and nothing it prints reaches an error's message, only the server's log. Real processes, real
namespaces; as root (the steps' uid 65534) and as another user."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from ignition_server.basegen.run import Limits, StepFailed, run_step
from ignition_server.basegen.sandbox import Sandbox, SandboxUnavailable, hide_list
from testsupport.harness import Listener
from testsupport.manifests import secret_volume

PROBE = r'''#!/usr/bin/python3
import json, os, socket, sys
paths = json.loads(sys.argv[1])
seen = {}
for name in ("key", "cache_file", "manifest", "sa_token"):
    try:
        with open(paths[name]) as f:
            seen[name] = f.read()
    except OSError as exc:
        seen[name] = None
for name in ("outside", "tmp"):
    try:
        with open(paths[name], "w") as f:
            f.write("escaped")
        seen["wrote_" + name] = True
    except OSError:
        seen["wrote_" + name] = False
with open("inside", "w") as f:
    f.write("fine")
try:
    socket.create_connection(("127.0.0.1", paths["port"]), timeout=2).close()
    seen["network"] = True
except OSError:
    seen["network"] = False
seen["fds"] = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
seen["uid"] = os.getuid()
seen["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
seen["env"] = sorted(os.environ)
seen["server_visible"] = os.path.exists(f"/proc/{paths['server_pid']}/environ") and paths["server_pid"] > 10
print(json.dumps(seen))
'''


def world(tmp_path: Path) -> tuple[Path, Path, Path, dict]:
    """A server's layout: the cache dir (0700) holding the work dir, its key file beside it,
    the manifests, a service-account token dir; the probe installed as an extracted image."""
    Path("/tmp/i21-sandbox-escape").unlink(missing_ok=True)  # (left by a run without the sandbox)
    cache = tmp_path / "cache"
    (cache / "tmp-mco" / "job").mkdir(parents=True)
    cache.chmod(0o700)
    (cache / "index.bin").write_text("the token index")
    (tmp_path / "cache.key").write_text("index secret-key")
    (tmp_path / "cache.key").chmod(0o600)
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "other-tenant.yaml").write_text("another cluster's pull secret")
    (tmp_path / "sa").mkdir()
    (tmp_path / "sa" / "token").write_text("the server's API token")
    (tmp_path / "outside").mkdir()
    binary = cache / "tmp-mco" / "image-1" / "usr" / "bin" / "machine-config-operator"
    binary.parent.mkdir(parents=True)
    binary.write_text(PROBE)
    binary.chmod(0o755)
    paths = {"key": str(tmp_path / "cache.key"), "cache_file": str(cache / "index.bin"),
             "manifest": str(tmp_path / "source" / "other-tenant.yaml"), "sa_token": str(tmp_path / "sa" / "token"),
             "outside": str(tmp_path / "outside" / "x"), "tmp": "/tmp/i21-sandbox-escape", "server_pid": os.getpid()}
    return cache, binary, cache / "tmp-mco" / "job", paths


def sandbox_for(tmp_path: Path) -> Sandbox:
    return Sandbox(hide=hide_list([tmp_path / "cache", tmp_path / "cache.key", tmp_path / "source", tmp_path / "sa"]))


def assert_contained(seen: dict, tmp_path: Path, job: Path, listener: Listener) -> None:
    assert seen["key"] is None and seen["cache_file"] is None
    assert seen["manifest"] is None and seen["sa_token"] is None
    assert not (tmp_path / "outside" / "x").exists() and not Path("/tmp/i21-sandbox-escape").exists()
    assert (job / "inside").read_text() == "fine"  # its work dir is its own
    assert seen["network"] is False and listener.accepted == 0
    assert seen["fds"][:3] == [0, 1, 2] and len(seen["fds"]) <= 4  # 3: the listing's own
    assert not seen["server_visible"] and max(seen["pids"]) < 10  # its own pid namespace
    # (LC_CTYPE: python3, the probe, sets it for itself in a C locale, PEP 538)
    assert set(seen["env"]) <= {"PATH", "HOME", "LANG", "PWD", "OLDPWD", "SHLVL", "_", "LC_CTYPE"}


def test_a_hostile_binary_sees_nothing_of_the_server_as_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root case needs root (CI runs as root)")
    _cache, binary, job, paths = world(tmp_path)
    listener = Listener()
    paths["port"] = listener.port
    leaked = os.open(paths["key"], os.O_RDONLY)  # an fd the server holds, made inheritable
    os.set_inheritable(leaked, True)
    os.environ["IGNITION_SERVER_SECRET_PROBE"] = "server env"
    try:
        sandbox = sandbox_for(tmp_path)
        sandbox.check(tmp_path / "cache" / "tmp-mco" / "check")
        out = asyncio.run(run_step([str(binary), json.dumps(paths)], job, Limits(timeout=60, sandbox=sandbox),
                                   {"PATH": "/usr/bin:/bin", "HOME": str(job), "LANG": "C.UTF-8"}))
    finally:
        os.close(leaked)
        del os.environ["IGNITION_SERVER_SECRET_PROBE"]
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["uid"] == 65534
    assert_contained(seen, tmp_path, job, listener)


@pytest.fixture
def open_tmp():
    """A temp dir another user can reach (pytest's own are 0700 root)."""
    path = Path(tempfile.mkdtemp(prefix="i21-sandbox-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_hostile_binary_sees_nothing_of_the_server_as_another_user(open_tmp: Path) -> None:
    """The pod's case: the server is not root; a user namespace maps it to root inside, capabilities dropped."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start the server's stand-in as another user")
    tmp_path = open_tmp
    _cache, binary, job, paths = world(tmp_path)
    listener = Listener()
    paths["port"] = listener.port
    subprocess.run(["chown", "-R", "65534:65534", str(tmp_path)], check=True)
    tmp_path.chmod(0o755)
    script = textwrap.dedent(f"""
        import asyncio, json, sys
        from pathlib import Path
        from ignition_server.basegen.run import Limits, run_step
        from ignition_server.basegen.sandbox import Sandbox, hide_list
        t = Path({str(tmp_path)!r})
        sandbox = Sandbox(hide=hide_list([t / "cache", t / "cache.key", t / "source", t / "sa"]))
        sandbox.check(t / "cache" / "tmp-mco" / "check")
        print(asyncio.run(run_step([{str(binary)!r}, {json.dumps(paths)!r}], Path({str(job)!r}),
                                   Limits(timeout=60, sandbox=sandbox), {{"PATH": "/usr/bin:/bin"}})))
    """)
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
                          capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["uid"] == 0  # root of its own user namespace: the server's uid outside, no capability
    assert_contained(seen, tmp_path, job, listener)
    # It could not make its namespace's root powers count: its mounts are locked, its caps gone.
    assert "hostile" not in (tmp_path / "cache" / "index.bin").read_text()


def test_a_binary_cannot_undo_its_mounts(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    _cache, binary, job, paths = world(tmp_path)
    binary.write_text("#!/bin/sh\numount " + paths["cache_file"].rsplit("/", 1)[0] + " 2>&1; "
                      "umount /run 2>&1; cat " + paths["key"] + " 2>&1; echo done\n")
    out = asyncio.run(run_step([str(binary)], job, Limits(timeout=60, sandbox=sandbox_for(tmp_path)), {"PATH": "/usr/bin:/bin"}))
    assert "secret-key" not in out and "done" in out


def test_nothing_a_binary_prints_reaches_the_message_only_the_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 31's channel: the key as klog `E` lines of lower-case hex in short runs, which the
    redaction of error lines let through to `data.message`."""
    stolen = bytes(range(200, 232)).hex()
    lines = "".join(f"echo 'E1124 10:00:01.000000    7 bootstrap.go:9] chunk {stolen[i:i + 16]}'\n" for i in range(0, 64, 16))
    binary = tmp_path / "machine-config-operator"
    binary.write_text("#!/bin/sh\n" + lines +
                      "echo 'F1124 10:00:02.000000    7 bootstrap.go:93] error rendering the controller config'\n"
                      "exit 255\n")
    binary.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    with caplog.at_level("WARNING", logger="ignition_server.basegen"), pytest.raises(StepFailed) as failed:
        asyncio.run(run_step([str(binary)], work, Limits(timeout=30), {"PATH": "/usr/bin:/bin"}))
    message = str(failed.value)
    assert message.startswith("machine-config-operator failed") and "server's log" in message
    assert "chunk" not in message and stolen[:16] not in message and "255" not in message
    assert "error rendering the controller config" not in message  # not even its own error lines
    logged = caplog.text
    assert "exited with 255" in logged and stolen[:16] in logged and "error rendering the controller config" in logged


def test_a_secret_volumes_key_and_the_edge_dir_stay_hidden_after_a_data_swap(state_dir: Path) -> None:
    """The hide list as the server makes it (reconcile.wiring passes these): the cache dir, a
    key file in a Secret volume, the serving pair in another, the manifests, `--edge-dir`
    published after start. The volumes are updated (`..data` swapped) after the hide list is
    made; the step then reads every path to a secret it can name. Every file is readable to
    the step's user, as in a pod, where the step runs as the server's own uid: only hiding helps."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    tmp_path = state_dir
    cache, binary, job, paths = world(tmp_path)
    keys, tls, edge = tmp_path / "cache-key", tmp_path / "serving", tmp_path / "edge"
    secret_volume(keys, {"cache.key": b"index old-key\n"}, "2026_11_27_01")
    secret_volume(tls, {"tls.crt": b"old certificate", "tls.key": b"old serving key"}, "2026_11_27_01")
    hide = hide_list([cache, keys / "cache.key", tmp_path / "source", tls / "tls.crt", tls / "tls.key"],
                     directories=[edge])
    edge.mkdir()
    (edge / "edge.pem").write_text("serving certificate and its key")
    secret_volume(keys, {"cache.key": b"index new-key\n"}, "2026_11_27_02")
    secret_volume(tls, {"tls.crt": b"new certificate", "tls.key": b"new serving key"}, "2026_11_27_02")
    targets = [keys / "cache.key", keys / "..data" / "cache.key", keys / "..2026_11_27_02" / "cache.key",
               tls / "tls.key", tls / "..data" / "tls.key", edge / "edge.pem"]
    for path in (keys, tls, edge):
        subprocess.run(["chmod", "-R", "a+rX", str(path)], check=True)
    assert all("key" in t.read_text() or "serving" in t.read_text() for t in targets)  # there to be read
    binary.write_text("#!/bin/sh\n" + "".join(f"cat {t} 2>/dev/null; echo\n" for t in targets) + "echo done\n")
    out = asyncio.run(run_step([str(binary)], job, Limits(timeout=60, sandbox=Sandbox(hide=hide)),
                               {"PATH": "/usr/bin:/bin"}))
    assert "done" in out
    for secret in ("key", "serving", "certificate"):
        assert secret not in out, out


def test_the_hide_list_takes_files_by_their_directory_as_named_and_keeps_the_outermost(tmp_path: Path) -> None:
    (tmp_path / "state" / "cache").mkdir(parents=True)
    secret_volume(tmp_path / "cache-key", {"cache.key": b"k"}, "v1")
    found = hide_list([tmp_path / "state" / "cache", tmp_path / "state", tmp_path / "cache-key" / "cache.key",
                       Path("/etc/passwd"), tmp_path / "missing"],
                      directories=[tmp_path / "edge", Path("/var/run/made-later")])
    # The edge dir though not made yet; a file by its directory, never its `..data` target; one in
    # a system directory alone; nothing under /run, which the sandbox replaces whole.
    assert found == (tmp_path / "edge", tmp_path / "state", tmp_path / "cache-key", Path("/etc/passwd"))


def test_a_host_without_the_namespaces_is_refused_at_start(tmp_path: Path) -> None:
    sandbox = Sandbox(hide=())
    sandbox_path = tmp_path / "bin"
    sandbox_path.mkdir()
    (sandbox_path / "unshare").write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2; exit 1\n")
    (sandbox_path / "unshare").chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{sandbox_path}:{old}"
    try:
        with pytest.raises(SandboxUnavailable, match="Operation not permitted"):
            sandbox.check(tmp_path / "check")
    finally:
        os.environ["PATH"] = old
