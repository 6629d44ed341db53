"""The wall between tenants, file source: each attack of issue 21 by a tenant who can write only
Secrets and ConfigMaps of their own namespace (`clusters-evil`), against a victim
(`clusters-victim`). The Kubernetes source's side is in tests/reconcile/test_tenancy_kube.py."""

from __future__ import annotations

import base64
import gzip
import json
import logging
from pathlib import Path
from urllib.parse import unquote

import jwt as pyjwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa

from ignition_server.auth.jwt import ServiceAccountVerifier
from ignition_server.model.token_secret import ANNOTATION_TOKEN_EXPIRATION, parse_token_secret
from ignition_server.reconcile.reconciler import Reconciler
from ignition_server.reconcile.releases import ANNOTATION_RELEASE_CATALOG
from ignition_server.reconcile.source_view import SourceView
from ignition_server.reconcile.tenancy import ANNOTATION_SHAREABLE, OutsideTenancy, Tenancy
from ignition_server.render.payload import render_payload
from ignition_server.sources.files import FileSource
from payload_cache import PayloadCache, TokenState
from testsupport.clock import T0, Clock
from testsupport.harness import EXAMPLE_MACHINECONFIG, write_manifests
from testsupport.manifests import CA_PEM, build_token_secret, kube_object
from testsupport.reconcile_world import file_reconciler, renders, settle
from testsupport.service_accounts import keys_configmap, legacy_jwt

RELEASE = "quay.io/openshift-release-dev/ocp-release@sha256:" + "1" * 64
GOOD_HAPROXY = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "2" * 64
EVIL_HAPROXY = "evil.example.com/haproxy@sha256:" + "6" * 64
VICTIM, EVIL, SHARED = "clusters-victim", "clusters-evil", "ignition-server"
VICTIM_PULL = '{"auths":{"quay.io":{"auth":"dmljdGltOnNlY3JldA=="}}}'
VICTIM_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://172.20.0.1:6443"}}]
users: [{name: admin, user: {token: victim-admin}}]
contexts: [{name: x, context: {cluster: c, user: admin}}]
current-context: x
"""


def catalog(namespace: str, image: str) -> dict:
    releases = [{"pullSpec": RELEASE, "version": "4.17.3", "images": {"haproxy-router": image}}]
    return kube_object("ConfigMap", namespace, "catalog", {"releases.yaml": yaml.safe_dump(releases)},
                       {ANNOTATION_RELEASE_CATALOG: "true"})


def token_secret(namespace: str, nodepool: str, token: str, *, created: str | None = None, suffix: str = "00000000",
                 annotations: dict | None = None) -> dict:
    secret = build_token_secret(namespace=namespace, nodepool=nodepool, token=token, release=RELEASE, suffix=suffix,
                                machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=namespace.replace("-", "")),
                                generation_time=T0)
    secret["metadata"]["annotations"].update(annotations or {})
    if created:
        secret["metadata"]["creationTimestamp"] = created
    return secret


def victim_cluster() -> list[dict]:
    return [
        kube_object("Secret", VICTIM, "pull-secret", {".dockerconfigjson": VICTIM_PULL}),
        kube_object("Secret", VICTIM, "bootstrap-kubeconfig", {"kubeconfig": VICTIM_KUBECONFIG}),
        kube_object("ConfigMap", VICTIM, "apiserver-proxy", {"listenIP": "172.20.0.1", "listenPort": "6443",
                                                     "backends": "c1.example.com:32167"}),
        token_secret(VICTIM, "clusters/workers", "victim-token", created="2026-01-01T00:00:00Z"),
    ]


VICTIM_REF = f"{VICTIM}/token-workers-00000000"


@pytest.fixture
def world(tmp_path: Path):
    """A reconciler over a file source, the shared namespace the server's own (the CLI's default)."""
    clock = Clock()
    verifier = ServiceAccountVerifier(clock=clock, overlap_seconds=60)
    reconciler, source, cache, source_dir, _outputs = file_reconciler(tmp_path, clock, shared={SHARED}, verifier=verifier)
    return reconciler, source, cache, source_dir, verifier


def secret_in(source_dir: Path, file: str, name: str) -> dict:
    return next(d for d in yaml.safe_load_all((source_dir / file).read_text()) if d["metadata"]["name"] == name)


def payload(cache: PayloadCache, ref: str) -> str | None:
    """The payload with every file's contents decoded (data URLs, gzip), to search in."""
    record = cache.get_render(ref)
    if record is None:
        return None
    config = json.loads(cache.get_blob(record.blob_id))
    parts = [json.dumps(config)]
    for entry in config.get("storage", {}).get("files", []):
        header, _, data = entry["contents"]["source"].partition(",")
        raw = base64.b64decode(data) if header.endswith(";base64") else unquote(data).encode()
        parts.append((gzip.decompress(raw) if entry["contents"].get("compression") == "gzip" else raw).decode(errors="replace"))
    return "\n".join(parts)


