"""The wall between tenants, Kubernetes source: real server processes against the test API
server, a tenant who can write only Secrets and ConfigMaps of `clusters-evil`, a victim in
`clusters-victim`. What differs from the file source is tested here: what is fetched from the
API, Events, and deletion (tests/reconcile/test_tenancy.py has the file source's side of every attack)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from ignition_server.model.token_secret import ANNOTATION_TOKEN_EXPIRATION
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, bearer, wait_for
from testsupport.ignition_client import files_in
from testsupport.kubeapi import KubeAPI
from testsupport.manifests import CA_PEM, build_token_secret, kube_object

VICTIM, EVIL = "clusters-victim", "clusters-evil"


def token_secret(namespace: str, nodepool: str, token: str, name: str) -> dict:
    secret = build_token_secret(namespace=namespace, nodepool=nodepool, token=token, generation_time=time.time(),
                                machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=namespace.replace("-", "")))
    secret["metadata"]["name"] = name
    return secret


def reason(api: KubeAPI, namespace: str, name: str) -> str:
    secret = api.get("secrets", namespace, name) or {"data": {}}
    return base64.b64decode(secret["data"].get("reason") or "").decode()


def contents(body: bytes) -> str:
    out = []
    for source in files_in(json.loads(body)).values():
        header, _, data = source.partition(",")
        out.append(base64.b64decode(data).decode(errors="replace") if header.endswith(";base64") else unquote(data))
    return "\n".join(out)


@pytest.fixture
def api(tmp_path: Path):
    with KubeAPI(tmp_path / "kubeapi", bookmark_interval=0.5) as server:
        for namespace in ("ignition", VICTIM, EVIL):
            server.namespace(namespace)
        yield server


@pytest.fixture
def server(tmp_path: Path, api: KubeAPI):
    (tmp_path / "empty").mkdir()
    proc = ServerProcess(tmp_path / "empty", tmp_path / "cache", extra=[
        "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition", "--replica-id", "r1",
        "--lease-duration", "3s", "--prune-expired-after", "1s"])
    yield proc
    proc.kill()


def test_an_input_in_another_tenants_namespace_is_never_fetched_and_is_an_event(api: KubeAPI, server) -> None:
    api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "admin-kubeconfig", "namespace": VICTIM},
                "data": {"kubeconfig": base64.b64encode(b"victim-admin-credential").decode()}})
    evil = token_secret(EVIL, "clusters/evil", "tok-evil", "token-evil-1")
    evil["metadata"]["annotations"]["ignition-server.openshift.io/input-bootstrap-kubeconfig"] = f"{VICTIM}/admin-kubeconfig"
    api.create(evil)
    server.start()
    wait_for(lambda: reason(api, EVIL, "token-evil-1") == "InvalidConfig", timeout=30, what="InvalidConfig on the Secret")
    message = base64.b64decode(api.get("secrets", EVIL, "token-evil-1")["data"]["message"]).decode()
    assert f"{VICTIM}/admin-kubeconfig" in message and "outside the NodePool's namespace" in message
    wait_for(lambda: any(e["involvedObject"]["name"] == "token-evil-1" and "outside" in e["message"]
                         for e in api.list("events", EVIL)), timeout=30, what="an Event saying why")
    assert ("secrets", VICTIM, "admin-kubeconfig") not in api.server.reads  # never fetched
    assert server.get("/ignition", bearer("tok-evil"))[0] != 200
    assert server.metrics().get('ign_server_tenancy_refusals_total{what="input"}', 0) >= 1


def test_a_token_secret_claiming_the_victims_nodepool_neither_expires_nor_deletes_it(api: KubeAPI, server) -> None:
    api.create(token_secret(VICTIM, "clusters/workers", "tok-victim", "token-workers-1"))
    server.start()
    wait_for(lambda: server.get("/ignition", bearer("tok-victim"))[0] == 200, timeout=30, what="the victim served")
    api.create(token_secret(EVIL, "clusters/workers", "tok-evil", "token-workers-2"))  # newer, same annotation
    wait_for(lambda: server.get("/ignition", bearer("tok-evil"))[0] == 200, timeout=30, what="the evil Secret applied")
    wait_for(lambda: any(s["metadata"]["name"].startswith("user-data-") for s in api.list("secrets", EVIL)),
             timeout=30, what="the evil Secret's write-backs done")
    victim = api.get("secrets", VICTIM, "token-workers-1")
    assert victim is not None and ANNOTATION_TOKEN_EXPIRATION not in victim["metadata"]["annotations"]
    assert server.get("/ignition", bearer("tok-victim"))[0] == 200


def test_a_leaked_token_in_another_secret_takes_nothing_over(api: KubeAPI, server) -> None:
    api.create(token_secret(VICTIM, "clusters/workers", "tok-victim", "token-workers-1"))
    server.start()
    wait_for(lambda: server.get("/ignition", bearer("tok-victim"))[0] == 200, timeout=30, what="the victim served")
    api.create(token_secret(EVIL, "clusters/evil", "tok-victim", "token-evil-1"))  # the victim's token, leaked
    wait_for(lambda: reason(api, EVIL, "token-evil-1") == "InvalidConfig", timeout=30, what="the newcomer refused")
    status, _, body = server.get("/ignition", bearer("tok-victim"))
    assert status == 200 and "/etc/clustersvictim.conf" in files_in(json.loads(body))
    assert "/etc/clustersevil.conf" not in files_in(json.loads(body))
    assert server.metrics()['ign_server_tenancy_refusals_total{what="duplicate-token"}'] == 1
    assert "tok-victim" not in server.logs()


def test_a_tenants_catalog_and_a_copied_service_account_key_change_nothing(api: KubeAPI, server) -> None:
    import yaml
    from cryptography.hazmat.primitives.asymmetric import rsa

    from ignition_server.reconcile.releases import ANNOTATION_RELEASE_CATALOG
    from testsupport.service_accounts import keys_configmap, legacy_jwt, url_token

    good, evil = ("quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + c * 64 for c in "27")
    secret = token_secret(VICTIM, "clusters/workers", "tok-victim", "token-workers-1")
    release = base64.b64decode(secret["data"]["release"]).decode()

    def catalog(namespace: str, image: str) -> dict:
        entries = [{"pullSpec": release, "version": "4.17.3", "images": {"haproxy-router": image}}]
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "catalog", "namespace": namespace, "annotations": {ANNOTATION_RELEASE_CATALOG: "true"}},
                "data": {"releases.yaml": yaml.safe_dump(entries)}}

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    api.create(catalog("ignition", good))  # the server's own namespace: shared
    api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "apiserver-proxy", "namespace": VICTIM},
                "data": {"listenIP": "172.20.0.1", "listenPort": "6443", "backends": "c1.example.com:32167"}})
    api.create(keys_configmap(VICTIM, key, "node-bootstrapper-token-one"))
    api.create(secret)
    server.start()
    jwt = url_token(legacy_jwt(key, "node-bootstrapper-token-one"))
    wait_for(lambda: server.get(f"/config/workers?token={jwt}")[0] == 200, timeout=30, what="the victim's JWT served")
    assert good in contents(server.get("/ignition", bearer("tok-victim"))[2])
    api.create(catalog(EVIL, evil))
    api.create(keys_configmap(EVIL, key, "node-bootstrapper-token-one"))

    def applied() -> bool:  # each either refused (counted) or taking effect: then the asserts below say which
        metrics = server.metrics()
        key = metrics.get('ign_server_tenancy_refusals_total{what="service-account-key"}', 0) == 1 \
            or server.get(f"/config/workers?token={jwt}")[0] != 200
        shared = metrics.get('ign_server_tenancy_refusals_total{what="shared-object"}', 0) >= 1 \
            or evil in contents(server.get("/ignition", bearer("tok-victim"))[2])
        return key and shared

    wait_for(applied, timeout=30, what="both objects applied")
    body = contents(server.get("/ignition", bearer("tok-victim"))[2])
    assert good in body and evil not in body
    assert server.get(f"/config/workers?token={jwt}")[0] == 200


def test_a_new_replica_with_an_empty_cache_keeps_a_contested_token_with_its_first_holder(
        api: KubeAPI, server, tmp_path: Path) -> None:
    """Issue 31: the tenant's Secret is the older one, edited to hold the victim's leaked token
    once the victim's exists. The writer refuses it and records the contest in its own
    namespace; a replica started afterwards with an empty cache, which lists the tenant's
    Secret first (oldest first), reaches the same answer: the victim's payload for its token."""
    api.create(token_secret(EVIL, "clusters/evil", "tok-evil", "token-evil-1"))
    api.create(token_secret(VICTIM, "clusters/workers", "tok-victim", "token-workers-1"))
    server.start()
    wait_for(lambda: server.get("/ignition", bearer("tok-victim"))[0] == 200, timeout=30, what="the victim served")
    api.patch("secrets", EVIL, "token-evil-1", {"data": {"token": base64.b64encode(b"tok-victim").decode()}})
    wait_for(lambda: reason(api, EVIL, "token-evil-1") == "InvalidConfig", timeout=30, what="the newcomer refused")
    wait_for(lambda: api.get("secrets", "ignition", "ignition-server-claims") is not None, timeout=30,
             what="the contest published for the other replicas")

    fresh = ServerProcess(tmp_path / "empty", tmp_path / "cache-r2", extra=[
        "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition", "--replica-id", "r2",
        "--lease-duration", "3s"])
    try:
        fresh.start()
        wait_for(lambda: fresh.get("/ignition", bearer("tok-victim"))[0] == 200, timeout=30, what="r2 serves the token")
        status, _, body = fresh.get("/ignition", bearer("tok-victim"))
        assert status == 200 and "/etc/clustersvictim.conf" in files_in(json.loads(body))
        assert "/etc/clustersevil.conf" not in files_in(json.loads(body))
        assert reason(api, VICTIM, "token-workers-1") == "AsExpected"
    finally:
        fresh.kill()


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def test_a_tenant_filling_its_namespace_runs_no_replica_out_of_memory(api: KubeAPI, tmp_path: Path) -> None:
    """Issue 31: every ConfigMap of a namespace and every `user-data-*` Secret were kept whole,
    so one tenant's 1 MiB objects grew every replica's owner process until the memory limit. Now
    ConfigMaps the server does not read are never fetched, and what it keeps of one namespace is
    bounded (--namespace-memory): the excess is refused, logged and told, and others boot on."""
    (tmp_path / "empty").mkdir()
    server = ServerProcess(tmp_path / "empty", tmp_path / "cache", extra=[
        "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition", "--replica-id", "r1",
        "--lease-duration", "3s", "--namespace-memory", "8Mi", "--workers", "0"])
    try:
        api.create(token_secret(VICTIM, "clusters/workers", "tok-victim", "token-workers-1"))
        server.start()
        wait_for(lambda: server.get("/ignition", bearer("tok-victim"))[0] == 200, timeout=30, what="the victim served")
        assert server.proc is not None
        before = _rss_mib(server.proc.pid)
        big = "x" * (1 << 20)
        for i in range(24):
            api.create(kube_object("ConfigMap", EVIL, f"junk-{i}", {"junk": big}))
            api.create(kube_object("Secret", EVIL, f"user-data-junk-{i}", {"value": big}))
        # Created after the flood, in the same watch streams: served once the flood was applied.
        api.create(kube_object("ConfigMap", VICTIM, "user-ca-bundle", {"ca-bundle.crt": CA_PEM}))
        api.create(token_secret(VICTIM, "clusters/second", "tok-second", "token-second-1"))
        wait_for(lambda: server.get("/ignition", bearer("tok-second"))[0] == 200, timeout=60,
                 what="another NodePool served after the flood")
        grown = _rss_mib(server.proc.pid) - before
        assert grown < 20, f"the owner grew {grown:.0f} MiB for 48 MiB of a tenant's objects"
        assert server.metrics()['ign_server_tenancy_refusals_total{what="namespace-budget"}'] >= 1
        assert f"namespace {EVIL} holds more than 8 MiB" in server.logs()
        wait_for(lambda: any(e.get("reason") == "NamespaceOverBudget" for e in api.list("events", EVIL)),
                 timeout=30, what="an Event on a refused object")
    finally:
        server.kill()


