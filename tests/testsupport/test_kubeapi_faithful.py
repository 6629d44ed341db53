"""The test API server is faithful: the real kubectl and kubernetes-asyncio, which no one here
wrote, work against it as against a real API server, and meet its strictness (409, 410, 404)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from testsupport.harness import wait_for
from testsupport.kubeapi import KubeAPI
from testsupport.realtools import require_tool

SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1", "namespace": "ns1"}, "data": {"a": "YQ=="}}


@pytest.fixture
def api(tmp_path: Path):
    with KubeAPI(tmp_path / "kubeapi", bookmark_interval=0.2) as server:
        yield server


@pytest.fixture
def kubectl(api: KubeAPI):
    binary = require_tool("kubectl", "apt-get install kubernetes-client")

    def run(*args: str, stdin: str | None = None, ok: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([binary, "--kubeconfig", str(api.kubeconfig), *args], input=stdin,
                                capture_output=True, text=True, timeout=60)
        if ok:
            assert result.returncode == 0, result.stdout + result.stderr
        return result

    return run


def test_kubectl_get_apply_patch_delete(api: KubeAPI, kubectl) -> None:
    api.create(SECRET)
    assert "s1" in kubectl("get", "secrets", "-A").stdout
    shown = json.loads(kubectl("get", "secret", "s1", "-n", "ns1", "-o", "json").stdout)
    assert shown["data"] == {"a": "YQ=="} and shown["metadata"]["resourceVersion"]
    kubectl("patch", "secret", "s1", "-n", "ns1", "--type", "merge", "-p", '{"data":{"b":"Yg=="}}')
    kubectl("patch", "secret", "s1", "-n", "ns1", "-p", '{"data":{"c":"Yw=="}}')  # strategic, kubectl's default
    kubectl("patch", "secret", "s1", "-n", "ns1", "--type", "json", "-p", '[{"op":"remove","path":"/data/a"}]')
    assert api.get("secrets", "ns1", "s1")["data"] == {"b": "Yg==", "c": "Yw=="}
    # A failed JSON-patch test leaves the object as it was.
    assert kubectl("patch", "secret", "s1", "-n", "ns1", "--type", "json", "-p",
                   '[{"op":"test","path":"/data/b","value":"x"},{"op":"remove","path":"/data/b"}]', ok=False).returncode != 0
    assert "b" in api.get("secrets", "ns1", "s1")["data"]
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "ns1"}, "data": {"x": "1"}}
    # Client-side validation needs the OpenAPI document, which this server does not serve.
    kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(cm))
    kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps({**cm, "data": {"x": "2"}}))
    assert kubectl("get", "cm", "cm", "-n", "ns1", "-o", "jsonpath={.data.x}").stdout == "2"
    kubectl("delete", "secret", "s1", "-n", "ns1")
    missing = kubectl("get", "secret", "s1", "-n", "ns1", ok=False)
    assert missing.returncode != 0 and 'secrets "s1" not found' in missing.stderr
    assert kubectl("get", "secret", "x", "-n", "no-such-ns", ok=False).returncode != 0


def test_kubectl_replace_with_a_stale_version_conflicts(api: KubeAPI, kubectl, tmp_path: Path) -> None:
    api.create(SECRET)
    stale = json.loads(kubectl("get", "secret", "s1", "-n", "ns1", "-o", "json").stdout)
    api.patch("secrets", "ns1", "s1", {"data": {"meanwhile": "eA=="}})
    stale["data"]["mine"] = "eQ=="
    path = tmp_path / "stale.json"
    path.write_text(json.dumps(stale))
    result = kubectl("replace", "--validate=false", "-f", str(path), ok=False)
    assert result.returncode != 0 and "the object has been modified" in result.stderr
    assert "mine" not in api.get("secrets", "ns1", "s1")["data"]


def test_kubectl_watch_sees_a_change(api: KubeAPI, kubectl) -> None:
    api.create(SECRET)
    binary = require_tool("kubectl", "apt-get install kubernetes-client")
    proc = subprocess.Popen([binary, "--kubeconfig", str(api.kubeconfig), "get", "secrets", "-n", "ns1", "--watch",
                             "-o", "name"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "secret/s1"  # the listing
        api.create({**SECRET, "metadata": {"name": "s2", "namespace": "ns1"}})
        assert proc.stdout.readline().strip() == "secret/s2"  # the watch
    finally:
        proc.kill()
        proc.wait()


def test_unauthenticated_requests_are_refused(api: KubeAPI, tmp_path: Path) -> None:
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=str(api.tls.ca))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{api.url}/api/v1/secrets", context=context, timeout=10)
    assert refused.value.code == 401


async def _core(api: KubeAPI) -> tuple[client.ApiClient, client.CoreV1Api]:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(api.kubeconfig), client_configuration=configuration)
    api_client = client.ApiClient(configuration)
    return api_client, client.CoreV1Api(api_client)


async def test_kubernetes_asyncio_list_watch_bookmark_gone_conflict(api: KubeAPI) -> None:
    api.create(SECRET)
    api_client, core = await _core(api)
    async with api_client:
        listed = await core.list_secret_for_all_namespaces()
        assert [s.metadata.name for s in listed.items] == ["s1"] and listed.metadata.resource_version
        api.create({**SECRET, "metadata": {"name": "s2", "namespace": "ns1"}})
        seen = []
        stream = watch.Watch()
        async for event in stream.stream(core.list_secret_for_all_namespaces, resource_version=listed.metadata.resource_version,
                                         allow_watch_bookmarks=True, timeout_seconds=5):
            seen.append((event["type"], event["raw_object"]["metadata"].get("name")))
            if event["type"] == "BOOKMARK":
                break
        stream.stop()
        assert seen[0] == ("ADDED", "s2") and seen[-1][0] == "BOOKMARK"
        # A compacted version: the watch answers 410 Gone, and the client must list again.
        api.compact()
        api.create({**SECRET, "metadata": {"name": "s3", "namespace": "ns1"}})
        with pytest.raises(ApiException) as gone:
            async for _event in watch.Watch().stream(core.list_secret_for_all_namespaces,
                                                     resource_version=listed.metadata.resource_version, timeout_seconds=5):
                pass
        assert gone.value.status == 410
        # A patch whose resourceVersion is stale: 409.
        current = await core.read_namespaced_secret("s1", "ns1")
        api.patch("secrets", "ns1", "s1", {"data": {"b": "Yg=="}})
        with pytest.raises(ApiException) as conflict:
            await core.patch_namespaced_secret("s1", "ns1", {"metadata": {"resourceVersion": current.metadata.resource_version},
                                                             "data": {"c": "Yw=="}})
        assert conflict.value.status == 409
        with pytest.raises(ApiException) as missing:
            await core.read_namespaced_secret("nope", "ns1")
        assert missing.value.status == 404
    wait_for(lambda: api.server.live_watches == 0, what="watches closed")


async def test_watch_list_streams_the_state_then_the_initial_events_end_bookmark(api: KubeAPI) -> None:
    """client-go's reflectors (1.35+, the reference server's controller-runtime) open a
    watch-list: sendInitialEvents=true, then wait for the bookmark annotated
    k8s.io/initial-events-end. A server without it would leave them waiting forever."""
    import ssl

    import aiohttp

    api.create(SECRET)
    headers = {"Authorization": f"Bearer {api.server.token}"}
    context = ssl.create_default_context(cafile=str(api.tls.ca))
    base = f"{api.url}/api/v1/namespaces/ns1/secrets?watch=1&timeoutSeconds=5"
    async with aiohttp.ClientSession(headers=headers) as session:
        query = "&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        async with session.get(base + query, ssl=context) as response:
            added = json.loads(await response.content.readline())
            end = json.loads(await response.content.readline())
            assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "s1")
            assert end["type"] == "BOOKMARK" and end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
            assert int(end["object"]["metadata"]["resourceVersion"]) >= int(added["object"]["metadata"]["resourceVersion"])
            api.create({**SECRET, "metadata": {"name": "s2", "namespace": "ns1"}})
            later = json.loads(await response.content.readline())
            assert (later["type"], later["object"]["metadata"]["name"]) == ("ADDED", "s2")
        # What a real API server refuses, this one refuses (422), so a client's fallback is exercised.
        for bad in ("&sendInitialEvents=true&allowWatchBookmarks=true",  # no resourceVersionMatch
                    "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",  # no bookmarks
                    "&resourceVersionMatch=NotOlderThan"):  # a match without sendInitialEvents
            async with session.get(base + bad, ssl=context) as response:
                assert response.status == 422, bad
        # An API server with the WatchList gate off refuses watch-lists; client-go then lists.
        api.server.watch_list = False
        async with session.get(base + query, ssl=context) as response:
            assert response.status == 422 and "WatchList feature gate" in (await response.json())["message"]
        # sendInitialEvents=false from no version: only what happens from now on.
        api.server.watch_list = True
        query = "&allowWatchBookmarks=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan"
        async with session.get(base + query, ssl=context) as response:
            api.create({**SECRET, "metadata": {"name": "s3", "namespace": "ns1"}})
            first = {"type": "BOOKMARK"}
            while first["type"] == "BOOKMARK":  # periodic bookmarks may come first
                first = json.loads(await response.content.readline())
            assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "s3")
    wait_for(lambda: api.server.live_watches == 0, what="watches closed")


def _pb(number: int, value: bytes | int) -> bytes:
    """One protobuf field (length-delimited or varint), as client-go's generated code writes it."""
    def varint(n: int) -> bytes:
        out = b""
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def test_protobuf_bodies_are_decoded_as_the_api_server_decodes_them(api: KubeAPI) -> None:
    """client-go writes built-in kinds as application/vnd.kubernetes.protobuf (the reference
    ignition server's Update of a token Secret and its Events do): the body is the `k8s\\0`
    magic and a runtime.Unknown envelope around the object's generated.proto fields."""
    import ssl
    import urllib.error
    import urllib.request

    created = api.create(SECRET)
    meta = (_pb(1, b"s1") + _pb(3, b"ns1") + _pb(6, created["metadata"]["resourceVersion"].encode())
            + _pb(12, _pb(1, b"hypershift.openshift.io/ignition-reached") + _pb(2, b"True")))
    secret = _pb(1, meta) + _pb(2, _pb(1, b"a") + _pb(2, b"new")) + _pb(3, b"Opaque")
    body = b"k8s\x00" + _pb(1, _pb(1, b"v1") + _pb(2, b"Secret")) + _pb(2, secret)
    context = ssl.create_default_context(cafile=str(api.tls.ca))

    def put(data: bytes) -> int:
        request = urllib.request.Request(f"{api.url}/api/v1/namespaces/ns1/secrets/s1", data=data, method="PUT", headers={
            "Authorization": f"Bearer {api.server.token}", "Content-Type": "application/vnd.kubernetes.protobuf"})
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    assert put(body) == 200
    stored = api.get("secrets", "ns1", "s1")
    assert stored["data"] == {"a": "bmV3"} and stored["type"] == "Opaque"
    assert stored["metadata"]["annotations"] == {"hypershift.openshift.io/ignition-reached": "True"}
    assert put(body) == 409  # its resourceVersion is a precondition, as in JSON
    assert put(b"k8s\x00" + _pb(1, _pb(1, b"v1") + _pb(2, b"Pod")) + _pb(2, b"")) == 415  # a kind not decoded here
    assert put(b'{"not": "protobuf"}') == 415