def refusals(reconciler: Reconciler, what: str) -> float:
    return reconciler.metrics.tenancy_refusals.labels(what=what)._value.get()


async def test_inputs_named_in_another_tenants_namespace_are_refused_and_never_read(world) -> None:
    reconciler, source, cache, source_dir, _ = world
    write_manifests(source_dir / "shared.yaml", catalog(SHARED, GOOD_HAPROXY))
    write_manifests(source_dir / "victim.yaml", *victim_cluster())
    steal = {f"ignition-server.openshift.io/input-{name}": f"{VICTIM}/{name}"
             for name in ("pull-secret", "bootstrap-kubeconfig", "apiserver-proxy")}
    write_manifests(source_dir / "evil.yaml", token_secret(EVIL, "clusters/evil", "evil-token", annotations=steal))
    await settle(reconciler, source, reconciler.tokens.outputs)
    evil = parse_token_secret(secret_in(source_dir, "evil.yaml", "token-evil-00000000"))
    assert evil.reason == "InvalidConfig"
    assert f"{VICTIM}/" in evil.message and "outside the NodePool's namespace clusters-evil" in evil.message
    assert "--shared-namespaces" in evil.message
    assert payload(cache, f"{EVIL}/token-evil-00000000") is None
    # Nothing of the victim's was looked up on the evil NodePool's behalf: only the victim's own NodePool reads them.
    victim_key = next(k for k in reconciler.tokens.secrets if k.namespace == VICTIM)
    graph = reconciler.input_graph
    readers = {k for dep in graph.objects_read() if dep.namespace == VICTIM for k in graph.readers_of(dep)}
    assert readers == {victim_key}
    assert refusals(reconciler, "input") >= 1
    # The victim is untouched; an input in a shared namespace stays allowed.
    assert "victim-admin" in payload(cache, VICTIM_REF)
    write_manifests(source_dir / "shared-proxy.yaml", kube_object("ConfigMap", SHARED, "proxy", {
        "listenIP": "172.20.0.1", "listenPort": "6443", "backends": "shared.example.com:32167"}, {ANNOTATION_SHAREABLE: "true"}))
    write_manifests(source_dir / "evil.yaml", token_secret(
        EVIL, "clusters/evil", "evil-token", annotations={"ignition-server.openshift.io/input-apiserver-proxy": f"{SHARED}/proxy"}))
    await settle(reconciler, source, reconciler.tokens.outputs)
    assert parse_token_secret(secret_in(source_dir, "evil.yaml", "token-evil-00000000")).reason == "AsExpected"
    assert "shared.example.com:32167" in payload(cache, f"{EVIL}/token-evil-00000000")


OPERATOR_PULL = '{"auths":{"registry.mgmt.example.com":{"auth":"b3BlcmF0b3I6aHVudGVyMg=="}}}'
OPERATOR_KUBECONFIG = VICTIM_KUBECONFIG.replace("victim-admin", "management-admin")


