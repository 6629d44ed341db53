"""A real registry for the tests: Debian's `docker-registry` on loopback with TLS, htpasswd
(Basic) or token (Bearer) auth, a token issuer, and a pusher that builds a synthetic
release image (an OCI index over amd64 and arm64) with plain distribution API calls."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import io
import json
import random
import ssl
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

with warnings.catch_warnings():  # bcrypt hashes for htpasswd from the system's libxcrypt (no extra package)
    warnings.simplefilter("ignore", DeprecationWarning)
    import crypt

from ignition_server.tls.certificates import ensure_self_signed, make_ca
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, free_port, wait_for
from testsupport.manifests import build_token_secret
from testsupport.realtools import require_tool

REGISTRY = "/usr/bin/docker-registry"
SERVICE, ISSUER = "test-registry", "test-token-issuer"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
ART = "quay.io/openshift-release-dev/ocp-v4.0-art-dev"
HAPROXY = ART + "@sha256:" + "a" * 64  # the haproxy-router image a release of this world names


def pool(namespace: str, name: str, token: str, release: str) -> dict[str, Any]:
    """A NodePool's token Secret on `release`, generated now."""
    return build_token_secret(namespace=namespace, nodepool=f"clusters/{name}", token=token, release=release,
                              machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name=name), generation_time=time.time())


def registry_requests(proc: ServerProcess) -> float:
    """How many requests the server has sent to registries (its metric, all labels)."""
    return sum(v for k, v in proc.metrics().items() if k.startswith("ign_server_registry_requests_total"))


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def image_references(images: dict[str, str], version: str) -> bytes:
    stream = {"kind": "ImageStream", "apiVersion": "image.openshift.io/v1", "metadata": {"name": version},
              "spec": {"tags": [{"name": n, "from": {"kind": "DockerImage", "name": i}} for n, i in images.items()]}}
    return json.dumps(stream).encode()


