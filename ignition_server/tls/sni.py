"""A serving certificate per hostname, chosen by SNI: one server, many clusters' hostnames.

With `--take-over`, every taken-over HostedControlPlane publishes its `Ignition` service as a Route
with a hostname of its own, and its nodes verify the server with the CA of its
`ignition-server-ca-cert` Secret (the self-made CA: the same for every cluster). One certificate
naming every cluster would show each tenant the others' hostnames and grow every handshake by
them; instead the process that learns the hostnames (the takeover, from the HCPs it watches)
writes them to `sni-hosts.json` beside the CA, and each serving process (the owner, or each
worker) issues a certificate for a listed name the first time a ClientHello asks for it (a few
milliseconds: an EC key and a signature), signed by the CA that signs the default certificate,
and keeps its context. An unlisted name, or no name, gets the default certificate (`--public-url`'s):
a ClientHello never makes the server sign a name it was not told about.

The contexts are dropped when `ca.crt` changes (a CA rotation: the next handshake gets a
certificate from the CA that signs now) and renewed as the default one is, before expiry.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
import ssl
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509

from ..fsio import atomic_write
from .certificates import (
    RENEW_BEFORE,
    SERVING_VALIDITY,
    PrivateKey,
    TLSFiles,
    _write_private,
    issue_serving,
    private_key_pem,
    read_private_key,
    server_context,
)
from .profiles import TLSProfile

log = logging.getLogger("ignition_server.tls")

HOSTS_FILE = "sni-hosts.json"
_SHM = Path("/dev/shm")
_HOST_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")


def is_host_name(name: str) -> bool:
    """A lowercase DNS name (no trailing dot, no wildcard): safe as a file name and a HAProxy SNI filter."""
    return _HOST_NAME.fullmatch(name) is not None


def write_hosts(directory: Path, hosts: Iterable[str]) -> None:
    """The hostnames the serving processes may issue certificates for (the takeover's Routes)."""
    atomic_write(directory / HOSTS_FILE, json.dumps(sorted({h.lower().rstrip(".") for h in hosts})).encode())


def read_hosts(directory: Path) -> frozenset[str]:
    """The listed hostnames (none without a list); OSError or ValueError when the list is unreadable."""
    if not (directory / HOSTS_FILE).exists():
        return frozenset()
    return frozenset(str(h) for h in json.loads((directory / HOSTS_FILE).read_text()))


def ca_signer(directory: Path, password: bytes | None) -> tuple[x509.Certificate, PrivateKey]:
    """The CA that signs now (the first of `ca.crt`) with its key, unsealed in memory only."""
    return (x509.load_pem_x509_certificate(directory.joinpath("ca.crt").read_bytes()),
            read_private_key(directory / "ca.key", password))


def stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


@dataclass
class HostCertificates:
    """The per-hostname contexts of one serving process; `install` puts its SNI callback on the
    default context, `refresh` (every few seconds, `refresh_periodically`) rereads the list and the CA."""

    files: TLSFiles
    profile: TLSProfile
    clock: type[dt.datetime] = dt.datetime
    _hosts: frozenset[str] = frozenset()
    _hosts_stamp: tuple[int, int] | None = None
    _ca_stamp: tuple[int, int] | None = None
    _contexts: dict[str, tuple[ssl.SSLContext, dt.datetime]] = field(default_factory=dict)
    # The CA that signs now, read once per ca.crt (its key is encrypted at rest: unsealing it is
    # most of an issue's cost, ~30 ms against ~3 ms).
    _signer: tuple[x509.Certificate, PrivateKey] | None = field(default=None, repr=False)

    @classmethod
    def for_files(cls, files: TLSFiles, profile: TLSProfile) -> "HostCertificates | None":
        """None when the server does not hold the CA's key (a certificate of the operator's own)."""
        if files.ca is None or not (files.ca.parent / "ca.key").exists():
            return None
        hosts = cls(files, profile)
        hosts.refresh()
        return hosts

    @property
    def directory(self) -> Path:
        assert self.files.ca is not None
        return self.files.ca.parent

    def install(self, context: ssl.SSLContext) -> None:
        context.sni_callback = self._select

    def refresh(self) -> None:
        hosts_stamp = stamp(self.directory / HOSTS_FILE)
        if hosts_stamp != self._hosts_stamp:
            self._hosts_stamp = hosts_stamp
            try:
                self._hosts = read_hosts(self.directory)
            except (OSError, ValueError) as exc:
                log.warning("%s not read (keeping the hostnames known): %s", HOSTS_FILE, exc)
            self._contexts = {h: c for h, c in self._contexts.items() if h in self._hosts}
        ca_stamp = stamp(self.directory / "ca.crt")
        if ca_stamp != self._ca_stamp:
            self._ca_stamp = ca_stamp
            self._contexts.clear()
            self._signer = None

    def _select(self, sslobj: ssl.SSLObject, server_name: str | None, _default: ssl.SSLContext) -> None:
        if not server_name:
            return
        name = server_name.lower().rstrip(".")
        if name not in self._hosts:
            return
        now = self.clock.now(dt.timezone.utc)
        held = self._contexts.get(name)
        if held is None or now - held[1] > SERVING_VALIDITY - RENEW_BEFORE:
            try:
                held = (self._issue(name, now), now)
            except (OSError, ValueError, ssl.SSLError) as exc:
                log.error("no certificate for %s (serving the default one): %s", name, exc)
                return
            self._contexts[name] = held
        sslobj.context = held[0]

    def _issue(self, name: str, now: dt.datetime) -> ssl.SSLContext:
        if self._signer is None:
            self._signer = ca_signer(self.directory, self.files.password)
        chain, key = issue_serving(*self._signer, [name], now)
        # The ssl module loads a pair only from files: a private directory, gone once loaded, in
        # memory where there is a tmpfs (the key never reaches a disk; and it is quicker).
        with tempfile.TemporaryDirectory(prefix="sni-", dir=_SHM if _SHM.is_dir() else None) as scratch:
            cert_path, key_path = Path(scratch) / "tls.crt", Path(scratch) / "tls.key"
            cert_path.write_bytes(chain)
            _write_private(key_path, private_key_pem(key))
            return server_context(TLSFiles(cert_path, key_path, None), self.profile)


async def refresh_periodically(hosts: HostCertificates, interval: float = 5.0) -> None:
    while True:
        await asyncio.sleep(interval)
        hosts.refresh()
