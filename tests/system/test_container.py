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
from testsupport.deploy import DOCKERFILE, final_stage, named_stage
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