HCP = {"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedControlPlane",
       "metadata": {"name": "hc1", "namespace": "clusters-hc1", "annotations": {"a": "b"}},
       "spec": {"releaseImage": "quay.io/openshift-release-dev/ocp-release:4.21.0-x86_64"}}


def test_kubectl_reads_and_writes_hosted_control_planes_through_discovery(api: KubeAPI, kubectl) -> None:
    api.namespace("clusters-hc1")
    kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(HCP))
    assert "hc1" in kubectl("get", "hostedcontrolplanes", "-A").stdout
    assert "hc1" in kubectl("get", "hostedcontrolplanes.hypershift.openshift.io", "-n", "clusters-hc1").stdout
    shown = json.loads(kubectl("get", "hostedcontrolplane", "hc1", "-n", "clusters-hc1", "-o", "json").stdout)
    assert shown["apiVersion"] == "hypershift.openshift.io/v1beta1" and shown["spec"] == HCP["spec"]
    kubectl("annotate", "hostedcontrolplane", "hc1", "-n", "clusters-hc1", "hypershift.openshift.io/disable-ignition-server=true")
    assert "hypershift.openshift.io/disable-ignition-server" in api.get("hostedcontrolplanes", "clusters-hc1", "hc1")["metadata"]["annotations"]
    kubectl("delete", "hostedcontrolplane", "hc1", "-n", "clusters-hc1")
    assert api.get("hostedcontrolplanes", "clusters-hc1", "hc1") is None


