"""Imports run one way, from the CLI down to the cache: no cycle, no upward import.

The source of `ignition_server/`, `payload_cache/` and `proxy/` is parsed (ast; nothing is
imported or run). Every import statement counts, wherever it is: module level, inside a
function (a function-local import still ties the modules together, it only hides it), and
under `if TYPE_CHECKING:` (a type-only import is still a dependency a reader must follow).
Importing `a.b.c` also runs the package `a.b`'s `__init__`, so a module outside `a.b` depends
on that `__init__` too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from testsupport import REPO

ROOT = REPO
PACKAGES = ("ignition_server", "payload_cache", "proxy")

# Lowest first. A module may import its own layer and the layers below it, never above.
# Each entry: the modules (a name covers its submodules), and why it sits there.
LAYERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("ignition_server", "ignition_server.fsio"),
     "the package itself (its version, nothing else: importing any module runs it) and crash-safe file writes (temp file, fsync, rename, fsync of the directory): the cache, the sources, "
     "TLS and the proxy all write this way"),
    (("payload_cache",),
     "the encrypted payload store and token index: knows nothing of HTTP, Kubernetes or the server"),
    (("ignition_server.bounded_yaml", "ignition_server.logs", "ignition_server.memory",
      "ignition_server.no_core_dumps", "ignition_server.sockets", "ignition_server.tallies", "ignition_server.tls"),
     "process-wide helpers with no knowledge of the domain: bounded YAML, log setup, sockets, counts kept without "
     "Prometheus, TLS (profiles, certificates and the self-made CA, its rotation, FIPS)"),
    (("ignition_server.model",),
     "the domain model (Kubernetes objects, the token Secret, the MCO base ConfigMap): everyone reads it"),
    (("ignition_server.render", "ignition_server.takeover", "ignition_server.config", "ignition_server.metrics"),
     "pure renderers (inputs -> bytes; the takeover's HostedControlPlane -> the CPO's ConfigMaps), the settings "
     "object, the metrics registry: used by all that runs"),
    (("ignition_server.auth", "ignition_server.sources", "ignition_server.registry", "ignition_server.edge_publication",
      "ignition_server.edge_publisher"),
     "where tokens are checked, where objects come from (files, Kubernetes), releases from registries, "
     "the edge directory's format (the contract the server and the front proxy share) and its writer"),
    (("proxy",),
     "the front proxy, its own program: it shares the contract, auth's checks and the Kubernetes client, "
     "nothing of the server's reconciler or HTTP app"),
    (("ignition_server.basegen", "ignition_server.base_import"),
     "MCO bases: generated with MCO's binaries, or imported from a bootstrap's output"),
    (("ignition_server.reconcile",),
     "the reconciler: source changes -> renders -> the cache and the token index"),
    (("ignition_server.http", "ignition_server.workers"),
     "serving: the HTTP app and its worker processes read the token index and the cache"),
    (("ignition_server.cluster", "ignition_server.server"),
     "wiring: Kubernetes mode's parts, and the server that starts, serves and stops them"),
    (("ignition_server.cli", "ignition_server.__main__"),
     "the command line: builds the settings and calls the server; nothing imports it"),
)

# Never imported by production code: test and benchmark support lives outside the packages.
NOT_FOR_PRODUCTION = ("tests", "bench", "testsupport", "harness", "conftest")


def modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported_names(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """Every absolute name the module imports (`from a import b` yields `a.b`: b may be a module), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield base, node.lineno
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, dict[str, int]]:
    """module -> {module it depends on: the line of the first import}."""
    found = modules(root, packages)

    def resolve(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, dict[str, int]] = {}
    for name, path in found.items():
        out: dict[str, int] = {}
        for imported, line in imported_names(name, path):
            target = resolve(imported)
            if target is None:
                continue
            # the packages whose __init__ runs on the way, unless this module is inside them
            chain = target.split(".")
            for depth in range(1, len(chain) + 1):
                step = ".".join(chain[:depth])
                if step in found and step != name and not name.startswith(step + "."):
                    out.setdefault(step, line)
        edges[name] = out
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_of(name: str) -> int:
    best, depth = -1, -1
    for number, (prefixes, _why) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = number, prefix.count(".")
    return best


