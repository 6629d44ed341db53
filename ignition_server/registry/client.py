"""The OCI distribution API over aiohttp: manifests and blobs, with the auth flows.

Every blob is hashed while it streams to disk and refused if its digest does not match;
a manifest fetched by digest is checked the same way. Bearer tokens are kept per
(registry, repository, credentials) until they expire.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import aiohttp

from .auth import AuthError, Credentials, parse_challenge
from .reference import Reference

log = logging.getLogger("ignition_server.registry")

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST)
LISTS = (OCI_INDEX, DOCKER_LIST)
MAX_MANIFEST_BYTES = 4 << 20
CHUNK = 256 << 10


class RegistryError(Exception):
    """A registry request failed. `permanent`: retrying the same registry will not help."""

    permanent = False


class Unreachable(RegistryError):
    """Connection refused, timed out, or a 5xx/429: try a mirror, or again later."""


class NotFound(RegistryError):
    permanent = True


class IntegrityError(RegistryError):
    """The bytes do not match their digest (a tampered or corrupt blob or manifest)."""

    permanent = True


class Refused(RegistryError):
    """Authentication or authorisation failed."""

    permanent = True


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class RegistryClient:
    session: aiohttp.ClientSession
    ssl_context: ssl.SSLContext
    # (registry host, result) for every request; bytes received from registries.
    count: Callable[[str, str], None] = lambda host, result: None
    count_bytes: Callable[[int], None] = lambda n: None
    timeout: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _tokens: dict[tuple[str, str, str], tuple[str, float]] = field(default_factory=dict)

    async def manifest(self, ref: Reference, creds: Credentials | None, tls: ssl.SSLContext | None = None) -> tuple[str, bytes, str]:
        """(media type, body, digest) of the manifest `ref` names."""
        async with await self._get(ref, f"manifests/{ref.version}", creds, ", ".join(MANIFEST_TYPES), tls) as resp:
            body = await resp.content.read(MAX_MANIFEST_BYTES + 1)
            if len(body) > MAX_MANIFEST_BYTES:
                raise IntegrityError(f"{ref}: manifest larger than {MAX_MANIFEST_BYTES} bytes")
            media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        self.count_bytes(len(body))
        digest = sha256_digest(body)
        if ref.digest and digest != ref.digest:
            raise IntegrityError(f"{ref}: the manifest's digest is {digest}, not the one asked for")
        if not media_type or media_type not in MANIFEST_TYPES:
            media_type = str(json_object(body, ref).get("mediaType", media_type))
        return media_type, body, digest

    async def blob_to_file(
        self, ref: Reference, digest: str, creds: Credentials | None, path: Path, limit: int, tls: ssl.SSLContext | None = None
    ) -> int:
        """Stream a blob to `path` (never whole in memory); refused unless its sha256 matches."""
        if not digest.startswith("sha256:"):
            raise IntegrityError(f"{ref}: unsupported digest algorithm in {digest!r}")
        hasher = hashlib.sha256()
        size = 0
        async with await self._get(ref, f"blobs/{digest}", creds, "*/*", tls) as resp:
            with open(path, "wb") as out:
                async for chunk in resp.content.iter_chunked(CHUNK):
                    size += len(chunk)
                    if size > limit:
                        raise IntegrityError(f"{ref}: blob {digest} is larger than {limit} bytes")
                    hasher.update(chunk)
                    out.write(chunk)
        self.count_bytes(size)
        if "sha256:" + hasher.hexdigest() != digest:
            raise IntegrityError(f"{ref}: blob {digest} does not match its digest (tampered or corrupt); refused")
        return size

    # -- requests and auth -------------------------------------------------------------

    async def _get(
        self, ref: Reference, path: str, creds: Credentials | None, accept: str, tls: ssl.SSLContext | None
    ) -> aiohttp.ClientResponse:
        tls = tls or self.ssl_context
        url = f"https://{ref.api_host}/v2/{ref.repository}/{path}"
        token_key = (ref.api_host, ref.repository, creds.username if creds else "")
        authorization = self._cached_token(token_key)
        for attempt in range(2):
            resp = await self._send(ref, url, accept, authorization, tls)
            if resp.status != 401 or attempt == 1:
                break
            challenge = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
            resp.release()
            if challenge.scheme == "basic":
                if creds is None:
                    raise Refused(f"{ref.host} asks for credentials and the pull secret has none for {ref.name}")
                authorization = creds.basic()
            elif challenge.scheme == "bearer":
                authorization = await self._bearer(ref, challenge.params, creds, token_key, tls)
            else:
                raise Refused(f"{ref.host}: unsupported authentication scheme {challenge.scheme!r}")
        if resp.status == 200:
            self.count(ref.host, "ok")
            return resp
        resp.release()
        if resp.status in (401, 403):
            self.count(ref.host, "denied")
            self._tokens.pop(token_key, None)
            who = f"user {creds.username!r}" if creds else "anonymous access"
            raise Refused(f"{ref.host} refused {who} for {ref.name} (HTTP {resp.status}): check the pull secret")
        if resp.status == 404:
            self.count(ref.host, "not_found")
            raise NotFound(f"{ref} not found on {ref.host}")
        self.count(ref.host, "error")
        raise Unreachable(f"{ref.host} answered HTTP {resp.status} for {ref}")

    async def _send(
        self, ref: Reference, url: str, accept: str, authorization: str | None, tls: ssl.SSLContext
    ) -> aiohttp.ClientResponse:
        headers = {"Accept": accept}
        if authorization:
            headers["Authorization"] = authorization
        try:
            return await self.session.get(
                url, headers=headers, ssl=tls,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout, sock_read=self.timeout),
            )
        except aiohttp.ClientConnectorCertificateError as exc:
            self.count(ref.host, "tls_error")
            raise Unreachable(f"{ref.host}: TLS certificate not trusted ({exc.certificate_error}); "
                              "add its CA to --registry-ca-file or the cluster's user-ca-bundle") from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self.count(ref.host, "unreachable")
            # One text for refused, timed out, reset or closed: the message reaches the token
            # Secret, and must not tell its author what answers on a port. The log has the cause.
            log.warning("%s unreachable: %s: %s", ref.host, type(exc).__name__, exc)
            raise Unreachable(f"{ref.host} unreachable (no answer, connection failed or closed)") from None

    def _cached_token(self, key: tuple[str, str, str]) -> str | None:
        found = self._tokens.get(key)
        if found and found[1] > self.clock():
            return found[0]
        return None

    async def _bearer(
        self, ref: Reference, params: dict[str, str], creds: Credentials | None, key: tuple[str, str, str],
        tls: ssl.SSLContext,
    ) -> str:
        realm = params.get("realm")
        if not realm or not realm.startswith(("https://", "http://")):
            raise Refused(f"{ref.host}: bearer challenge without a usable realm")
        query = {"scope": params.get("scope") or f"repository:{ref.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        headers = {"Authorization": creds.basic()} if creds else {}
        try:
            async with self.session.get(realm, params=query, headers=headers, ssl=tls,
                                        timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                if resp.status in (401, 403):
                    self.count(ref.host, "denied")
                    who = f"user {creds.username!r}" if creds else "anonymous access"
                    raise Refused(f"the token service of {ref.host} refused {who} (HTTP {resp.status}): check the pull secret")
                if resp.status != 200:
                    self.count(ref.host, "error")
                    raise Unreachable(f"the token service of {ref.host} answered HTTP {resp.status}")
                body = await resp.content.read(1 << 20)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self.count(ref.host, "unreachable")
            log.warning("the token service of %s unreachable: %s: %s", ref.host, type(exc).__name__, exc)
            raise Unreachable(f"the token service of {ref.host} is unreachable (no answer, connection failed or closed)") from None
        self.count(ref.host, "token")
        answer = json_object(body, ref)
        token = answer.get("token") or answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise Refused(f"the token service of {ref.host} answered without a token")
        expires_in = answer.get("expires_in")
        lifetime = expires_in if isinstance(expires_in, (int, float)) else 60
        authorization = "Bearer " + token
        self._tokens[key] = (authorization, self.clock() + max(10.0, float(lifetime) - 10.0))
        return authorization


def json_object(body: bytes, what: object) -> dict[str, Any]:
    """A registry's JSON answer (manifest, token), or IntegrityError naming `what`."""
    try:
        value = json.loads(body)
    except ValueError:
        raise IntegrityError(f"{what}: the registry's answer is not JSON") from None
    if not isinstance(value, dict):
        raise IntegrityError(f"{what}: the registry's answer is not a JSON object")
    return value


__all__ = ["AuthError", "IntegrityError", "NotFound", "Refused", "RegistryClient", "RegistryError", "Unreachable"]
