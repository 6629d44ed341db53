"""The release resolver against a real registry (docker-registry, TLS, htpasswd or token auth)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiohttp
import pytest

from ignition_server.registry.auth import credentials_for
from ignition_server.registry.client import RegistryClient
from ignition_server.registry.mirrors import Mirrors, parse_overrides
from ignition_server.registry.reference import parse
from ignition_server.registry.resolver import Failure, ReleaseResolver, ReleaseStore
from testsupport.registry_world import Registry

REPO = "openshift-release-dev/ocp-release"
AMD64 = {"haproxy-router": "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "a" * 64,
         "cli": "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "c" * 64}
ARM64 = {"haproxy-router": "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "b" * 64}


@pytest.fixture(params=["htpasswd", "token"])
def registry(request, tmp_path: Path):
    reg = Registry(tmp_path / "registry", auth=request.param).start()
    yield reg
    reg.stop()


class World:
    def __init__(self, registry: Registry, tmp_path: Path, mirrors: Mirrors | None = None, architecture: str = "amd64"):
        self.stored: dict[str, bytes] = {}
        self.counts: dict[str, int] = {}
        self.done: asyncio.Queue[str] = asyncio.Queue()
        self.session = aiohttp.ClientSession(trust_env=True)
        context = ssl.create_default_context(cafile=str(registry.ca_file))
        client = RegistryClient(self.session, context, count=self._count)
        from ignition_server.registry.resolver import ResolverSettings
        self.resolver = ReleaseResolver(
            client=client, mirrors=mirrors or Mirrors(), store=ReleaseStore(self.stored.get, self.stored.__setitem__),
            settings=ResolverSettings(architecture=architecture), on_resolved=self.done.put_nowait, work_dir=tmp_path,
        )

    def _count(self, host: str, result: str) -> None:
        self.counts[result] = self.counts.get(result, 0) + 1

    async def resolve(self, spec: str, pull_secret: str | None, ca_bundle: str | None = None) -> Failure | None:
        self.resolver.request(spec, pull_secret, ca_bundle)
        assert await asyncio.wait_for(self.done.get(), 30) == spec
        return self.resolver.failure(spec)


async def test_resolves_a_release_index_with_the_pull_secret(registry: Registry, tmp_path: Path) -> None:
    digests = registry.push_release(REPO, {"amd64": AMD64, "arm64": ARM64}, "4.17.3")
    spec = f"{registry.host}/{REPO}@{digests['index']}"
    world = World(registry, tmp_path)
    try:
        assert await world.resolve(spec, registry.pull_secret()) is None
        release = world.resolver.known(spec)
        assert release is not None and release.version == "4.17.3" and dict(release.images) == AMD64
        # Stored by digest (the index's): a second resolver reads it without the registry.
        assert f"release-{digests['index'].replace(':', '-')}" in world.stored
        requests = sum(world.counts.values())
        again = World(registry, tmp_path)
        again.stored.update(world.stored)
        assert await again.resolve(spec, None) is None and again.resolver.known(spec) == release
        assert again.counts == {}
        # Another architecture picks its own image from the index.
        arm = World(registry, tmp_path, architecture="arm64")
        assert await arm.resolve(spec, registry.pull_secret()) is None
        assert dict(arm.resolver.known(spec).images) == ARM64
        assert requests > 0
        if registry.auth == "token":  # the Bearer flow really ran: the issuer was asked, the token used
            assert world.counts.get("token", 0) >= 1 and registry.issuer is not None and registry.issuer.issued >= 2
        await again.session.close()
        await arm.session.close()
    finally:
        await world.session.close()


async def test_tag_resolves_to_the_digest(registry: Registry, tmp_path: Path) -> None:
    digests = registry.push_release(REPO, {"amd64": AMD64}, "4.17.4", tag="4.17.4-x86_64")
    world = World(registry, tmp_path)
    try:
        spec = f"{registry.host}/{REPO}:4.17.4-x86_64"
        assert await world.resolve(spec, registry.pull_secret()) is None
        assert world.resolver.known(spec).version == "4.17.4"
        assert world.resolver.known(f"{registry.host}/{REPO}@{digests['index']}").version == "4.17.4"
    finally:
        await world.session.close()


async def test_wrong_password_is_a_clear_configuration_error(registry: Registry, tmp_path: Path) -> None:
    digests = registry.push_release(REPO, {"amd64": AMD64}, "4.17.3")
    spec = f"{registry.host}/{REPO}@{digests['index']}"
    world = World(registry, tmp_path)
    try:
        failure = await world.resolve(spec, registry.pull_secret(password="wrong"))
        assert failure is not None and failure.permanent
        assert "refused user 'puller'" in failure.message and "check the pull secret" in failure.message
        assert "wrong" not in failure.message  # never the password
        # The same wrong secret backs off; another NodePool's good pull secret is tried at once.
        world.resolver.request(spec, registry.pull_secret(password="wrong"))
        assert not world.resolver.pending(spec)
        assert await world.resolve(spec, registry.pull_secret()) is None and world.resolver.known(spec) is not None
        # No credentials for the host at all: as clear.
        other = World(registry, tmp_path)
        failure = await other.resolve(spec, registry.pull_secret(host="elsewhere.example.com"))
        assert failure is not None and failure.permanent and ("anonymous" in failure.message or "has none" in failure.message)
        await other.session.close()
    finally:
        await world.session.close()


async def test_a_tampered_blob_is_refused(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry").start()
    world = World(registry, tmp_path)
    try:
        digests = registry.push_release(REPO, {"amd64": AMD64}, "4.17.3")
        blob = registry.blob_file(digests["amd64-layer"])
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        spec = f"{registry.host}/{REPO}@{digests['index']}"
        failure = await world.resolve(spec, registry.pull_secret())
        assert failure is not None and failure.permanent and "does not match its digest" in failure.message
        assert world.resolver.known(spec) is None and not world.stored
    finally:
        await world.session.close()
        registry.stop()


async def test_mirror_first_with_the_origin_unreachable(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry").start()
    world = None
    try:
        digests = registry.push_release("mirror/ocp-release", {"amd64": AMD64}, "4.17.3")
        origin = f"quay.io/{REPO}@{digests['index']}"  # never contacted: the mirror answers first
        dead = f"127.0.0.1:1/{REPO}"  # a mirror that refuses connections, tried first
        mirrors = Mirrors(parse_overrides(f"quay.io/{REPO}={dead},quay.io/{REPO}={registry.host}/mirror/ocp-release"))
        world = World(registry, tmp_path, mirrors)
        assert await world.resolve(origin, registry.pull_secret()) is None
        assert world.resolver.known(origin).version == "4.17.3"
        assert world.counts.get("unreachable") == 1
        # The dead mirror is now tried last, so the choice stays on the working one.
        assert [r.host for r in mirrors.candidates(parse(origin))][:1] == [registry.host]
        # The payload names the first configured mirror of each component image.
        assert mirrors.rewrite(AMD64["haproxy-router"]) == AMD64["haproxy-router"]  # no rule for that repository
        art = Mirrors(parse_overrides("quay.io/openshift-release-dev=mirror.example.com/ocp"))
        assert art.rewrite(AMD64["haproxy-router"]) == "mirror.example.com/ocp/ocp-v4.0-art-dev@sha256:" + "a" * 64
    finally:
        if world is not None:
            await world.session.close()
        registry.stop()


async def test_user_ca_bundle_is_trusted_for_registry_tls(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry").start()
    try:
        digests = registry.push_release(REPO, {"amd64": AMD64}, "4.17.3")
        spec = f"{registry.host}/{REPO}@{digests['index']}"
        session = aiohttp.ClientSession()
        stored: dict[str, bytes] = {}
        done: asyncio.Queue[str] = asyncio.Queue()
        resolver = ReleaseResolver(
            client=RegistryClient(session, ssl.create_default_context()), mirrors=Mirrors(),
            store=ReleaseStore(stored.get, stored.__setitem__), on_resolved=done.put_nowait, work_dir=tmp_path,
        )
        try:
            resolver.request(spec, registry.pull_secret())
            await asyncio.wait_for(done.get(), 30)
            failure = resolver.failure(spec)
            assert failure is not None and not failure.permanent and "not trusted" in failure.message
            resolver._failures.clear()  # the back-off is not what this test is about
            resolver.request(spec, registry.pull_secret(), registry.ca_file.read_text())
            await asyncio.wait_for(done.get(), 30)
            assert resolver.failure(spec) is None and resolver.known(spec) is not None
        finally:
            await session.close()
    finally:
        registry.stop()


def test_pull_secret_matching_follows_the_container_tools() -> None:
    import base64
    import json
    def entry(user: str) -> dict:
        return {"auth": base64.b64encode(f"{user}:pw".encode()).decode()}
    secret = json.dumps({"auths": {
        "quay.io": entry("host"), "quay.io/openshift-release-dev": entry("namespace"),
        "https://registry.example.com/v1/": entry("scheme"), "https://index.docker.io/v1/": entry("hub"),
    }})
    assert credentials_for(secret, parse("quay.io/openshift-release-dev/ocp-release@sha256:" + "1" * 64)).username == "namespace"
    assert credentials_for(secret, parse("quay.io/other/image:1")).username == "host"
    assert credentials_for(secret, parse("registry.example.com/a/b:1")).username == "scheme"
    assert credentials_for(secret, parse("busybox")).username == "hub"
    assert credentials_for(secret, parse("elsewhere.io/a:1")) is None
    assert "pw" not in repr(credentials_for(secret, parse("quay.io/x:1")))


def test_pull_specs_parse_as_the_container_tools_read_them() -> None:
    from ignition_server.registry.reference import ReferenceError
    digest = "sha256:" + "1" * 64
    ref = parse(f"quay.io/openshift-release-dev/ocp-release@{digest}")
    assert (ref.host, ref.repository, ref.tag, ref.digest) == ("quay.io", "openshift-release-dev/ocp-release", "", digest)
    assert parse("localhost:5000/a/b:4.17").tag == "4.17" and parse("localhost:5000/a/b:4.17").host == "localhost:5000"
    hub = parse("busybox")
    assert (hub.host, hub.repository, hub.tag, hub.api_host) == ("docker.io", "library/busybox", "latest", "registry-1.docker.io")
    for bad in ("", "quay.io/a b", "https://quay.io/x", "quay.io/x@md5:abc", "quay.io/UPPER/x"):
        with pytest.raises(ReferenceError):
            parse(bad)


def test_mirror_sets_apply_by_pull_kind_and_can_forbid_the_source() -> None:
    mirrors = Mirrors()
    idms = {"kind": "ImageDigestMirrorSet", "spec": {"imageDigestMirrors": [
        {"source": "quay.io/openshift-release-dev", "mirrors": ["m1.example.com/ocp", "m2.example.com/ocp"],
         "mirrorSourcePolicy": "NeverContactSource"}]}}
    itms = {"kind": "ImageTagMirrorSet", "spec": {"imageTagMirrors": [
        {"source": "quay.io/openshift-release-dev/ocp-release", "mirrors": ["t.example.com/release"]}]}}
    assert mirrors.update("idms", idms) and mirrors.update("itms", itms) and not mirrors.update("itms", itms)
    by_digest = parse("quay.io/openshift-release-dev/ocp-release@sha256:" + "1" * 64)
    assert [str(r) for r in mirrors.candidates(by_digest)] == [
        "m1.example.com/ocp/ocp-release@sha256:" + "1" * 64, "m2.example.com/ocp/ocp-release@sha256:" + "1" * 64]
    by_tag = parse("quay.io/openshift-release-dev/ocp-release:4.17.3-x86_64")
    assert [str(r) for r in mirrors.candidates(by_tag)] == [
        "t.example.com/release:4.17.3-x86_64", "quay.io/openshift-release-dev/ocp-release:4.17.3-x86_64"]
    # A prefix matches at a path boundary only.
    assert mirrors.configured(parse("quay.io/openshift-release-dev-other/x@sha256:" + "1" * 64))[0].host == "quay.io"
    # A failed mirror goes last for a while; the configured order is what the payload names.
    mirrors.failed("m1.example.com")
    assert mirrors.candidates(by_digest)[0].host == "m2.example.com"
    assert mirrors.rewrite(str(by_digest)).startswith("m1.example.com/")
    with pytest.raises(ValueError):
        mirrors.update("bad", {"kind": "ImageDigestMirrorSet", "spec": {"imageDigestMirrors": [{"mirrors": ["x"]}]}})
    with pytest.raises(ValueError):
        parse_overrides("quay.io")


def test_a_rewrite_follows_the_mirror_sets_as_they_change() -> None:
    """`rewrite` keeps its answers (every NodePool's reconcile asks for the same release images)
    only until a mirror set changes."""
    mirrors = Mirrors()
    image = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "1" * 64
    assert mirrors.rewrite(image) == image
    idms = {"kind": "ImageDigestMirrorSet", "spec": {"imageDigestMirrors": [
        {"source": "quay.io/openshift-release-dev", "mirrors": ["m1.example.com/ocp"]}]}}
    assert mirrors.update("idms", idms)
    assert mirrors.rewrite(image) == "m1.example.com/ocp/ocp-v4.0-art-dev@sha256:" + "1" * 64
    assert mirrors.update("idms", None)
    assert mirrors.rewrite(image) == image