async def test_the_servers_own_secrets_cannot_be_named_until_the_operator_marks_one(world) -> None:
    """Issue 31, item 5: the default shared namespace is the server's own, which also holds the
    operator's image pull secret and a management kubeconfig. A tenant naming them by `input-*`
    is refused, says why, and gets nothing of them; the shared CA bundle the operator marks
    shareable is served, and marking it re-renders the refused NodePool by itself. The server's
    own catalog there keeps working unmarked (it is not read through `input-*`)."""
    reconciler, source, cache, source_dir, _ = world
    write_manifests(source_dir / "shared.yaml", catalog(SHARED, GOOD_HAPROXY),
                    kube_object("Secret", SHARED, "pull-secret", {".dockerconfigjson": OPERATOR_PULL}),
                    kube_object("Secret", SHARED, "management-kubeconfig", {"kubeconfig": OPERATOR_KUBECONFIG}),
                    kube_object("ConfigMap", SHARED, "ca", {"ca-bundle.crt": CA_PEM}))
    write_manifests(source_dir / "victim.yaml", *victim_cluster())
    steal = {"ignition-server.openshift.io/input-pull-secret": f"{SHARED}/pull-secret",
             "ignition-server.openshift.io/input-bootstrap-kubeconfig": f"{SHARED}/management-kubeconfig"}
    write_manifests(source_dir / "evil.yaml", token_secret(EVIL, "clusters/evil", "evil-token", annotations=steal))
    await settle(reconciler, source, reconciler.tokens.outputs)
    evil = parse_token_secret(secret_in(source_dir, "evil.yaml", "token-evil-00000000"))
    assert evil.reason == "InvalidConfig", evil.message
    assert f"{SHARED}/pull-secret" in evil.message and "not marked shareable" in evil.message
    assert ANNOTATION_SHAREABLE in evil.message
    assert payload(cache, f"{EVIL}/token-evil-00000000") is None
    assert refusals(reconciler, "input") >= 1
    assert GOOD_HAPROXY in payload(cache, VICTIM_REF)  # the server's own catalog, unmarked, still counts
    # A CA bundle the operator shares: refused while unmarked, served once marked, with no change to the tenant's Secret.
    share = {"ignition-server.openshift.io/input-user-ca-bundle": f"{SHARED}/ca"}
    write_manifests(source_dir / "evil.yaml", token_secret(EVIL, "clusters/evil", "evil-token", annotations=share))
    await settle(reconciler, source, reconciler.tokens.outputs)
    evil = parse_token_secret(secret_in(source_dir, "evil.yaml", "token-evil-00000000"))
    assert evil.reason == "InvalidConfig" and f"{SHARED}/ca" in evil.message
    write_manifests(source_dir / "shared.yaml", catalog(SHARED, GOOD_HAPROXY),
                    kube_object("Secret", SHARED, "pull-secret", {".dockerconfigjson": OPERATOR_PULL}),
                    kube_object("Secret", SHARED, "management-kubeconfig", {"kubeconfig": OPERATOR_KUBECONFIG}),
                    kube_object("ConfigMap", SHARED, "ca", {"ca-bundle.crt": CA_PEM}, {ANNOTATION_SHAREABLE: "true"}))
    await settle(reconciler, source, reconciler.tokens.outputs)
    evil = parse_token_secret(secret_in(source_dir, "evil.yaml", "token-evil-00000000"))
    assert evil.reason == "AsExpected", evil.message
    served = payload(cache, f"{EVIL}/token-evil-00000000") or ""
    assert CA_PEM.strip().splitlines()[1] in served
    assert "registry.mgmt.example.com" not in served and "management-admin" not in served
    # The render command judges alike.
    write_manifests(source_dir / "evil.yaml", token_secret(EVIL, "clusters/evil", "evil-token", annotations=steal))
    once = FileSource(source_dir)
    view = SourceView.of(once.read_once(), once.get_full, Tenancy(frozenset({SHARED})))
    with pytest.raises(OutsideTenancy, match="not marked shareable"):
        view.render_inputs(view.newest_secret("clusters/evil"))


async def test_a_release_catalog_outside_the_shared_namespaces_changes_no_payload(world) -> None:
    reconciler, source, cache, source_dir, _ = world
    write_manifests(source_dir / "shared.yaml", catalog(SHARED, GOOD_HAPROXY))
    write_manifests(source_dir / "victim.yaml", *victim_cluster())
    await settle(reconciler, source, reconciler.tokens.outputs)
    assert GOOD_HAPROXY in payload(cache, VICTIM_REF)
    before = renders(reconciler)
    write_manifests(source_dir / "evil-catalog.yaml", catalog(EVIL, EVIL_HAPROXY))
    await settle(reconciler, source, reconciler.tokens.outputs)
    assert GOOD_HAPROXY in payload(cache, VICTIM_REF) and EVIL_HAPROXY not in payload(cache, VICTIM_REF)
    assert renders(reconciler) == before
    assert reconciler.releases.get(RELEASE).images["haproxy-router"] == GOOD_HAPROXY
    # A mirror set in a tenant's namespace would rename the image every payload pulls: ignored too.
    write_manifests(source_dir / "evil-idms.yaml", {
        "apiVersion": "config.openshift.io/v1", "kind": "ImageDigestMirrorSet", "metadata": {"name": "x", "namespace": EVIL},
        "spec": {"imageDigestMirrors": [{"source": "quay.io/openshift-release-dev", "mirrors": ["evil.example.com/m"]}]}})
    await settle(reconciler, source, reconciler.tokens.outputs)
    assert GOOD_HAPROXY in payload(cache, VICTIM_REF) and "evil.example.com" not in payload(cache, VICTIM_REF)
    assert refusals(reconciler, "shared-object") >= 2


