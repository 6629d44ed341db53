"""HyperShift's REAL ignition server (../shared/real/hypershift-ignition-server), run against
the tests' Kubernetes API server, as the reference the parity tests compare our payloads with.

    server = ReferenceServer(binary, tmp_path / "ref", api, "clusters-a", ca_files=[registry.ca_file]).start()
    body = server.fetch("the token")          # GET /ignition until it stops answering 511

It runs as HyperShift's control-plane-operator runs it (../shared/real/README.md, "Running
the reference server"): one process per control-plane namespace (`MY_NAMESPACE`), a
controller-runtime client on `KUBECONFIG` (the test API server), `SSL_CERT_FILE` with the
CAs of the registries it pulls the release from, the deployment's rendered FeatureGate
(`--feature-gate-manifest`) and a serving certificate of its own. Its machine-config-server
step listens on the fixed ports 22625/22626 (HyperShift's code, not a flag): two reference
servers generating at once would read each other's payloads, so a test runs one at a time.
"""

from __future__ import annotations

import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ignition_server.tls.certificates import ensure_self_signed
from testsupport.harness import bearer, free_port, wait_for
from testsupport.kubeapi import KubeAPI
from testsupport.real_release import require_packed, unpack_binary

# The FeatureGate HyperShift's ignition-server deployment renders in its init container
# (`fetch-feature-gate`, FEATURE_GATE_YAML): the reference copies it into `render`'s input.
FEATURE_GATE_YAML = """\
apiVersion: config.openshift.io/v1
kind: FeatureGate
metadata:
  name: cluster
spec: {}
status:
  featureGates: null

"""
SYSTEM_CAS = Path("/etc/ssl/certs/ca-certificates.crt")
MCS_PORTS = (22625, 22626)  # hard-coded in HyperShift's local_ignitionprovider.go


@pytest.fixture(scope="session")
def reference_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference server's binary, decompressed once per test session (from where
    real_release finds the MCO binaries: it is the same directory)."""
    return unpack_binary(require_packed("hypershift-ignition-server"), tmp_path_factory.mktemp("reference"))


@dataclass
class ReferenceServer:
    binary: Path
    workdir: Path
    api: KubeAPI
    namespace: str
    ca_files: Iterable[Path] = ()
    platform: str = ""  # --platform (AWS, Azure, OpenStack, ...): Azure/OpenStack read a cloud config
    # The init container's FEATURE_GATE_YAML: the CPO puts spec.configuration.featureGate there when set.
    feature_gate: str = FEATURE_GATE_YAML
    img_overrides: str = ""  # OPENSHIFT_IMG_OVERRIDES: the management cluster's mirrors, never the HCP's
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "reference.log"

    def start(self) -> "ReferenceServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tls = ensure_self_signed(self.workdir / "tls", self.url)
        # Go reads SSL_CERT_FILE instead of the system's bundle: keep the system's CAs in it.
        cas = self.workdir / "cas.pem"
        cas.write_bytes(b"".join(p.read_bytes() for p in (SYSTEM_CAS, *self.ca_files) if p.is_file()))
        gate = self.workdir / "99_feature-gate.yaml"
        gate.write_text(self.feature_gate)
        payloads = self.workdir / "payloads"
        payloads.mkdir(exist_ok=True)
        self.api.namespace(self.namespace)
        args = [str(self.binary), "ignition-server", "--addr", f"127.0.0.1:{self.port}",
                "--metrics-addr", f"127.0.0.1:{self.metrics_port}",
                "--cert-file", str(self.tls.cert), "--key-file", str(self.tls.key),
                "--work-dir", str(payloads), "--feature-gate-manifest", str(gate)]
        if self.platform:
            args += ["--platform", self.platform]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.workdir), "MY_NAMESPACE": self.namespace,
               "KUBECONFIG": str(self.api.kubeconfig), "SSL_CERT_FILE": str(cas), "OPENSHIFT_IMG_OVERRIDES": self.img_overrides}
        self.proc = subprocess.Popen(args, env=env, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT,
                                     cwd=self.workdir)
        wait_for(self._listening, timeout=30, what="the reference ignition server listening")
        return self

    def _listening(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the reference server exited with {self.proc.returncode}:\n{self.logs()[-4000:]}")
        try:
            self.get("/healthz")
        except OSError:
            return False
        return True

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def context(self) -> ssl.SSLContext:
        assert self.tls.ca is not None
        return ssl.create_default_context(cafile=str(self.tls.ca))

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, context=self.context(), timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def fetch(self, token: str, headers: dict[str, str] | None = None, timeout: float = 180.0) -> bytes:
        """The payload for `token`: asked until the reference stops answering 511 (it has not
        generated it yet), as a node's Ignition does (with the pointer config's `headers`). Any
        other answer fails at once."""
        def answered() -> bytes | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the reference server exited with {self.proc.returncode}:\n{self.logs()[-4000:]}")
            status, body = self.get("/ignition", {**bearer(token), **(headers or {})})
            if status not in (200, 511):
                raise AssertionError(f"the reference answered {status}: {body[:300]!r}\n{self.logs()[-4000:]}")
            return body if status == 200 else None

        try:
            return wait_for(answered, timeout=timeout, interval=0.5, what="the reference's payload")
        except AssertionError as exc:
            if "not met within" not in str(exc):
                raise
            raise AssertionError(f"no payload from the reference after {timeout:.0f}s:\n{self.logs()[-6000:]}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        self.kill()
