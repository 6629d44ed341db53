"""Kubernetes mode's wiring: the API client, the source, the Lease, and the CA every replica shares.

Several replicas serve the same NodePools, so they must present certificates that the
same pointer configs trust: the first replica to start makes the CA and serving certificate
and publishes them in a Secret (create, so only one can win); every other replica uses that
one. Only the Lease holder writes (rotation, status, user-data).
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .config import ServeSettings
from .metrics import ServerMetrics
from .reconcile.interest import inputs_referenced, object_wanted
from .reconcile.tenancy import Tenancy
from .sources.kube import KubeClient, KubeError, KubeSource, LeaderElector
from .sources.kube.client import MERGE_PATCH, collection_path, item_path
from .takeover import ca_cert
from .tls.ca_rotation import FILES as CA_FILES, CAState
from .tls.certificates import CA_VALIDITY, TLSFiles, ensure_self_signed, plaintext_key_pem, write_private_key

log = logging.getLogger("ignition_server.cluster")

TLS_SECRET = "ignition-server-tls"
_TLS_FILES = ("ca.crt", "ca.key", "serving.crt", "serving.key")


@dataclass
class Cluster:
    client: KubeClient
    source: KubeSource
    elector: LeaderElector

    def is_writer(self) -> bool:
        return self.elector.is_leader

    async def close(self) -> None:
        await self.elector.release()
        await self.client.close()


async def connect(settings: ServeSettings, metrics: ServerMetrics, on_watch: "WatchHealth") -> Cluster:
    api = await KubeClient.connect(settings.kubeconfig, count=lambda verb: metrics.api_requests.labels(verb=verb).inc())
    # The shareable mark is judged on what the source keeps: of a shared namespace, only what the
    # server reads for itself and the objects marked shareable (kept whole, so they can be named).
    tenancy = Tenancy(frozenset(settings.shared_namespaces), lookup=lambda key: source.get(key))
    source = KubeSource(
        # A reference past the wall is never fetched: only those the tenancy allows are named.
        # --take-over: HostedControlPlanes too, and the Secrets and ConfigMaps an annotated one's takeover
        # reads (in its own namespace only), kept without the private keys beside them (ca_cert.trim_secret).
        api, wanted=lambda meta: object_wanted(meta) or tenancy.offers(meta) or (settings.take_over and ca_cert.is_ours(meta)),
        references=lambda obj: [*inputs_referenced(obj, tenancy), *ca_cert.references(obj)],
        namespaces=settings.namespaces, watch_timeout=settings.watch_timeout, on_health=on_watch,
        namespace_budget=settings.namespace_budget,
        on_over_budget=lambda namespace: metrics.tenancy_refusals.labels(what="namespace-budget").inc(),
        extra_kinds=("HostedControlPlane",) if settings.take_over else (), trim=ca_cert.trim_secret,
    )
    elector = LeaderElector(
        api, namespace=settings.pod_namespace, identity=settings.replica_id,
        lease_duration=settings.lease_duration, renew_interval=settings.lease_duration / 3,
        on_change=lambda leader: metrics.leader.set(1 if leader else 0),
    )
    return Cluster(api, source, elector)


class WatchHealth:
    """The informers' state, for the metrics and /readyz: which watches are behind."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.behind: set[str] = set()

    def __call__(self, kind: str, up: bool, reason: str | None) -> None:
        self.metrics.source_watch_up.labels(kind=kind).set(1 if up else 0)
        if reason is not None:
            self.metrics.source_watch_restarts.labels(kind=kind, reason=reason).inc()
        (self.behind.discard if up else self.behind.add)(kind)


async def shared_tls(client: KubeClient, namespace: str, directory: Path, public_url: str | None,
                     ca_validity: dt.timedelta = CA_VALIDITY, *, password: bytes | None = None) -> TLSFiles:
    """The replicas' one CA and serving certificate, from the Secret (made here if none yet).
    The Secret holds the keys in plaintext (as any Kubernetes TLS Secret); the copies in the
    cache dir are encrypted under `password` (certificates.py)."""
    path = item_path("Secret", namespace, TLS_SECRET)
    try:
        secret = await client.request("get", "GET", path)
    except KubeError as exc:
        if exc.status != 404:
            raise
        with tempfile.TemporaryDirectory() as scratch:  # made encrypted there too; the Secret gets them plaintext
            made = ensure_self_signed(Path(scratch), public_url, ca_validity, password=password)
            data = {name: base64.b64encode(plaintext_key_pem(content, password) if name.endswith(".key") else content).decode()
                    for name in _TLS_FILES for content in [(made.cert.parent / name).read_bytes()]}
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data,
                "metadata": {"name": TLS_SECRET, "namespace": namespace}}
        try:
            secret = await client.request("create", "POST", collection_path("Secret", namespace), body=body)
            log.info("made the replicas' CA and serving certificate: Secret %s/%s", namespace, TLS_SECRET)
        except KubeError as race:
            if race.status != 409:
                raise
            secret = await client.request("get", "GET", path)  # another replica made it first: use theirs
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name in _TLS_FILES:
        target = directory / name
        content = base64.b64decode(secret["data"][name])
        if name.endswith(".key"):
            write_private_key(target, content, password)  # encrypted; left alone if it holds that key
        elif not target.exists() or target.read_bytes() != content:
            target.write_bytes(content)
            target.chmod(0o644)
    # Reads them back (and checks they belong together).
    return ensure_self_signed(directory, public_url, password=password)


@dataclass
class SecretStore:
    """The CA material in the Secret the replicas share: only the writer changes it, with its
    resourceVersion as a precondition (two writers cannot both take a step)."""

    client: KubeClient
    namespace: str

    async def load(self) -> tuple[CAState | None, str | None]:
        secret = await self.client.request("get", "GET", item_path("Secret", self.namespace, TLS_SECRET))
        data = secret.get("data") or {}
        files = {name: base64.b64decode(data[name]) for name in CA_FILES if name in data}
        state = CAState.from_files(files) if "ca.crt" in files and "ca.key" in files else None
        return state, (secret.get("metadata") or {}).get("resourceVersion")

    async def save(self, state: CAState, version: str | None) -> bool:
        data: dict[str, str | None] = {name: base64.b64encode(content).decode() for name, content in state.files().items()}
        data.setdefault("next-ca.key", None)  # dropped once the next CA signs
        patch = {"metadata": {"resourceVersion": version}, "data": data}
        try:
            await self.client.request("patch", "PATCH", item_path("Secret", self.namespace, TLS_SECRET), body=patch,
                                      content_type=MERGE_PATCH)
        except KubeError as exc:
            if exc.status == 409:
                return False
            raise
        return True