async def test_the_render_command_sees_the_source_as_serve_does(world) -> None:
    """`ignition-server render` reads the directory once (reconcile/source_view.py) and prints the
    payload serve stored, byte for byte: a tenant's release catalog ignored by both."""
    reconciler, source, cache, source_dir, _ = world
    write_manifests(source_dir / "shared.yaml", catalog(SHARED, GOOD_HAPROXY))
    write_manifests(source_dir / "victim.yaml", *victim_cluster())
    # Listed after the shared one (the listing is in name order): it would win a merge.
    write_manifests(source_dir / "z-evil-catalog.yaml", catalog(EVIL, EVIL_HAPROXY))
    await settle(reconciler, source, reconciler.tokens.outputs)
    once = FileSource(source_dir)
    view = SourceView.of(once.read_once(), once.get_full, Tenancy(frozenset({SHARED})))
    secret = view.newest_secret("clusters/workers")
    assert secret.ref == VICTIM_REF
    printed = render_payload(view.render_inputs(secret)).body
    record = cache.get_render(VICTIM_REF)
    assert record is not None and printed == cache.get_blob(record.blob_id)
    assert GOOD_HAPROXY in (payload(cache, VICTIM_REF) or "")
    with pytest.raises(LookupError, match="known: clusters/workers"):
        view.newest_secret("clusters/nope")


async def test_a_token_secret_claiming_another_tenants_nodepool_outdates_nothing(world) -> None:
    reconciler, source, cache, source_dir, _ = world
    write_manifests(source_dir / "shared.yaml", catalog(SHARED, GOOD_HAPROXY))
    write_manifests(source_dir / "victim.yaml", *victim_cluster())
    await settle(reconciler, source, reconciler.tokens.outputs)
    # Newer, and naming the victim's NodePool exactly as the victim's Secret does.
    write_manifests(source_dir / "evil.yaml", token_secret(EVIL, "clusters/workers", "evil-token",
                                                            created="2026-06-01T00:00:00Z"))
    await settle(reconciler, source, reconciler.tokens.outputs)
    victim = secret_in(source_dir, "victim.yaml", "token-workers-00000000")
    assert ANNOTATION_TOKEN_EXPIRATION not in victim["metadata"]["annotations"]
    assert cache.lookup_token("victim-token").state is TokenState.CURRENT
    # Within the victim's own namespace a newer generation still outdates the older one.
    write_manifests(source_dir / "victim-next.yaml", token_secret(VICTIM, "clusters/workers", "victim-next",
                                                                   created="2026-06-02T00:00:00Z", suffix="11111111"))
    await settle(reconciler, source, reconciler.tokens.outputs)
    victim = secret_in(source_dir, "victim.yaml", "token-workers-00000000")
    assert ANNOTATION_TOKEN_EXPIRATION in victim["metadata"]["annotations"]


@pytest.mark.parametrize("together", [False, True], ids=["later", "in-one-listing"])
async def test_a_token_already_held_by_another_secret_is_refused_for_the_newcomer(world, caplog, together: bool) -> None:
    reconciler, source, cache, source_dir, _ = world
    caplog.set_level(logging.INFO)
    write_manifests(source_dir / "shared.yaml", catalog(SHARED, GOOD_HAPROXY))
    # "a-evil.yaml" is read first; in one listing, the Secret created first must still win.
    stolen = token_secret(EVIL, "clusters/evil", "victim-token", created="2026-06-01T00:00:00Z")
    if together:
        write_manifests(source_dir / "a-evil.yaml", stolen)
    write_manifests(source_dir / "victim.yaml", *victim_cluster())
    await settle(reconciler, source, reconciler.tokens.outputs)
    if not together:
        write_manifests(source_dir / "a-evil.yaml", stolen)
        await settle(reconciler, source, reconciler.tokens.outputs)
    record = cache.lookup_token("victim-token")
    assert record is not None and record.secret == VICTIM_REF and record.state is TokenState.CURRENT
    assert "/etc/clustersvictim.conf" in payload(cache, VICTIM_REF)
    assert payload(cache, f"{EVIL}/token-evil-00000000") is None
    evil = parse_token_secret(secret_in(source_dir, "a-evil.yaml", "token-evil-00000000"))
    assert evil.reason == "InvalidConfig" and "already held by another token Secret" in evil.message
    assert refusals(reconciler, "duplicate-token") == 1
    assert "victim-token" not in caplog.text and f"{EVIL}/token-evil-00000000" in caplog.text
    # Not rotated either: the refused Secret gets no token of ours.
    reconciler.rotation.clock.now = T0 + 60  # type: ignore[attr-defined]
    await reconciler.rotation.rotate_due()
    assert all(k.namespace != EVIL for k in reconciler.tokens.secrets)