def release_layer(images: dict[str, str], version: str, filler: int = 0) -> bytes:
    """A gzip tar layer as `oc adm release new` lays it out (plus filler, to make it big)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        files = {
            # Incompressible, like the real manifests' bulk would be after gzip.
            "release-manifests/0000_50_filler.yaml": random.Random(version).randbytes(filler),
            "release-manifests/image-references": image_references(images, version),
            "release-manifests/release-metadata": json.dumps({"kind": "cincinnati-metadata-v0", "version": version}).encode(),
        }
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=1)


@dataclass
class TokenIssuer:
    """Docker token service: Basic credentials in, an ES256 JWT the registry trusts (x5c) out."""

    users: dict[str, str]
    tls: Any
    port: int = field(default_factory=free_port)
    issued: int = 0
    _server: http.server.ThreadingHTTPServer | None = None

    def __post_init__(self) -> None:
        cert_pem, key_pem = make_ca()
        self.cert_pem = cert_pem
        key = serialization.load_pem_private_key(key_pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)  # make_ca's: tokens are signed ES256
        self._key = key
        self._x5c = base64.b64encode(x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)).decode()

    @property
    def realm(self) -> str:
        return f"https://127.0.0.1:{self.port}/token"

    def start(self) -> None:
        issuer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                user = issuer._user(self.headers.get("Authorization", ""))
                if user is None:
                    self.send_response(401)
                    self.end_headers()
                    return
                access = []
                for scope in query.get("scope", []):
                    kind, name, actions = scope.split(":")
                    access.append({"type": kind, "name": name, "actions": actions.split(",")})
                now = int(time.time())
                claims = {"iss": ISSUER, "sub": user, "aud": SERVICE, "iat": now, "nbf": now - 5, "exp": now + 300,
                          "jti": uuid.uuid4().hex, "access": access}
                token = jwt.encode(claims, issuer._key, algorithm="ES256", headers={"x5c": [issuer._x5c]})
                issuer.issued += 1
                body = json.dumps({"token": token, "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.tls.cert), str(self.tls.key))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _user(self, header: str) -> str | None:
        if not header.startswith("Basic "):
            return None
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        return user if self.users.get(user) == password else None

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@dataclass
class Registry:
    """One `docker-registry` process; `auth` is "htpasswd" or "token"."""

    workdir: Path
    auth: str = "htpasswd"
    user: str = "puller"
    password: str = "s3cret-pw"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    issuer: TokenIssuer | None = None

    def __post_init__(self) -> None:
        require_tool(REGISTRY, "apt-get install docker-registry")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tls = ensure_self_signed(self.workdir / "tls", "https://127.0.0.1")
        assert self.tls.ca is not None
        self.ca_file = self.tls.ca
        self.storage = self.workdir / "storage"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        auth: dict[str, Any]
        if self.auth == "htpasswd":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                hashed = crypt.crypt(self.password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
            (self.workdir / "htpasswd").write_text(f"{self.user}:{hashed}\n")
            auth = {"htpasswd": {"realm": "test", "path": str(self.workdir / "htpasswd")}}
        else:
            if self.issuer is None:
                self.issuer = TokenIssuer({self.user: self.password}, self.tls)
                self.issuer.start()
            (self.workdir / "token-root.pem").write_bytes(self.issuer.cert_pem)
            auth = {"token": {"realm": self.issuer.realm, "service": SERVICE, "issuer": ISSUER,
                              "rootcertbundle": str(self.workdir / "token-root.pem")}}
        return {
            "version": 0.1,
            "log": {"level": "info", "accesslog": {"disabled": False}},
            "storage": {"filesystem": {"rootdirectory": str(self.storage)}},
            "http": {"addr": self.host, "tls": {"certificate": str(self.tls.cert), "key": str(self.tls.key)}},
            "auth": auth,
        }

    def start(self) -> Registry:
        path = self.workdir / "config.yml"
        path.write_text(yaml.safe_dump(self.config()))
        self.log = self.workdir / f"registry-{self.port}.log"
        self.proc = subprocess.Popen([REGISTRY, "serve", str(path)], stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        wait_for(self._answers, timeout=20, what=f"docker-registry on {self.host}")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"docker-registry exited:\n{self.log.read_text()}")
        try:
            self._request("GET", "/v2/", auth=False)
        except urllib.error.HTTPError:
            return True  # 401: up, and asking for credentials
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.issuer is not None:
            self.issuer.stop()

    # -- pushing (plain HTTP API calls) -------------------------------------------------

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _authorization(self, scope: str) -> str:
        if self.auth == "htpasswd":
            return "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        assert self.issuer is not None
        url = f"{self.issuer.realm}?service={SERVICE}&scope={urllib.parse.quote(scope)}"
        request = urllib.request.Request(url, headers={
            "Authorization": "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()})
        with urllib.request.urlopen(request, context=self.context(), timeout=10) as response:
            return "Bearer " + json.loads(response.read())["token"]

    def _request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
                 auth: bool = True, scope: str = "") -> tuple[int, dict[str, str], bytes]:
        url = path if path.startswith("https://") else f"https://{self.host}{path}"
        all_headers = dict(headers or {})
        if auth:
            all_headers["Authorization"] = self._authorization(scope)
        request = urllib.request.Request(url, data=body, headers=all_headers, method=method)
        with urllib.request.urlopen(request, context=self.context(), timeout=30) as response:
            return response.status, dict(response.headers), response.read()

    def push_blob(self, repo: str, data: bytes) -> str:
        digest = sha256(data)
        scope = f"repository:{repo}:pull,push"
        _s, headers, _b = self._request("POST", f"/v2/{repo}/blobs/uploads/", b"", scope=scope)
        location = headers["Location"]
        if location.startswith("/"):
            location = f"https://{self.host}{location}"
        joiner = "&" if "?" in location else "?"
        self._request("PUT", f"{location}{joiner}digest={urllib.parse.quote(digest)}", data,
                      {"Content-Type": "application/octet-stream"}, scope=scope)
        return digest

    def push_manifest(self, repo: str, reference: str, body: bytes, media_type: str) -> str:
        self._request("PUT", f"/v2/{repo}/manifests/{reference}", body, {"Content-Type": media_type},
                      scope=f"repository:{repo}:pull,push")
        return sha256(body)

    def push_release(self, repo: str, images: dict[str, dict[str, str]], version: str, tag: str = "",
                     filler: int = 0) -> dict[str, str]:
        """An OCI index over one image per architecture (`images`: arch -> component images).

        Returns digests: "index", and per architecture "<arch>" (manifest) and "<arch>-layer"."""
        digests: dict[str, str] = {}
        entries = []
        for arch, components in images.items():
            layer = release_layer(components, version, filler)
            config = json.dumps({"architecture": arch, "os": "linux", "rootfs": {"type": "layers",
                                 "diff_ids": [sha256(gzip.decompress(layer))]}}).encode()
            config_digest = self.push_blob(repo, config)
            layer_digest = self.push_blob(repo, layer)
            manifest = json.dumps({
                "schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": len(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest, "size": len(layer)}],
            }).encode()
            digest = self.push_manifest(repo, sha256(manifest), manifest, OCI_MANIFEST)
            digests[arch], digests[f"{arch}-layer"] = digest, layer_digest
            entries.append({"mediaType": OCI_MANIFEST, "digest": digest, "size": len(manifest),
                            "platform": {"architecture": arch, "os": "linux"}})
        index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
        digests["index"] = self.push_manifest(repo, tag or sha256(index), index, OCI_INDEX)
        return digests

    def blob_file(self, digest: str) -> Path:
        hexdigest = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def pull_secret(self, password: str | None = None, host: str | None = None) -> str:
        auth = base64.b64encode(f"{self.user}:{password or self.password}".encode()).decode()
        return json.dumps({"auths": {host or self.host: {"auth": auth}}})
