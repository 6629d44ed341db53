"""FIPS mode: only FIPS-approved algorithms on the wire (AES-GCM, SHA-2, ECDHE, ECDSA/RSA; no
ChaCha20), and a word at start-up on which OpenSSL and provider are in use.

Python's ssl module cannot choose TLS 1.3 suites, so the process runs with an OpenSSL
configuration that sets them for every TLS context (OpenSSL's `system_default` section): the
CLI re-executes itself once with OPENSSL_CONF pointing at it, before any TLS context exists.
The TLS 1.2 ciphers come from the TLS profile, restricted here to AES-GCM.
"""

from __future__ import annotations

import os
import ssl
import sys
import tempfile
from typing import Sequence

from .profiles import TLSProfile

MARKER = "IGNITION_SERVER_FIPS_OPENSSL_CONF"
TLS13_SUITES = "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256"
TLS12_CIPHERS = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384"
_CONFIG = f"""openssl_conf = openssl_init
[openssl_init]
ssl_conf = ssl_sect
[ssl_sect]
system_default = fips_tls
[fips_tls]
Ciphersuites = {TLS13_SUITES}
CipherString = {TLS12_CIPHERS}
"""


def reexec_with_fips_openssl(argv: Sequence[str]) -> None:
    """Run this command again under the FIPS OpenSSL configuration (once)."""
    if os.environ.get(MARKER):
        return
    handle, path = tempfile.mkstemp(prefix="ignition-server-fips-", suffix=".cnf")
    with os.fdopen(handle, "w") as out:
        out.write(_CONFIG)
    env = {**os.environ, "OPENSSL_CONF": path, MARKER: path}
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
