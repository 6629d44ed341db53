"""YAML with bounds: what one manifest may cost to load.

A manifest is input from whoever can write to the source. A "billion laughs" file (nine
levels of nine aliases in 20 lines) composes to a small graph that expands to 9^9 nodes the
moment anything walks it, and a deeply nested one exhausts the stack: either would stall the
first listing and with it every NodePool. Here the composed graph is measured before it is
constructed: its expanded size and its depth are bounded (Kubernetes' own YAML reader
refuses excessive aliasing the same way), and an error says which bound.
"""

from __future__ import annotations

from typing import Any

import yaml

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MAX_EXPANDED_NODES = 2_000_000  # a 300 KiB token Secret has a few hundred; a 1,000-key ConfigMap a few thousand
MAX_DEPTH = 200


class UnsafeYAML(yaml.YAMLError):
    """A document over the bounds: refused, not loaded."""


def load_all(text: str | bytes, *, max_nodes: int = MAX_EXPANDED_NODES, max_depth: int = MAX_DEPTH) -> list[Any]:
    """Every document of `text`, each checked against the bounds before it is built."""
    loader = _Loader(text)
    try:
        documents = []
        while loader.check_node():
            node = loader.get_node()
            check(node, max_nodes, max_depth)
            documents.append(loader.construct_document(node))
        return documents
    finally:
        loader.dispose()


def load(text: str | bytes, **bounds: int) -> Any:
    documents = load_all(text, **bounds)
    return documents[0] if documents else None


def check(root: yaml.Node, max_nodes: int = MAX_EXPANDED_NODES, max_depth: int = MAX_DEPTH) -> int:
    """The number of nodes `root` expands to (an alias counts its target's whole size again).
    Raises UnsafeYAML past `max_nodes` or `max_depth`, or for a node that contains itself."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # Iterative post-order walk: a deep document must not exhaust Python's stack either.
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            if total > max_nodes:
                raise UnsafeYAML(f"document expands to more than {max_nodes:,} nodes (aliases?): refused")
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise UnsafeYAML("document refers to itself (a recursive alias): refused")
        if depth > max_depth:
            raise UnsafeYAML(f"document nests deeper than {max_depth} levels: refused")
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in _children(node) if id(child) not in sizes)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
