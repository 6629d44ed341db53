"""Release pull spec → version and component images, read from the registry once.

Everything under a digest is immutable: a resolved release is stored (encrypted, by
digest) and never fetched again, across restarts and registry outages. A tag is resolved
to a digest for `tag_ttl`; when the registry is down the last digest it named is used.
One resolution per release at a time (single-flight), however many NodePools ask; a
failure is retried with back-off, and says whether it is a configuration problem
(refused credentials, a tampered blob, not a release image) or the registry's absence.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .auth import AuthError, Credentials, credentials_for
from .client import NotFound, Refused, RegistryClient, RegistryError, Unreachable
from .layers import WANTED, NotARelease, ReleaseContent, extract, layer_digests, pick_manifest, release_content
from .mirrors import Mirrors
from .reference import Reference, ReferenceError, parse

log = logging.getLogger("ignition_server.registry")

MAX_LAYER_BYTES = 4 << 30


@dataclass(frozen=True)
class Failure:
    permanent: bool  # a configuration problem (InvalidConfig) rather than an unreachable registry
    message: str
    refused: bool = False  # credentials were refused: another NodePool's pull secret may do better


@dataclass(frozen=True)
class ResolverSettings:
    architecture: str = "amd64"
    tag_ttl: float = 300.0
    max_layer_bytes: int = MAX_LAYER_BYTES
    retry_min: float = 2.0
    retry_max: float = 300.0


@dataclass
class ReleaseStore:
    """Where resolved releases outlive the process: any encrypted name → bytes store."""

    load: Callable[[str], bytes | None]
    save: Callable[[str, bytes], None]

    @staticmethod
    def digest_name(digest: str) -> str:
        return "release-" + digest.replace(":", "-")

    @staticmethod
    def tag_name(ref: Reference) -> str:
        return "release-tag-" + hashlib.sha256(str(ref).encode()).hexdigest()


@dataclass
class ReleaseResolver:
    client: RegistryClient
    mirrors: Mirrors
    store: ReleaseStore
    settings: ResolverSettings = ResolverSettings()
    on_resolved: Callable[[str], None] = lambda pull_spec: None
    observe: Callable[[float], None] = lambda seconds: None  # resolution time
    fetched: Callable[[], None] = lambda: None  # a release read from a registry (not the store)
    work_dir: Path | None = None
    make_context: Callable[[], ssl.SSLContext] = ssl.create_default_context  # the base trust, before a bundle is added
    clock: Callable[[], float] = time.monotonic
    _by_digest: dict[str, ReleaseContent] = field(default_factory=dict)
    _tags: dict[str, tuple[str, float]] = field(default_factory=dict)  # str(ref) -> digest, fresh until
    _inflight: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _waiting: dict[str, set[str]] = field(default_factory=dict)
    _failures: dict[str, tuple[Failure, int, float]] = field(default_factory=dict)
    _refused: dict[str, str] = field(default_factory=dict)  # pull spec -> fingerprint of the pull secret refused
    _contexts: dict[str, ssl.SSLContext] = field(default_factory=dict)

    def known(self, pull_spec: str) -> ReleaseContent | None:
        digest = self.digest_of(pull_spec)
        return self._by_digest.get(digest) if digest else None

    def digest_of(self, pull_spec: str) -> str | None:
        """The digest a release pull spec names now (a tag's, while it is fresh); None: not known."""
        try:
            ref = parse(pull_spec)
        except ReferenceError:
            return None
        if ref.digest:
            return ref.digest
        tagged = self._tags.get(str(ref))
        return tagged[0] if tagged and tagged[1] > self.clock() else None

    def failure(self, pull_spec: str) -> Failure | None:
        found = self._failures.get(pull_spec)
        return found[0] if found else None

    def pending(self, pull_spec: str) -> bool:
        return any(pull_spec in specs for specs in self._waiting.values())

    def request(self, pull_spec: str, pull_secret: str | None, ca_bundle: str | None = None) -> None:
        """Resolve `pull_spec` in the background (once); `on_resolved` says when it is known or failed."""
        try:
            ref = parse(pull_spec)
        except ReferenceError as exc:
            self._failures[pull_spec] = (Failure(True, f"release {pull_spec!r}: {exc}"), 1, float("inf"))
            return
        failed = self._failures.get(pull_spec)
        fingerprint = hashlib.sha256((pull_secret or "").encode()).hexdigest()
        if failed is not None and failed[2] > self.clock():
            # Backing off, unless credentials were refused and these are other credentials.
            if not failed[0].refused or self._refused.get(pull_spec) == fingerprint:
                return
        key = ref.digest or str(ref)
        self._waiting.setdefault(key, set()).add(pull_spec)
        if key not in self._inflight:
            self._refused[pull_spec] = fingerprint  # kept only if this attempt is refused
            self._inflight[key] = asyncio.create_task(self._resolve(key, ref, pull_secret, ca_bundle), name=f"resolve {ref}")

    def due(self, pull_spec: str) -> bool:
        """Whether a failed resolution may be tried again."""
        found = self._failures.get(pull_spec)
        return found is None or found[2] <= self.clock() or found[0].refused

    async def _resolve(self, key: str, ref: Reference, pull_secret: str | None, ca_bundle: str | None) -> None:
        started = time.perf_counter()
        try:
            failure = await self._resolve_once(ref, pull_secret, self.tls(ca_bundle))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug must not leave the release pending for ever
            log.exception("resolving release %s failed", ref)
            failure = Failure(False, f"resolving release {ref} failed: {type(exc).__name__}: {exc}")
        finally:
            self._inflight.pop(key, None)
        self.observe(time.perf_counter() - started)
        for spec in self._waiting.pop(key, set()):
            if failure is None:
                self._failures.pop(spec, None)
                self._refused.pop(spec, None)
            else:
                attempts = (self._failures[spec][1] + 1) if spec in self._failures else 1
                delay = min(self.settings.retry_max, self.settings.retry_min * 2 ** (attempts - 1))
                self._failures[spec] = (failure, attempts, self.clock() + delay)
            self.on_resolved(spec)

    async def _resolve_once(self, ref: Reference, pull_secret: str | None, tls: ssl.SSLContext) -> Failure | None:
        if ref.digest and await self._load(ref.digest):
            return None
        if not ref.digest:
            tagged = self._tags.get(str(ref))
            if tagged and tagged[1] > self.clock() and tagged[0] in self._by_digest:
                return None
        errors: list[tuple[bool, bool, str]] = []  # permanent, not found, message
        refused = False
        candidates = self.mirrors.candidates(ref)
        if not candidates:
            return Failure(True, self.mirrors.refusal(ref), False)
        for candidate in candidates:
            try:
                creds = credentials_for(pull_secret, candidate)
                digest, content = await self._fetch_with(candidate, creds, tls)
            except (RegistryError, AuthError, NotARelease) as exc:
                permanent = not isinstance(exc, Unreachable) and getattr(exc, "permanent", True)
                if isinstance(exc, Unreachable):
                    self.mirrors.failed(candidate.api_host)
                refused = refused or isinstance(exc, (Refused, AuthError))
                errors.append((permanent, isinstance(exc, NotFound), str(exc)))
                log.warning("release %s from %s: %s", ref, candidate.host, exc)
                continue
            self.mirrors.worked(candidate.api_host)
            self.fetched()
            await self._remember(ref, digest, content)
            log.info("release %s resolved from %s: version %s, %d images", ref, candidate.host, content.version or "?", len(content.images))
            return None
        if not ref.digest:
            tag_digest = await self._stored_tag(ref)
            if tag_digest and await self._load(tag_digest):
                log.warning("registry unavailable for %s: using the digest it named last (%s)", ref, tag_digest)
                return None
        message = "; ".join(text for _p, _nf, text in errors) or f"no registry to read {ref} from"
        # Refused credentials or a tampered blob anywhere is a configuration problem worth
        # saying so, even if another mirror was merely unreachable. "Not found" is one only
        # where every registry said so (a mirror not synced yet, the origin down: wait).
        permanent = any(p and not nf for p, nf, _t in errors) or bool(errors) and all(nf for _p, nf, _t in errors)
        return Failure(permanent, message, refused)

    def tls(self, ca_bundle: str | None) -> ssl.SSLContext:
        """The client's trust plus the cluster's additional trust bundle (user-ca-bundle), if any."""
        if not ca_bundle or "BEGIN CERTIFICATE" not in ca_bundle:
            return self.client.ssl_context
        key = hashlib.sha256(ca_bundle.encode()).hexdigest()
        context = self._contexts.get(key)
        if context is None:
            context = self.make_context()
            try:
                context.load_verify_locations(cadata=ca_bundle)
            except (ssl.SSLError, ValueError) as exc:
                log.warning("the user-ca-bundle is not usable for registry TLS, ignoring it: %s", exc)
                return self.client.ssl_context
            self._contexts = {key: context}  # one bundle in use at a time, typically
        return context

    async def _fetch_with(self, ref: Reference, creds: Credentials | None, tls: ssl.SSLContext) -> tuple[str, ReleaseContent]:
        what = str(ref)
        media_type, body, digest = await self.client.manifest(ref, creds, tls)
        sub = pick_manifest(media_type, body, self.settings.architecture, what)
        if sub is not None:
            _media, body, _d = await self.client.manifest(ref.at(sub), creds, tls)
        found: dict[str, bytes] = {}
        # The release manifests live in the top layer: read from the top, stop when both are found.
        for layer in reversed(layer_digests(body, what)):
            with tempfile.TemporaryDirectory(dir=self.work_dir, prefix="layer-") as tmp:
                path = Path(tmp) / "layer"
                await self.client.blob_to_file(ref, layer, creds, path, self.settings.max_layer_bytes, tls)
                layer_files: dict[str, bytes] = {}
                await asyncio.to_thread(extract, path, layer_files)
            for name, data in layer_files.items():
                found.setdefault(name, data)
            if all(name in found for name in WANTED):
                break
        return digest, release_content(found, what)

    async def _remember(self, ref: Reference, digest: str, content: ReleaseContent) -> None:
        self._by_digest[digest] = content
        data = json.dumps({"version": content.version, "images": dict(content.images)}, sort_keys=True).encode()
        await asyncio.to_thread(self.store.save, ReleaseStore.digest_name(digest), data)
        if not ref.digest:
            self._tags[str(ref)] = (digest, self.clock() + self.settings.tag_ttl)
            await asyncio.to_thread(self.store.save, ReleaseStore.tag_name(ref), digest.encode())

    async def _load(self, digest: str) -> bool:
        if digest in self._by_digest:
            return True
        data = await asyncio.to_thread(self.store.load, ReleaseStore.digest_name(digest))
        if data is None:
            return False
        try:
            stored = json.loads(data)
            self._by_digest[digest] = ReleaseContent(str(stored["version"]), dict(stored["images"]))
        except (ValueError, KeyError, TypeError):
            return False
        return True

    async def _stored_tag(self, ref: Reference) -> str | None:
        data = await asyncio.to_thread(self.store.load, ReleaseStore.tag_name(ref))
        if not data:
            return None
        digest = data.decode(errors="replace")
        # Known, if stale: used for a little while, then the registry is asked again.
        self._tags[str(ref)] = (digest, self.clock() + self.settings.retry_min * 15)
        return digest
