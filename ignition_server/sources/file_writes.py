"""Writing into the file source's manifests: one object changed in its file, or a new object's own file.

A write-back rewrites only the document it changes, keeps the file's other documents as
they were written, replaces the file atomically (temp file, fsync, rename) and never over
an edit made meanwhile. What the file source then knows of the file (its objects, its
stamp) is the file source's business (`files.py`); this module only touches files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from .. import bounded_yaml
from ..fsio import atomic_write, fsync_dir, temp_path_for, write_exclusive
from ..model.objects import ObjectKey, object_key, slim
from .events import Mutation

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_DOC_SEPARATOR = re.compile(r"(?m)^---[ \t]*(?:#.*)?\n?")
_ATTEMPTS = 10  # edits racing ours; past that the file is left to settle and the write fails


class ManifestUnreadable(ValueError):
    """A write-back's target file does not parse (edited by hand meanwhile); nothing was written."""


@dataclass(frozen=True)
class Rewritten:
    """A write-back that changed its file."""

    obj: dict[str, Any]  # the object as written
    data: bytes  # the file's new content
    # A one-document file's objects (slim), as a re-read would parse them; None: read the file again.
    objects: list[tuple[ObjectKey, dict[str, Any]]] | None


def objects_of(document: Any) -> list[dict[str, Any]]:
    """The objects one YAML document holds: itself, or a List's items."""
    if not isinstance(document, dict):
        return []
    if document.get("kind") == "List" or (document.get("kind", "").endswith("List") and "items" in document):
        return [item for item in document.get("items") or [] if isinstance(item, dict)]
    return [document]


def split_documents(text: str) -> list[str]:
    """The documents of a multi-document YAML file, each with its own text kept verbatim."""
    return _DOC_SEPARATOR.split(text)


def rewrite(path: Path, key: ObjectKey, mutate: Mutation) -> Rewritten | None:
    """Apply `mutate` to the freshest copy of `key` in `path` and replace the file atomically.

    `mutate` changes the object in place and returns False when there is nothing to write
    (then None). Blocking I/O.
    """
    for _ in range(_ATTEMPTS):
        # A symlinked manifest (a GitOps checkout, a Kubernetes volume's `..data/` chain)
        # is written where it really lives, and the link(s) stay: replacing the link
        # itself would leave the operator's file with the old token. Resolved on every
        # attempt, since a volume update swaps `..data` to a new directory.
        real = Path(os.path.realpath(path))
        with open(real, "rb") as original:
            raw = original.read()
            inode = os.fstat(original.fileno()).st_ino
            edited = _edit(path, raw, key, mutate)
            if edited is None:
                return None
            new_text, target, objects = edited
            new_bytes = new_text.encode()
            mode = real.stat().st_mode & 0o7777
            if key.kind == "Secret":  # it now holds a token the server made: never world-readable
                mode &= ~0o007  # (the group the operator chose keeps its access)
            tmp = temp_path_for(real)  # in the target's own directory: the rename stays atomic
            _writing(real, lambda: write_exclusive(tmp, new_bytes, mode))
            # Compare before replacing: an edit made while we worked must not be clobbered.
            if os.stat(real).st_ino != inode or os.pread(original.fileno(), len(raw) + 1, 0) != raw:
                os.unlink(tmp)
                continue
            try:
                _writing(real, lambda: os.replace(tmp, real))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            fsync_dir(real.parent)
            # An in-place write racing the rename landed in the old file: it wins, and
            # the mutation is applied again on top of it.
            late = _read_all(original.fileno())
            if late != raw:
                atomic_write(real, late, real.stat().st_mode & 0o7777)
                continue
        return Rewritten(target, new_bytes, objects)
    raise RuntimeError(f"{path} kept changing while writing back {key}")


def create(directory: Path, key: ObjectKey, obj: dict[str, Any]) -> Path:
    """Write a new object into a file of its own in `directory` (a free name after its own); returns the file."""
    path = directory / f"{key.name}.yaml"
    counter = 1
    while path.exists():
        path = directory / f"{key.name}-{counter}.yaml"
        counter += 1
    # Private: what the server creates (user-data Secrets) holds the current token.
    atomic_write(path, yaml.dump(obj, Dumper=_Dumper, sort_keys=False).encode(), 0o600)
    return path


def replace_with(new: dict[str, Any]) -> Mutation:
    """The mutation that makes an object `new` (nothing to write when it already is)."""

    def mutate(obj: dict[str, Any]) -> bool:
        if obj == new:
            return False
        obj.clear()
        obj.update(new)
        return True

    return mutate


def _edit(
    path: Path, raw: bytes, key: ObjectKey, mutate: Mutation
) -> tuple[str, dict[str, Any], list[tuple[ObjectKey, dict[str, Any]]] | None] | None:
    """The file's new text, the mutated object and, for a one-document file, its objects (slim)."""
    try:
        text = raw.decode()
        documents = split_documents(text)
    except UnicodeDecodeError as exc:
        raise ManifestUnreadable(f"{path} is not UTF-8 text ({exc}); left as it is") from None
    for index, doc_text in enumerate(documents):
        try:
            document = bounded_yaml.load(doc_text)
        except yaml.YAMLError as exc:
            # Nothing is written to a file that no longer parses: the operator's edit
            # stays exactly as it is, and the write is tried again once it is fixed.
            raise ManifestUnreadable(f"{path} no longer parses, left as it is: {_one_line(exc)}") from None
        target = next((o for o in objects_of(document) if object_key(o) == key), None)
        if target is not None:
            break
    else:
        raise KeyError(f"{key} is no longer in {path}")
    if not mutate(target):
        return None
    documents[index] = yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    written = None
    if len([d for d in documents if d.strip()]) == 1:
        # A one-document file: what we wrote is what a re-read would parse (a 345 KiB
        # manifest costs more to parse than to write).
        written = [(k, slim(o)) for o in objects_of(document) if (k := object_key(o)) is not None]
    return _join_documents(text, documents), target, written


def _join_documents(original: str, documents: list[str]) -> str:
    separators = _DOC_SEPARATOR.findall(original)
    out = [documents[0]]
    for separator, document in zip(separators, documents[1:]):
        if out[-1] and not out[-1].endswith("\n"):
            out.append("\n")
        out.append(separator if separator.endswith("\n") else separator + "\n")
        out.append(document)
    return "".join(out)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _writing(target: Path, write: Callable[[], None]) -> None:
    """Run `write`; a target that cannot be written (read-only mount, permissions) says which file."""
    try:
        write()
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise PermissionError(exc.errno, f"cannot write {target} ({os.strerror(exc.errno)})") from None
        raise


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)
