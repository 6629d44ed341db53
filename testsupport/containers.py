"""The repository's images built with buildah and run the way the deploy manifests run them.

`Buildah` builds from the Dockerfile as it is (its base pulled, or a stand-in made from Debian's
packages when the registry cannot be reached). `PodContainer` runs one container of a manifest
from the image's root file system with testsupport/container_launch.py: the pod's user and groups,
fsGroup on its volumes, the read-only root, the dropped capabilities, no_new_privs, and its
probes. Networking is the host's (hostNetwork): ports are mapped by choosing free host ports and
giving them to the program (its listen settings), as a port mapping would.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testsupport import REPO
from testsupport.deploy import DOCKERFILE

LAUNCHER = Path(__file__).resolve().parent / "container_launch.py"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# What a container runtime (containerd, CRI-O) leaves in the bounding set when nothing is dropped.
RUNTIME_DEFAULT_CAPS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7,
                        "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_RAW": 13, "SYS_CHROOT": 18, "MKNOD": 27,
                        "AUDIT_WRITE": 29, "SETFCAP": 31}


class BuildError(AssertionError):
    """A build step failed: the test fails, with the tool's output."""


def base_images(dockerfile: Path = DOCKERFILE) -> list[str]:
    """The images the Dockerfile's stages start FROM (not its own stages)."""
    stages: set[str] = set()
    bases: list[str] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            image = words[1]
            if image not in stages and image not in bases:
                bases.append(image)
            if len(words) >= 4 and words[2].upper() == "AS":
                stages.add(words[3])
    return bases


