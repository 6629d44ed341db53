"""Releases from a real registry through the real server process: mirrors, the pull secret,
the user-ca-bundle, statuses that say why, and a restart that needs no registry."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testsupport.harness import Listener, ServerProcess, Started, bearer, free_port, wait_for, write_manifests
from testsupport.ignition_client import payload_text
from testsupport.manifests import join_objects, token_status
from testsupport.registry_world import ART, HAPROXY, Registry, pool, registry_requests


@pytest.fixture
def world():
    started = Started()
    yield started
    started.stop_all()


def test_mirror_first_origin_unreachable_resolves_and_renders_mirrored_images(world, tmp_path: Path) -> None:
    registry = world(Registry, tmp_path / "registry").start()
    digests = registry.push_release("mirror/ocp-release", {"amd64": {"haproxy-router": HAPROXY}, "arm64": {}}, "4.17.3")
    origin = f"127.0.0.1:{free_port()}/openshift-release-dev/ocp-release"  # nothing listens there
    release = f"{origin}@{digests['index']}"
    source = tmp_path / "source"
    source.mkdir()
    write_manifests(source / "cluster.yaml", *join_objects("clusters-a", registry.pull_secret(), registry.ca_file.read_text()))
    # Component images through an ImageDigestMirrorSet from the source: the payload names the mirror.
    write_manifests(source / "idms.yaml", {
        "apiVersion": "config.openshift.io/v1", "kind": "ImageDigestMirrorSet", "metadata": {"name": "art"},
        "spec": {"imageDigestMirrors": [{"source": ART, "mirrors": ["mirror.example.com/ocp/art-dev"]}]},
    })
    path = write_manifests(source / "pool.yaml", pool("clusters-a", "workers", "tok-a", release))
    proc = world(ServerProcess, source, tmp_path / "cache", extra=[
        "--release-resolve", "--registry-overrides", f"{origin}={registry.host}/mirror/ocp-release"]).start()
    # The origin is not on --registry-allow (the default list): only its configured mirror is read.
    wait_for(lambda: token_status(path).reason == "AsExpected", timeout=30, what="rendered")
    status, _, body = proc.get("/ignition", bearer("tok-a"))
    assert status == 200
    text = payload_text(body)
    assert "mirror.example.com/ocp/art-dev@sha256:" + "a" * 64 in text and HAPROXY not in text
    metrics = proc.metrics()
    assert metrics["ign_server_release_fetches_total"] == 1
    assert metrics.get(f'ign_server_registry_requests_total{{registry="{registry.host}",result="ok"}}', 0) >= 3


def test_wrong_password_invalid_config_and_registry_down_keeps_the_last_good_payload(world, tmp_path: Path) -> None:
    registry = world(Registry, tmp_path / "registry", auth="token").start()
    good = registry.push_release("ocp/release", {"amd64": {"haproxy-router": HAPROXY}}, "4.17.3")
    newer = registry.push_release("ocp/release", {"amd64": {"haproxy-router": ART + "@sha256:" + "d" * 64}}, "4.17.4")
    # A release only the wrong pull secret asks for (a release someone else read is known: no registry needed).
    other = registry.push_release("ocp/release", {"amd64": {"haproxy-router": ART + "@sha256:" + "e" * 64}}, "4.17.5")
    source = tmp_path / "source"
    source.mkdir()
    ca = registry.ca_file.read_text()
    write_manifests(source / "a.yaml", *join_objects("clusters-a", registry.pull_secret(password="wrong"), ca))
    write_manifests(source / "b.yaml", *join_objects("clusters-b", registry.pull_secret(), ca))
    bad = write_manifests(source / "bad.yaml", pool("clusters-a", "bad", "tok-bad", f"{registry.host}/ocp/release@{other['index']}"))
    ok = write_manifests(source / "ok.yaml", pool("clusters-b", "ok", "tok-ok", f"{registry.host}/ocp/release@{good['index']}"))
    proc = world(ServerProcess, source, tmp_path / "cache", extra=["--release-resolve", "--registry-allow", registry.host]).start()
    wait_for(lambda: token_status(ok).reason == "AsExpected", timeout=30, what="the good pull secret's pool rendered")
    secret = wait_for(lambda: (s := token_status(bad)).reason == "InvalidConfig" and s, timeout=60, what="InvalidConfig")
    assert "refused user 'puller'" in secret.message and "check the pull secret" in secret.message
    assert proc.get("/ignition", bearer("tok-bad"))[0] >= 500  # no payload yet: retry later, not a 4xx
    before = proc.get("/ignition", bearer("tok-ok"))[2]
    # The registry goes away; the NodePool moves to a release not read yet: it says so, retries,
    # and the last good payload keeps serving.
    registry.stop()
    moved = pool("clusters-b", "ok", "tok-ok", f"{registry.host}/ocp/release@{newer['index']}")
    write_manifests(ok, moved)
    secret = wait_for(lambda: (s := token_status(ok)).reason == "ReleaseUnavailable" and s, timeout=30, what="unavailable")
    assert newer["index"] in secret.message and "unreachable" in secret.message
    assert proc.get("/ignition", bearer("tok-ok"))[2] == before
    # Back: the retry (with back-off) picks it up without anyone touching the NodePool.
    registry.start()
    wait_for(lambda: token_status(ok).reason == "AsExpected", timeout=60, what="resolved after the registry came back")
    assert ART + "@sha256:" + "d" * 64 in payload_text(proc.get("/ignition", bearer("tok-ok"))[2])


def test_restart_with_the_registry_gone_serves_every_payload_without_it(world, tmp_path: Path) -> None:
    registry = world(Registry, tmp_path / "registry").start()
    releases = [registry.push_release("ocp/release", {"amd64": {"haproxy-router": ART + "@sha256:" + c * 64}}, f"4.17.{i}")
                for i, c in enumerate("abc")]
    source = tmp_path / "source"
    source.mkdir()
    write_manifests(source / "cluster.yaml", *join_objects("clusters-a", registry.pull_secret(), registry.ca_file.read_text()))
    paths = [write_manifests(source / f"p{i}.yaml", pool("clusters-a", f"p{i}", f"tok-{i}",
                                                         f"{registry.host}/ocp/release@{releases[i % 3]['index']}"))
             for i in range(9)]
    proc = world(ServerProcess, source, tmp_path / "cache", extra=["--release-resolve", "--registry-allow", registry.host]).start()
    wait_for(lambda: all(token_status(p).reason == "AsExpected" for p in paths), timeout=60, what="all rendered")
    assert proc.metrics()["ign_server_release_fetches_total"] == 3  # nine NodePools, three releases
    bodies = {i: proc.get("/ignition", bearer(f"tok-{i}"))[2] for i in range(9)}
    registry.stop()
    proc.stop()
    proc.start()
    for i in range(9):
        status, _, body = proc.get("/ignition", bearer(f"tok-{i}"))
        assert status == 200 and body == bodies[i]
    wait_for(lambda: "listed " in proc.logs(), what="the first listing")
    # The source is applied and every release looked up again: from the encrypted cache only.
    wait_for(lambda: proc.metrics().get("ign_server_release_resolution_seconds_count", 0) >= 3, what="releases loaded")
    metrics = proc.metrics()
    assert registry_requests(proc) == 0 and metrics.get("ign_server_release_fetches_total", 0) == 0
    assert metrics.get("ign_server_payload_cache_miss_total", 0) == 0  # nothing rendered again
    assert all(token_status(p).reason == "AsExpected" for p in paths)
    # Stored encrypted: no component image in the clear anywhere in the cache.
    for file in (tmp_path / "cache").rglob("*"):
        if file.is_file():
            assert b"ocp-v4.0-art-dev" not in file.read_bytes(), file


def test_kubernetes_mode_only_the_writer_reads_the_registry(world, tmp_path: Path) -> None:
    from testsupport.kubeapi import KubeAPI

    registry = world(Registry, tmp_path / "registry").start()
    digests = registry.push_release("ocp/release", {"amd64": {"haproxy-router": HAPROXY}}, "4.17.3")
    release = f"{registry.host}/ocp/release@{digests['index']}"
    with KubeAPI(tmp_path / "kubeapi", bookmark_interval=0.5) as api:
        api.namespace("ignition")
        api.namespace("clusters-a")
        for obj in join_objects("clusters-a", registry.pull_secret(), registry.ca_file.read_text()):
            api.create(obj)
        api.create(pool("clusters-a", "workers", "tok-k", release))
        (tmp_path / "empty").mkdir()
        procs = [world(ServerProcess, tmp_path / "empty", tmp_path / name / "cache", extra=[
            "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition",
            "--replica-id", name, "--lease-duration", "3s", "--release-resolve", "--registry-allow", registry.host]).start()
             for name in ("r1", "r2")]
        for proc in procs:
            wait_for(lambda proc=proc: proc.get("/ignition", bearer("tok-k"))[0] == 200, timeout=60, what="served")
            assert HAPROXY in payload_text(proc.get("/ignition", bearer("tok-k"))[2])
        fetches = sorted(p.metrics().get("ign_server_release_fetches_total", 0) for p in procs)
        requests = sorted(registry_requests(p) for p in procs)
        assert fetches == [0, 1] and requests[0] == 0, (fetches, requests)
        # What the writer published for the others: the release's haproxy-router image, nothing more.
        import hashlib
        shared = api.get("configmaps", "ignition", "ignition-server-release-" + hashlib.sha256(release.encode()).hexdigest()[:16])
        assert shared is not None and yaml.safe_load(shared["data"]["releases.yaml"]) == [
            {"pullSpec": release, "version": "4.17.3", "images": {"haproxy-router": HAPROXY}}]


def test_a_release_on_a_registry_not_allowed_is_never_contacted(world, tmp_path: Path) -> None:
    listener = world(Listener)
    source = tmp_path / "source"
    source.mkdir()
    write_manifests(source / "cluster.yaml", *join_objects("clusters-evil", '{"auths":{}}', ""))
    evil = write_manifests(source / "evil.yaml", pool("clusters-evil", "evil", "tok-evil",
                                                      f"127.0.0.1:{listener.port}/evil/release@sha256:" + "e" * 64))
    world(ServerProcess, source, tmp_path / "cache", extra=["--release-resolve"]).start()  # the default list
    secret = wait_for(lambda: (s := token_status(evil)).reason == "InvalidConfig" and s, timeout=30, what="refused")
    assert "not on a registry this server may read from" in secret.message and "--registry-allow" in secret.message
    assert listener.accepted == 0


def test_registry_errors_do_not_tell_whether_a_port_answered(world, tmp_path: Path) -> None:
    listener = world(Listener)
    closed = free_port()
    source = tmp_path / "source"
    source.mkdir()
    write_manifests(source / "cluster.yaml", *join_objects("clusters-a", '{"auths":{}}', ""))
    paths = {port: write_manifests(source / f"p{port}.yaml", pool("clusters-a", f"p{port}", f"tok-{port}",
                                                                   f"127.0.0.1:{port}/ocp/release@sha256:" + c * 64))
             for port, c in ((listener.port, "e"), (closed, "f"))}
    world(ServerProcess, source, tmp_path / "cache", extra=["--release-resolve", "--registry-allow", "*"]).start()
    statuses = {port: wait_for(lambda p=path: (s := token_status(p)).reason not in (None, "", "AsExpected") and s,
                               timeout=60, what="a failure") for port, path in paths.items()}
    assert listener.accepted >= 1  # allowed: it was tried
    answered, silent = (statuses[p].message.replace(str(p), "PORT").replace("e" * 64, "f" * 64)
                        for p in (listener.port, closed))
    assert answered == silent
