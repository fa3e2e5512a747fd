"""What a snapshot root holds, one :class:`SnapshotInfo` a folder, and finding one by id prefix.

States:

``committed``  the folder has a valid ``manifest.json``: a snapshot that readers use
``writing``    no manifest yet and a live write lease: a writer is at work
``abandoned``  no manifest and no live write lease: a writer died (its shards may be resumed by
               the next run of the same pipeline, or purged with ``--incomplete``)
``corrupt``    ``manifest.json`` exists but cannot be read (see :attr:`SnapshotInfo.problem`)

A snapshot folder is a folder of the root named by a fingerprint (``layout.is_fingerprint``)
that holds at least one file snapcache writes (``layout.is_own_file``): any other folder,
empty or holding only other files, is not one and is not listed. A snapshot folder that also
holds other files lists them in :attr:`SnapshotInfo.foreign_files`; ``purge`` leaves it alone.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

from snapcache.errors import CorruptSnapshotError, UnknownFormatVersionError
from snapcache.options import default_root, default_root_from_environment
from snapcache.store import layout
from snapcache.store.protocol import versions
from snapcache.store.catalog import read_entry
from snapcache.store.fs import FileStat, Storage
from snapcache.store.protocol import LeaseInfo, expired, read_leases, write_leases
from snapcache.store.manifest import Manifest

STATES = ("committed", "writing", "abandoned", "corrupt")


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot folder of a root, as ``snapcache ls`` shows it.

    Example::

        for snap in snapcache.ls("s3://bucket/snaps"):
            print(snap.short_id, snap.name, snap.state, snap.size_bytes)
    """

    id: str                          # the fingerprint (folder name)
    url: str                         # where the folder is
    state: str                       # one of STATES
    name: str | None                 # the human name given with snapshot(..., name=...)
    num_examples: int | None         # None unless committed
    num_shards: int                  # listed in the manifest, or shard files present
    size_bytes: int                  # every file in the folder, bookkeeping included
    raw_bytes: int | None            # uncompressed payload, if the manifest records it
    created_at: datetime | None
    last_used: datetime | None       # last read, else commit time, else newest file
    pipeline: str                    # one-line summary of the upstream pipeline
    live_leases: tuple[LeaseInfo, ...] = ()
    problem: str = ""                # why the manifest cannot be read (state "corrupt")
    newer_format: bool = False       # ... because a newer snapcache wrote it: not damaged,
                                     # this release can neither read, verify nor rebuild it
    corrupt_leases: tuple[str, ...] = ()  # lease files that cannot be parsed, and why
    link_target: str | None = None   # the folder is a symbolic link to this path: its bytes
                                     # live outside the root (size_bytes counts none of them)
    tmp_files: int = 0               # temporary files (layout.is_tmp): being written, or left
                                     # by a killed writer (``purge --incomplete`` removes stale)
    manifest: Manifest | None = field(default=None, repr=False, compare=False)
    files: tuple[FileStat, ...] = field(default=(), repr=False, compare=False)
    versions: tuple[int, ...] = ()   # a delta snapshot's versions (``manifest``: the newest)
    referenced: frozenset[str] | None = field(default=None, repr=False, compare=False)
    """A delta snapshot: the files some version needs (shards shared by versions once)."""
    unreadable_versions: tuple[versions.Unreadable, ...] = ()
    """A delta snapshot: versions whose manifest cannot be read (the newest can: ``problem``
    says why and what to do; ``newer``: written by a newer snapcache, not damaged)."""

    @property
    def short_id(self) -> str:
        return self.id[:12]

    @property
    def foreign_files(self) -> tuple[str, ...]:
        """Files in the folder that snapcache does not write (a user's): ``purge`` never
        deletes a folder holding any (a symbolic link to one loses only the link)."""
        return tuple(f.path for f in self.files if not layout.is_own_file(f.path))

    @property
    def compression_ratio(self) -> float | None:
        """Uncompressed over stored shard bytes (2.0: shards take half the raw size)."""
        stored = self.manifest.total_bytes if self.manifest is not None else 0
        return self.raw_bytes / stored if self.raw_bytes and stored else None

    @property
    def leased(self) -> bool:
        return bool(self.live_leases)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (what ``snapcache ls --json`` prints for each snapshot)."""
        def iso(t: datetime | None) -> str | None:
            return t.isoformat(timespec="seconds") if t is not None else None

        return {
            "id": self.id, "name": self.name, "state": self.state, "url": self.url,
            "num_examples": self.num_examples, "num_shards": self.num_shards,
            "size_bytes": self.size_bytes, "raw_bytes": self.raw_bytes,
            "compression_ratio": round(self.compression_ratio, 3)
            if self.compression_ratio else None,
            "created_at": iso(self.created_at), "last_used": iso(self.last_used),
            "pipeline": self.pipeline, "problem": self.problem or None,
            "newer_format": self.newer_format,
            "versions": list(self.versions) or None,
            "unreadable_versions": [{"version": u.version, "problem": u.problem,
                                     "newer": u.newer} for u in self.unreadable_versions],
            "corrupt_leases": list(self.corrupt_leases),
            "link_target": self.link_target, "tmp_files": self.tmp_files,
            "foreign_files": list(self.foreign_files),
            "live_leases": [{"kind": lease.kind, "host": lease.host, "pid": lease.pid,
                             "file": lease.name} for lease in self.live_leases],
        }


def open_root(root: str | os.PathLike | None = None, storage_options: dict | None = None
              ) -> Storage:
    """The root to work on (default ``$SNAPCACHE_ROOT`` or ``~/.cache/snapcache``); raises
    FileNotFoundError if a local root does not exist (a prefix of an object store with no
    objects is an empty root: S3 has no folders, so purging the last snapshot removes it)."""
    storage = Storage(default_root() if root is None else root, storage_options)
    if not storage.exists():
        if not storage.local and storage.bucket_exists():
            return storage  # an object store has no folders: an emptied root is empty
        if root is None:
            raise FileNotFoundError(_missing_default_root(storage.url))
        raise FileNotFoundError(f"snapshot root {storage.url} does not exist")
    if storage.local and not os.path.isdir(storage.root):
        raise NotADirectoryError(f"snapshot root {storage.url} is not a folder")
    return storage


def _missing_default_root(url: str) -> str:
    if default_root_from_environment():
        return (f"snapshot root {url} (from $SNAPCACHE_ROOT) does not exist: set "
                "$SNAPCACHE_ROOT to the folder holding your snapshots, or pass a root "
                "(`snapcache ls ROOT`)")
    return (f"no snapshots yet: the default snapshot root {url} does not exist (the first "
            "`.snapshot()` without a path creates it); to look elsewhere, pass a root "
            "(`snapcache ls ROOT`) or set $SNAPCACHE_ROOT")


def locate(root: str | os.PathLike | None = None, storage_options: dict | None = None
           ) -> tuple[Storage, str | None]:
    """:func:`open_root`, except that one snapshot's folder given as the root (as
    ``open_snapshot(folder)`` takes it: ``snaps/32f6d8...``) gives its root and its id;
    ``(root, None)`` for a root."""
    storage = open_root(root, storage_options)
    parent, _, name = storage.url.rpartition("/")
    if parent and not parent.endswith(":/") and layout.is_fingerprint(name) and \
            layout.is_snapshot_folder(name, storage.listdir()):  # a LIST only for such names
        return Storage(parent, storage_options), name
    return storage, None


def not_a_root(storage: Storage, own: str, way: str) -> ValueError:
    """The error for the folder of snapshot ``own`` (in root ``storage``) given where a root
    is needed, ``way`` saying what to do instead."""
    return ValueError(f"{storage.url}/{own} is the folder of snapshot {own[:12]}, not a "
                      f"snapshot root: {way}")


def ls(root: str | os.PathLike | None = None, *, storage_options: dict | None = None
       ) -> list[SnapshotInfo]:
    """Every snapshot folder in ``root``: committed ones, most recently used first, then the
    ones being written, abandoned or corrupt. A snapshot's own folder given as ``root``
    lists that snapshot.

    Example::

        >>> [s.name for s in snapcache.ls("/tmp/snaps") if s.state == "committed"]
        ['train-224px', 'val-224px']
    """
    storage, own = locate(root, storage_options)
    return [describe(storage.child(own), own)] if own else scan(storage)


SCAN_THREADS = 16
"""Snapshot folders described at once by :func:`scan`: each is a few requests on S3 (a listing,
the manifest, the leases, the last use), so a root of 200 snapshots 50 ms away took ~50 s one
at a time."""


def scan(storage: Storage) -> list[SnapshotInfo]:
    names = [name for name in storage.listdir() if layout.is_fingerprint(name)]
    if len(names) > 1 and not storage.local:
        with ThreadPoolExecutor(min(SCAN_THREADS, len(names)),
                                thread_name_prefix="snapcache-scan") as pool:
            infos = list(pool.map(lambda name: describe(storage.child(name), name), names))
    else:
        infos = [describe(storage.child(name), name) for name in names]
    return sorted((info for info in infos if _snapshot_folder(info)), key=_order)


def _snapshot_folder(info: SnapshotInfo) -> bool:
    """Whether a folder named like a snapshot is one: it holds a file snapcache writes (a
    symbolic link to a folder is judged by what it points to)."""
    return any(layout.is_own_file(f.path) for f in info.files)


def _order(info: SnapshotInfo) -> tuple:
    used = info.last_used.timestamp() if info.last_used else 0.0
    return (STATES.index(info.state), -used, info.id)


def describe(folder: Storage, fingerprint: str) -> SnapshotInfo:
    """Look at one snapshot folder."""
    files = tuple(folder.walk())
    entry = read_entry(folder, fingerprint)
    manifest, problem = entry.manifest, entry.problem
    every = write_leases(folder) + read_leases(folder)
    leases = tuple(lease for lease in every if not expired(folder, lease, one_shot=True))
    corrupt = tuple(lease.problem for lease in every if lease.corrupt)
    newest = max((f.mtime for f in files if f.mtime is not None), default=None)
    oldest = min((f.mtime for f in files if f.mtime is not None), default=None)
    target = folder.link_target()
    common = dict(id=fingerprint, url=folder.url, live_leases=leases, files=files,
                  corrupt_leases=corrupt,
                  size_bytes=0 if target is not None else sum(f.size for f in files),
                  link_target=target, tmp_files=sum(layout.is_tmp(f.path) for f in files))
    if manifest is not None:
        committed = parse_time(manifest.committed_at)
        return SnapshotInfo(
            state="committed", name=manifest.name, num_examples=manifest.num_examples,
            num_shards=len(manifest.shards), raw_bytes=manifest.raw_bytes or None,
            created_at=parse_time(manifest.created_at) or committed,
            last_used=_last_used(folder, files) or committed, pipeline=manifest.pipeline,
            manifest=manifest, versions=entry.versions, referenced=entry.referenced,
            unreadable_versions=entry.unreadable, **common)
    writing = any(lease.kind == "write" for lease in leases)
    state = "corrupt" if problem else "writing" if writing else "abandoned"
    shards = [f for f in files if f.path.endswith(layout.SHARD_SUFFIX)]
    return SnapshotInfo(
        state=state, name=None, num_examples=None, num_shards=len(shards), raw_bytes=None,
        created_at=_from_timestamp(oldest),
        last_used=_last_used(folder, files) or _from_timestamp(newest), pipeline="",
        problem=problem, newer_format=entry.newer, **common)


def _last_used(folder: Storage, files: Iterable[FileStat]) -> datetime | None:
    if not any(f.path == layout.LAST_USED for f in files):
        return None
    try:
        return parse_time(json.loads(folder.read_bytes(layout.LAST_USED)).get("at"))
    except (OSError, ValueError, AttributeError):
        return None  # torn or hand-edited: fall back to the commit time


def parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _from_timestamp(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, timezone.utc) if seconds is not None else None


def find(storage: Storage, wanted: str) -> SnapshotInfo:
    """The one snapshot in ``storage`` whose id starts with ``wanted`` (or, if no id does, whose
    name is ``wanted``); ValueError naming the candidates otherwise. Only the matching folders
    are read, unless a name has to be looked up."""
    text = wanted.strip().lower()
    if not text:
        raise ValueError("an empty snapshot id")
    names = [n for n in storage.listdir() if layout.is_fingerprint(n)]
    ids = [n for n in names if n.startswith(text)] if layout.is_hex(text) else []
    if ids:
        matches = [info for info in (describe(storage.child(n), n) for n in ids[:6])
                   if _snapshot_folder(info)]
    else:
        matches = [i for i in scan(storage) if i.name == wanted]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ValueError(f"no snapshot {wanted!r} in {storage.url} (see `snapcache ls`)")
    count = max(len(ids), len(matches))
    shown = ", ".join(i.short_id + (f" ({i.name})" if i.name else "") for i in matches[:5])
    more = f" and {count - 5} more" if count > 5 else ""
    raise ValueError(f"{wanted!r} is ambiguous in {storage.url}: it matches {count} "
                     f"snapshots ({shown}{more}); give more digits of the id")


def find_all(storage: Storage, wanted: Iterable[str]) -> list[SnapshotInfo]:
    """Each of ``wanted`` found with :func:`find`, duplicates dropped, in the order given."""
    chosen: dict[str, SnapshotInfo] = {}
    for text in wanted:
        info = find(storage, text)
        chosen.setdefault(info.id, info)
    return list(chosen.values())


def info(root: str | os.PathLike | None, id: str | None = None, *,
         storage_options: dict | None = None) -> SnapshotInfo:
    """One snapshot of ``root``, by any unique prefix of its id (or its exact name), with its
    manifest in :attr:`SnapshotInfo.manifest`. Without ``id``, like ``open_snapshot``: the
    snapshot whose folder ``root`` is, or the only snapshot in ``root``.

    Example::

        snap = snapcache.info("/tmp/snaps", "3fa9c2")
        print(snap.manifest.schema)
    """
    storage, own = locate(root, storage_options)
    if own is not None:
        if id is not None:
            raise not_a_root(storage, own, "give the folder alone, or its root and an id "
                                           f"(`snapcache info {storage.url} {id}`)")
        return describe(storage.child(own), own)
    if id is not None:
        return find(storage, id)
    found = scan(storage)  # snapshot folders only, by their contents (as `ls` lists them)
    if len(found) == 1:
        return found[0]
    if not found:
        raise ValueError(f"no snapshots in {storage.url}")
    shown = ", ".join(i.short_id + (f" ({i.name})" if i.name else "") for i in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    raise ValueError(f"{storage.url} holds {len(found)} snapshots ({shown}{more}): give one "
                     "id (a unique prefix, as `snapcache ls` shows) or name")


def delta_versions(snap: SnapshotInfo, storage_options: dict | None = None) -> list[Manifest]:
    """The committed versions of a delta snapshot that can be read (oldest first; empty for
    other snapshots): the others are in :attr:`SnapshotInfo.unreadable_versions`."""
    folder = Storage(snap.url, storage_options)
    found = []
    for version in snap.versions:
        try:
            manifest = versions.load_version(folder, version)
        except (CorruptSnapshotError, UnknownFormatVersionError):
            continue  # damaged since the snapshot was described: said by the next look
        if manifest is not None:
            found.append(manifest)
    return found


def source_files(snap: SnapshotInfo, storage_options: dict | None = None
                 ) -> list[dict] | None:
    """The files a delta snapshot's newest version was built from, in its order: each a dict
    of ``path``, ``size``, ``mtime_ns`` or ``etag``, and ``segment``. None for a snapshot
    that records none: not a delta snapshot (only ``from_files`` / ``from_parquet`` sources
    make one), or not committed."""
    if not snap.versions or snap.manifest is None:
        return None
    folder = Storage(snap.url, storage_options)
    return [{**unit.identity, "segment": unit.segment}
            for unit in versions.read_units(folder, snap.manifest)]