@pytest.mark.parametrize("together", [False, True], ids=["later", "in-one-listing"])
async def test_a_copy_of_a_clusters_public_key_elsewhere_breaks_nothing(world, together: bool) -> None:
    reconciler, source, cache, source_dir, verifier = world
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = {"iss": "kubernetes/serviceaccount", "kubernetes.io/serviceaccount/namespace": "openshift-infra",
              "kubernetes.io/serviceaccount/secret.name": "node-bootstrapper-token-one",
              "kubernetes.io/serviceaccount/service-account.name": "node-bootstrapper",
              "kubernetes.io/serviceaccount/service-account.uid": "2f3c6a51-0000-4000-8000-000000000001",
              "sub": "system:serviceaccount:openshift-infra:node-bootstrapper"}
    token = pyjwt.encode(claims, key, algorithm="RS256")
    copy = keys_configmap(EVIL, key, created="2026-06-01T00:00:00Z")
    if together:
        write_manifests(source_dir / "a-evil.yaml", copy)
    write_manifests(source_dir / "victim.yaml", keys_configmap(VICTIM, key, created="2026-01-01T00:00:00Z"))
    await settle(reconciler, source, reconciler.tokens.outputs)
    if not together:
        write_manifests(source_dir / "a-evil.yaml", copy)
        await settle(reconciler, source, reconciler.tokens.outputs)
    assert verifier.verify(token).cluster == VICTIM
    assert refusals(reconciler, "service-account-key") == 1


async def test_a_generated_base_published_outside_the_shared_namespaces_is_not_adopted(world, tmp_path: Path) -> None:
    """The writer publishes generated bases in its own namespace for the other replicas; a copy
    in a tenant's namespace naming some pair's key must not become that pair's base."""
    from ignition_server.basegen.generator import BaseGenerator
    from ignition_server.reconcile.generated_bases import ANNOTATION_GENERATED_BASE

    reconciler, source, _cache, source_dir, _ = world
    store: dict[str, bytes] = {}
    reconciler.base_waits.generator = BaseGenerator(files=None, load=store.get, save=store.__setitem__,  # type: ignore[arg-type]
                                                    work_dir=tmp_path / "work")
    base = EXAMPLE_MACHINECONFIG.format(name="base")
    for namespace, key in ((EVIL, "a" * 64), (SHARED, "b" * 64)):
        write_manifests(source_dir / f"base-{namespace}.yaml", kube_object(
            "ConfigMap", namespace, "ignition-server-base-x", {"machineconfigs.yaml": base},
            {ANNOTATION_GENERATED_BASE: key}))
    await settle(reconciler, source, reconciler.tokens.outputs)
    assert reconciler.base_waits.generator.known("a" * 64) is None
    assert reconciler.base_waits.generator.known("b" * 64) == base


async def test_an_old_object_edited_to_claim_a_key_stays_refused_after_a_restart(tmp_path: Path) -> None:
    """Issue 31: the tenant's keys ConfigMap is older than the victim's, and later edited to hold
    the victim's public key. The running server refuses it; so must the same server restarted,
    which meets the tenant's object first in its listing (oldest first)."""
    clock = Clock()
    victim_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = legacy_jwt(victim_key, "node-bootstrapper-token-one")

    def start() -> tuple[Reconciler, FileSource, PayloadCache, Path, ServiceAccountVerifier]:
        verifier = ServiceAccountVerifier(clock=clock, overlap_seconds=60)
        reconciler, source, cache, source_dir, _ = file_reconciler(tmp_path, clock, shared={SHARED}, verifier=verifier)
        return reconciler, source, cache, source_dir, verifier

    reconciler, source, cache, source_dir, verifier = start()
    own_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    write_manifests(source_dir / "a-evil.yaml", keys_configmap(EVIL, own_key, created="2025-01-01T00:00:00Z"))
    write_manifests(source_dir / "victim.yaml", keys_configmap(VICTIM, victim_key, created="2026-01-01T00:00:00Z"))
    await settle(reconciler, source, reconciler.tokens.outputs)
    write_manifests(source_dir / "a-evil.yaml", keys_configmap(EVIL, victim_key, created="2025-01-01T00:00:00Z"))
    await settle(reconciler, source, reconciler.tokens.outputs)
    assert verifier.verify(token).cluster == VICTIM
    assert refusals(reconciler, "service-account-key") == 1
    cache.flush()

    reconciler, source, cache, source_dir, verifier = start()
    await settle(reconciler, source, reconciler.tokens.outputs)
    assert verifier.verify(token).cluster == VICTIM
    assert refusals(reconciler, "service-account-key") == 1  # the newcomer, refused again