def test_the_servers_own_secrets_are_never_fetched_for_a_tenant_until_marked_shareable(api: KubeAPI, server) -> None:
    """Issue 31, item 5, Kubernetes: the server's own namespace (shared by default) holds the
    operator's Secrets. A tenant naming one by `input-*` gets `InvalidConfig` saying why and an
    Event, and the Secret is never fetched; a CA bundle the operator marks shareable there is
    served to the NodePool that names it, re-rendered when marked, with no change to its Secret."""
    from ignition_server.reconcile.tenancy import ANNOTATION_SHAREABLE

    api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "management-kubeconfig", "namespace": "ignition"},
                "data": {"kubeconfig": base64.b64encode(b"management-admin-credential").decode()}})
    api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ca", "namespace": "ignition"},
                "data": {"ca-bundle.crt": CA_PEM}})
    evil = token_secret(EVIL, "clusters/evil", "tok-evil", "token-evil-1")
    evil["metadata"]["annotations"]["ignition-server.openshift.io/input-bootstrap-kubeconfig"] = "ignition/management-kubeconfig"
    api.create(evil)
    shares = token_secret(EVIL, "clusters/shares", "tok-shares", "token-shares-1")
    shares["metadata"]["annotations"]["ignition-server.openshift.io/input-user-ca-bundle"] = "ignition/ca"
    api.create(shares)
    server.start()
    wait_for(lambda: reason(api, EVIL, "token-evil-1") == "InvalidConfig", timeout=30, what="InvalidConfig on the Secret")
    message = base64.b64decode(api.get("secrets", EVIL, "token-evil-1")["data"]["message"]).decode()
    assert "ignition/management-kubeconfig" in message and "not marked shareable" in message, message
    wait_for(lambda: any(e["involvedObject"]["name"] == "token-evil-1" and "shareable" in e["message"]
                         for e in api.list("events", EVIL)), timeout=30, what="an Event saying why")
    assert server.get("/ignition", bearer("tok-evil"))[0] != 200
    wait_for(lambda: reason(api, EVIL, "token-shares-1") == "InvalidConfig", timeout=30, what="the unmarked CA refused")
    api.patch("configmaps", "ignition", "ca", {"metadata": {"annotations": {ANNOTATION_SHAREABLE: "true"}}})
    wait_for(lambda: server.get("/ignition", bearer("tok-shares"))[0] == 200, timeout=30, what="the marked CA served")
    assert CA_PEM.strip().splitlines()[1] in contents(server.get("/ignition", bearer("tok-shares"))[2])
    # Written once the payload is durable, a few ms after it is first served: waited for, not raced.
    wait_for(lambda: reason(api, EVIL, "token-shares-1") == "AsExpected", timeout=10, what="AsExpected on the Secret")
    assert ("secrets", "ignition", "management-kubeconfig") not in api.server.reads  # never fetched
    assert server.metrics().get('ign_server_tenancy_refusals_total{what="input"}', 0) >= 2
