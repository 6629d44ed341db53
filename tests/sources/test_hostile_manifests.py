"""Hostile manifests cost bounded memory and time, and never the other NodePools their boots."""

from __future__ import annotations

import base64
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
import yaml

from ignition_server.bounded_yaml import UnsafeYAML, load_all
from ignition_server.model.objects import ManifestError
from ignition_server.model.token_secret import MAX_CONFIG_BYTES, decode_config
from ignition_server.render.inputs import RefusedInput
from ignition_server.render.machineconfig import parse_machineconfigs
from testsupport import REPO
from testsupport.harness import EXAMPLE_MACHINECONFIG, ServerProcess, wait_for, write_manifests
from testsupport.manifests import build_token_secret

# "Billion laughs" in a ConfigMap: nine levels of nine aliases, 9^9 nodes once expanded.
ALIAS_BOMB = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: laughs, namespace: clusters-a}\ndata:\n" \
    "  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"  {chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))


def gzip_of_zeros(mib: int) -> bytes:
    stream = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(1 << 20)
    return b"".join(stream.compress(chunk) for _ in range(mib)) + stream.flush()


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    started = time.monotonic()
    with pytest.raises(UnsafeYAML, match="expands to more than"):
        load_all(ALIAS_BOMB)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("text, message", [
    ("[" * 1000 + "]" * 1000, "nests deeper than"),
    ("a: &x [*x]\n", "refers to itself|recursive"),
])
def test_deep_or_recursive_documents_are_refused(text: str, message: str) -> None:
    with pytest.raises(yaml.YAMLError, match=message):
        load_all(text)


def test_ordinary_aliases_still_load() -> None:
    assert load_all("base: &b {x: 1}\nother: *b\n") == [{"base": {"x": 1}, "other": {"x": 1}}]


def test_a_gzip_bomb_config_is_refused_within_bounded_memory() -> None:
    bomb = base64.b64encode(gzip_of_zeros(256))  # 256 MiB of zeros in ~260 KiB
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError, match="decompresses to more than"):
            decode_config(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_CONFIG_BYTES  # never the whole 256 MiB


def flat_list_config(items: int) -> str:
    """A token Secret's `config` value: gzip of a flat YAML list, ~1 KiB of gzip per 250,000 nodes."""
    return base64.b64encode(zlib.compress(b"- a\n" * items, 9, wbits=16 + zlib.MAX_WBITS)).decode()


@pytest.mark.parametrize("items", [100_000, 2_000_000])  # under the decompression bound, and over it
def test_a_flat_list_config_is_refused_before_it_is_composed(items: int) -> None:
    config = flat_list_config(items).encode()
    assert len(config) < 16 * 1024
    tracemalloc.start()
    try:
        with pytest.raises((RefusedInput, ManifestError), match="refused"):
            parse_machineconfigs(decode_config(config))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Composed, 100,000 nodes were ~45 MiB and 2,000,000 ~900 MiB; refused, the cost is the text's.
    assert peak < 8 * 1024 * 1024, f"peak {peak / 2 ** 20:.0f} MiB"


def test_the_node_budget_allows_real_manifests() -> None:
    text = REPO.joinpath("deploy", "statefulset.yaml").read_text()  # 13.8 bytes a node
    assert load_all(text)


def test_the_server_serves_the_good_nodepool_beside_hostile_files(tmp_path: Path) -> None:
    source = tmp_path / "source"
    write_manifests(source / "good.yaml", build_token_secret(
        namespace="clusters-a", nodepool="clusters/good", token="tok-good",
        machineconfigs_yaml=EXAMPLE_MACHINECONFIG.format(name="good"), generation_time=time.time()))
    (source / "bomb.yaml").write_text(ALIAS_BOMB)
    huge = source / "huge.yaml"
    with open(huge, "wb") as sparse:  # a 1 GiB document: refused by its size, unread
        sparse.truncate(1 << 30)
    gzip_bomb = build_token_secret(namespace="clusters-a", nodepool="clusters/bomb", token="tok-bomb",
                                   machineconfigs_yaml="", generation_time=time.time())
    gzip_bomb["data"]["config"] = base64.b64encode(base64.b64encode(gzip_of_zeros(256))).decode()
    write_manifests(source / "gzip-bomb.yaml", gzip_bomb)
    flat = build_token_secret(namespace="clusters-a", nodepool="clusters/flat", token="tok-flat",
                              machineconfigs_yaml="", generation_time=time.time())
    flat["data"]["config"] = base64.b64encode(flat_list_config(250_000).encode()).decode()  # 1 MB of YAML in 2 KiB
    write_manifests(source / "flat.yaml", flat)
    proc = ServerProcess(source, tmp_path / "cache").start()
    try:
        bearer = {"Authorization": "Bearer " + base64.b64encode(b"tok-good").decode()}
        wait_for(lambda: proc.get("/ignition", bearer)[0] == 200, timeout=60, what="the good NodePool served")

        def bomb_status() -> str:
            secret = next(d for d in yaml.safe_load_all((source / "gzip-bomb.yaml").read_text()) if d)
            return base64.b64decode(secret["data"].get("message", "")).decode()

        wait_for(lambda: "decompresses to more than" in bomb_status(), timeout=60, what="InvalidConfig on the gzip bomb")

        def flat_status() -> str:
            secret = next(d for d in yaml.safe_load_all((source / "flat.yaml").read_text()) if d)
            return base64.b64decode(secret["data"].get("message", "")).decode()

        wait_for(lambda: "nodes" in flat_status(), timeout=60, what="InvalidConfig on the flat list")
        assert "refused" in flat_status()
        logs = proc.logs()
        assert "bomb.yaml" in logs and "expands to more than" in logs
        assert "huge.yaml" in logs and "over the" in logs
        status = (Path("/proc") / str(proc.proc.pid) / "status").read_text()  # type: ignore[union-attr]
        peak_kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
        print(f"owner peak RSS {peak_kib // 1024} MiB")
        assert peak_kib < 160 * 1024, f"peak RSS {peak_kib // 1024} MiB"  # composed, the flat list alone was ~110 MiB
    finally:
        proc.kill()
