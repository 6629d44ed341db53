"""The three patch types a Kubernetes API server takes, as it applies them."""

from __future__ import annotations

import copy
from typing import Any

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class PatchError(ValueError):
    pass


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge for the kinds served here: their lists have no merge keys, so it is a
    merge patch plus the `$patch: replace|delete` directives on maps."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive is not None:
        raise PatchError(f"unknown $patch directive {directive!r}")
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            raise PatchError(f"unsupported directive {key!r}")
        if value is None:
            out.pop(key, None)
            continue
        merged = strategic_merge_patch(out.get(key), value)
        if merged is None:
            out.pop(key, None)
        else:
            out[key] = merged
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with /")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise PatchError(f"path element {part!r} not found")
    return node, parts[-1]


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 (add, remove, replace, test, copy, move); a failed `test` fails the patch."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed operation {op!r}")
        parts = _pointer(op["path"])
        kind = op["op"]
        if kind in ("copy", "move"):
            src_parent, src_key = _parent(doc, _pointer(op["from"]))
            value = copy.deepcopy(src_parent[int(src_key)] if isinstance(src_parent, list) else src_parent[src_key])
            if kind == "move":
                del src_parent[int(src_key) if isinstance(src_parent, list) else src_key]
            kind, op = "add", {**op, "value": value}
        if not parts:
            if kind == "test":
                if doc != op.get("value"):
                    raise PatchError("test operation failed")
                continue
            doc = copy.deepcopy(op["value"])
            continue
        parent, key = _parent(doc, parts)
        if isinstance(parent, list):
            index = len(parent) if key == "-" else int(key)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "remove":
                del parent[index]
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "test":
                if parent[index] != op.get("value"):
                    raise PatchError(f"test operation failed at {op['path']}")
            else:
                raise PatchError(f"unknown op {kind!r}")
            continue
        if not isinstance(parent, dict):
            raise PatchError(f"cannot apply {kind} at {op['path']}")
        if kind == "add":
            parent[key] = copy.deepcopy(op["value"])
        elif kind in ("remove", "replace", "test"):
            if key not in parent:
                raise PatchError(f"{op['path']} not found")
            if kind == "remove":
                del parent[key]
            elif kind == "replace":
                parent[key] = copy.deepcopy(op["value"])
            elif parent[key] != op.get("value"):
                raise PatchError(f"test operation failed at {op['path']}")
        else:
            raise PatchError(f"unknown op {kind!r}")
    return doc


def apply_patch(content_type: str, target: dict[str, Any], patch: Any) -> dict[str, Any]:
    media = content_type.split(";")[0].strip().lower()
    if media == MERGE:
        return merge_patch(target, patch)
    if media == STRATEGIC:
        return strategic_merge_patch(target, patch)
    if media == JSON_PATCH:
        return json_patch(target, patch)
    raise PatchError(f"unsupported patch type {media!r}")
