"""TLS security profiles (OpenShift's Old/Intermediate/Modern/Custom), checked with real handshakes."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from testsupport.harness import ServerProcess, handshakes


def handshake(proc: ServerProcess, *, max_version: ssl.TLSVersion | None = None, ciphers: str | None = None) -> str | None:
    """The negotiated cipher, or None when the server refused the handshake."""
    context = ssl.create_default_context(cafile=str(proc.ca_file))
    if max_version is not None:
        context.maximum_version = max_version
    if ciphers is not None:
        context.set_ciphers(ciphers)
    try:
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                return tls.cipher()[0]
    except ssl.SSLError:
        return None


@pytest.fixture
def serve(tmp_path: Path):
    started: list[ServerProcess] = []

    def start(*flags: str) -> ServerProcess:
        (tmp_path / "source").mkdir(exist_ok=True)
        proc = ServerProcess(tmp_path / "source", tmp_path / f"cache{len(started)}", extra=list(flags)).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


def test_modern_refuses_tls12_and_default_takes_it(serve) -> None:
    modern = serve("--tls-profile", "Modern")
    assert handshake(modern, max_version=ssl.TLSVersion.TLSv1_2) is None
    assert handshake(modern) is not None  # TLS 1.3
    default = serve()
    assert handshake(default, max_version=ssl.TLSVersion.TLSv1_2) is not None


def test_custom_takes_only_its_ciphers(serve) -> None:
    custom = serve("--tls-profile", "Custom", "--tls-min-version", "VersionTLS12",
                   "--tls-ciphers", "ECDHE-ECDSA-AES256-GCM-SHA384")
    assert handshake(custom, max_version=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE-ECDSA-AES256-GCM-SHA384") \
        == "ECDHE-ECDSA-AES256-GCM-SHA384"
    assert handshake(custom, max_version=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE-ECDSA-CHACHA20-POLY1305") is None


def test_a_custom_profile_with_an_unknown_cipher_stops_at_start_up(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "ignition_server", "serve", "--source", str(tmp_path),
                             "--cache-dir", str(tmp_path / "cache"), "--tls-profile", "Custom",
                             "--tls-min-version", "VersionTLS12", "--tls-ciphers", "NOT-A-CIPHER"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "cipher" in result.stderr.lower(), result.stderr


def s_client(proc: ServerProcess, *args: str) -> bool:
    """Whether the real OpenSSL client completes a handshake with these options."""
    return handshakes(proc.port, proc.ca_file, *args)


def test_fips_mode_refuses_chacha20_and_says_what_it_runs_on(serve) -> None:
    default = serve()
    assert s_client(default, "-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256")  # the check can fail
    fips = serve("--fips")
    assert not s_client(fips, "-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256")
    assert not s_client(fips, "-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305")
    assert s_client(fips, "-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256")
    assert s_client(fips, "-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384")
    assert "FIPS mode: OpenSSL" in fips.logs()


def test_fips_mode_writes_no_file_and_its_workers_run_under_it(serve, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The configuration it re-executes under was a temporary file per start, left in /tmp for good.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the server's, and the temp files' of anything it starts
    fips = serve("--fips", "--workers", "2")  # every serving process reads the configuration
    for _ in range(8):  # connections spread over both workers by the kernel: each must refuse
        assert not s_client(fips, "-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256")
    assert s_client(fips, "-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256")
    assert fips.stop() == 0
    assert list(scratch.iterdir()) == []


def weak_handshake(proc: ServerProcess, *, version: ssl.TLSVersion, ciphers: str) -> str | None:
    """What a client that offers old versions and NULL ciphers (OpenSSL's security level 0) gets."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = context.maximum_version = version
    context.set_ciphers(ciphers + ":@SECLEVEL=0")
    try:
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as raw:
            with context.wrap_socket(raw) as tls:
                return tls.cipher()[0]
    except (ssl.SSLError, ConnectionResetError):
        return None


def test_custom_never_goes_below_tls12_nor_offers_null_ciphers(serve) -> None:
    # What a review served a payload over: TLS 1.0 and ECDHE-ECDSA-NULL-SHA, both named in a Custom profile.
    custom = serve("--tls-profile", "Custom", "--tls-min-version", "VersionTLS10",
                   "--tls-ciphers", "@SECLEVEL=0:ECDHE-ECDSA-NULL-SHA:ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES128-GCM-SHA256")
    assert weak_handshake(custom, version=ssl.TLSVersion.TLSv1, ciphers="ECDHE-ECDSA-AES128-SHA") is None
    assert weak_handshake(custom, version=ssl.TLSVersion.TLSv1_1, ciphers="ECDHE-ECDSA-AES128-SHA") is None
    assert weak_handshake(custom, version=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE-ECDSA-NULL-SHA") is None
    assert weak_handshake(custom, version=ssl.TLSVersion.TLSv1_2, ciphers="aNULL:eNULL:EXPORT") is None
    assert weak_handshake(custom, version=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE-ECDSA-AES128-SHA") \
        == "ECDHE-ECDSA-AES128-SHA"
    assert "raised to VersionTLS12" in custom.logs()
