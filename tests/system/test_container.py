"""The container images: the server (the last stage, the default target) and the front proxy
(`--target proxy`). Statically: each runs as a non-root numeric user, without compilers, from a
pinned base image, with no secrets baked in, writing only its state directory. For real: both
are built with buildah from the Dockerfile as it is and run with the deploy manifests' security
context (testsupport/containers.py): the real Ignition client boots from the server's container,
directly and through the proxy's container."""

from __future__ import annotations

import base64
import errno
import gzip
import os
import re
import shutil
import socket
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from ignition_server.render.userdata import pointer_config
from testsupport.containers import (
    Buildah,
    PodContainer,
    Workload,
    base_images,
    bounding_set,
    build_volumes,
    cache_key,
    make_stand_in,
    qualified,
    remap,
    storage_root,
)
from testsupport.deploy import DOCKERFILE, final_stage, kustomize, named_stage
from testsupport.harness import free_port
from testsupport.ignition_client import files_in, ignition_fetch, require_ignition
from testsupport.realtools import in_ci, require_tool

# The images users run: the server (final stage) and the proxy.
SHIPPED = {"server": final_stage, "proxy": lambda: named_stage("proxy")}


@pytest.mark.parametrize("image", sorted(SHIPPED))
def test_the_image_runs_as_a_numeric_non_root_user(image: str) -> None:
    users = [line.split(None, 1)[1] for line in SHIPPED[image]() if line.upper().startswith("USER ")]
    assert users, f"no USER in the {image} stage"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric: runAsNonRoot can check it


@pytest.mark.parametrize("image", sorted(SHIPPED))
def test_the_image_has_no_compilers_and_its_command(image: str) -> None:
    stage = "\n".join(SHIPPED[image]())
    assert not re.search(r"\b(gcc|g\+\+|clang|build-essential|libc6-dev|make)\b", stage), stage
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", stage, re.MULTILINE)
    assert entry and yaml.safe_load(entry.group(1)) == [f"ignition-{image}"]


def test_base_images_are_pinned() -> None:
    for line in DOCKERFILE.read_text().splitlines():
        if line.upper().startswith("FROM "):
            image = line.split()[1]
            assert "@sha256:" in image or re.search(r":\d+\.\d+", image), f"{image} is not pinned"
            assert not image.endswith(":latest")


def test_no_secret_is_baked_in() -> None:
    text = DOCKERFILE.read_text()
    for line in text.splitlines():
        if line.upper().startswith(("COPY", "ADD")):
            assert not re.search(r"\.(key|pem|crt)\b|token|secret|kubeconfig", line, re.I), line
        if line.upper().startswith(("ENV", "ARG")):
            assert not re.search(r"(PASSWORD|TOKEN|SECRET|_KEY)=", line.upper().replace("CACHE_KEY_FILE", "")), line


def test_only_the_cache_dir_is_written() -> None:
    stage = "\n".join(final_stage())
    cache = re.search(r"IGNITION_SERVER_CACHE_DIR=(\S+)", stage)
    assert cache and cache.group(1).startswith("/var/lib/ignition-server")
    # The deployment mounts that path (a volume) and /tmp, and runs with a read-only root filesystem.
    statefulset = (DOCKERFILE.parent / "deploy" / "statefulset.yaml").read_text()
    assert "readOnlyRootFilesystem: true" in statefulset and "mountPath: /var/lib/ignition-server" in statefulset


