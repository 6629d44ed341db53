"""A strict API-level Kubernetes test server, run in a thread of its own over real TLS.

    with KubeAPI(tmp_path) as api:             # listens on 127.0.0.1:<free port>, TLS
        api.kubeconfig                         # a real kubeconfig file (CA, server, token)
        api.namespace("clusters-a")
        api.create(secret_object)              # through the server's own store, thread-safe
        api.get("secrets", "clusters-a", "x"); api.patch(...); api.delete(...)
        api.server.faults.watch_max_seconds = 2    # fault injection (see server.Faults)
        api.compact()                          # older resourceVersions: 410 Gone
        api.stop(); api.start()                # an API server outage, same address
        api.server.requests                    # Counter[(verb, plural)]

kubectl and kubernetes-asyncio talk to it through `api.kubeconfig`; tests prove it
faithful by running the real kubectl against it (tests/testsupport/test_kubeapi_faithful.py).
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from ignition_server.tls.certificates import ensure_self_signed, server_context

from .patch import MERGE, apply_patch
from .server import ApiServer, Faults
from .store import RESOURCES, ApiError, Resource

__all__ = ["KubeAPI", "ApiError", "Faults"]


def resource(plural: str) -> Resource:
    return next(r for r in RESOURCES if r.plural == plural)


class KubeAPI:
    def __init__(self, directory: Path, *, bookmark_interval: float = 1.0) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.tls = ensure_self_signed(directory / "tls", "https://127.0.0.1")
        self.server = ApiServer(token=secrets.token_hex(16), bookmark_interval=bookmark_interval)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = directory / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url, "certificate-authority": str(self.tls.ca)}}],
            "users": [{"name": "test", "user": {"token": self.server.token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        }))
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="kubeapi", daemon=True)
        self._thread.start()
        self._runner: web.AppRunner | None = None
        self.start()

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        async def start() -> None:
            self._runner = web.AppRunner(self.server.app(), handle_signals=False, access_log=None, shutdown_timeout=0.5)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=server_context(self.tls),
                               reuse_address=True)
            await site.start()

        self.call(start())

    def stop(self) -> None:
        """Close the listener and every open connection and watch (an API server outage)."""
        if self._runner is not None:
            self.call(self._runner.cleanup())
            self._runner = None

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "KubeAPI":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()

    # --- the store, from the test's thread --------------------------------------------------

    def namespace(self, name: str) -> None:
        async def make() -> None:
            try:
                await self.server.store.create(resource("namespaces"), "", {"metadata": {"name": name}})
            except ApiError as exc:
                if exc.code != 409:
                    raise
        self.call(make())

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = _resource_of(obj)
        namespace = obj.get("metadata", {}).get("namespace", "") if res.namespaced else ""
        if namespace:
            self.namespace(namespace)
        return self.call(self.server.store.create(res, namespace, yaml.safe_load(yaml.safe_dump(obj))))

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return yaml.safe_load(yaml.safe_dump(self.server.store.get(resource(plural), namespace, name)))
        except ApiError:
            return None

    def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return yaml.safe_load(yaml.safe_dump(self.server.store.list(resource(plural), namespace)))

    def patch(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        async def apply() -> dict[str, Any]:
            res = resource(plural)
            current = self.server.store.get(res, namespace, name)
            return await self.server.store.replace(res, namespace, name, apply_patch(MERGE, current, patch))
        return self.call(apply())

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = _resource_of(obj)
        meta = obj["metadata"]
        return self.call(self.server.store.replace(res, meta.get("namespace", ""), meta["name"], yaml.safe_load(yaml.safe_dump(obj))))

    def delete(self, plural: str, namespace: str, name: str) -> None:
        self.call(self.server.store.delete(resource(plural), namespace, name, {}))

    def compact(self) -> None:
        self.loop.call_soon_threadsafe(self.server.store.compact)


def _resource_of(obj: dict[str, Any]) -> Resource:
    for res in RESOURCES:
        if res.kind == obj.get("kind") and res.api_version == obj.get("apiVersion"):
            return res
    raise ValueError(f"the test API server does not serve {obj.get('apiVersion')} {obj.get('kind')}")