def qualified(image: str) -> str:
    """Docker's reading of a short name: `python:3.11` is docker.io/library/python:3.11."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if "/" in image else f"docker.io/library/{image}"


@dataclass
class Buildah:
    root: Path
    driver: str = "overlay"

    def command(self, *args: str) -> list[str]:
        return ["buildah", "--root", str(self.root / "root"), "--runroot", str(self.root / "run"),
                "--storage-driver", self.driver, *args]

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise BuildError(f"buildah {' '.join(args[:3])} failed ({result.returncode}):\n"
                             f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
        return result

    def has_image(self, name: str) -> bool:
        return self.run("inspect", "--type", "image", name, check=False).returncode == 0

    def pull(self, name: str, timeout: float = 120) -> bool:
        try:
            return self.run("pull", "--quiet", "--retry", "1", name, timeout=timeout, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def build(self, tag: str, target: str | None, volumes: list[str]) -> float:
        args = ["build", "--isolation", "chroot", "--network", "host", "--layers", "--force-rm", "--pull=never",
                *(f"--volume={volume}" for volume in volumes), *(["--target", target] if target else []),
                "-t", tag, "-f", str(DOCKERFILE), str(REPO)]
        started = time.monotonic()
        self.run(*args, timeout=900)
        return time.monotonic() - started

    def image_config(self, name: str) -> dict[str, Any]:
        return json.loads(self.run("inspect", "--type", "image", name).stdout)["OCIv1"]["config"]

    def image_size(self, name: str) -> str:
        return self.run("images", "--format", "{{.Size}}", name).stdout.strip()

    def rootfs(self, image: str, name: str) -> Path:
        """A working container of `image` (a fresh one) and the path of its mounted root file system."""
        self.run("rm", name, check=False)
        self.run("from", "--pull-never", "--name", name, image)
        return Path(self.run("mount", name).stdout.strip())

    def remove(self, name: str) -> None:
        self.run("umount", name, check=False)
        self.run("rm", name, check=False)


def make_stand_in(buildah: Buildah, image: str, workdir: Path) -> str:
    """`localhost/python:X.Y-slim-<suite>` from Debian's own packages: Debian's python3 (X.Y must
    be the suite's), venv and pip, /usr/local/bin/python linked to it as the official image has."""
    match = re.fullmatch(r"(?:docker\.io/)?(?:library/)?python:(\d+\.\d+)-slim-(\w+)", image)
    if not match:
        raise BuildError(f"the base {image} cannot be pulled and no stand-in is known for it")
    version, suite = match.groups()
    workdir.mkdir(parents=True, exist_ok=True)
    tarball = workdir / "rootfs.tar"
    result = subprocess.run(["mmdebstrap", "--variant=minbase", "--include=python3,python3-venv,python3-pip",
                             "--format=tar", suite, str(tarball)], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise BuildError(f"mmdebstrap failed:\n{result.stderr[-4000:]}")
    (workdir / "Containerfile").write_text(
        "FROM scratch\nADD rootfs.tar /\n"
        f"RUN test -x /usr/bin/python{version} && ln -s /usr/bin/python{version} /usr/local/bin/python\n"
        "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8\n"
        'CMD ["python3"]\n')
    tag = "localhost/" + image.split("/")[-1]
    buildah.run("build", "--isolation", "chroot", "--network", "host", "-t", tag, "-f",
                str(workdir / "Containerfile"), str(workdir))
    tarball.unlink()
    return tag


def build_volumes(workdir: Path) -> list[str]:
    """What RUN steps see read-only: the host's CA bundle and a pip.conf naming it, so pip trusts
    what the host trusts (a TLS-inspecting proxy's CA) whichever certifi the base's pip carries."""
    if not HOST_CA_BUNDLE.exists():
        return []
    pip_conf = workdir / "pip.conf"
    pip_conf.write_text(f"[global]\ncert = {HOST_CA_BUNDLE}\n")
    return [f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro", f"{pip_conf}:/etc/pip.conf:ro"]


# --- the manifests -------------------------------------------------------------------------


@dataclass
class Workload:
    """One container of a Deployment or StatefulSet, with its pod's spec."""

    pod: dict[str, Any]
    container: dict[str, Any]
    claims: set[str]

    @classmethod
    def load(cls, path: Path) -> "Workload":
        return cls.of(list(yaml.safe_load_all(path.read_text())))

    @classmethod
    def of(cls, documents: list[dict[str, Any]], container: str | None = None) -> "Workload":
        """The Deployment's or StatefulSet's container named `container` (None: its only one)."""
        (document,) = [d for d in documents if d and d.get("kind") in ("Deployment", "StatefulSet")]
        pod = document["spec"]["template"]["spec"]
        (chosen,) = [c for c in pod["containers"] if container is None or c["name"] == container]
        claims = {claim["metadata"]["name"] for claim in document["spec"].get("volumeClaimTemplates", [])}
        return cls(pod, chosen, claims)

    def security(self) -> dict[str, Any]:
        """The container's security context over the pod's, as the kubelet merges them."""
        merged = {k: v for k, v in self.pod.get("securityContext", {}).items() if k != "fsGroup"}
        merged.update(self.container.get("securityContext", {}))
        return merged

    @property
    def fs_group(self) -> int | None:
        return self.pod.get("securityContext", {}).get("fsGroup")

    def port(self, name_or_number: str | int) -> int:
        if isinstance(name_or_number, int):
            return name_or_number
        (port,) = [p["containerPort"] for p in self.container.get("ports", []) if p.get("name") == name_or_number]
        return port

    def env(self) -> dict[str, str]:
        """The literal values (valueFrom entries name the pod's own fields: Kubernetes mode only)."""
        return {e["name"]: str(e["value"]) for e in self.container.get("env", []) if "value" in e}


def bounding_set(capabilities: dict[str, Any]) -> tuple[list[int], set[int]]:
    """(capabilities to drop from the bounding set, those kept), as a runtime applies the context."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    every = set(range(last + 1))
    drop = {c.upper() for c in capabilities.get("drop", [])}
    kept = set() if "ALL" in drop else {n for name, n in RUNTIME_DEFAULT_CAPS.items() if name not in drop}
    kept |= {RUNTIME_DEFAULT_CAPS[c.upper()] for c in capabilities.get("add", []) if c.upper() in RUNTIME_DEFAULT_CAPS}
    return sorted(every - kept), kept


def remap(address: str, ports: dict[int, int], host: str | None = None) -> str:
    """`HOST:PORT` with the container port replaced by its host port (and the host, if given)."""
    old_host, _, port = address.rpartition(":")
    return f"{host if host is not None else old_host}:{ports.get(int(port), int(port))}"


@dataclass
class PodContainer:
    """A manifest's container running from an image's root file system (see module docstring)."""

    workload: Workload
    buildah: Buildah
    image: str
    workdir: Path
    ports: dict[int, int]  # container port -> host port
    env: dict[str, str] = field(default_factory=dict)  # over the image's and the manifest's
    args: list[str] | None = None  # None: the manifest's args, else the image's CMD
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # secret/configMap volume -> files
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    # The pod's volumes, shared by its containers (a socket in a memory emptyDir, the cache claim):
    # None, the container's own (one container per pod). A shared memory emptyDir is a directory
    # under /dev/shm rather than a tmpfs of each container's own, so that both see one.
    pod_dir: Path | None = None

    @property
    def name(self) -> str:
        return f"ignition-test-{self.workdir.name}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "container.log"

    def volume_dir(self, volume: str) -> Path:
        return (self.pod_dir or self.workdir) / "volumes" / volume

    def _volumes(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Bind mounts and tmpfs mounts for the container's volumeMounts, made as the kubelet makes them."""
        volumes = {v["name"]: v for v in self.workload.pod.get("volumes", [])}
        group = self.workload.fs_group
        binds, tmpfs = [], []
        for mount in self.workload.container.get("volumeMounts", []):
            name, target, read_only = mount["name"], mount["mountPath"], bool(mount.get("readOnly"))
            volume = volumes.get(name, {})
            if "emptyDir" in volume and (volume["emptyDir"] or {}).get("medium") == "Memory" and self.pod_dir is None:
                size = str(volume["emptyDir"].get("sizeLimit", "64Mi")).replace("Mi", "m").replace("Gi", "g")
                tmpfs.append({"target": target, "options": f"mode=777,size={size}"})
                continue
            directory = self.volume_dir(name)
            directory.mkdir(parents=True, exist_ok=True)
            if "secret" in volume or "configMap" in volume:
                source = volume.get("secret") or volume.get("configMap")
                mode = source.get("defaultMode", 0o644)
                for filename, data in self.files.get(name, {}).items():
                    (directory / filename).write_bytes(data)
                    os.chmod(directory / filename, mode)
                    if group is not None:
                        os.chown(directory / filename, 0, group)
            elif name in self.workload.claims or "emptyDir" in volume:
                # fsGroup: the volume's group is the pod's, group-writable, new files inherit it.
                if group is not None:
                    os.chown(directory, 0, group)
                os.chmod(directory, 0o2770 if group is not None else 0o777)
            else:
                raise AssertionError(f"volume {name}: no stand-in for {sorted(volume)}")
            binds.append({"source": str(directory), "target": target, "read_only": read_only})
        return binds, tmpfs

    def start(self) -> "PodContainer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.buildah.image_config(self.image)
        security = self.workload.security()
        image_user = (config.get("User") or "0").split(":")
        uid = int(security.get("runAsUser", image_user[0]))
        gid = int(security.get("runAsGroup", image_user[1] if len(image_user) > 1 else 0))
        if security.get("runAsNonRoot") and uid == 0:
            raise AssertionError("runAsNonRoot with uid 0: the kubelet would refuse this container")
        groups = sorted({gid} | ({self.workload.fs_group} if self.workload.fs_group is not None else set()))
        env = dict(item.split("=", 1) for item in config.get("Env") or [])
        env.update(self.workload.env())
        env.update(self.env)
        command = self.workload.container.get("command") or config.get("Entrypoint") or []
        args = self.args if self.args is not None else self.workload.container.get("args", config.get("Cmd") or [])
        drop, _ = bounding_set(security.get("capabilities", {}))
        binds, tmpfs = self._volumes()
        binds += [{"source": path, "target": path, "read_only": True} for path in ("/etc/hosts", "/etc/resolv.conf")
                  if os.path.exists(path)]
        rootfs = self.buildah.rootfs(self.image, self.name)
        (self.workdir / "root").mkdir(exist_ok=True)
        spec = {
            "rootfs": str(rootfs), "mountpoint": str(self.workdir / "root"), "binds": binds, "tmpfs": tmpfs,
            "read_only_root": bool(security.get("readOnlyRootFilesystem")), "uid": uid, "gid": gid, "groups": groups,
            "no_new_privs": security.get("allowPrivilegeEscalation") is False, "bounding_set_drop": drop,
            "env": env, "argv": [*command, *args], "cwd": config.get("WorkingDir") or "/",
        }
        (self.workdir / "spec.json").write_text(json.dumps(spec, indent=1))
        log = open(self.log_path, "ab")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--",
             sys.executable, str(LAUNCHER), str(self.workdir / "spec.json")],
            stdout=log, stderr=subprocess.STDOUT)
        return self

    def pid(self) -> int:
        """The host's pid of the container's pid 1 (unshare's one child)."""
        assert self.proc is not None
        unshare = self.proc.pid

        def child() -> int | None:
            children = Path(f"/proc/{unshare}/task/{unshare}/children")
            text = children.read_text().split() if children.exists() else []
            return int(text[0]) if text else None

        deadline = time.monotonic() + 10
        while (pid := child()) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the container did not start:\n{self.logs()}")
            time.sleep(0.02)
        return pid

    def processes(self) -> list[int]:
        """Host pids of every process in the container (pid 1 and its descendants)."""
        found, todo = [], [self.pid()]
        while todo:
            pid = todo.pop()
            found.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*/children"):
                try:
                    todo += [int(child) for child in task.read_text().split()]
                except OSError:  # gone meanwhile
                    pass
        return found

    def usage(self) -> tuple[float, int]:
        """(CPU seconds used so far, resident bytes now) of the container's live processes, as a
        cgroup would count them (children that exited included through their parent's cutime)."""
        ticks = os.sysconf("SC_CLK_TCK")
        cpu, rss = 0.0, 0
        for pid in self.processes():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except OSError:
                continue
            cpu += sum(int(v) for v in fields[11:15]) / ticks  # utime stime cutime cstime
        return cpu, rss

    def status(self) -> dict[str, str]:
        """/proc/<pid>/status of the container's pid 1: what the kernel says it runs with."""
        lines = Path(f"/proc/{self.pid()}/status").read_text().splitlines()
        return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}

    def exec(self, argv: list[str], uid: int, gid: int) -> subprocess.CompletedProcess[str]:
        """`argv` inside the container (its mounts, its root, its pid namespace) as uid:gid."""
        return subprocess.run(["nsenter", "-t", str(self.pid()), "--mount", "--pid", "--root", "--wd=/",
                               "-S", str(uid), "-G", str(gid), "--", *argv], capture_output=True, text=True, timeout=30)

    def probe(self, probe: dict[str, Any]) -> int | None:
        """The probe's httpGet, as the kubelet sends it (HTTPS without verifying); the status or None."""
        get = probe["httpGet"]
        port = self.ports[self.workload.port(get["port"])]
        url = f"{get.get('scheme', 'HTTP').lower()}://127.0.0.1:{port}{get.get('path', '/')}"
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        try:
            with urllib.request.urlopen(url, context=context if url.startswith("https") else None, timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except (OSError, urllib.error.URLError):
            return None

    def wait_probe(self, kind: str) -> float:
        """Seconds from start until the manifest's `kind` probe succeeds; fails after the budget
        the manifest gives it (failureThreshold x periodSeconds past initialDelaySeconds)."""
        probe = self.workload.container[kind]
        budget = probe.get("initialDelaySeconds", 0) + probe.get("failureThreshold", 3) * probe.get("periodSeconds", 10)
        while True:
            status = self.probe(probe)
            if status is not None and 200 <= status < 400:
                return time.monotonic() - self.started
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the container exited ({self.proc.returncode}):\n{self.logs()}")
            if time.monotonic() - self.started > budget:
                raise AssertionError(f"{kind} not passed within {budget}s (last {status}):\n{self.logs()}")
            time.sleep(0.05)

    def terminate(self) -> tuple[int, float]:
        """As the kubelet stops a pod: the preStop hook (an exec in the container, as its user),
        then SIGTERM to pid 1. The exit status and the seconds from SIGTERM to the exit; fails
        after terminationGracePeriodSeconds, when the kubelet would SIGKILL it."""
        assert self.proc is not None
        hook = self.workload.container.get("lifecycle", {}).get("preStop", {}).get("exec")
        if hook:
            security = self.workload.security()
            result = self.exec(hook["command"], uid=security["runAsUser"], gid=security["runAsGroup"])
            assert result.returncode == 0, f"preStop {hook['command']}: {result.stdout}{result.stderr}"
        grace = self.workload.pod.get("terminationGracePeriodSeconds", 30)
        started = time.monotonic()
        os.kill(self.pid(), signal.SIGTERM)
        try:
            status = self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {grace}s after SIGTERM:\n{self.logs()}") from None
        return status, time.monotonic() - started

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGKILL to pid 1 of the namespace ends every process in it; unshare then exits.
            os.kill(self.pid(), signal.SIGKILL)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.buildah.remove(self.name)


def cache_key() -> bytes:
    """A cache key file in the format the README's deployment step makes."""
    return f"index {base64.b64encode(os.urandom(32)).decode()}\naes {base64.b64encode(os.urandom(32)).decode()}\n".encode()


def storage_root() -> Path:
    """Kept across sessions (a local rerun reuses cached layers); CI's machine starts empty."""
    configured = os.environ.get("IGNITION_TEST_CONTAINER_STORAGE")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "ignition-server-test-containers"
