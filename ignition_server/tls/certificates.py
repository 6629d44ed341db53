"""TLS for the serving port: a self-made CA when none is given, and reload on change.

Without `--tls-cert` the server makes a CA and a serving certificate in the cache dir on
first start and reuses them later, so the embedded default runs with TLS out of the box;
pointer configs trust that CA.

The private keys it keeps there are encrypted PKCS#8 (PBES2: PBKDF2-HMAC-SHA256, AES-256-CBC)
under a password derived from the cache key (`PayloadCache.derived_secret`), which lives
outside the cache dir: a copy of the cache dir, or a snapshot of its volume, holds no key that
could pose as this server. OpenSSL loads them with the password (`load_cert_chain`); a key
found in plaintext (written by an older server) is encrypted in place, the same key, so the
certificate stays. Without a password (`password=None`: the tests, tools) keys are plaintext.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import logging
import os
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..fsio import atomic_write
from .profiles import TLSProfile

log = logging.getLogger("ignition_server.tls")

CA_VALIDITY = dt.timedelta(days=3650)
SERVING_VALIDITY = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=30)

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
# What the cache key derives the private keys' password for (PayloadCache.derived_secret).
PASSWORD_PURPOSE = "tls-private-keys"


@dataclass(frozen=True)
class TLSFiles:
    cert: Path
    key: Path
    ca: Path | None  # the CA pointer configs must trust, when we made it
    # What the key file is encrypted under (the self-made pair in the cache dir); None: plaintext.
    password: bytes | None = field(default=None, repr=False, compare=False)

    def key_pem(self) -> bytes:
        """The private key, plaintext PKCS#8 PEM (for a front proxy that terminates TLS with it)."""
        return private_key_pem(read_private_key(self.key, self.password))


class KeyUnreadable(ValueError):
    """A private key file that cannot be read with the password at hand (or at all)."""


_ENCRYPTED = b"-----BEGIN ENCRYPTED PRIVATE KEY-----"


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


def private_key_pem(key: PrivateKey, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def is_encrypted(pem: bytes) -> bool:
    return pem.lstrip().startswith(_ENCRYPTED)


def parse_private_key(pem: bytes, password: bytes | None, where: object = "a private key") -> PrivateKey:
    """A PEM private key, encrypted (with `password`) or not."""
    try:
        key = serialization.load_pem_private_key(pem, password=password if is_encrypted(pem) else None)
    except (ValueError, TypeError) as exc:
        if is_encrypted(pem):
            raise KeyUnreadable(f"{where} is encrypted under another cache key (or none is at hand): restore the cache "
                                "key file it was made with, or remove the TLS directory to make a new CA (pointer "
                                "configs must then trust it)") from None
        raise KeyUnreadable(f"{where} is not a PEM private key: {exc}") from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise KeyUnreadable(f"{where} is a {type(key).__name__}, not an EC or RSA key")
    return key


def read_private_key(path: Path, password: bytes | None) -> PrivateKey:
    return parse_private_key(path.read_bytes(), password, path)


def plaintext_key_pem(pem: bytes, password: bytes | None) -> bytes:
    """`pem` (encrypted or not) as plaintext PKCS#8 PEM: what two copies of one key compare by."""
    return private_key_pem(parse_private_key(pem, password))


def sealed_key_pem(pem: bytes, password: bytes | None) -> bytes:
    """A plaintext PEM key (a Secret's, a new CA's) as it is kept on disk: encrypted under `password`."""
    return private_key_pem(parse_private_key(pem, None), password) if password else pem


def write_private_key(path: Path, pem: bytes, password: bytes | None) -> None:
    """Write a key (given as plaintext PEM) encrypted under `password`, unless the file holds it already."""
    if path.exists():
        try:
            current = path.read_bytes()
            if plaintext_key_pem(current, password) == plaintext_key_pem(pem, None) \
                    and (is_encrypted(current) or not password):
                return
        except (OSError, KeyUnreadable):
            pass
    atomic_write(path, sealed_key_pem(pem, password), 0o600)


def seal_in_place(path: Path, password: bytes | None) -> None:
    """A plaintext key left by an older server, encrypted: the same key, so its certificate stays."""
    if password and path.exists() and not is_encrypted(path.read_bytes()):
        atomic_write(path, private_key_pem(read_private_key(path, None), password), 0o600)
        log.info("encrypted %s under the cache key", path)


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
    return ca_cert.public_bytes(serialization.Encoding.PEM), private_key_pem(ca_key)


def ensure_self_signed(directory: Path, public_url: str | None, ca_validity: dt.timedelta = CA_VALIDITY,
                       password: bytes | None = None) -> TLSFiles:
    """Make (or reuse) a CA and a serving certificate for `public_url` under `directory`, their
    private keys encrypted under `password` (KeyUnreadable: a key is under another password).

    `ca.crt` may hold several CAs (a CA rotation's overlap): the first one signs."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_cert_path, ca_key_path = directory / "ca.crt", directory / "ca.key"
    cert_path, key_path = directory / "serving.crt", directory / "serving.key"
    now = dt.datetime.now(dt.timezone.utc)
    for path in (ca_key_path, directory / "next-ca.key", key_path):
        seal_in_place(path, password)
    if ca_cert_path.exists() and ca_key_path.exists():
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        ca_key = read_private_key(ca_key_path, password)
    else:
        cert_pem, key_pem = make_ca(ca_validity)
        _write_private(ca_key_path, sealed_key_pem(key_pem, password))
        ca_cert_path.write_bytes(cert_pem)
        ca_cert = x509.load_pem_x509_certificate(cert_pem)
        ca_key = parse_private_key(key_pem, None)
        log.info("made a new CA for the serving certificate: %s", ca_cert_path)
    names = subject_names(public_url)
    if cert_path.exists() and key_path.exists() and _still_good(cert_path, names, now, ca_cert):
        read_private_key(key_path, password)  # readable with this password, or say so now
        return TLSFiles(cert_path, key_path, ca_cert_path, password)
    chain, key = issue_serving(ca_cert, ca_key, names, now)
    _write_private(key_path, private_key_pem(key, password))
    cert_path.write_bytes(chain)
    return TLSFiles(cert_path, key_path, ca_cert_path, password)


def issue_serving(ca_cert: x509.Certificate, ca_key: PrivateKey, names: list[str],
                  now: dt.datetime) -> tuple[bytes, ec.EllipticCurvePrivateKey]:
    """A serving certificate for `names` (the first is its CN) signed by the CA: the chain (leaf,
    then the CA) as PEM, and its new key."""
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
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(serialization.Encoding.PEM), key


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
    the files again, which may change meanwhile) then go into the live one, from memory.
    An encrypted key is loaded with `files.password` (never OpenSSL's prompt: an empty one
    when there is none, which fails)."""
    pem = files.cert.read_bytes() + b"\n" + files.key.read_bytes()
    password = files.password or b""
    fd = os.memfd_create("tls-pair", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        path = f"/proc/self/fd/{fd}"
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(path, password=password)
        except ssl.SSLError as exc:
            raise ssl.SSLError(f"the key in {files.key} does not match the certificate in {files.cert} "
                               f"(or either is unreadable): {exc}") from None
        context.load_cert_chain(path, password=password)
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