def test_the_proxy_writes_only_its_state_dir_and_has_haproxy() -> None:
    stage = "\n".join(named_stage("proxy"))
    assert re.search(r"apt-get install .*\bhaproxy\b", stage)
    table = re.search(r"IGNITION_PROXY_CONFIG=(\S+)", stage)
    deployment = yaml.safe_load((DOCKERFILE.parent / "deploy" / "proxy" / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The table is read from a read-only mount; the state dir (the table's state_dir) is the one written.
    assert table and mounts[str(Path(table.group(1)).parent)].get("readOnly") is True
    assert "/var/lib/ignition-proxy" in mounts and not mounts["/var/lib/ignition-proxy"].get("readOnly")


# --- built with buildah and run as the deploy manifests run them ---------------------------------

STATEFULSET = DOCKERFILE.parent / "deploy" / "statefulset.yaml"
PROXY_DEPLOYMENT = DOCKERFILE.parent / "deploy" / "proxy" / "deployment.yaml"
PROXY_TABLE = DOCKERFILE.parent / "deploy" / "proxy" / "table.yaml"
EXAMPLE = DOCKERFILE.parent / "examples" / "token-secret.yaml"
TARGETS = {"server": None, "proxy": "proxy"}  # SHIPPED's stages as `--target` names it (None: the last)


@dataclass
class Images:
    buildah: Buildah
    tags: dict[str, str]  # server/proxy -> the built image
    bases: dict[str, str]  # FROM image -> "pulled" or the stand-in's tag
    seconds: dict[str, float]


def require_root_and_buildah() -> None:
    require_tool("buildah", "apt-get install buildah")
    require_tool("nsenter", "apt-get install util-linux")
    if os.geteuid() != 0:
        message = "running a container's mounts and user switch needs root"
        if in_ci():
            pytest.fail(f"CI needs root: {message}", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> Images:
    """Both shipped images, built once a session (and their layers kept in storage_root()).
    The Dockerfile's base is pulled; only where that fails is a stand-in made (containers.py)."""
    require_root_and_buildah()
    assert set(TARGETS) == set(SHIPPED)
    buildah = Buildah(storage_root(), driver=os.environ.get("IGNITION_TEST_STORAGE_DRIVER", "overlay"))
    work = tmp_path_factory.mktemp("images")
    bases: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for base in base_images():
        stand_in = "localhost/" + base.split("/")[-1]
        if buildah.pull(qualified(base)):
            buildah.run("rmi", stand_in, check=False)  # the short name must find only the real one
            bases[base] = "pulled"
        elif buildah.has_image(stand_in):
            bases[base] = stand_in
        else:
            require_tool("mmdebstrap", "apt-get install mmdebstrap")
            started = time.monotonic()
            bases[base] = make_stand_in(buildah, base, work / "stand-in")
            seconds["stand-in base"] = time.monotonic() - started
    volumes = build_volumes(work)
    tags = {}
    for image, target in TARGETS.items():
        tags[image] = f"localhost/ignition-{image}:test"
        seconds[image] = buildah.build(tags[image], target, volumes)
    sizes = {image: buildah.image_size(tag) for image, tag in tags.items()}
    print(f"\ncontainer images: bases {bases}, build seconds {({k: round(v, 1) for k, v in seconds.items()})}, sizes {sizes}")
    return Images(buildah, tags, bases, seconds)


def example_secret() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def example_files() -> set[str]:
    """The paths the example's MachineConfigs write (read from the example, not restated here)."""
    secret = example_secret()
    text = gzip.decompress(base64.b64decode(base64.b64decode(secret["data"]["config"]))).decode()
    return {f["path"] for mc in yaml.safe_load_all(text) if mc
            for f in mc["spec"]["config"].get("storage", {}).get("files", [])}


def proxy_route_sends_proxy() -> bool:
    table = yaml.safe_load(yaml.safe_load(PROXY_TABLE.read_text())["data"]["table.yaml"])
    return any(route.get("send_proxy") for route in table["routes"] if "endpoints" in route)


def stopped_at_teardown(container: PodContainer) -> Iterator[PodContainer]:
    try:
        yield container
    finally:
        container.stop()


@pytest.fixture(scope="module")
def server(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodContainer]:
    """The server image serving its embedded example, with the StatefulSet's container: its
    security context, volumes (the claim and the cache-key Secret, fsGroup applied), env and
    probes. Its args are the image's own (`serve --source-read-only`): `--kubernetes` needs a cluster."""
    workload = Workload.load(STATEFULSET)
    ports = {workload.port(p["name"]): free_port() for p in workload.container["ports"]}
    env = workload.env()
    # Dual-stack, so the proxy can reach it over ::1 (the one peer trusted with PROXY headers)
    # while probes and clients come from 127.0.0.1.
    overrides = {
        "IGNITION_SERVER_LISTEN": remap(env["IGNITION_SERVER_LISTEN"], ports, host="[::]"),
        "IGNITION_SERVER_METRICS_LISTEN": remap(env["IGNITION_SERVER_METRICS_LISTEN"], ports),
        "IGNITION_SERVER_PUBLIC_URL": f"https://localhost:{ports[workload.port('ignition')]}",
    }
    if proxy_route_sends_proxy():
        overrides["IGNITION_SERVER_PROXY_PROTOCOL_FROM"] = "::1/128"
    (key_volume,) = [v["name"] for v in workload.pod["volumes"] if "secret" in v]
    key_name = Path(env["IGNITION_SERVER_CACHE_KEY_FILE"]).name
    container = PodContainer(workload, images.buildah, images.tags["server"], tmp_path_factory.mktemp("server"), ports,
                             env=overrides, args=images.buildah.image_config(images.tags["server"])["Cmd"],
                             files={key_volume: {key_name: cache_key()}})
    yield from stopped_at_teardown(container.start())


def assert_runs_with_its_security_context(container: PodContainer) -> None:
    """What the kernel says the container's pid 1 runs with equals what its manifest asks."""
    security = container.workload.security()
    status = container.status()
    assert status["Uid"].split() == [str(security["runAsUser"])] * 4
    assert status["Gid"].split() == [str(security["runAsGroup"])] * 4
    assert str(container.workload.fs_group) in status["Groups"].split()
    assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == 0
    _, kept = bounding_set(security.get("capabilities", {}))
    assert int(status["CapBnd"], 16) == sum(1 << cap for cap in kept)
    assert status["NoNewPrivs"] == ("1" if security.get("allowPrivilegeEscalation") is False else "0")
    mounts = Path(f"/proc/{container.pid()}/mountinfo").read_text().splitlines()
    (root,) = [line.split() for line in mounts if line.split()[4] == "/"]
    assert ("ro" in root[5].split(",")) == bool(security.get("readOnlyRootFilesystem"))


def test_the_server_image_becomes_ready_and_live_by_the_manifests_probes(server: PodContainer) -> None:
    ready = server.wait_probe("startupProbe")
    server.wait_probe("readinessProbe")
    server.wait_probe("livenessProbe")
    print(f"\nserver container: start to ready {ready:.2f}s")
    assert_runs_with_its_security_context(server)


@pytest.mark.ignition
def test_the_real_ignition_client_boots_from_the_server_image(server: PodContainer, tmp_path: Path) -> None:
    require_ignition()
    server.wait_probe("readinessProbe")
    secret = example_secret()
    token = base64.b64decode(secret["data"]["token"]).decode()
    nodepool = secret["metadata"]["annotations"]["hypershift.openshift.io/nodePool"]
    ca = server.volume_dir("cache") / "cache" / "tls" / "ca.crt"
    port = server.ports[server.workload.port("ignition")]
    pointer = pointer_config(source_url=f"https://localhost:{port}", token=token, ca_pem=ca.read_bytes(), nodepool=nodepool)
    run = ignition_fetch(pointer, tmp_path / "node")
    assert run.returncode == 0 and run.config is not None, run.output
    assert example_files() <= set(files_in(run.config)), run.config
    assert token not in server.logs()


def test_only_the_writable_volumes_are_writable_in_the_server_image(server: PodContainer) -> None:
    server.wait_probe("readinessProbe")
    security = server.workload.security()
    mounts = server.workload.container["volumeMounts"]
    writable = {m["mountPath"] for m in mounts if not m.get("readOnly")}
    read_only = {m["mountPath"] for m in mounts if m.get("readOnly")}
    image_env = dict(e.split("=", 1) for e in server.buildah.image_config(server.image)["Env"])
    image_paths = {"/", "/etc", "/opt/ignition-server", "/usr/local/bin", image_env["IGNITION_SERVER_SOURCE"]}
    script = ("import sys\nfor p in sys.argv[1:]:\n  try:\n    open(p.rstrip('/') + '/.w', 'w').close(); print(p, 'ok')\n"
              "  except OSError as e:\n    print(p, e.errno)\n")
    paths = sorted(writable | read_only | image_paths)
    result = server.exec(["/opt/ignition-server/bin/python", "-c", script, *paths],
                         uid=security["runAsUser"], gid=security["runAsGroup"])
    assert result.returncode == 0, result.stderr
    answers = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert {p for p, a in answers.items() if a == "ok"} == writable, answers
    assert all(answers[p] == str(errno.EROFS) for p in read_only | image_paths), answers
    # The server wrote its state there: the cache (and its index) on the claim's volume.
    assert any((server.volume_dir("cache") / "cache").iterdir())


@pytest.fixture(scope="module")
def proxy(images: Images, server: PodContainer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodContainer]:
    """The proxy image with the proxy Deployment's container, its ConfigMap's table (the
    shipped one) with its ports mapped, its route's host `localhost` (what the server's
    self-made certificate names) and its `endpoints` replaced by the server container."""
    workload = Workload.load(PROXY_DEPLOYMENT)
    ports = {workload.port(p["name"]): free_port() for p in workload.container["ports"]}
    config_map = yaml.safe_load(PROXY_TABLE.read_text())
    table = yaml.safe_load(config_map["data"]["table.yaml"])
    table["listen"] = ports[int(table["listen"])]
    for key in ("metrics_listen", "prometheus_listen"):
        table[key] = remap(table[key], ports)
    server_port = server.ports[server.workload.port("ignition")]
    for route in table["routes"]:
        if route.pop("endpoints", None) is not None:
            route["host"], route["backends"] = "localhost", [f"[::1]:{server_port}"]
    (volume,) = [v["name"] for v in workload.pod["volumes"]
                 if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]]
    table_file = Path(workload.env()["IGNITION_PROXY_CONFIG"]).name
    container = PodContainer(workload, images.buildah, images.tags["proxy"], tmp_path_factory.mktemp("proxy"), ports,
                             files={volume: {table_file: yaml.safe_dump(table).encode()}})
    yield from stopped_at_teardown(container.start())


@pytest.mark.ignition
@pytest.mark.haproxy
def test_the_proxy_image_runs_haproxy_in_front_of_the_server_image(server: PodContainer, proxy: PodContainer,
                                                                  tmp_path: Path) -> None:
    require_ignition()
    server.wait_probe("readinessProbe")
    ready = proxy.wait_probe("readinessProbe")
    proxy.wait_probe("livenessProbe")
    print(f"\nproxy container: start to ready {ready:.2f}s")
    assert_runs_with_its_security_context(proxy)
    secret = example_secret()
    token = base64.b64decode(secret["data"]["token"]).decode()
    ca = server.volume_dir("cache") / "cache" / "tls" / "ca.crt"
    nodepool = secret["metadata"]["annotations"]["hypershift.openshift.io/nodePool"]
    pointer = pointer_config(source_url=f"https://localhost:{proxy.ports[proxy.workload.port('https')]}", token=token,
                             ca_pem=ca.read_bytes(), nodepool=nodepool)
    run = ignition_fetch(pointer, tmp_path / "node")
    assert run.returncode == 0 and run.config is not None, run.output + proxy.logs()
    assert example_files() <= set(files_in(run.config))


# --- the in-pod edge (deploy/edge, issue 32): the server and the edge container as one pod ----------

EDGE_OVERLAY = DOCKERFILE.parent / "deploy" / "edge"
EDGE_LOAD_SECONDS = 20.0  # the short load the edge's resource requests were set from
EDGE_LOAD_CLIENTS = 32


@dataclass
class EdgePod:
    server: PodContainer
    edge: PodContainer

    @property
    def port(self) -> int:  # the Services' `ignition` port: the edge's
        return self.edge.ports[self.edge.workload.port("ignition")]

    @property
    def ca(self) -> Path:
        return self.server.volume_dir("cache") / "cache" / "tls" / "ca.crt"


@pytest.fixture(scope="module")
def edge_pod(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgePod]:
    """deploy/edge's StatefulSet as kustomize renders it: its two containers from the two images, each
    with its own manifest's security context, env, args and probes, sharing the pod's volumes (the
    cache claim, the edge's read-only view of it, the memory emptyDir holding the server's socket),
    and, as a pod's containers do, one network namespace (here the host's: ports mapped apart).
    Both start at once, as the kubelet starts them: the edge waits for the server's publication."""
    docs = kustomize(EDGE_OVERLAY, "--load-restrictor", "LoadRestrictionsNone")
    server_workload, edge_workload = Workload.of(docs, "ignition-server"), Workload.of(docs, "edge")
    pod_dir = Path(tempfile.mkdtemp(prefix="ignition-pod-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    edge_ports = {edge_workload.port(p["name"]): free_port() for p in edge_workload.container["ports"]}
    server_ports = {server_workload.port(p["name"]): free_port() for p in server_workload.container["ports"]}
    env = server_workload.env()
    (key_volume,) = [v["name"] for v in server_workload.pod["volumes"] if "secret" in v]
    server = PodContainer(
        server_workload, images.buildah, images.tags["server"], tmp_path_factory.mktemp("pod-server"), server_ports,
        env={"IGNITION_SERVER_LISTEN": remap(env["IGNITION_SERVER_LISTEN"], server_ports),
             "IGNITION_SERVER_METRICS_LISTEN": remap(env["IGNITION_SERVER_METRICS_LISTEN"], server_ports),
             # The name nodes use: the edge's port, whose certificate is the server's.
             "IGNITION_SERVER_PUBLIC_URL": f"https://localhost:{edge_ports[edge_workload.port('ignition')]}"},
        args=images.buildah.image_config(images.tags["server"])["Cmd"],
        files={key_volume: {Path(env["IGNITION_SERVER_CACHE_KEY_FILE"]).name: cache_key()}}, pod_dir=pod_dir)
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ignition-edge"]
    table = yaml.safe_load(config_map["data"]["table.yaml"])
    table["listen"] = edge_ports[int(table["listen"])]
    for key in ("metrics_listen", "prometheus_listen"):
        table[key] = remap(table[key], edge_ports)
    (table_volume,) = [v["name"] for v in edge_workload.pod["volumes"]
                       if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]]
    edge = PodContainer(edge_workload, images.buildah, images.tags["proxy"], tmp_path_factory.mktemp("pod-edge"), edge_ports,
                        files={table_volume: {Path(edge_workload.env()["IGNITION_PROXY_CONFIG"]).name:
                                              yaml.safe_dump(table).encode()}}, pod_dir=pod_dir)
    try:
        server.start()
        edge.start()
        yield EdgePod(server, edge)
    finally:
        for container in (edge, server):
            container.stop()
        shutil.rmtree(pod_dir, ignore_errors=True)


@pytest.mark.ignition
@pytest.mark.haproxy
def test_the_in_pod_edge_serves_the_real_client_from_the_servers_socket(edge_pod: EdgePod, tmp_path: Path) -> None:
    """Both containers as the pod runs them: ready and live by their probes, each with its own
    security context, the same user; the real Ignition client fetches through the edge's port
    (TLS ended by HAProxy with the server's certificate, verified with the server's CA), and the
    request reaches the server only through the socket in the shared memory volume."""
    require_ignition()
    for container in (edge_pod.server, edge_pod.edge):
        container.wait_probe("readinessProbe")
        container.wait_probe("livenessProbe")
        assert_runs_with_its_security_context(container)
    assert edge_pod.server.status()["Uid"] == edge_pod.edge.status()["Uid"]  # the socket is 0660: one user, one group
    socket_path = Path(edge_pod.server.workload.env()["IGNITION_SERVER_EDGE_SOCKET"])
    (run_mount,) = [m["name"] for m in edge_pod.edge.workload.container["volumeMounts"]
                    if m["mountPath"] == str(socket_path.parent)]
    assert (edge_pod.server.volume_dir(run_mount) / socket_path.name).is_socket()
    secret = example_secret()
    token = base64.b64decode(secret["data"]["token"]).decode()
    nodepool = secret["metadata"]["annotations"]["hypershift.openshift.io/nodePool"]
    pointer = pointer_config(source_url=f"https://localhost:{edge_pod.port}", token=token,
                             ca_pem=edge_pod.ca.read_bytes(), nodepool=nodepool)
    run = ignition_fetch(pointer, tmp_path / "node")
    assert run.returncode == 0 and run.config is not None, run.output + edge_pod.edge.logs()
    assert example_files() <= set(files_in(run.config))
    # What the edge forwarded went over the socket: the server saw it, with the node's address.
    assert '"ignition"' in edge_pod.server.logs() or "/ignition" in edge_pod.server.logs()
    assert token not in edge_pod.server.logs() + edge_pod.edge.logs()


def storm(port: int, ca: Path, token: str, seconds: float, clients: int) -> tuple[int, dict[int, int]]:
    """Boot-storm-like load: `clients` threads, each fetching /ignition over a new TLS connection
    (as booting nodes do) for `seconds`. (requests, statuses)."""
    context = ssl.create_default_context(cafile=str(ca))
    header = f"Authorization: Bearer {base64.b64encode(token.encode()).decode()}"
    request = (f"GET /ignition HTTP/1.1\r\nHost: localhost\r\n{header}\r\n"
               "Accept: application/vnd.coreos.ignition+json;version=3.4.0\r\nConnection: close\r\n\r\n").encode()
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    ends = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < ends:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, \
                        context.wrap_socket(raw, server_hostname="localhost") as tls:
                    tls.sendall(request)
                    data = b""
                    while chunk := tls.recv(65536):
                        data += chunk
                status = int(data.split(b" ", 2)[1])
            except (OSError, IndexError, ValueError):
                status = 0
            with lock:
                statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(statuses.values()), statuses


@pytest.mark.haproxy
def test_the_edge_containers_requests_cover_a_short_storm(edge_pod: EdgePod) -> None:
    """The edge's resource requests come from this measurement (printed; the commit that set them
    says the figures): its CPU per second of a storm and its resident memory at the peak stay
    within what deploy/edge asks for and limits it to."""
    edge_pod.edge.wait_probe("readinessProbe")
    token = base64.b64decode(example_secret()["data"]["token"]).decode()
    assert storm(edge_pod.port, edge_pod.ca, token, 1.0, 2)[1].get(200), edge_pod.edge.logs()  # warm
    containers = {"edge": edge_pod.edge, "server": edge_pod.server}
    before = {name: c.usage()[0] for name, c in containers.items()}
    peak = dict.fromkeys(containers, 0)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            for name, container in containers.items():
                peak[name] = max(peak[name], container.usage()[1])

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.monotonic()
    try:
        total, statuses = storm(edge_pod.port, edge_pod.ca, token, EDGE_LOAD_SECONDS, EDGE_LOAD_CLIENTS)
    finally:
        done.set()
        sampler.join()
    elapsed = time.monotonic() - started
    cpu = {name: c.usage()[0] - before[name] for name, c in containers.items()}
    print(f"\nin-pod edge under {EDGE_LOAD_CLIENTS} clients, new TLS connection each, {elapsed:.1f}s: {total} requests "
          f"({total / elapsed:.0f}/s) {statuses}; load {os.getloadavg()[0]:.1f}")
    for name in containers:
        print(f"  {name}: CPU {cpu[name]:.2f}s ({cpu[name] / elapsed:.2f} cores, {1000 * cpu[name] / max(total, 1):.2f} ms"
              f"/request), peak RSS {peak[name] / 2**20:.0f} MiB")
    # 408 and 0 (cut): the edge's 3 s client timeout (proxy/render.py) ending a connection whose
    # client thread this machine starved between the handshake and the request (0.4% at load 16).
    assert set(statuses) <= {200, 408, 0} and statuses.get(200, 0) >= 0.95 * total, statuses
    resources = edge_pod.edge.workload.container["resources"]
    assert peak["edge"] <= parse_quantity(resources["limits"]["memory"]), f"edge RSS {peak['edge']} over its limit"
    assert peak["edge"] <= 2 * parse_quantity(resources["requests"]["memory"]), "the memory request is far below use"


def test_the_edge_pods_containers_stop_on_sigterm_within_their_grace_period(edge_pod: EdgePod) -> None:
    """Last of the edge pod's tests: it stops them. The kubelet signals every container of the pod."""
    for container in (edge_pod.edge, edge_pod.server):
        container.wait_probe("readinessProbe")
    for container in (edge_pod.edge, edge_pod.server):
        status, seconds = container.terminate()
        print(f"\n{container.image} in the edge pod: stopped {seconds:.2f}s after SIGTERM, status {status}")
        assert status == 0, container.logs()


def parse_quantity(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(text[:-2]) * units[text[-2:]] if text[-2:] in units else int(text)


def test_both_containers_stop_on_sigterm_within_their_grace_period(server: PodContainer, proxy: PodContainer) -> None:
    """Last in this module: it stops the module's containers. The program is pid 1 of its pid
    namespace, where a signal without a handler is ignored: a missing SIGTERM handler would
    show here as a pod that only SIGKILL ends."""
    server.wait_probe("readinessProbe")
    proxy.wait_probe("readinessProbe")
    for container in (proxy, server):  # the proxy drains first, as a rollout behind it would
        status, seconds = container.terminate()
        print(f"\n{container.image}: stopped {seconds:.2f}s after SIGTERM, status {status}")
        assert status == 0, container.logs()
