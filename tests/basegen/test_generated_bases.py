"""Generated MCO bases (--generate-bases) through the real server process, with STAND-IN binaries.

The MCO binaries in the image are STAND-INS (testsupport/mco_image.py: python3 scripts with MCO's
command line and output layout) where a fault is injected (a step that fails with a long
output, fails once, hangs) or runs are counted per process; the real binaries' payloads are
tested in tests/basegen/test_generated_bases_real.py. Everything else is real: the docker-registry the image and
the release are pulled from (with the pull secret, over TLS), the layers (verified and
streamed, an upper layer replacing a lower one's file), the subprocesses (time limit,
SIGKILL, address-space limit), the encrypted cache that keeps the result across restarts.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest

from testsupport.harness import ServerProcess, Started, bearer, wait_for, write_manifests
from testsupport.ignition_client import payload_text
from testsupport.manifests import join_objects, kube_object, secret_volume, token_status
from testsupport.mco_image import CRIO_CONF, KUBELET_UNIT, cluster_config, push_mco_image, runs
from testsupport.registry_world import HAPROXY, Registry, pool, registry_requests

RHCOS = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "f" * 64


@pytest.fixture
def world():
    started = Started()
    yield started
    started.stop_all()


def release(registry: Registry, mco: str, version: str) -> str:
    components = {"haproxy-router": HAPROXY, "machine-config-operator": mco, "cluster-config-api": mco, "rhel-coreos": RHCOS}
    digests = registry.push_release("ocp/release", {"amd64": components}, version)
    return f"{registry.host}/ocp/release@{digests['index']}"


def write_cluster(source: Path, namespace: str, registry: Registry) -> None:
    objs = join_objects(namespace, registry.pull_secret(), registry.ca_file.read_text())
    objs.append(kube_object("ConfigMap", namespace, "machine-config-server", cluster_config("infra-" + namespace)))
    write_manifests(source / f"{namespace}.yaml", *objs)


def generations(proc: ServerProcess, result: str = "ok") -> float:
    return proc.metrics().get(f'ign_server_base_generations_total{{result="{result}"}}', 0.0)


def files_of(body: bytes) -> dict[str, dict]:
    return {f["path"]: f for f in json.loads(body)["storage"]["files"]}


def test_one_run_per_cluster_and_release_cached_across_restarts_failures_keep_the_last_payload(world, tmp_path: Path) -> None:  # noqa: F811
    registry = world(Registry, tmp_path / "registry").start()
    counter = tmp_path / "runs.log"
    good = release(registry, push_mco_image(registry, "ocp/mco", counter), "4.17.3")
    broken = release(registry, push_mco_image(registry, "ocp/mco-broken", counter, mode="fail"), "4.17.4")
    source = tmp_path / "source"
    source.mkdir()
    paths = {}
    for namespace in ("clusters-a", "clusters-b"):
        write_cluster(source, namespace, registry)
        for n in range(3):
            name = f"{namespace}-p{n}"
            paths[name] = write_manifests(source / f"{name}.yaml", pool(namespace, name, "tok-" + name, good))
    # Runs are counted through a file outside the step's work dir: without the sandbox (the kube test has it).
    extra = ["--release-resolve", "--generate-bases", "--registry-allow", registry.host, "--base-sandbox", "none"]
    proc = world(ServerProcess, source, tmp_path / "cache", extra=extra).start()
    for name, path in paths.items():
        wait_for(lambda path=path: token_status(path).reason == "AsExpected", timeout=60, what=f"{name} rendered")
    # One operator and one controller run per (cluster, release): 2 pairs for 6 NodePools.
    assert sorted((step, infra) for _pid, step, _v, infra in runs(counter)) == [
        ("controller", "infra-clusters-a"), ("controller", "infra-clusters-b"),
        ("operator", "infra-clusters-a"), ("operator", "infra-clusters-b")]
    assert {v for _p, _s, v, _i in runs(counter)} == {"4.17.3"}
    assert generations(proc) == 2
    served = {}
    for name in paths:
        status, _, body = proc.get("/ignition", bearer("tok-" + name))
        assert status == 200
        served[name] = body
        files = files_of(body)
        namespace = name.rsplit("-", 1)[0]
        # The base's files: from the image's templates, and from this cluster's configuration.
        assert f"infrastructure infra-{namespace} payload 4.17.3" in payload_text(body)
        assert "/etc/crio/crio.conf.d/00-default" in files and CRIO_CONF in payload_text(body)
        units = {u["name"]: u for u in json.loads(body)["systemd"]["units"]}
        assert units["kubelet.service"]["contents"] == KUBELET_UNIT
        assert "/etc/ignition-machine-config-encapsulated.json" in files  # merged as a base: MCS appenders
        assert f"/etc/{name}.conf" in files  # and the NodePool's own MachineConfig
    assert token_status(paths["clusters-a-p0"]).message.startswith("MCO base merged: rendered-master-")  # the pool HyperShift serves

    # Restart (SIGKILL): the bases come from the encrypted cache: no run, no registry request, no render.
    proc.kill()
    proc = world(ServerProcess, source, tmp_path / "cache", extra=extra).start()
    for name in paths:
        status, _, body = wait_for(lambda name=name: (r := proc.get("/ignition", bearer("tok-" + name)))[0] == 200 and r,
                                   timeout=30, what=f"{name} served after the restart")
        assert body == served[name]
    proc_metrics = proc.metrics()
    assert len(runs(counter)) == 4 and generations(proc) == 0 and registry_requests(proc) == 0
    assert proc_metrics.get("ign_server_payload_cache_miss_total", 0) == 0
    assert not any(b"infra-clusters-a" in p.read_bytes() for p in (tmp_path / "cache").rglob("*") if p.is_file())

    # A release whose MCO fails: InvalidConfig with the tail of its output; the last good payload serves.
    write_manifests(paths["clusters-a-p0"], pool("clusters-a", "clusters-a-p0", "tok-clusters-a-p0", broken))
    secret = wait_for(lambda: (s := token_status(paths["clusters-a-p0"])).reason == "InvalidConfig" and s,
                      timeout=60, what="InvalidConfig from the failed run")
    # Which step failed and where to look; nothing it printed, not even its error lines (issue 31).
    assert "machine-config-operator failed; its output is in the server's log" in secret.message
    assert "error rendering the controller config" not in secret.message and "noise line" not in secret.message
    assert len(secret.message.encode()) < 4096
    logs = proc.logs()
    assert "noise line 01999" in logs and "machine-config-operator exited with 255" in logs  # the tail is in the log
    assert "error rendering the controller config: infrastructure has no status.platformStatus" in logs
    assert registry.password not in secret.message  # the stand-in printed it
    for leaked in (registry.pull_secret(), base64.b64encode(registry.pull_secret().encode()).decode(),
                   json.loads(registry.pull_secret())["auths"][registry.host]["auth"]):
        assert leaked not in secret.message
    assert generations(proc, "failed") == 1
    status, _, body = proc.get("/ignition", bearer("tok-clusters-a-p0"))
    assert status == 200 and body == served["clusters-a-p0"]

    # A change of one cluster's configuration generates again for that cluster only.
    objs = join_objects("clusters-b", registry.pull_secret(), registry.ca_file.read_text())
    objs.append(kube_object("ConfigMap", "clusters-b", "machine-config-server", cluster_config("infra-b-renamed")))
    write_manifests(source / "clusters-b.yaml", *objs)
    for n in range(3):
        wait_for(lambda n=n: "infrastructure infra-b-renamed" in payload_text(proc.get("/ignition", bearer(f"tok-clusters-b-p{n}"))[2]),
                 timeout=60, what=f"clusters-b-p{n} on its regenerated base")
    assert sorted((s, i) for _p, s, v, i in runs(counter)[4:] if v == "4.17.3") == [
        ("controller", "infra-b-renamed"), ("operator", "infra-b-renamed")]
    assert proc.get("/ignition", bearer("tok-clusters-a-p1"))[2] == served["clusters-a-p1"]


def test_a_step_past_its_time_limit_is_killed(world, tmp_path: Path) -> None:  # noqa: F811
    registry = world(Registry, tmp_path / "registry").start()
    counter = tmp_path / "runs.log"
    stuck = release(registry, push_mco_image(registry, "ocp/mco-stuck", counter, mode="sleep"), "4.17.5")
    source = tmp_path / "source"
    source.mkdir()
    write_cluster(source, "clusters-a", registry)
    path = write_manifests(source / "p.yaml", pool("clusters-a", "stuck", "tok-stuck", stuck))
    started = time.monotonic()
    proc = world(ServerProcess, source, tmp_path / "cache",
          extra=["--release-resolve", "--generate-bases", "--base-timeout", "2s", "--registry-allow", registry.host,
                 "--base-sandbox", "none"]).start()  # (its pid is checked below: the host's, not a namespace's)
    secret = wait_for(lambda: (s := token_status(path)).reason == "InvalidConfig" and s, timeout=60, what="killed")
    assert "machine-config-operator did not finish within 2 s and was killed" in secret.message
    assert "server's log" in secret.message and "rendering..." not in secret.message
    wait_for(lambda: "rendering..." in proc.logs(), what="its output so far in the log")
    assert time.monotonic() - started < 45
    pid = runs(counter)[0][0]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # SIGKILLed and reaped: not even a zombie


def test_a_hostile_release_reads_nothing_of_the_server_and_what_it_prints_reaches_only_the_log(
        world, tmp_path: Path, state_dir: Path) -> None:  # noqa: F811
    """Issue 31: a release's binary read `--edge-dir/edge.pem` (the serving key) and, after a
    Secret volume's `..data` swap, the cache key, and carried them out through the tenant's own
    `data.message` as klog `E` lines of short hex runs. The server's state as in a pod: the cache
    and the edge dir on its volume, the cache key and the serving pair in Secret volumes; the
    step runs as the server's own uid (--base-uid 0 here, as the pod's user namespace maps it),
    so no file permission hides anything: only the sandbox does."""
    from ignition_server.tls.certificates import ensure_self_signed

    if os.geteuid() != 0:
        pytest.skip("needs root (the sandbox's namespaces as the server's own uid)")
    registry = world(Registry, tmp_path / "registry").start()
    keys, serving, edge = state_dir / "cache-key", state_dir / "serving", state_dir / "edge"
    key_text = "index {}\naes {}\n".format(*(base64.b64encode(os.urandom(32)).decode() for _ in range(2)))
    secret_volume(keys, {"cache.key": key_text.encode()}, "2026_11_27_01")
    pair = ensure_self_signed(tmp_path / "issued", None)
    secret_volume(serving, {"tls.crt": pair.cert.read_bytes(), "tls.key": pair.key.read_bytes()}, "2026_11_27_01")
    steal = [keys / "cache.key", keys / "..data" / "cache.key", serving / "tls.key", edge / "edge.pem"]
    hostile = release(registry, push_mco_image(registry, "ocp/mco-hostile", tmp_path / "runs.log", mode="steal",
                                               steal=steal), "4.17.9")
    source = tmp_path / "source"
    source.mkdir()
    write_cluster(source, "clusters-a", registry)
    proc = ServerProcess(source, state_dir / "cache", extra=[
        "--release-resolve", "--generate-bases", "--registry-allow", registry.host, "--base-uid", "0",
        "--cache-key-file", str(keys / "cache.key"), "--tls-cert", str(serving / "tls.crt"),
        "--tls-key", str(serving / "tls.key"), "--edge-dir", str(edge)])
    proc.ca = pair.ca
    proc.start()
    wait_for(lambda: (edge / "edge.pem").exists(), what="the edge publication")
    # The kubelet updates both Secret volumes (a rotated pair, say) after the server started.
    secret_volume(keys, {"cache.key": key_text.replace("index", "index ").encode()}, "2026_11_27_02")
    renewed = ensure_self_signed(tmp_path / "renewed", None)
    secret_volume(serving, {"tls.crt": renewed.cert.read_bytes(), "tls.key": renewed.key.read_bytes()}, "2026_11_27_02")
    readable = {path: path.read_bytes()[:64] for path in steal if path.exists()}
    assert len(readable) == len(steal)  # every one is there to be read
    path = write_manifests(source / "p.yaml", pool("clusters-a", "hostile", "tok-hostile", hostile))
    secret = wait_for(lambda: (s := token_status(path)).reason == "InvalidConfig" and s, timeout=60, what="the failed run")
    assert "machine-config-operator failed; its output is in the server's log" in secret.message
    assert "bootstrap.go" not in secret.message  # nothing it printed
    logs = wait_for(lambda: "machine-config-operator exited with 1" in (text := proc.logs()) and text,
                    what="its output in the log")
    # It ran, its output is in the log, and what it looked for was not there (hidden, not merely
    # unreadable: it ran as the files' owner).
    assert logs.count("FileNotFoundError") == len(steal) and "PermissionError" not in logs
    for stolen, data in readable.items():
        for at in range(0, len(data), 8):
            assert data[at:at + 8].hex() not in logs + secret.message, f"{stolen} was read"


def test_generate_bases_needs_release_resolve(tmp_path: Path) -> None:
    from ignition_server.cli.parser import build_parser
    from ignition_server.cli.settings import serve_settings

    args = build_parser().parse_args(["serve", "--source", str(tmp_path), "--cache-dir", str(tmp_path / "c"),
                                      "--generate-bases"])
    with pytest.raises(ValueError, match="--generate-bases needs --release-resolve"):
        serve_settings(args)


def _layer(path: Path, files: dict[str, bytes]) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return path


def test_extract_tree_takes_only_the_paths_asked_for_and_refuses_escapes(tmp_path: Path) -> None:
    from ignition_server.registry.client import IntegrityError
    from ignition_server.registry.layers import extract_tree

    dest = tmp_path / "root"
    dest.mkdir()
    layer = _layer(tmp_path / "l.tar.gz", {
        "usr/bin/machine-config-operator": b"#!/bin/sh\n", "./etc/mcc/templates/a/b.yaml": b"x: 1\n",
        "usr/bin/other": b"no", "etc/mcc/templates/.wh.gone": b"",  # a whiteout: ignored (said in extract_tree)
    })
    assert extract_tree(layer, ("usr/bin/machine-config-operator", "etc/mcc/templates"), dest, 1 << 20) == 15
    found = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert found == ["etc/mcc/templates/a/b.yaml", "usr/bin/machine-config-operator"]
    assert os.access(dest / "usr/bin/machine-config-operator", os.X_OK)
    with pytest.raises(IntegrityError, match="exceed"):
        extract_tree(layer, ("usr/bin",), dest, 5)
    escape = _layer(tmp_path / "e.tar.gz", {"etc/mcc/templates/../../../../escaped": b"boom"})
    with pytest.raises(IntegrityError, match="outside the image root"):
        extract_tree(escape, ("etc/mcc/templates",), dest, 1 << 20)
    assert not (tmp_path / "escaped").exists()


async def test_a_step_over_its_memory_limit_fails_with_its_output(tmp_path: Path) -> None:
    from ignition_server.basegen.run import Limits, StepFailed, run_step

    hog = ["/usr/bin/python3", "-c", "print('allocating', flush=True); x = bytearray(512 << 20)"]
    env = {"PATH": "/usr/bin:/bin"}
    assert "allocating" in await run_step(hog, tmp_path, Limits(timeout=30, memory_bytes=4 << 30), env)
    with pytest.raises(StepFailed, match=r"python3 failed; its output is in the server's log"):
        await run_step(hog, tmp_path, Limits(timeout=30, memory_bytes=256 << 20), env)


async def test_generator_single_flight_back_off_and_retry(tmp_path: Path) -> None:
    """The generator on its own, against the real registry: concurrent requests for one pair are
    one run; a failed run is not retried before its back-off, then is, and succeeds."""
    import asyncio
    import ssl

    import aiohttp

    from ignition_server.basegen.generator import BaseGenerator, BaseJob, GeneratorSettings
    from ignition_server.registry.client import RegistryClient
    from ignition_server.registry.image_files import ImageFiles
    from ignition_server.registry.mirrors import Mirrors

    registry = Registry(tmp_path / "registry").start()
    counter = tmp_path / "runs.log"
    try:
        mco = push_mco_image(registry, "ocp/mco", counter, mode="fail-once")
        async with aiohttp.ClientSession() as session:
            client = RegistryClient(session, ssl.create_default_context(cafile=str(registry.ca_file)))
            store: dict[str, bytes] = {}
            done: asyncio.Queue[str] = asyncio.Queue()
            now = [1000.0]  # the back-off's clock, moved by the test
            (tmp_path / "work").mkdir()
            generator = BaseGenerator(
                files=ImageFiles(client, Mirrors(), work_dir=tmp_path / "work"), load=store.get, save=store.__setitem__,
                work_dir=tmp_path / "work", settings=GeneratorSettings(retry_min=60.0), on_done=done.put_nowait,
                clock=lambda: now[0])
            job = BaseJob(key="k1", namespace="clusters-a", release="example/release@sha256:" + "1" * 64,
                          release_digest="sha256:" + "1" * 64, version="4.17.3",
                          images={"machine-config-operator": mco, "cluster-config-api": mco}, cluster_files=cluster_config("infra-a"),
                          pull_secret=registry.pull_secret())
            for _ in range(5):
                generator.request(job)  # one run however many ask
            assert await asyncio.wait_for(done.get(), 30) == "k1"
            assert "machine-config-operator failed" in (generator.failure("k1") or "")
            assert generator.known("k1") is None and not generator.due("k1")
            generator.request(job)  # backing off: ignored
            assert not generator.pending("k1")
            now[0] += 59.0
            assert not generator.due("k1")
            now[0] += 1.0
            assert generator.due("k1")
            generator.request(job)
            assert await asyncio.wait_for(done.get(), 30) == "k1"
            assert generator.failure("k1") is None
            text = generator.known("k1")
            assert text is not None and "infrastructure infra-a payload 4.17.3" in text.replace("%20", " ")
            assert store["mco-base-k1"] == text.encode()
            assert [s for _p, s, _v, _i in runs(counter)] == ["operator", "operator", "controller"]
            # Another generator over the same store: known without a run.
            again = BaseGenerator(files=generator.files, load=store.get, save=store.__setitem__, work_dir=tmp_path / "work")
            assert again.known("k1") == text
    finally:
        registry.stop()


async def test_a_controller_that_writes_garbage_is_a_failed_run_that_says_where(tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Exit 0 is not enough: what the controller wrote is read as a render would, and a file
    that is not YAML fails the run: the message says whose output, the log which file and why
    (a file's name and content are the binary's to choose: never in the message)."""
    import asyncio
    import ssl

    import aiohttp

    from ignition_server.basegen.generator import BaseGenerator, BaseJob
    from ignition_server.registry.client import RegistryClient
    from ignition_server.registry.image_files import ImageFiles
    from ignition_server.registry.mirrors import Mirrors

    registry = Registry(tmp_path / "registry").start()
    try:
        mco = push_mco_image(registry, "ocp/mco", tmp_path / "runs.log", mode="garbage")
        async with aiohttp.ClientSession() as session:
            client = RegistryClient(session, ssl.create_default_context(cafile=str(registry.ca_file)))
            done: asyncio.Queue[str] = asyncio.Queue()
            (tmp_path / "work").mkdir()
            store: dict[str, bytes] = {}
            generator = BaseGenerator(files=ImageFiles(client, Mirrors(), work_dir=tmp_path / "work"), load=store.get,
                                      save=store.__setitem__, work_dir=tmp_path / "work", on_done=done.put_nowait)
            generator.request(BaseJob(key="g", namespace="clusters-a", release="example/release@sha256:" + "1" * 64,
                                      release_digest="sha256:" + "1" * 64, version="4.17.3",
                                      images={"machine-config-operator": mco, "cluster-config-api": mco},
                                      cluster_files=cluster_config("infra-a"), pull_secret=registry.pull_secret()))
            assert await asyncio.wait_for(done.get(), 30) == "g"
            failure = generator.failure("g") or ""
            assert "the output of machine-config-controller cannot be used; the server's log says why" in failure, failure
            assert "rendered-master-0" not in failure
            assert "machine-config-controller wrote machine-configs/rendered-master-0.yaml, which is not YAML" in caplog.text
            assert generator.known("g") is None and store == {}
    finally:
        registry.stop()
