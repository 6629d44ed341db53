"""The file source: a directory (recursive) of Kubernetes YAML manifests, as `oc get -o yaml` prints them.

It lists, then polls for changed files, and hands every change to the handler it runs
with, like a Kubernetes watch (ADDED / MODIFIED / DELETED). Writes into the manifests
(write-back, new objects) are `file_writes.py`'s; this module keeps what it knows of the
files up to date after them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from .. import bounded_yaml
from ..model.objects import ObjectKey, digested, has_large_values, object_key, slim
from . import file_writes, listing
from .events import Change, ChangeHandler, Ingesting, Mutation
from .listing import ListingStore

log = logging.getLogger("ignition_server.sources.files")

_SUFFIXES = (".yaml", ".yml", ".json")
_RACY_NS = 2_000_000_000
SNAPSHOT_INTERVAL = 10.0
# A poll's walk stats every manifest: ~45 ms of CPU at the seeds' 11,001 files on an idle core,
# two to four times that beside the serving workers after a restart. Polls are spaced so that
# walking takes at most this share of one core, however large the source or busy the machine.
WALK_CPU_SHARE = 0.05
# A manifest larger than this is refused unread (a 300 KiB payload's token Secret is ~350 KiB).
MAX_MANIFEST_BYTES = 32 * 1024 * 1024


Stamp = tuple[int, int, int]  # (mtime_ns, size, inode)


@dataclass(frozen=True)
class _Scan:
    """What a poll's walk found, before anything is read: the files to read (new, changed, or
    written too recently for their stamp to tell) and the files gone."""

    to_read: list[tuple[str, Stamp]]
    gone: list[str]


@dataclass(slots=True)  # one per file, 11,001 at the seeds' fleet: no __dict__ each
class _FileState:
    stamp: tuple[int, int, int]  # (mtime_ns, size, inode)
    digest: str
    keys: tuple[ObjectKey, ...] = ()
    # When its content was last read (time_ns). Read within _RACY_NS of its stamp, it is read
    # once more after that, so the snapshot's record is one a restart can trust (files this
    # server writes are always read that soon: without it, a restart parsed them all again).
    read_at: int = 1 << 62


@dataclass
class FileSource:
    root: Path
    poll_interval: float = 0.5
    read_only: bool = False
    # Files are named by their path as a str, as the walk finds it: a Path object per file was
    # ~300 B more each (its parts list and cached text), 11,001 of them at the seeds' fleet.
    _files: dict[str, _FileState] = field(default_factory=dict)
    _objects: dict[ObjectKey, dict[str, Any]] = field(default_factory=dict)
    _where: dict[ObjectKey, str] = field(default_factory=dict)
    _handler: ChangeHandler | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _listed: bool = False
    _large: set[ObjectKey] = field(default_factory=set)  # keys whose slim copy holds LargeValues
    # Which objects to keep in memory (slim); the others are kept as a fingerprint only and
    # read again from their file when asked for (the reconciler keeps what it needs of them).
    retain: Callable[[dict[str, Any]], bool] = lambda _obj: True
    # Objects whose values are kept as digests only, however small (get_full reads the file):
    # for objects only ever compared, as the user-data Secrets the reconciler writes (~8 MiB of
    # pointer configs at 5,280 NodePools, each with its token).
    digest_values: Callable[[dict[str, Any]], bool] = lambda _obj: False
    _fingerprints: dict[ObjectKey, bytes] = field(default_factory=dict)  # sha256 digests: 65 B each, the hex 113
    # Where the listing is kept between runs, so a restart parses only the files that
    # changed (sources/listing.py).
    state: ListingStore | None = None
    _records: dict[str, bytes] = field(default_factory=dict)  # per file, for the next snapshot (listing.encode_record)
    _restorable: dict[str, bytes] = field(default_factory=dict)  # the last snapshot's records, until listed
    _snapshot_dirty: bool = False  # a record changed since the snapshot was saved (or loaded)
    # Held while a poll reads the files it found changed (`run`'s `ingesting`): the reconciler
    # starts no render meanwhile, so a flood of new files is parsed at full speed and every
    # token Secret in it (another tenant's too) is indexed before the CPU goes to renders.
    _ingesting: Ingesting = contextlib.nullcontext
    # Walks and parses run on a thread of their own: queued behind the write-backs and renders
    # of the default executor, one poll's reading waited a second or more under a flood.
    _reader: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="file-source"))
    _walk_cpu: float = 0.0  # CPU seconds the last poll's walk took (its thread's)

    @property
    def writable(self) -> bool:
        return not self.read_only and os.access(self.root, os.W_OK)

    def describe(self) -> str:
        return f"directory {self.root}"

    def objects(self) -> dict[ObjectKey, dict[str, Any]]:
        return dict(self._objects)

    def get(self, key: ObjectKey) -> dict[str, Any] | None:
        """The object as kept in memory: values over LARGE_VALUE_BYTES are LargeValue digests.

        An object not retained is read from its file (blocking I/O)."""
        found = self._objects.get(key)
        if found is None and key in self._fingerprints:
            full = self.get_full(key)
            return slim(full) if full is not None else None
        return found

    def get_full(self, key: ObjectKey) -> dict[str, Any] | None:
        """The whole object, read again from its file when it has large values (blocking I/O)."""
        if key not in self._large and key in self._objects:
            return self._objects[key]
        path = self._where.get(key)
        if path is None:
            return None
        try:
            parsed = self._parse(Path(path).read_bytes())
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            return None
        return next((obj for found, obj in parsed if found == key), None)

    def attach(self, handler: ChangeHandler) -> None:
        """Hand every later batch of changes (`poll_once`, a write-back's own change) to `handler`."""
        self._handler = handler

    async def run(self, handler: ChangeHandler, *, ingesting: Ingesting | None = None,
                  iterations: int | None = None) -> None:
        """List, hand the listing over as ADDED changes, then poll until cancelled: each poll
        starts one `poll_interval` after the one before started (however long a flood's took),
        a quarter of one after it ended at the least; longer when walking the directory would
        take more than WALK_CPU_SHARE of a core (`poll_spacing`).

        `ingesting` is held while a poll reads changed files; `iterations` bounds the poll loop
        for tests (as kopf's watcher does).
        """
        self.attach(handler)
        if ingesting is not None:
            self._ingesting = ingesting
        if not self.root.is_dir():
            raise FileNotFoundError(f"source directory {self.root} does not exist")
        started = time.monotonic()
        if self.state is not None and not self._listed:
            await asyncio.to_thread(self._load_snapshot)
        restorable = len(self._restorable)
        await self.poll_once()
        log.info(
            "listed %s: %d objects in %d files in %.1fs (%d files restored from the snapshot)",
            self.root, len(self._fingerprints), len(self._files), time.monotonic() - started,
            restorable - len(self._restorable),
        )
        if self._restorable:
            self._snapshot_dirty = True  # records of files gone while down: the snapshot drops them
        self._restorable.clear()
        await self._save_snapshot()
        last_save = time.monotonic()
        count = 0
        failing: str | None = None
        polled = time.monotonic()
        while iterations is None or count < iterations:
            since = time.monotonic() - polled
            interval = poll_spacing(self.poll_interval, self._walk_cpu)
            await asyncio.sleep(max(interval - since, interval / 4))
            polled = time.monotonic()
            try:
                await self.poll_once()
                failing = None
            except Exception as exc:
                # An unreadable directory is an outage of the source, not of the server:
                # keep what we know and try again (said once, not every poll). Nor does
                # any other fault stop the poller: later changes must still arrive.
                said = f"{type(exc).__name__}: {exc}"
                if said != failing:
                    log.warning("cannot read source %s (polling on): %s", self.root, said)
                failing = said
            if time.monotonic() - last_save > SNAPSHOT_INTERVAL:
                await self._save_snapshot()
                last_save = time.monotonic()
            count += 1

    def _load_snapshot(self) -> None:
        assert self.state is not None
        raw = self.state.load_state(listing.SNAPSHOT_NAME)
        if raw is None:
            return
        try:
            self._restorable = listing.unpack(raw, str(self.root.resolve()))
        except ValueError as exc:
            log.warning("source listing snapshot unusable, listing from scratch: %s", exc)

    def _write_snapshot(self, state: ListingStore, records: dict[str, bytes]) -> None:
        state.save_state(listing.SNAPSHOT_NAME, listing.pack(str(self.root.resolve()), records))

    async def flush(self) -> None:
        """Save what a restart needs (the listing snapshot) now; for a draining shutdown."""
        await self._save_snapshot()

    async def _save_snapshot(self) -> None:
        if self.state is None or not self._snapshot_dirty:
            return
        self._snapshot_dirty = False
        records = dict(self._records)  # the rest happens off the event loop
        try:
            await asyncio.to_thread(self._write_snapshot, self.state, records)
        except OSError as exc:
            self._snapshot_dirty = True
            log.warning("could not save the source listing snapshot: %s", exc)

    async def poll_once(self) -> None:
        loop = asyncio.get_running_loop()
        async with self._lock:
            scan = await loop.run_in_executor(self._reader, self._walk_for_changes)
            changes: list[Change] = []
            if scan.to_read or scan.gone:
                with self._ingesting():
                    changes = await loop.run_in_executor(self._reader, self._read, scan)
        # The first listing is handed over even when empty: it tells the reconciler what is gone.
        if (changes or not self._listed) and self._handler is not None:
            self._listed = True
            await self._handler(changes)

    def read_once(self) -> dict[ObjectKey, dict[str, Any]]:
        """Read the directory once, without running or telling a handler: for a one-shot
        command (`ignition-server render`). Returns `objects()`; `get_full` then reads any
        object whole. Blocking I/O."""
        self._rescan()
        return self.objects()

    def _rescan(self) -> list[Change]:
        return self._read(self._walk_for_changes())

    def _walk_for_changes(self) -> _Scan:
        started = time.thread_time()
        try:
            return self._compare_walk()
        finally:
            self._walk_cpu = time.thread_time() - started

    def _compare_walk(self) -> _Scan:
        seen: set[str] = set()
        to_read: list[tuple[str, Stamp]] = []
        now_ns = time.time_ns()
        for path, stamp in self._walk():
            seen.add(path)
            known = self._files.get(path)
            # Timestamps are coarse (a few ms): a same-size rewrite within one tick keeps the
            # stamp, so a recently modified file is re-hashed until its stamp is old (as git
            # does for "racily clean" entries).
            # A file read within the racy window of its stamp is read once more after it, so its
            # snapshot record is one a restart trusts.
            if known is None or known.stamp != stamp or now_ns - stamp[0] <= _RACY_NS \
                    or known.read_at - stamp[0] <= _RACY_NS:
                to_read.append((path, stamp))
        return _Scan(to_read, [p for p in self._files if p not in seen])

    def _read(self, scan: _Scan) -> list[Change]:
        changes: list[Change] = []
        for path, stamp in scan.to_read:
            known = self._files.get(path)
            raw_record = self._restorable.get(path) if known is None else None
            record = _decoded(raw_record, path)
            if record is not None and record.stamp == stamp and record.read_at - stamp[0] > _RACY_NS:
                del self._restorable[path]
                changes.extend(self._apply_parsed(path, stamp, record.digest, record.objects, raw_record, record.read_at))
                continue
            changes.extend(self._reload(path, stamp))
        for path in scan.gone:
            changes.extend(self._forget(path))
        return changes

    def _walk(self) -> list[tuple[str, tuple[int, int, int]]]:
        """Every manifest under the root with its stamp, in path order: one scandir pass (at
        10,000 files a poll is a few tens of ms instead of hundreds). Stamps, not stat results:
        10,560 of those are ~19 MiB of small objects, and the first listing's were freed among
        everything it keeps, as holes the heap could not give back.

        A stack, not a nested function calling itself: that function and its closure were a
        reference cycle holding the poll's whole result, freed only by a full garbage
        collection, so every poll's list piled up between two (+50 MiB in two minutes in an
        idle owner at 110 x 12, issue 33)."""
        found: list[tuple[str, tuple[int, int, int]]] = []
        stack = [iter(_sorted_entries(str(self.root)))]  # depth first, each directory in name order
        while stack:
            entry = next(stack[-1], None)
            if entry is None:
                stack.pop()
            elif entry.name.startswith("."):
                continue
            elif entry.is_dir(follow_symlinks=False):  # as os.walk: no symlink loops
                stack.append(iter(_sorted_entries(entry.path)))
            elif entry.name.endswith(_SUFFIXES):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                found.append((entry.path, (st.st_mtime_ns, st.st_size, st.st_ino)))
        return found

    def _reload(self, path: str, stamp: tuple[int, int, int]) -> list[Change]:
        if stamp[1] > MAX_MANIFEST_BYTES:
            # Not read at all: one file must not cost the others their memory or their turn.
            known = self._files.get(path)
            marker = f"too large: {stamp}"
            if known is None or known.digest != marker:
                log.error("%s is %d bytes, over the %d-byte limit for a manifest: refused unread, "
                          "keeping its last good objects", path, stamp[1], MAX_MANIFEST_BYTES)
            if known is not None:
                known.stamp, known.digest = stamp, marker
            else:
                self._files[path] = _FileState(stamp, marker)
            return []
        try:
            raw = Path(path).read_bytes()
        except FileNotFoundError:
            return self._forget(path)
        digest = hashlib.sha256(raw).hexdigest()
        known = self._files.get(path)
        if known is not None and known.digest == digest:
            known.stamp, known.read_at = stamp, time.time_ns()
            kept = self._records.get(path)
            if kept is not None and known.read_at - stamp[0] > _RACY_NS:  # a racy read changes nothing for a restart
                self._records[path] = listing.restamped(kept, stamp, known.read_at)
                self._snapshot_dirty = True
            return []
        try:
            parsed = self._parse(raw)
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            # Bad input loses nothing: the objects this file held before stay as they were,
            # also across a restart (the listing snapshot remembers them).
            log.error("cannot parse %s, keeping its last good objects: %s", path, exc)
            raw_record = self._restorable.pop(path, None) if known is None else None
            record = _decoded(raw_record, path)
            if record is not None:
                return self._apply_parsed(path, stamp, digest, record.objects)
            if known is not None:
                known.stamp, known.digest = stamp, digest
            else:
                self._files[path] = _FileState(stamp, digest)
            return []
        return self._apply_parsed(path, stamp, digest, [(key, slim(obj)) for key, obj in parsed])

    def _apply_parsed(
        self, path: str, stamp: tuple[int, int, int], digest: str, parsed: list[tuple[ObjectKey, dict[str, Any]]],
        restored: bytes | None = None, read_at: int | None = None,
    ) -> list[Change]:
        """Apply a file's objects; `restored`: the snapshot's record they came from, kept as it is."""
        known = self._files.get(path)
        old_keys = set(known.keys) if known else set()
        changes: list[Change] = []
        new_keys: list[ObjectKey] = []
        applied: list[tuple[ObjectKey, dict[str, Any]]] = []
        for key, kept in parsed:
            if self.digest_values(kept):
                kept = digested(kept)
            other = self._where.get(key)
            if other is not None and other != path and other in self._files:
                log.error("%s in %s is also defined in %s; ignoring the copy in %s", key, path, other, path)
                continue
            new_keys.append(key)
            applied.append((key, kept))
            previous = self._fingerprints.get(key)
            fingerprint = _fingerprint(kept)
            if previous != fingerprint:
                # Handlers get the slim copy too: a first listing of thousands of large
                # Secrets must not hold them all at once. `get_full` reads one when needed.
                changes.append(Change("MODIFIED" if previous is not None else "ADDED", key, kept))
            self._fingerprints[key] = fingerprint
            if self.retain(kept):
                self._objects[key] = kept
            else:
                self._objects.pop(key, None)
            if has_large_values(kept):
                self._large.add(key)
            else:
                self._large.discard(key)
            self._where[key] = path
        for key in old_keys - set(new_keys):
            changes.append(Change("DELETED", key, self._drop(key)))
        read_at = time.time_ns() if read_at is None else read_at
        self._files[path] = _FileState(stamp, digest, tuple(new_keys), read_at)
        if self.state is not None:
            if restored is not None:
                self._records[path] = restored  # as the saved snapshot holds it: nothing to save
            else:
                self._records[path] = listing.encode_record(stamp, digest, read_at, applied)
                self._snapshot_dirty = True
        return changes

    def _drop(self, key: ObjectKey) -> dict[str, Any]:
        self._where.pop(key, None)
        self._large.discard(key)
        self._fingerprints.pop(key, None)
        gone = self._objects.pop(key, None)
        return gone if gone is not None else {"kind": key.kind, "metadata": {"name": key.name, "namespace": key.namespace}}

    def _forget(self, path: str) -> list[Change]:
        if self._records.pop(path, None) is not None:
            self._snapshot_dirty = True
        state = self._files.pop(path, None)
        changes = []
        for key in state.keys if state else ():
            if self._where.get(key) == path:
                changes.append(Change("DELETED", key, self._drop(key)))
        return changes

    @staticmethod
    def _parse(raw: bytes) -> list[tuple[ObjectKey, dict[str, Any]]]:
        found = []
        for document in bounded_yaml.load_all(raw.decode()):
            for obj in file_writes.objects_of(document):
                key = object_key(obj)
                if key is not None:
                    found.append((key, obj))
        return found

    async def write_back(self, key: ObjectKey, mutate: Mutation) -> dict[str, Any] | None:
        """Apply `mutate` to the freshest copy of `key` in its file and replace that file atomically.

        `mutate` changes the object in place and returns False when there is nothing to
        write. Returns the object as written, or None when nothing was written.
        """
        if not self.writable:
            raise PermissionError(f"source {self.root} is read-only")
        async with self._lock:
            changes, written = await asyncio.to_thread(self._write_back, key, mutate)
        if changes and self._handler is not None:
            await self._handler(changes)
        return written

    async def put(self, obj: dict[str, Any], *, beside: ObjectKey) -> None:
        """Create or replace an object; a new one gets its own file next to `beside`'s."""
        key = object_key(obj)
        if key is None:
            raise ValueError("an object needs kind and metadata.name")
        if key in self._where:
            await self.write_back(key, file_writes.replace_with(obj))
            return
        if not self.writable:
            raise PermissionError(f"source {self.root} is read-only")
        async with self._lock:
            changes = await asyncio.to_thread(self._create, key, obj, beside)
        if changes and self._handler is not None:
            await self._handler(changes)

    def _create(self, key: ObjectKey, obj: dict[str, Any], beside: ObjectKey) -> list[Change]:
        near = self._where.get(beside)
        directory = os.path.dirname(near) if near is not None else str(self.root)
        created = file_writes.create(Path(directory), key, obj)
        path = os.path.join(directory, created.name)  # named as the walk names it (scandir's join)
        return self._reload(path, _stamp(path))

    def _write_back(self, key: ObjectKey, mutate: Mutation) -> tuple[list[Change], dict[str, Any] | None]:
        path = self._where.get(key)
        if path is None:
            raise KeyError(f"{key} is not in the source")
        done = file_writes.rewrite(Path(path), key, mutate)
        if done is None:
            return self._reload(path, _stamp(path)), None
        if done.objects is not None:
            return self._apply_parsed(path, _stamp(path), hashlib.sha256(done.data).hexdigest(), done.objects), done.obj
        return self._reload(path, _stamp(path)), done.obj


def _sorted_entries(directory: str) -> list[os.DirEntry[str]]:
    with os.scandir(directory) as entries:
        return sorted(entries, key=lambda entry: entry.name)


def poll_spacing(interval: float, walk_cpu: float) -> float:
    """Seconds from one poll's start to the next: `interval`, or longer when the last walk's CPU
    time would otherwise be more than WALK_CPU_SHARE of a core."""
    return max(interval, walk_cpu / WALK_CPU_SHARE)


def _decoded(raw: bytes | None, path: str) -> listing.Record | None:
    if raw is None:
        return None
    try:
        return listing.decode_record(raw)
    except ValueError as exc:
        log.warning("listing snapshot record of %s unusable, reading the file: %s", path, exc)
        return None


def _fingerprint(obj: dict[str, Any]) -> bytes:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).digest()


def _stamp(path: str | Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)
