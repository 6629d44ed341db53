"""FIPS mode: only FIPS-approved algorithms on the wire (AES-GCM, SHA-2, ECDHE, ECDSA/RSA; no
ChaCha20), and a word at start-up on which OpenSSL and provider are in use.

Python's ssl module cannot choose TLS 1.3 suites, so the process runs with an OpenSSL
configuration that sets them for every TLS context (OpenSSL's `system_default` section): the
CLI re-executes itself once with OPENSSL_CONF pointing at it, before any TLS context exists.
That configuration is a file shipped with the package (`fips-openssl.cnf`), not one written at
start: a temporary file per start stayed in /tmp for good (worker processes, started again at any
time, read it too, so it could not be removed once read). The TLS 1.2 ciphers come from the TLS
profile, restricted here to AES-GCM.
"""

from __future__ import annotations

import os
import ssl
import sys
from pathlib import Path
from typing import Sequence

from .profiles import TLSProfile

MARKER = "IGNITION_SERVER_FIPS_OPENSSL_CONF"
OPENSSL_CONF = Path(__file__).with_name("fips-openssl.cnf")


def _setting(name: str) -> str:
    """A setting of the shipped configuration: the suites are written once, there."""
    for line in OPENSSL_CONF.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == name:
            return value.strip()
    raise LookupError(f"{OPENSSL_CONF} sets no {name}")


TLS13_SUITES = _setting("Ciphersuites")
TLS12_CIPHERS = _setting("CipherString")


def reexec_with_fips_openssl(argv: Sequence[str]) -> None:
    """Run this command again under the FIPS OpenSSL configuration (once)."""
    if os.environ.get(MARKER):
        return
    env = {**os.environ, "OPENSSL_CONF": str(OPENSSL_CONF), MARKER: str(OPENSSL_CONF)}
    os.execve(sys.executable, [sys.executable, "-m", "ignition_server", *argv], env)


def fips_profile(profile: TLSProfile) -> TLSProfile:
    """The profile with only FIPS-approved ciphers (its minimum version kept)."""
    if profile.min_version in ("VersionTLS10", "VersionTLS11"):
        raise ValueError("--fips needs TLS 1.2 or later: not with the Old profile")
    if profile.name == "Custom":
        refused = [c for c in profile.ciphers.split(":") if c and "GCM" not in c]
        if refused:
            raise ValueError(f"--fips: not FIPS-approved: {', '.join(refused)}")
        return profile
    return TLSProfile(f"{profile.name}+FIPS", profile.min_version, TLS12_CIPHERS)


def describe() -> str:
    provider = "unknown"
    try:
        from cryptography.hazmat.backends.openssl.backend import backend

        provider = "FIPS provider active" if getattr(backend, "_fips_enabled", False) else \
            "default provider (no FIPS provider active: algorithms restricted, module not validated)"
    except ImportError:
        pass
    return (f"FIPS mode: {ssl.OPENSSL_VERSION}, {provider}; TLS 1.3 suites {TLS13_SUITES}; "
            f"TLS 1.2 ciphers {TLS12_CIPHERS}")
