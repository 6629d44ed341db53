"""YAML with bounds: what one manifest may cost to load.

A manifest is input from whoever can write to the source. A "billion laughs" file (nine
levels of nine aliases in 20 lines) composes to a small graph that expands to 9^9 nodes the
moment anything walks it, and a deeply nested one exhausts the stack: either would stall the
first listing and with it every NodePool. Here the composed graph is measured before it is
constructed: its expanded size and its depth are bounded (Kubernetes' own YAML reader
refuses excessive aliasing the same way), and an error says which bound.

Composing is itself the cost a flat document makes: every node is ~450 bytes of Python
objects, so 5 KiB of gzip holding "- a" eight million times took the owner process to
~950 MiB before any bound was checked. So the parser's events are counted first, in a
streaming pass that holds one event at a time, and a text is composed only if its node count
fits a budget proportional to its size (`node_budget`): what any input can cost to load is a
small multiple of its own size. Real manifests have 13 bytes or more per node (Kubernetes'
own, MCO's templates); the budget allows 8.
"""

from __future__ import annotations

from typing import Any

import yaml

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MAX_EXPANDED_NODES = 2_000_000  # a 300 KiB token Secret has a few hundred; a 1,000-key ConfigMap a few thousand
MAX_DEPTH = 200
NODES_FREE = 10_000  # any text may have this many nodes (~4.5 MiB composed)...
BYTES_PER_NODE = 8  # ...and one more per 8 bytes of its size...
MAX_COMPOSED_NODES = 250_000  # ...up to ~110 MiB composed, whatever the size (a real input has thousands)


class OverBounds(Exception):
    """Marks a refusal that the same input always meets again: retrying it is pointless."""


class UnsafeYAML(yaml.YAMLError, OverBounds):
    """A document over the bounds: refused, not loaded."""


def node_budget(size: int) -> int:
    """The nodes a text of `size` bytes may have: its memory cost stays a small multiple of it."""
    return min(NODES_FREE + size // BYTES_PER_NODE, MAX_COMPOSED_NODES)


def load_all(text: str | bytes, *, max_nodes: int = MAX_EXPANDED_NODES, max_depth: int = MAX_DEPTH) -> list[Any]:
    """Every document of `text`, each checked against the bounds before it is built."""
    budget = min(max_nodes, node_budget(len(text)))
    if most_nodes(text) > budget:  # else it cannot be over: no need to count (most manifests)
        count_nodes(text, budget, max_depth)
    # Without an anchor there is no alias (an alias names an anchor before it), so every document
    # is a tree no larger than the text's node count bounded above: only its depth is left to check,
    # which costs a third of what measuring the expanded size does (a third of a manifest's load).
    shared = ("&" in text) if isinstance(text, str) else (b"&" in text)
    loader = _Loader(text)
    try:
        documents = []
        while loader.check_node():
            node = loader.get_node()
            assert node is not None  # check_node() said there is one
            if shared:
                check(node, max_nodes, max_depth)
            else:
                check_depth(node, max_depth)
            documents.append(loader.construct_document(node))
        return documents
    finally:
        loader.dispose()


def load(text: str | bytes, **bounds: int) -> Any:
    documents = load_all(text, **bounds)
    return documents[0] if documents else None


_INDICATORS = b",:-[{?.\n"


def most_nodes(text: str | bytes) -> int:
    """An upper bound on the nodes `text` can hold, from a count of characters (~0.2 ms for
    300 KiB, where counting the parser's events costs about as much as composing): past a
    document's first node, every node comes with one of , : - [ { ? (or a document's end, a
    line) and none brings more than three (a mapping, its key and its value)."""
    data = text.encode(errors="surrogatepass") if isinstance(text, str) else text
    return 1 + 3 * (len(data) - len(data.translate(None, _INDICATORS)))


def count_nodes(text: str | bytes, max_nodes: int, max_depth: int = MAX_DEPTH) -> int:
    """The nodes `text` holds as written (an alias counts once), found from the parser's
    events one at a time, before anything is composed; UnsafeYAML past `max_nodes` or
    `max_depth`."""
    loader = _Loader(text)
    count = depth = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
                count += 1
            elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                count += 1
                depth += 1
                if depth > max_depth:
                    raise UnsafeYAML(f"document nests deeper than {max_depth} levels: refused")
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
            if count > max_nodes:
                raise UnsafeYAML(f"{len(text):,} bytes of YAML hold more than {max_nodes:,} nodes "
                                 f"(at most {NODES_FREE:,} + one per {BYTES_PER_NODE} bytes): refused")
        return count
    finally:
        loader.dispose()


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


def check_depth(root: yaml.Node, max_depth: int = MAX_DEPTH) -> None:
    """Raises UnsafeYAML when `root`, a tree (no aliases), nests deeper than `max_depth`."""
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise UnsafeYAML(f"document nests deeper than {max_depth} levels: refused")
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.append((key, depth + 1))
                stack.append((value, depth + 1))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
