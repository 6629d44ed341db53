"""The Kubernetes API as this server uses it: JSON in and out over kubernetes-asyncio's
configured client (kubeconfig or in-cluster: TLS, token), and watch streams as JSON lines.

One small surface (request, stream) instead of the generated per-kind methods: the source
needs metadata-only answers (`PartialObjectMetadata`), patches with preconditions and raw
watch events, and every request is counted for the API-load figures.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable
from urllib.parse import urlsplit

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
MERGE_PATCH = "application/merge-patch+json"

_PATHS = {
    "Secret": ("/api/v1", "secrets"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Event": ("/api/v1", "events"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "HostedControlPlane": ("/apis/hypershift.openshift.io/v1beta1", "hostedcontrolplanes"),
}
API_VERSIONS = {"HostedControlPlane": "hypershift.openshift.io/v1beta1"}  # the rest: v1 or as they say


class KubeError(Exception):
    """A non-2xx answer of the API server, with its status code and reason."""

    def __init__(self, status: int, reason: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason, self.retry_after = status, reason, retry_after


def collection_path(kind: str, namespace: str | None) -> str:
    prefix, plural = _PATHS[kind]
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


def item_path(kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(kind, namespace)}/{name}"


@dataclass
class KubeClient:
    api: client.ApiClient
    count: Callable[[str], None] = lambda _verb: None

    @classmethod
    async def connect(cls, kubeconfig: Path | None, count: Callable[[str], None] = lambda _verb: None) -> "KubeClient":
        configuration = client.Configuration()
        if kubeconfig is not None:
            await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
        if configuration.proxy is None:
            configuration.proxy = _env_proxy(configuration.host or "")
        api = client.ApiClient(configuration)
        _without_env_lookups(api)
        return cls(api, count)

    async def close(self) -> None:
        await self.api.close()

    async def request(
        self, verb: str, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None,
        content_type: str = "application/json", accept: str = "application/json", timeout: float = 30.0,
    ) -> Any:
        self.count(verb)
        headers = {"Accept": accept, "Content-Type": content_type}
        try:
            response = await self.api.call_api(
                path, method, query_params=list((query or {}).items()), header_params=headers, body=body,
                auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout,
            )
            raw = await response.read()
        except ApiException as exc:
            raise _error(exc) from None
        if not 200 <= response.status <= 299:
            raise _status_error(response.status, raw, response.headers)
        return json.loads(raw) if raw else None

    async def stream(self, path: str, query: dict[str, Any], accept: str, timeout: float) -> AsyncIterator[dict[str, Any]]:
        """The events of a watch, until the server ends the stream."""
        self.count("watch")
        try:
            response = await self.api.call_api(
                path, "GET", query_params=list({**query, "watch": "true"}.items()), header_params={"Accept": accept},
                auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout,
            )
        except ApiException as exc:
            raise _error(exc) from None
        if not 200 <= response.status <= 299:
            raw = await response.read()
            response.release()
            raise _status_error(response.status, raw, response.headers)
        try:
            while line := await response.content.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            response.release()


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for the API server (HTTPS_PROXY, NO_PROXY), looked up once."""
    parts = urlsplit(url)
    if not parts.hostname or urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies_environment().get(parts.scheme or "https")


def _without_env_lookups(api: client.ApiClient) -> None:
    """kubernetes-asyncio's session trusts the environment, so every request read ~/.netrc and
    looked the proxy up in the default executor: behind a flood's renders (blob writes, fsyncs)
    each watch event's GET waited there, and one tenant's 2,000 token Secrets held another's
    back by 12 s. The proxy is looked up once instead (`_env_proxy`); a bearer token or client
    certificate is all the API server is given (no netrc, as client-go)."""
    rest = api.rest_client
    trusting = rest.pool_manager
    connector = trusting.connector
    trusting.detach()  # the connector (its TLS settings) goes on in the new session
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=2**21)


def _status_error(status: int, body: bytes | str | None, headers: Any) -> KubeError:
    """The v1 Status of a refusal: its message, and Retry-After when the server sent one."""
    retry_after = None
    value = str((headers or {}).get("Retry-After", ""))
    if value.isdigit():
        retry_after = float(value)
    reason = f"HTTP {status}"
    try:
        reason = json.loads(body or b"").get("message", reason)
    except (TypeError, ValueError, AttributeError):
        pass
    return KubeError(status, reason, retry_after)


def _error(exc: ApiException) -> KubeError:
    return _status_error(exc.status or 0, exc.body, exc.headers)
