"""The self-made CA's and serving certificate's private keys at rest (issue 31, item 6): in the
cache dir they are encrypted PKCS#8 under a password derived from the cache key, which lives
outside it. A copy of the cache dir (a volume snapshot) without the key file holds no key that
could pose as the server; the server itself, its workers, a restart, a CA rotation and the
replicas' shared Secret all keep working."""

from __future__ import annotations

import base64
import datetime as dt
import shutil
import socket
import ssl
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from ignition_server.tls.ca_rotation import CARotation, DirectoryStore
from ignition_server.tls.certificates import (
    PASSWORD_PURPOSE as PURPOSE,
    KeyUnreadable,
    TLSFiles,
    ensure_self_signed,
    is_encrypted,
    make_ca,
    server_context,
)
from payload_cache.keys import KeyRing, load_key_file
from testsupport.harness import ServerProcess, wait_for, write_manifests
from testsupport.kubeapi import KubeAPI
from testsupport.manifests import build_token_secret

PLAINTEXT = (b"BEGIN PRIVATE KEY", b"BEGIN EC PRIVATE KEY", b"BEGIN RSA PRIVATE KEY")


def plaintext_keys(directory: Path) -> list[Path]:
    """Files under `directory` holding a private key in the clear."""
    return [p for p in directory.rglob("*") if p.is_file() and any(m in p.read_bytes() for m in PLAINTEXT)]


