"""TLS security profiles as the cluster sets them (OpenShift's `tlsSecurityProfile`: Old,
Intermediate, Modern, Custom; HyperShift's ignition server follows the same setting).

Cipher lists are OpenShift's, in OpenSSL's names; TLS 1.3 suites are not configurable through
Python's ssl module and are OpenSSL's (all AEAD). The default stays what the server always
served: Intermediate's minimum (TLS 1.2) with ECDHE and AEAD ciphers only.

Whatever a profile names, NULL (no encryption), anonymous (no authentication) and export
ciphers are never offered, and a Custom profile never goes below TLS 1.2: a review served a
payload (it holds a token and a pull secret) over TLS 1.0 and ECDHE-ECDSA-NULL-SHA because a
Custom profile named them. Old stays OpenShift's own profile, as the cluster asks.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass

log = logging.getLogger("ignition_server.tls")

_INTERMEDIATE = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384"
)
_OLD = _INTERMEDIATE + (
    ":ECDHE-ECDSA-AES128-SHA256:ECDHE-RSA-AES128-SHA256:ECDHE-ECDSA-AES128-SHA:ECDHE-RSA-AES128-SHA:"
    "ECDHE-ECDSA-AES256-SHA384:ECDHE-RSA-AES256-SHA384:ECDHE-ECDSA-AES256-SHA:ECDHE-RSA-AES256-SHA:"
    "DHE-RSA-AES128-SHA256:DHE-RSA-AES256-SHA256:AES128-GCM-SHA256:AES256-GCM-SHA384:AES128-SHA256:"
    "AES256-SHA256:AES128-SHA:AES256-SHA:DES-CBC3-SHA"
)
_VERSIONS = {"VersionTLS10": ssl.TLSVersion.TLSv1, "VersionTLS11": ssl.TLSVersion.TLSv1_1,
             "VersionTLS12": ssl.TLSVersion.TLSv1_2, "VersionTLS13": ssl.TLSVersion.TLSv1_3}
DEFAULT_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
# Appended to every list: "!" removes for good, whatever came before (a "@SECLEVEL=0" too).
NEVER_OFFERED = ":!aNULL:!eNULL:!NULL:!EXPORT:!LOW"
CUSTOM_FLOOR = "VersionTLS12"


@dataclass(frozen=True)
class TLSProfile:
    name: str = "Default"
    min_version: str = "VersionTLS12"
    ciphers: str = DEFAULT_CIPHERS

    def apply(self, context: ssl.SSLContext) -> None:
        context.minimum_version = _VERSIONS[self.min_version]
        if self.min_version != "VersionTLS13":  # TLS 1.3 suites are OpenSSL's own
            context.set_ciphers(self.ciphers + NEVER_OFFERED)


def profile(name: str, *, min_version: str | None = None, ciphers: str | None = None) -> TLSProfile:
    """The named profile; Custom takes `min_version` (VersionTLS10..13) and `ciphers` (OpenSSL names)."""
    if name == "Default":
        return TLSProfile()
    if name == "Old":
        return TLSProfile("Old", "VersionTLS10", _OLD)
    if name == "Intermediate":
        return TLSProfile("Intermediate", "VersionTLS12", _INTERMEDIATE)
    if name == "Modern":
        return TLSProfile("Modern", "VersionTLS13", "")
    if name == "Custom":
        if min_version not in _VERSIONS:
            raise ValueError(f"--tls-min-version must be one of {', '.join(_VERSIONS)} with --tls-profile Custom")
        if not ciphers and min_version != "VersionTLS13":
            raise ValueError("--tls-ciphers is needed with --tls-profile Custom below TLS 1.3")
        if list(_VERSIONS).index(min_version) < list(_VERSIONS).index(CUSTOM_FLOOR):
            log.warning("--tls-min-version %s raised to %s: TLS 1.0 and 1.1 are never served", min_version, CUSTOM_FLOOR)
            min_version = CUSTOM_FLOOR
        checked = TLSProfile("Custom", min_version, ciphers or "")
        try:
            checked.apply(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))  # an unknown cipher fails here, at start-up
        except ssl.SSLError:
            raise ValueError(f"--tls-ciphers {ciphers!r}: OpenSSL knows no cipher in that list that may be offered "
                             "(NULL, anonymous and export ciphers never are)") from None
        return checked
    raise ValueError(f"unknown TLS profile {name!r} (Old, Intermediate, Modern, Custom)")
