"""IBM's token shape end to end: node-bootstrapper service-account JWTs, real keys, the real client."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import jwt as pyjwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ignition_server.auth.jwks import kube_key_id
from ignition_server.render.userdata import pointer_config
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, bearer, wait_for, write_manifests
from testsupport.ignition_client import files_in, finish_fetch, ignition_fetch, require_ignition
from testsupport.manifests import build_token_secret
from testsupport.service_accounts import keys_configmap, legacy_jwt, public_pem, url_token

OVERLAP = 3.0


@pytest.fixture
def cluster_pair(tmp_path: Path):
    key_a = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_b = ec.generate_private_key(ec.SECP256R1())
    source = tmp_path / "source"
    for namespace, key, pool in (("clusters-a", key_a, "workers"), ("clusters-b", key_b, "infra")):
        write_manifests(
            source / f"{namespace}.yaml",
            keys_configmap(namespace, key, "node-bootstrapper-token-one"),
            build_token_secret(namespace=namespace, nodepool=f"clusters/{pool}", token=f"opaque-{pool}",
                               machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=pool), generation_time=time.time()),
        )
    # A failed-auth window longer than any test here: an address once held stays held throughout.
    proc = ServerProcess(source, tmp_path / "cache", extra=[
        "--service-account-overlap", f"{OVERLAP}s", "--auth-failure-window", "120s"]).start()
    wait_for(lambda: proc.metrics().get("ign_server_payload_cache_total") == 2, what="both payloads rendered")
    yield proc, key_a, key_b
    proc.kill()


def test_real_client_boots_with_a_service_account_jwt(cluster_pair, tmp_path: Path) -> None:
    require_ignition()
    proc, key_a, _ = cluster_pair
    token = legacy_jwt(key_a, "node-bootstrapper-token-one")
    # The URL shape carries base64 of the JWT, as in IBM's design; pointer_config quotes it.
    pointer = pointer_config(
        source_url=proc.url, token=base64.b64encode(token.encode()).decode(), ca_pem=proc.ca_file.read_bytes(),
        shape="mcs", nodepool="clusters/workers",
    )
    run = ignition_fetch(pointer, tmp_path / "node")
    assert run.returncode == 0, run.output
    assert "/etc/workers.conf" in files_in(run.config or {})
    # The header shape takes the same JWT (base64 in the Bearer value) with the NodePool header.
    status, _, body = proc.get("/ignition", {
        "Authorization": "Bearer " + base64.b64encode(token.encode()).decode(), "NodePool": "clusters/workers"})
    assert status == 200 and b"/etc/workers.conf" in body
    assert token not in proc.logs()


def test_forged_and_foreign_tokens_are_refused(cluster_pair) -> None:
    proc, key_a, key_b = cluster_pair
    good = legacy_jwt(key_a, "node-bootstrapper-token-one")
    assert proc.get(f"/config/workers?token={url_token(good)}")[0] == 200
    # Cluster B's valid token on cluster A's NodePool, and on a pool B does not have.
    foreign = legacy_jwt(key_b, "node-bootstrapper-token-one", alg="ES256")
    assert proc.get(f"/config/infra?token={url_token(foreign)}")[0] == 200
    assert proc.get(f"/config/workers?token={url_token(foreign)}")[0] == 403
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    header, payload, signature = good.split(".")
    tampered_claims = base64.urlsafe_b64encode(
        base64.urlsafe_b64decode(payload + "==").replace(b"openshift-infra", b"openshift-other")
    ).rstrip(b"=").decode()
    none_alg = pyjwt.encode({"iss": "kubernetes/serviceaccount"}, None, algorithm="none")
    forged = {
        "another key's signature under cluster A's kid": legacy_jwt(
            stranger, "node-bootstrapper-token-one", kid=kube_key_id(key_a.public_key())),
        "altered claims": f"{header}.{tampered_claims}.{signature}",
        "alg none": none_alg,
        "wrong namespace": legacy_jwt(key_a, "node-bootstrapper-token-one", namespace="default"),
        "old token Secret": legacy_jwt(key_a, "node-bootstrapper-token-zero"),
    }
    for name, token in forged.items():
        status = proc.get(f"/config/workers?token={url_token(token)}")[0]
        assert 400 <= status < 500, f"{name}: {status}"
    # A key no cluster here has (its kid names none): maybe one not read yet, retried, never served.
    assert proc.get(f"/config/workers?token={url_token(legacy_jwt(stranger, 'node-bootstrapper-token-one'))}")[0] == 511


def test_token_secret_and_signing_key_rotations_overlap(cluster_pair) -> None:
    proc, key_a, _ = cluster_pair
    before_secret_rotation = legacy_jwt(key_a, "node-bootstrapper-token-one")
    path = proc.source / "clusters-a.yaml"
    import yaml

    documents = list(yaml.safe_load_all(path.read_text()))
    documents[0]["data"]["token-secret-name"] = "node-bootstrapper-token-two"
    write_manifests(path, *documents)
    after = legacy_jwt(key_a, "node-bootstrapper-token-two")
    wait_for(lambda: proc.get(f"/config/workers?token={url_token(after)}")[0] == 200, what="the new token Secret accepted")
    assert proc.get(f"/config/workers?token={url_token(before_secret_rotation)}")[0] == 200  # inside the window
    # Signing-key rotation: the new key signs from now on; the old key's tokens stay good for the window.
    new_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    documents[0]["data"]["sa.pub"] = public_pem(new_key)
    write_manifests(path, *documents)
    signed_by_new_key = legacy_jwt(new_key, 'node-bootstrapper-token-two')
    wait_for(lambda: proc.get(f"/config/workers?token={url_token(signed_by_new_key)}")[0] == 200,
             what="the new signing key trusted")
    assert proc.get(f"/config/workers?token={url_token(after)}")[0] == 200  # old key, inside the window
    # After the window: the old key's tokens are refused (403: a key that left, not one not read yet),
    # and so is the old Secret's token.
    wait_for(lambda: proc.get(f"/config/workers?token={url_token(after)}")[0] == 403, timeout=OVERLAP + 15,
             what="the old signing key dropped after the overlap")
    assert proc.get(f"/config/workers?token={url_token(legacy_jwt(new_key, 'node-bootstrapper-token-one'))}")[0] == 403
    assert proc.get(f"/config/workers?token={url_token(legacy_jwt(new_key, 'node-bootstrapper-token-two'))}")[0] == 200


def test_a_client_polling_through_a_key_rotation_every_50ms_is_served_once_the_key_is(cluster_pair) -> None:
    # The hosted cluster signs with its new key before the server has read it: a client
    # polling every 50 ms fails well over the burst (30) and its address is held. That
    # holds back its failures only: once the key is trusted, its token is served.
    proc, _, _ = cluster_pair
    path = proc.source / "clusters-a.yaml"
    import yaml

    new_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = url_token(legacy_jwt(new_key, "node-bootstrapper-token-one"))

    def poll() -> int:
        status = proc.get(f"/config/workers?token={token}")[0]
        time.sleep(0.05)
        return status

    wait_for(lambda: poll() == 503, timeout=60, interval=0, what="the polling address held")
    documents = list(yaml.safe_load_all(path.read_text()))
    documents[0]["data"]["sa.pub"] = public_pem(new_key)
    write_manifests(path, *documents)
    wait_for(lambda: poll() == 200, timeout=60, interval=0, what="the new key's token served to the held address")
    forged = url_token(legacy_jwt(rsa.generate_private_key(public_exponent=65537, key_size=2048), "x"))
    assert proc.get(f"/config/workers?token={forged}")[0] == 503  # still held: the success passed through it


def test_real_client_retries_a_key_the_server_has_not_read_yet(cluster_pair, tmp_path: Path) -> None:
    """The hosted cluster rotated its signing key and the node holds a token signed by the new
    one before the server reads it: 511 (retried) until it does, then 200; never a 4xx, which
    would end the node's boot. Uses the real client's own retry."""
    require_ignition()
    proc, _, _ = cluster_pair
    path = proc.source / "clusters-a.yaml"
    import yaml

    new_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = legacy_jwt(new_key, "node-bootstrapper-token-one")
    pointer = pointer_config(
        source_url=proc.url, token=base64.b64encode(token.encode()).decode(), ca_pem=proc.ca_file.read_bytes(),
        shape="mcs", nodepool="clusters/workers",
    )
    refused_before = sum(v for k, v in proc.metrics().items() if k.startswith("ign_server_responses_total{code=\"4"))
    client = ignition_fetch(pointer, tmp_path / "node", background=True)
    wait_for(lambda: proc.metrics().get('ign_server_responses_total{code="511"}', 0) >= 2, timeout=30,
             what="the client retrying the unknown key's 511s")
    assert client.poll() is None, "the client must keep retrying a 511"
    documents = list(yaml.safe_load_all(path.read_text()))
    documents[0]["data"]["sa.pub"] = public_pem(new_key)
    write_manifests(path, *documents)
    output, _ = client.communicate(timeout=60)
    run = finish_fetch(client, output, tmp_path / "node")
    assert run.returncode == 0, output
    assert "/etc/workers.conf" in files_in(run.config or {})
    assert "GET result: Network Authentication Required" in output
    refused_after = sum(v for k, v in proc.metrics().items() if k.startswith("ign_server_responses_total{code=\"4"))
    assert refused_after == refused_before, "a 4xx was answered while the key was not read yet"


@pytest.mark.haproxy
def test_edge_haproxy_config_follows_key_rotations(tmp_path: Path) -> None:
    import json
    import ssl
    import threading
    import urllib.error
    import urllib.request

    import yaml

    from testsupport.harness import ProxyProcess
    from testsupport.realtools import require_tool

    require_tool("haproxy", "apt-get install haproxy")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    source = tmp_path / "source"
    write_manifests(
        source / "a.yaml",
        keys_configmap("clusters-a", key, "node-bootstrapper-token-one"),
        build_token_secret(namespace="clusters-a", nodepool="clusters/workers", token="opaque",
                           machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="workers"), generation_time=time.time()),
    )
    edge_dir = tmp_path / "edge"
    proc = ServerProcess(source, tmp_path / "cache", extra=[
        "--service-account-overlap", f"{OVERLAP}s", "--edge-dir", str(edge_dir)]).start()
    publication = edge_dir / "publication.json"
    wait_for(lambda: publication.exists() and len(json.loads(publication.read_text())["keys"]) == 1, what="the publication")
    proxy = ProxyProcess(tmp_path / "proxy" / "state")
    proxy.write_table([{"host": "localhost", "mode": "terminate", "publication": str(edge_dir),
                        "backends": [f"127.0.0.1:{proc.port}"]}])
    try:
        proxy.start(require_tool("haproxy", "apt-get install haproxy"))
        context = ssl.create_default_context(cafile=str(proc.ca_file))

        def via_edge(token: str) -> int:
            request = urllib.request.Request(f"https://localhost:{proxy.port}/config/workers?token={url_token(token)}")
            try:
                with urllib.request.urlopen(request, context=context, timeout=10) as response:
                    return response.status
            except urllib.error.HTTPError as error:
                return error.code

        good = legacy_jwt(key, "node-bootstrapper-token-one")
        wait_for(lambda: via_edge(good) == 200, what="served through the proxy")
        served = proc.metrics().get('ign_server_get_request{nodePool="clusters/workers"}')
        stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        assert via_edge(legacy_jwt(stranger, "x", kid=kube_key_id(key.public_key()))) == 403  # a held kid: forged
        assert via_edge(legacy_jwt(stranger, "x")) == 511  # a kid the edge does not hold (yet)
        assert proc.metrics().get('ign_server_get_request{nodePool="clusters/workers"}') == served  # stopped at the edge
        # Key rotation: the publication holds both keys, then only the new one; HAProxy 2.6
        # loads jwt_verify keys with its config, so the controller reloads for each (counted).
        # Nodes keep booting through both reloads: every request during them is answered.
        statuses: list[int | str] = []
        stop = threading.Event()

        def keep_booting() -> None:
            while not stop.is_set():
                request = urllib.request.Request(f"https://localhost:{proxy.port}/config/workers?token=opaque")
                try:
                    with urllib.request.urlopen(request, context=context, timeout=10) as response:
                        statuses.append(response.status)
                except urllib.error.HTTPError as error:
                    statuses.append(error.code)
                except OSError as error:
                    statuses.append(type(error).__name__)

        booting = threading.Thread(target=keep_booting, daemon=True)
        booting.start()
        new_key = ec.generate_private_key(ec.SECP256R1())
        documents = list(yaml.safe_load_all((source / "a.yaml").read_text()))
        documents[0]["data"]["sa.pub"] = public_pem(new_key)
        write_manifests(source / "a.yaml", *documents)
        new_token = legacy_jwt(new_key, "node-bootstrapper-token-one", alg="ES256")
        new_statuses: list[int] = []
        wait_for(lambda: new_statuses.append(via_edge(new_token)) or new_statuses[-1] == 200,
                 what="the edge trusting the new key")
        assert set(new_statuses) <= {511, 200}, new_statuses  # before its reload: retried, never a 4xx
        # After the overlap the edge holds the old key's file and kid no more: 511 there (the
        # server, which remembers the kids of keys that left, answers 403 behind it).
        wait_for(lambda: via_edge(good) == 511, timeout=OVERLAP + 15, what="the edge dropping the old key after the overlap")
        assert via_edge(new_token) == 200
        stop.set()
        booting.join(15)
        reloads = proxy.reloads()
        assert reloads >= 1 and proxy.metrics()["ign_proxy_reloads_total"] == reloads
        assert len(statuses) > 10 and set(statuses) == {200}, sorted(set(map(str, statuses)))  # no dropped connection
    finally:
        proxy.stop()
        proc.kill()


@pytest.mark.haproxy
def test_edge_passes_every_token_the_server_accepts(tmp_path: Path) -> None:
    """One token of each kind through the real HAProxy edge in front of the real server:
    legacy and bound service-account JWTs (the bound one with the cluster's own issuer) and
    opaque tokens (checked against the server's token map), both request shapes."""
    import ssl
    import urllib.error
    import urllib.request

    from testsupport.harness import ProxyProcess
    from testsupport.realtools import require_tool

    haproxy_bin = require_tool("haproxy", "apt-get install haproxy")
    issuer = "https://oidc.example.com/clusters-a"
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    keys = keys_configmap("clusters-a", key, "node-bootstrapper-token-one")
    keys["data"]["issuer"] = issuer
    del keys["data"]["token-secret-name"]  # bound tokens name no Secret
    source = tmp_path / "source"
    write_manifests(
        source / "a.yaml", keys,
        build_token_secret(namespace="clusters-a", nodepool="clusters/workers", token="opaque-0c9d8e7f",
                           machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="workers"), generation_time=time.time()),
    )
    edge_dir = tmp_path / "edge"
    proc = ServerProcess(source, tmp_path / "cache", extra=["--edge-dir", str(edge_dir)]).start()
    publication = edge_dir / "publication.json"
    token_map = proc.cache_dir / "edge" / "tokens.map"
    proxy = ProxyProcess(tmp_path / "proxy" / "state")
    proxy.write_table([{"host": "localhost", "mode": "terminate", "publication": str(edge_dir),
                        "backends": [f"127.0.0.1:{proc.port}"]}])
    try:
        wait_for(lambda: publication.exists() and issuer in publication.read_text(), what="the publication with the cluster's issuer")
        wait_for(lambda: token_map.exists() and b"clusters/workers" in token_map.read_bytes(), what="the token map")
        proxy.start(haproxy_bin)
        wait_for(proxy.servers_up, what="the backend healthy")
    except BaseException:
        proxy.stop()
        proc.kill()
        raise
    edge_port = proxy.port
    context = ssl.create_default_context(cafile=str(proc.ca_file))

    def via_edge(path: str, headers: dict[str, str] | None = None) -> int:
        request = urllib.request.Request(f"https://localhost:{edge_port}{path}", headers=headers or {})
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    def served() -> float:
        return proc.metrics().get('ign_server_get_request{nodePool="clusters/workers"}', 0.0)

    now = int(time.time())
    bound = pyjwt.encode({
        "iss": issuer, "sub": "system:serviceaccount:openshift-machine-config-operator:node-bootstrapper",
        "aud": ["https://kubernetes.default.svc"], "iat": now - 60, "nbf": now - 60, "exp": now + 3600,
        "kubernetes.io": {"namespace": "openshift-machine-config-operator",
                          "serviceaccount": {"name": "node-bootstrapper", "uid": "0b8e1b5c-1c43-4c6e-a5b1-2b1f0e9f7c11"}},
    }, key, algorithm="RS256")
    try:
        accepted = {
            "legacy JWT": ("/config/workers?token=" + url_token(legacy_jwt(key, "node-bootstrapper-token-one")), {}),
            "bound JWT, the cluster's issuer": ("/config/workers?token=" + url_token(bound), {}),
            "opaque token in the URL": ("/config/workers?token=opaque-0c9d8e7f", {}),
            "opaque token as Bearer": ("/ignition", bearer("opaque-0c9d8e7f")),
        }
        for name, (path, headers) in accepted.items():
            before = served()
            assert via_edge(path, headers) == 200, name
            assert served() == before + 1, name  # served by the server behind the edge
        before = served()
        # Unknown but well formed: maybe newer than the map, so a 5xx the client retries.
        assert via_edge("/config/workers?token=opaque-forged-1234") == 511
        assert via_edge("/ignition", bearer("opaque-forged-1234")) == 511
        assert via_edge("/config/workers?token=bad%20token%0A") == 403  # malformed: never good
        assert served() == before  # none of them reached the server
        assert proc.metrics().get('ign_server_responses_total{code="511"}', 0.0) == 0
    finally:
        proxy.stop()
        proc.kill()