def served_certificate(port: int, ca: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def password_of(cache_dir: Path) -> bytes:
    """The password, from the key file beside the cache dir (`<cache-dir>.key`), as server.py derives it."""
    return base64.b64encode(load_key_file(Path(str(cache_dir) + ".key")).derived(PURPOSE))


def test_the_served_keys_are_encrypted_and_a_restart_serves_the_same_certificate(tmp_path: Path) -> None:
    source, cache_dir = tmp_path / "source", tmp_path / "state" / "cache"
    write_manifests(source / "p.yaml", build_token_secret(namespace="ns", nodepool="ns/p", token="t"))
    proc = ServerProcess(source, cache_dir, extra=["--workers", "2"]).start()  # the workers load the key too
    first = {served_certificate(proc.port, proc.ca_file) for _ in range(8)}
    assert len(first) == 1
    assert proc.stop() == 0
    tls = cache_dir / "tls"
    assert plaintext_keys(tmp_path / "state") == [] and plaintext_keys(cache_dir) == []
    for name in ("ca.key", "serving.key"):
        assert is_encrypted((tls / name).read_bytes()), name
    again = ServerProcess(source, cache_dir, extra=["--workers", "2"]).start()
    assert {served_certificate(again.port, again.ca_file) for _ in range(8)} == first
    assert plaintext_keys(cache_dir) == []
    again.stop()


def test_a_copy_of_the_cache_dir_without_the_key_file_cannot_load_the_keys(tmp_path: Path) -> None:
    source, cache_dir = tmp_path / "source", tmp_path / "state" / "cache"
    write_manifests(source / "p.yaml", build_token_secret(namespace="ns", nodepool="ns/p", token="t"))
    proc = ServerProcess(source, cache_dir, extra=["--workers", "0"]).start()
    proc.stop()
    copy = tmp_path / "snapshot" / "cache"
    shutil.copytree(cache_dir, copy)  # the directory, not <cache-dir>.key beside it
    tls = copy / "tls"
    for name in ("ca.key", "serving.key"):
        with pytest.raises((TypeError, ValueError)):
            serialization.load_pem_private_key((tls / name).read_bytes(), password=None)
    with pytest.raises(ssl.SSLError):
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(tls / "serving.crt", tls / "serving.key", password=b"")
    with pytest.raises(ssl.SSLError):
        server_context(TLSFiles(tls / "serving.crt", tls / "serving.key", None))
    with pytest.raises(KeyUnreadable, match="another cache key"):
        ensure_self_signed(tls, "https://127.0.0.1")
    with pytest.raises(KeyUnreadable, match="another cache key"):
        ensure_self_signed(tls, "https://127.0.0.1", password=base64.b64encode(KeyRing.generate().derived(PURPOSE)))
    # A server started on the copy (it makes a new cache key) says so and stops: it makes no new CA
    # behind the pointer configs' back.
    thief = ServerProcess(source, copy, extra=["--workers", "0"]).start(wait=False)
    assert thief.proc is not None and thief.proc.wait(60) != 0
    assert "encrypted under another cache key" in thief.logs()
    # With the key file, the copy is the server's (that is what the key file is for).
    shutil.copy(cache_dir.parent / "cache.key", copy.parent / "cache.key")
    files = ensure_self_signed(tls, "https://127.0.0.1", password=password_of(copy))
    assert files.cert.read_bytes() == (cache_dir / "tls" / "serving.crt").read_bytes()
    server_context(files)


def test_keys_an_older_server_left_in_plaintext_are_encrypted_in_place_and_the_certificate_stays(tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    old = ensure_self_signed(tls, "https://127.0.0.1")  # as a server before this change wrote them
    cert = old.cert.read_bytes()
    public = serialization.load_pem_private_key(old.key.read_bytes(), None).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert plaintext_keys(tls)
    new = ensure_self_signed(tls, "https://127.0.0.1", password=b"derived")
    assert plaintext_keys(tls) == []
    assert new.cert.read_bytes() == cert
    key = serialization.load_pem_private_key(new.key.read_bytes(), b"derived")
    assert key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) == public
    server_context(new)


async def test_a_ca_rotation_in_the_cache_dir_keeps_every_key_encrypted(tmp_path: Path) -> None:
    tls, password = tmp_path / "tls", b"derived"
    files = ensure_self_signed(tls, "https://127.0.0.1", ca_validity=dt.timedelta(seconds=100),
                               password=password)
    first_serving = files.cert.read_bytes()
    now = [time.time() + 95]  # past 80% of the CA's life
    rotation = CARotation(DirectoryStore(tls, password), tls, "https://127.0.0.1", overlap=10.0, make_ca=make_ca,
                          clock=lambda: now[0], password=password)
    phases = []
    for _ in range(3):
        await rotation.step()
        state, _ = await DirectoryStore(tls, password).load()
        assert state is not None
        phases.append(state.phase)
        assert plaintext_keys(tls) == [], state.phase
        assert all(is_encrypted(p.read_bytes()) for p in tls.glob("*.key"))
        server_context(TLSFiles(files.cert, files.key, None, password))
        now[0] += 11
    assert phases == ["adding", "retiring", "steady"]
    assert files.cert.read_bytes() != first_serving  # signed by the next CA now


def test_replicas_share_the_secrets_pair_and_keep_it_encrypted_in_their_cache_dirs(tmp_path: Path) -> None:
    with KubeAPI(tmp_path / "kubeapi", bookmark_interval=0.5) as api:
        api.namespace("ignition")
        (tmp_path / "empty").mkdir()

        def replica(name: str) -> ServerProcess:
            return ServerProcess(tmp_path / "empty", tmp_path / name / "cache", extra=[
                "--kubernetes", "--kubeconfig", str(api.kubeconfig), "--pod-namespace", "ignition",
                "--replica-id", name, "--lease-duration", "3s", "--workers", "1"]).start()

        r1, r2 = replica("r1"), replica("r2")
        served = served_certificate(r1.port, r1.ca_file)
        assert served_certificate(r2.port, r2.ca_file) == served
        secret = api.get("secrets", "ignition", "ignition-server-tls")
        assert secret is not None
        shared_key = base64.b64decode(secret["data"]["serving.key"])
        for proc in (r1, r2):
            assert plaintext_keys(proc.cache_dir) == []
            key = serialization.load_pem_private_key((proc.cache_dir / "tls" / "serving.key").read_bytes(),
                                                     password_of(proc.cache_dir))
            assert key.private_numbers() == serialization.load_pem_private_key(shared_key, None).private_numbers()
        r2.stop()
        again = ServerProcess(tmp_path / "empty", r2.cache_dir, extra=r2.extra).start()
        wait_for(lambda: served_certificate(again.port, again.ca_file) == served, timeout=30, what="the same certificate")
        assert plaintext_keys(again.cache_dir) == []
        for proc in (r1, again):
            proc.stop()



def test_the_password_outlives_an_aes_key_rotation_and_differs_per_key_file(tmp_path: Path) -> None:
    """Derived from the index key, which never changes: `add_key` + `rekey` + `prune_keys` (the
    cache key's rotation) leave the TLS keys readable. Another key file gives another password."""
    from payload_cache.keys import add_key, create_key_file, prune_keys

    key_file = tmp_path / "cache.key"
    before = create_key_file(key_file).derived(PURPOSE)
    add_key(key_file)
    prune_keys(key_file)
    assert load_key_file(key_file).derived(PURPOSE) == before
    assert create_key_file(tmp_path / "other.key").derived(PURPOSE) != before
    assert load_key_file(key_file).derived("something else") != before
