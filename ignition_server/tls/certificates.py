"""TLS for the serving port: a self-made CA when none is given, and reload on change.

Without `--tls-cert` the server makes a CA and a serving certificate in the cache dir on
first start and reuses them later, so the embedded default runs with TLS out of the box;
pointer configs trust that CA.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import logging
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .profiles import TLSProfile

log = logging.getLogger("ignition_server.tls")

CA_VALIDITY = dt.timedelta(days=3650)
SERVING_VALIDITY = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class TLSFiles:
    cert: Path
    key: Path
    ca: Path | None  # the CA pointer configs must trust, when we made it


def subject_names(public_url: str | None) -> list[str]:
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname()]
    if public_url:
        host = urlsplit(public_url if "//" in public_url else f"https://{public_url}").hostname
        if host:
            names.insert(0, host)
    return list(dict.fromkeys(names))


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_ca(validity: dt.timedelta = CA_VALIDITY) -> tuple[bytes, bytes]:
    """A new self-signed CA: (certificate PEM, key PEM)."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ignition-server CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - min(dt.timedelta(minutes=5), validity / 10))  # clock skew, not a share of its life
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_cert.public_bytes(serialization.Encoding.PEM), _key_pem(ca_key)


def ensure_self_signed(directory: Path, public_url: str | None, ca_validity: dt.timedelta = CA_VALIDITY) -> TLSFiles:
    """Make (or reuse) a CA and a serving certificate for `public_url` under `directory`.

    `ca.crt` may hold several CAs (a CA rotation's overlap): the first one signs."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_cert_path, ca_key_path = directory / "ca.crt", directory / "ca.key"
    cert_path, key_path = directory / "serving.crt", directory / "serving.key"
    now = dt.datetime.now(dt.timezone.utc)
    if ca_cert_path.exists() and ca_key_path.exists():
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    else:
        cert_pem, key_pem = make_ca(ca_validity)
        _write_private(ca_key_path, key_pem)
        ca_cert_path.write_bytes(cert_pem)
        ca_cert = x509.load_pem_x509_certificate(cert_pem)
        ca_key = serialization.load_pem_private_key(key_pem, password=None)
        log.info("made a new CA for the serving certificate: %s", ca_cert_path)
    names = subject_names(public_url)
    if cert_path.exists() and key_path.exists() and _still_good(cert_path, names, now, ca_cert):
        return TLSFiles(cert_path, key_path, ca_cert_path)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + SERVING_VALIDITY)
        .add_extension(_san(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False  # type: ignore[arg-type]
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    _write_private(key_path, _key_pem(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(serialization.Encoding.PEM))
    return TLSFiles(cert_path, key_path, ca_cert_path)


def _still_good(cert_path: Path, names: list[str], now: dt.datetime, ca_cert: x509.Certificate) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        cert.verify_directly_issued_by(ca_cert)  # signed by the CA that signs now (a CA rotation switched?)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
        return False
    have = {str(v) for v in san.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in san.get_values_for_type(x509.IPAddress)}
    return cert.not_valid_after_utc - now > RENEW_BEFORE and set(names) <= have


def server_context(files: TLSFiles, profile: TLSProfile = TLSProfile()) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    profile.apply(context)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    # No session tickets: a booting node never resumes a session (every boot is a full
    # handshake), so each ticket was an encryption and a record written for nothing, per
    # connection, in exactly the moment that matters (a boot storm).
    context.options |= ssl.OP_NO_TICKET
    context.num_tickets = 0
    load_pair(context, files)
    return context


def serving_context(files: TLSFiles, profile: TLSProfile) -> tuple[ssl.SSLContext, tuple[int, int]]:
    """The serving context, and the `pair_stamp` to hand `reload_on_change`: taken before the
    load, so that a pair replaced in between is reloaded rather than taken for the one loaded."""
    loaded = pair_stamp(files)
    return server_context(files, profile), loaded


def load_pair(context: ssl.SSLContext, files: TLSFiles) -> None:
    """Load the certificate and key into `context` only if they match (ssl.SSLError if not).

    OpenSSL takes the certificate into the context before it checks the key: a live context
    handed a new certificate and an old key served that mismatched pair, and every handshake
    failed. So both files are read once, tried on a scratch context, and the same bytes (not
    the files again, which may change meanwhile) then go into the live one, from memory."""
    pem = files.cert.read_bytes() + b"\n" + files.key.read_bytes()
    fd = os.memfd_create("tls-pair", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        path = f"/proc/self/fd/{fd}"
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(path)
        except ssl.SSLError as exc:
            raise ssl.SSLError(f"the key in {files.key} does not match the certificate in {files.cert} "
                               f"(or either is unreadable): {exc}") from None
        context.load_cert_chain(path)
    finally:
        os.close(fd)


def pair_stamp(files: TLSFiles) -> tuple[int, int]:
    """When the certificate and the key last changed on disk."""
    return (files.cert.stat().st_mtime_ns, files.key.stat().st_mtime_ns)


async def reload_on_change(context: ssl.SSLContext, files: TLSFiles, *, loaded: tuple[int, int],
                           interval: float = 5.0) -> None:
    """Load a changed certificate/key into the live context: new handshakes use it, no restart.

    `loaded` is the pair's `pair_stamp` taken before the context loaded it: a pair replaced
    while the process was starting (after the load, before this task's first look) is a change
    too. Stamped here instead, such a process served the old pair until the next change on
    disk, while the others served the new one."""
    seen = loaded
    failed: tuple[int, int] | None = loaded  # None: the files could not be read at all
    while True:
        await asyncio.sleep(interval)
        current = None
        try:
            current = pair_stamp(files)
            if current != seen:
                load_pair(context, files)
                seen = current
                log.info("reloaded the serving certificate from %s", files.cert)
        except (OSError, ssl.SSLError) as exc:
            if current != failed:  # once per change on disk, not every few seconds until the other half comes
                failed = current
                log.warning("serving certificate not reloaded (keeping the current pair): %s", exc)
