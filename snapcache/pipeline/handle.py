"""The public handle on one snapshot: what users, adapters and the CLI hold.

:func:`open_snapshot` finds a snapshot in a root (by id prefix or name) or takes a snapshot
folder; ``Dataset.open_snapshot()`` gives the pipeline's own. The handle says where the
snapshot is and what state it is in, and reads a committed one by row::

    snap = snapcache.open_snapshot("s3://bucket/snaps", "3fa9c2")
    snap.state, snap.num_examples         # ('committed', 120000)
    snap[17], snap.take([3, 1, 4])        # one record batch decoded per row, not a shard
    train = snap.to_torch_map_style()     # a map-style torch Dataset for your own sampler

States (one vocabulary, the same as ``snapcache ls``):

``committed``  a valid manifest: readers use it
``writing``    no manifest yet, a live write lease: a writer is at work
``abandoned``  no manifest and no live writer: its shards wait for a resume or a purge
``absent``     nothing there (never written, or purged)
``corrupt``    the manifest cannot be read, or belongs to another snapshot
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Protocol, Sequence

from snapcache.errors import (
    CorruptSnapshotError, SnapshotNotFoundError, SnapshotStateError, UnknownFormatVersionError)
from snapcache.store import layout
from snapcache.store.catalog import holds_snapshot, read_entry
from snapcache.store.fs import Storage
from snapcache.store import protocol
from snapcache.store.manifest import Manifest, ShardInfo, load_manifest
from snapcache.store.protocol import versions
from snapcache.store.options import ReadOptions
from snapcache.store.reader import SnapshotReader, open_reader
from snapcache.store.schema import Schema

STATES = ("committed", "writing", "abandoned", "absent", "corrupt")

__all__ = ["STATES", "Builder", "Snapshot", "StreamWrite", "open_snapshot"]


class Builder(Protocol):
    """What the pipeline gives a handle so it can build its snapshot stream by stream
    (``Dataset.open_snapshot()`` supplies one; a handle opened from a path has none)."""

    def commit_fields(self) -> dict:
        """The manifest fields besides shards and schema (:func:`protocol.commit_fields`)."""

    def write_stream(self, index: int, count: int) -> int:
        """Run stream ``index`` of ``count`` of the upstream, writing its shards and marker
        through the protocol; the number of examples it yielded."""

    def resumable(self) -> bool:
        """True if a rerun of a stream skips the examples of its finished shards."""

    def delta_stream(self, index: int, count: int, compute: bool = True) -> Any:
        """A delta snapshot: compute stream ``index`` of ``count``'s share of the next
        version's segments, commit when all are recorded (``compute=False``: only commit);
        a :class:`snapcache.pipeline.delta_exec.Progress`."""


@dataclass(frozen=True)
class StreamWrite:
    """What :meth:`Snapshot.write_stream` did: ``"written"`` (computed, resuming an earlier
    attempt's ``resumed_rows``), ``"complete"`` (an earlier run had finished it) or
    ``"committed"`` (the snapshot was committed already)."""

    stream: int
    status: str
    examples: int = 0
    resumed_rows: int = 0
    seconds: float = 0.0


class Snapshot:
    """One snapshot folder: its identity, its state, and random access once committed.

    ``id`` is the fingerprint of everything upstream of the snapshot, the folder's name and
    what ``snapcache ls`` shows. ``state`` is looked up afresh each time it is asked; the
    manifest, once committed, never changes and is kept.
    """

    def __init__(self, folder: Storage, *, read: ReadOptions | None = None,
                 builder: Builder | None = None, source_digest: str | None = None):
        self._folder = folder
        self._source_digest = source_digest  # a delta snapshot: the version of these files
        self._read = read or ReadOptions()
        self._builder = builder
        self._manifest: Manifest | None = None
        self._rows: Any = None
        self._lock = threading.Lock()

    # -- identity ------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._folder.url.rstrip("/").rsplit("/", 1)[-1]

    @property
    def url(self) -> str:
        return self._folder.url

    @property
    def storage(self) -> Storage:
        """The snapshot folder (for the store's own protocol and the adapters)."""
        return self._folder

    @property
    def read_options(self) -> ReadOptions:
        return self._read

    def __repr__(self) -> str:
        return f"Snapshot({self.url!r}, state={self.state!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Snapshot) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __getstate__(self) -> dict:
        # A copy in another process (a DataLoader or Ray worker) opens its own files. It
        # reads; to build there, open the handle from the pipeline (``ds.open_snapshot()``).
        return {"_folder": self._folder, "_read": self._read, "_manifest": self._manifest,
                "_source_digest": self._source_digest}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._rows, self._lock, self._builder = None, threading.Lock(), None

    # -- state ---------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """One of :data:`STATES`, as of now."""
        if self._manifest is not None:
            return "committed" if self._folder.exists(versions.manifest_file(self._manifest)) \
                else "absent"
        if self._source_digest is not None:  # a delta snapshot: the version of its files
            try:
                self._manifest = versions.find_version(self._folder, self._source_digest)
            except (CorruptSnapshotError, UnknownFormatVersionError):  # `problem` says which
                return "corrupt"
            if self._manifest is not None:
                return "committed"
            if any(lease.kind == "write" for lease in protocol.live_leases(self._folder)):
                return "writing"
            return "absent"
        entry = read_entry(self._folder, self.id)
        if entry.manifest is not None:
            self._manifest = entry.manifest
        return entry.state

    @property
    def problem(self) -> str:
        """Why the snapshot is corrupt ("" otherwise)."""
        return read_entry(self._folder, self.id).problem

    @property
    def manifest(self) -> Manifest:
        """The committed manifest; SnapshotStateError naming the state otherwise."""
        if self._manifest is None:
            state = self.state
            if self._manifest is None:
                raise SnapshotStateError(self._not_committed(state))
        return self._manifest

    def _not_committed(self, state: str) -> str:
        if state == "corrupt":
            entry = read_entry(self._folder, self.id)
            if entry.newer:  # not damaged: this release cannot read it
                return f"snapshot {self.id[:12]} at {self.url} is unreadable here: {entry.problem}"
        why = {
            "writing": "it is being written; iterate the pipeline (it waits for the commit) "
                       "or try again later",
            "abandoned": "its writer stopped before committing; run the pipeline again to "
                         "finish it, or `snapcache purge --incomplete`",
            "absent": "nothing is there; run the pipeline once to build it",
            "corrupt": f"{self.problem}",
        }[state]
        return f"snapshot {self.id[:12]} at {self.url} is {state}: {why}"

    @property
    def committed(self) -> bool:
        return self.state == "committed"

    @property
    def name(self) -> str | None:
        """The name given with ``snapshot(..., name=...)`` (None if none, or not committed)."""
        return self._manifest.name if self._manifest is not None or self.committed else None

    @property
    def schema(self) -> Schema | None:
        """The examples' structure (None for an empty snapshot)."""
        schema = self.manifest.schema
        return Schema.from_json(schema) if schema is not None else None

    @property
    def num_examples(self) -> int:
        return self.manifest.num_examples

    # -- building, one stream at a time (what a distributed build needs) ------------------------
    def stream_status(self, streams: int) -> protocol.StreamStatus:
        """The commit (if any) and which of ``streams`` streams are complete (a delta
        snapshot's stream: its share of the next version's segments is recorded)."""
        if self._source_digest is not None and self._builder is not None:
            progress = self._builder.delta_stream(0, streams, compute=False)
            return protocol.StreamStatus(progress.manifest, frozenset(
                set(range(streams)) - set(progress.missing)), streams)
        return protocol.stream_status(self._folder, streams)

    def write_stream(self, index: int, count: int) -> StreamWrite:
        """Write stream ``index`` of ``count`` unless it is done: the same protocol as ``count``
        processes iterating ``ds.iterate(epoch=0, stream=(index, count))``. A stream that
        finds every stream complete commits the snapshot."""
        builder = self._need_builder("write a stream")
        if self._source_digest is not None:
            return self._write_delta_stream(builder, index, count)
        status = self.stream_status(count)
        if status.committed is not None:
            return StreamWrite(index, "committed")
        if index in status.complete:
            self.commit(count)
            return StreamWrite(index, "complete")
        previous = protocol.best_progress(self._folder, index, count) \
            if builder.resumable() else None
        start = time.monotonic()
        examples = builder.write_stream(index, count)
        return StreamWrite(index, "written", examples=examples,
                           resumed_rows=previous.rows if previous is not None else 0,
                           seconds=time.monotonic() - start)

    def commit(self, streams: int) -> Manifest | None:
        """Commit the snapshot if all ``streams`` streams are complete (the last writer may have
        died between its marker and the manifest); the committed manifest, or None while
        streams are missing."""
        builder = self._need_builder("commit")
        if self._source_digest is not None:
            progress = builder.delta_stream(0, streams, compute=False)
            self._manifest = progress.manifest or self._manifest
            return progress.manifest
        status = self.stream_status(streams)
        if status.committed is not None:
            self._manifest = status.committed
            return status.committed
        manifest = protocol.try_commit(self._folder, streams, **builder.commit_fields())
        if manifest is not None:
            self._manifest = manifest
        return manifest

    def _write_delta_stream(self, builder: Builder, index: int, count: int) -> StreamWrite:
        """A delta snapshot's version, stream by stream: stream ``index`` of ``count``
        computes its share of the segments to compute (docs/format.md, "Building a
        version"); whoever records the last one commits."""
        start = time.monotonic()
        if self.committed:
            return StreamWrite(index, "committed")
        progress = builder.delta_stream(index, count)
        self._manifest = progress.manifest or self._manifest
        status = "written" if progress.written else "complete"
        return StreamWrite(index, status, examples=progress.written,
                           seconds=time.monotonic() - start)

    def _need_builder(self, what: str) -> Builder:
        if self._builder is None:
            raise SnapshotStateError(
                f"cannot {what} of snapshot {self.id[:12]}: this handle was opened from a path "
                "(or unpickled); build through the pipeline's handle, ds.open_snapshot()")
        return self._builder

    # -- reading -------------------------------------------------------------------------------
    def reader(self) -> SnapshotReader:
        """A sequential reader of the committed snapshot, configured by the read options."""
        return open_reader(self._folder, self.manifest, self._read)

    @property
    def shards(self) -> tuple[ShardInfo, ...]:
        """The committed snapshot's shards, in order (path, rows, bytes, checksum)."""
        return self.manifest.shards

    def column_batches(self, shards: Sequence[ShardInfo] | None = None, *,
                       read_threads: int | None = None) -> Iterator[dict[str, Any]]:
        """The decoded columns of each record batch of ``shards`` (default: all), every shard
        verified before use (per the read options): what a distributed reader's task reads."""
        reader = SnapshotReader(self._folder, self.manifest, verify=self._read.verify,
                                prefetch_bytes=self._read.prefetch_bytes,
                                read_threads=read_threads)
        return reader.columns(shards)

    def _row_access(self) -> Any:
        from snapcache.store.row_access import RowAccess

        with self._lock:
            if self._rows is None:
                self._rows = RowAccess(self.reader())
            return self._rows

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, index: int) -> Any:
        """Example ``index`` (negative counts from the end). The first example of a record
        batch reads only what it needs: on local disk the pages holding it, each checked
        against its checksum in the manifest (raw shards; docs/format.md "Page checksums"),
        else that record batch alone, checked against its checksum (snapshots written before
        batch checksums were recorded load and verify the whole shard). A shard that keeps
        being read is held (mapped, or fetched whole once ranged reads have cost as much:
        :mod:`snapcache.store.random_access`), and a record batch whose rows keep being read
        is read and verified whole and kept decoded, within the read budget: later rows of it
        are an index."""
        rows = self._rows  # indexed when the handle was opened (open_snapshot)
        return (rows if rows is not None else self._row_access())[index]

    def take(self, indices: Sequence[int]) -> list:
        """The examples at ``indices``, in that order; each record batch decoded once."""
        return self._row_access().take(indices)

    def to_torch_map_style(self) -> Any:
        """A map-style ``torch.utils.data.Dataset`` over the rows (examples as tensors), for
        your own samplers::

            loader = DataLoader(snap.to_torch_map_style(), batch_size=64, shuffle=True)
        """
        from snapcache.adapters.torch import to_torch_map_style  # imports torch, on demand

        return to_torch_map_style(self)


def open_snapshot(path: str | os.PathLike, id: str | None = None, *,
                  storage_options: dict | None = None, read: ReadOptions | None = None
                  ) -> Snapshot:
    """The snapshot ``id`` (an id prefix, or a name given with ``snapshot(..., name=...)``) in
    the root ``path``; or, without ``id``, the snapshot folder ``path`` itself, or the only
    snapshot of the root ``path``. SnapshotNotFoundError names the candidates otherwise.

    Example::

        snap = snapcache.open_snapshot("/data/snaps", "train-224px")
        snap = snapcache.open_snapshot("s3://bucket/snaps/3fa9c2...",
                                       storage_options={"client_kwargs": {...}})
    """
    storage = Storage(path, storage_options)
    if id is None:
        leaf = storage.url.rstrip("/").rsplit("/", 1)[-1]
        if layout.is_fingerprint(leaf):
            return _ready(Snapshot(storage, read=read))
    folders = _folders(storage)
    if id is None:
        folders = _snapshots(storage, folders)
        if len(folders) == 1:
            return _ready(Snapshot(storage.child(folders[0]), read=read))
        if not folders:
            raise SnapshotNotFoundError(
                f"no snapshot in {storage.url}: neither a snapshot folder nor a root holding "
                "one (check the path, or run the pipeline once to build it)")
        raise SnapshotNotFoundError(
            f"{storage.url} holds {len(folders)} snapshots ({_shown(storage, folders)}); "
            "pass the id (a prefix of it, as `snapcache ls` shows) or the name")
    return _ready(Snapshot(storage.child(_find(storage, folders, id)), read=read))


def _ready(snap: Snapshot) -> Snapshot:
    """``snap`` with its manifest read (one GET on S3 for an ordinary snapshot; a delta
    lineage's newest version) and its rows indexed if it is committed (what the peers do when
    a dataset is opened), so that a first ``snap[i]`` reads only its record batch."""
    try:
        manifest = load_manifest(snap.storage)
    except (CorruptSnapshotError, UnknownFormatVersionError):
        # a delta lineage's marker, damage, or a newer format: its state says which
        manifest = None
    if manifest is not None and manifest.version is None:
        snap._manifest = manifest
    elif not (manifest is None and snap.state == "committed"):  # the newest version, if any
        return snap
    snap._row_access()
    return snap


def _folders(storage: Storage) -> list[str]:
    if storage.local and os.path.exists(storage.root) and not os.path.isdir(storage.root):
        raise SnapshotNotFoundError(f"{storage.url} is a file, not a snapshot root or folder")
    names = storage.listdir()  # one LIST on S3; whether the root exists only when it is empty
    if not names and not storage.exists():
        raise SnapshotNotFoundError(
            f"snapshot root {storage.url} does not exist (check the path and "
            "storage_options)")
    return sorted(n for n in names if layout.is_fingerprint(n))


def _snapshots(storage: Storage, names: list[str]) -> list[str]:
    """Those of the folders ``names`` that are snapcache's by their contents (one LIST each on
    S3), as `snapcache ls` counts them: a user's folder named in hex is not a snapshot."""
    return [n for n in names if holds_snapshot(storage.child(n))]


def _find(storage: Storage, folders: list[str], wanted: str) -> str:
    text = wanted.strip().lower()
    if not text:
        raise SnapshotNotFoundError("an empty snapshot id")
    if layout.is_hex(text):
        ids = _snapshots(storage, [n for n in folders if n.startswith(text)])
        if len(ids) == 1:
            return ids[0]
        if len(ids) > 1:
            raise SnapshotNotFoundError(
                f"{wanted!r} is ambiguous in {storage.url}: it matches {len(ids)} snapshots "
                f"({_shown(storage, ids)}); give more digits of the id")
    named = [n for n in folders if _name_of(storage.child(n)) == wanted]
    if len(named) == 1:
        return named[0]
    if named:
        raise SnapshotNotFoundError(
            f"{len(named)} snapshots in {storage.url} are named {wanted!r} "
            f"({_shown(storage, named)}); pass an id instead")
    raise SnapshotNotFoundError(f"no snapshot {wanted!r} in {storage.url} (see `snapcache ls "
                                f"{storage.url}`)")


def _name_of(folder: Storage) -> str | None:
    entry = read_entry(folder, "")
    return entry.manifest.name if entry.manifest is not None else None


def _shown(storage: Storage, ids: list[str], most: int = 5) -> str:
    shown = ", ".join(i[:12] + (f" ({name})" if (name := _name_of(storage.child(i))) else "")
                      for i in ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")