def test_no_import_cycle() -> None:
    found = cycles(graph(ROOT))
    assert not found, "import cycles (break them: move what both need lower):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_module_has_a_layer() -> None:
    assert [name for name in modules(ROOT) if layer_of(name) < 0] == []


def test_no_upward_import() -> None:
    edges = graph(ROOT)
    wrong = [
        f"{importer} (layer {layer_of(importer)}) imports {target} (layer {layer_of(target)}), line {line}"
        for importer, targets in sorted(edges.items())
        for target, line in sorted(targets.items())
        if layer_of(target) > layer_of(importer)
    ]
    assert wrong == []


def test_the_server_imports_nothing_of_the_proxy() -> None:
    edges = graph(ROOT)
    wrong = [(importer, target) for importer, targets in edges.items() if not importer.startswith("proxy")
             for target in targets if target == "proxy" or target.startswith("proxy.")]
    assert wrong == []


def test_production_code_imports_no_test_or_bench_code() -> None:
    wrong = [
        f"{name}:{line} imports {imported}"
        for name, path in modules(ROOT).items()
        for imported, line in imported_names(name, path)
        if imported.split(".")[0] in NOT_FOR_PRODUCTION
    ]
    assert wrong == []


@pytest.mark.parametrize("source, expected", [
    ({"a": "from .b import x", "b": "import pkg.a"}, [["pkg.a", "pkg.b"]]),
    ({"a": "def f():\n    from . import b\n", "b": "from .a import y"}, [["pkg.a", "pkg.b"]]),
    ({"a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import T\n", "b": "from . import a"},
     [["pkg.a", "pkg.b"]]),
    ({"a": "from .b import x", "b": "import os"}, []),
])
def test_the_checker_sees_cycles_of_every_kind(tmp_path: Path, source: dict[str, str], expected: list[list[str]]) -> None:
    """Module-level, function-local and TYPE_CHECKING imports all close a cycle (the checker itself, on a toy package)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    for name, text in source.items():
        (tmp_path / "pkg" / f"{name}.py").write_text(text + "\n")
    assert cycles(graph(tmp_path, ("pkg",))) == expected


def test_tests_and_bench_import_the_harness_by_one_name() -> None:
    """Under two names (`harness`, `tests.harness`) it was two modules with two STARTED lists, and
    conftest's clean-up missed the servers a bench helper started inside a test."""
    wrong = []
    for folder in ("tests", "bench", "testsupport"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for imported, line in imported_names(path.stem, path):
                if imported.split(".")[0] in ("harness", "realtools") or imported.startswith(("tests.harness", "tests.realtools")):
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert wrong == []


def dotted(path: Path) -> str:
    """The module name of a file under the repository's root (`bench/run.py` -> `bench.run`)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_tests_and_bench_never_import_each_other() -> None:
    """What both need is in testsupport/, imported by one name: a test runs a benchmark as a user
    does (`python -m bench`, testsupport.harness.run_bench), and neither bench/ nor testsupport/
    imports a test file (tests/ is no package: its files are found by path, not imported)."""
    test_files = {path.stem for path in (ROOT / "tests").rglob("*.py")}
    forbidden = {"tests": {"bench"}, "bench": {"tests"} | test_files, "testsupport": {"tests", "bench"} | test_files}
    wrong = []
    for folder, names in forbidden.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for imported, line in imported_names(dotted(path), path):
                if imported.split(".")[0] in names:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert wrong == []


def test_bench_finds_its_imports_without_changing_sys_path() -> None:
    """`python -m bench` from the repository's root puts the root on sys.path, which is all that
    bench/ needs (bench, testsupport, the installed server); a module that edits sys.path hides
    where its imports come from."""
    wrong = []
    for folder in ("bench", "testsupport"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                        and node.value.id == "sys":
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert wrong == []