def test_a_finalizer_holds_a_deleted_object_readable_until_it_is_removed(api: KubeAPI, kubectl) -> None:
    api.create({**SECRET, "metadata": {**SECRET["metadata"], "finalizers": ["example.com/keep"]}})
    # A DELETE sets deletionTimestamp and keeps the object, readable; a second one changes nothing.
    kubectl("delete", "secret", "s1", "-n", "ns1", "--wait=false")
    kept = json.loads(kubectl("get", "secret", "s1", "-n", "ns1", "-o", "json").stdout)
    assert kept["metadata"]["deletionTimestamp"] and kept["data"] == SECRET["data"]
    kubectl("delete", "secret", "s1", "-n", "ns1", "--wait=false")
    assert api.get("secrets", "ns1", "s1")["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]
    # It can still be updated, but takes no new finalizer, and its deletionTimestamp stays.
    kubectl("patch", "secret", "s1", "-n", "ns1", "--type", "merge", "-p", '{"data":{"b":"Yg=="}}')
    refused = kubectl("patch", "secret", "s1", "-n", "ns1", "--type", "merge", "-p",
                      '{"metadata":{"finalizers":["example.com/keep","example.com/more"]}}', ok=False)
    assert refused.returncode != 0 and "no new finalizers can be added if the object is being deleted" in refused.stderr
    kubectl("patch", "secret", "s1", "-n", "ns1", "--type", "merge", "-p", '{"metadata":{"deletionTimestamp":null}}')
    assert api.get("secrets", "ns1", "s1")["metadata"]["deletionTimestamp"] == kept["metadata"]["deletionTimestamp"]
    # The last finalizer removed: it is gone.
    kubectl("patch", "secret", "s1", "-n", "ns1", "--type", "json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')
    missing = kubectl("get", "secret", "s1", "-n", "ns1", ok=False)
    assert missing.returncode != 0 and 'secrets "s1" not found' in missing.stderr
    # Without finalizers a DELETE deletes at once; a create never carries a deletionTimestamp.
    api.create({**SECRET, "metadata": {**SECRET["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert "deletionTimestamp" not in api.get("secrets", "ns1", "s1")["metadata"]
    kubectl("delete", "secret", "s1", "-n", "ns1")
    assert api.get("secrets", "ns1", "s1") is None
