"""Streams: several cooperating writers of one snapshot, progress records, and the commit.

Each writer owns stream ``i`` of ``n`` (a single writer is stream 0 of 1). While writing it
records the shards it has finished in ``progress-<n>-<i>-<run>.json`` (so a crashed run's shards
can be reused; from its 257th shard on, in more files of 256 shards each, see
:data:`PROGRESS_PART`), and when its stream is done it writes ``stream-<n>-<i>.json``. Whoever writes
the last marker assembles the manifest from all markers and creates ``manifest.json``
exclusively: exactly one commit, however many finish at once.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields as dataclass_fields, replace
from typing import Any, Callable

from snapcache.errors import CorruptSnapshotError, LeaseLostError, StoreError
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.protocol.lease import WriteLease, live_leases
from snapcache.store.options import WriteOptions
from snapcache.store.manifest import (
    Manifest, ShardInfo, load_manifest, now_iso, writer_identity)
from snapcache.store.schema import Schema, merge_schemas

log = logging.getLogger(__name__)


PROGRESS_PART = 256
"""Shards a file of a progress record holds. A writer rewrites only the file of its newest
shards as it finishes more, so recording a shard costs the same however many came before it
(one file listing every shard so far had a stream of 10,000 shards rewrite 6 MB of JSON, 2.5 s
of CPU, for each shard). File 0 is a record on its own, the first 256 shards: what releases
before these files read (a resume from it computes the rest again); the next files
(``progress-<n>-<i>-<run>.<k>.json``) have no ``shards`` key, so those releases ignore them."""

_SHARD_FIELDS = tuple(f.name for f in dataclass_fields(ShardInfo))


def _shard_doc(shard: ShardInfo) -> dict:
    return {name: getattr(shard, name) for name in _SHARD_FIELDS}


@dataclass(frozen=True)
class StreamRecord:
    """The shards one writer run has finished for one stream, in order."""

    stream: int
    streams: int
    run_id: str
    shards: tuple[ShardInfo, ...]
    schema: dict | None
    task: str | None = None
    """A delta build's task (the digest of its units' keys) the shards hold the first rows of;
    None for ordinary snapshots' streams."""

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def _header(self) -> dict:
        return {"stream": self.stream, "streams": self.streams, "run_id": self.run_id,
                "schema": self.schema, "task": self.task}

    def dumps(self) -> bytes:
        return json.dumps({**self._header(),
                           "shards": [_shard_doc(s) for s in self.shards]}).encode()

    def dumps_part(self, part: int) -> bytes:
        """File ``part`` of this record as a progress record (:data:`PROGRESS_PART`)."""
        shards = self.shards[part * PROGRESS_PART:(part + 1) * PROGRESS_PART]
        if part == 0:
            return replace(self, shards=shards).dumps()
        return json.dumps({**self._header(), "part": part,
                           "part_shards": [_shard_doc(s) for s in shards]}).encode()

    @classmethod
    def loads(cls, data: bytes, *, where: str, part: int = 0) -> "StreamRecord":
        """A record (``part`` 0), or the shards of file ``part`` of a progress record."""
        try:
            doc = json.loads(data)
            if part and doc["part"] != part:
                raise ValueError(f"it says it is file {doc['part']!r}")
            shards = tuple(ShardInfo(**s) for s in doc["part_shards" if part else "shards"])
            task = doc.get("task")
            record = cls(int(doc["stream"]), int(doc["streams"]), str(doc["run_id"]), shards,
                         doc.get("schema"), None if task is None else str(task))
        except (ValueError, TypeError, KeyError) as e:
            raise CorruptSnapshotError(f"{where}: unreadable stream record ({e})") from None
        for shard in shards:
            if not layout.is_safe_shard_path(shard.path):
                raise CorruptSnapshotError(f"{where}: unsafe shard path {shard.path!r}")
        return record


def write_progress(storage: Storage, record: StreamRecord, recorded: int = 0) -> None:
    """Write ``record`` as this run's progress record, ``recorded`` of its shards being in
    the files written before: only the files holding the others are written."""
    last = _last_part(record)
    for part in range(min(recorded // PROGRESS_PART, last), last + 1):
        storage.write_atomic(
            layout.progress_name(record.streams, record.stream, record.run_id, part),
            record.dumps_part(part))


def _last_part(record: StreamRecord) -> int:
    """The file of a progress record holding its last shard (0 for a record of none)."""
    return max(len(record.shards) - 1, 0) // PROGRESS_PART


def remove_progress(storage: Storage, record: StreamRecord) -> None:
    """Remove the files of this run's progress record on ``record``'s stream (``record``:
    what the run recorded last)."""
    for part in range(_last_part(record) + 1):
        storage.remove(layout.progress_name(record.streams, record.stream, record.run_id, part))


def discard(storage: Storage, record: StreamRecord) -> None:
    """Drop the earlier runs' progress on ``record``'s stream (the caller holds the stream's
    write lease): a stream whose upstream cannot skip examples restarts from its first one.
    Their shards stay, for the clean-up after the commit (which keeps those the manifest
    lists): a writer paused after its fence may still record them in its stream marker."""
    for name in storage.listdir():
        if name.startswith(layout.progress_prefix(record.streams, record.stream)):
            storage.remove(name)


def missing_shards(storage: Storage, shards: "tuple[ShardInfo, ...] | list[ShardInfo]",
                   sizes: dict[str, int] | None = None) -> list[str]:
    """The shards (of this folder) that are not there with their recorded size: one listing
    (none if ``sizes``, from :func:`_listing`, is given)."""
    if not shards:
        return []
    sizes = _listing(storage)[1] if sizes is None else sizes
    return [s.path for s in shards if sizes.get(s.path) != s.bytes]


def _listing(storage: Storage) -> tuple[list[str], dict[str, int]]:
    """One recursive listing of the folder: the names directly in it (as ``listdir``) and
    the size of every file below it (one LIST per 1,000 files on S3)."""
    sizes = {f.path: f.size for f in storage.walk()}
    return sorted({path.split("/", 1)[0] for path in sizes}), sizes


def fence(storage: Storage, record: StreamRecord, lease: WriteLease | None) -> None:
    """What must hold, at commit time, before a stream marker or manifest is written: the
    writer still holds the newest generation of its lease (LeaseLostError otherwise), and every
    shard it lists exists with its recorded size (StoreError otherwise: nothing is committed
    that cannot be read)."""
    names, sizes = _listing(storage)  # one listing for the lease and the shards
    if lease is not None:
        lease.check(names)
    missing = missing_shards(storage, record.shards, sizes)
    if missing:
        raise StoreError(
            f"snapshot {storage.url}: {len(missing)} shard(s) this writer finished are gone "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); the folder was "
            "purged or damaged while writing. Nothing was committed; run the pipeline again")


def write_marker(storage: Storage, record: StreamRecord, lease: WriteLease | None = None) -> None:
    """Record stream ``record.stream`` as complete, once: the marker is created exclusively
    after :func:`fence`, so a writer that lost its stream never replaces the marker of the
    writer that took it over. LeaseLostError if another run's marker is there already, or the
    snapshot is committed already (then every stream was completed by the writers that took
    this one's over, and their commit removed their markers)."""
    try:
        fence(storage, record, lease)
        committed = storage.is_file(layout.MANIFEST)
    except StoreError:
        # Its shards were removed by the clean-up after the commit of the writer that took it
        # over (and a resumed heartbeat may have made its lease look like its own again, as
        # below): the manifest says what happened.
        committed = storage.is_file(layout.MANIFEST)
        if not committed:
            raise
    if committed:
        # A writer stopped inside its heartbeat (after the check, before the write) rewrites
        # its lease file when it resumes, after the one that took over committed and released:
        # the lease then looks like this writer's again, but the manifest says otherwise.
        raise LeaseLostError(
            f"snapshot {storage.url}: taken over by another writer, which has committed it "
            "while this one was stopped: it commits nothing")
    name = layout.marker_name(record.streams, record.stream)
    if storage.create_exclusive(name, record.dumps()):
        return
    existing = _load(storage, name)
    if existing is not None and existing.run_id == record.run_id:
        return  # ours, from an earlier attempt of this run
    raise LeaseLostError(
        f"snapshot {storage.url}: stream {record.stream} of {record.streams} was completed by "
        f"another writer (run {existing.run_id if existing else '?'}) while this one was "
        "stopped: it commits nothing")


def _load(storage: Storage, name: str, part: int = 0) -> StreamRecord | None:
    try:
        return StreamRecord.loads(storage.read_bytes(name), where=storage.url_of(name),
                                  part=part)
    except FileNotFoundError:
        return None
    except CorruptSnapshotError as e:
        log.warning("ignoring %s", e)
        return None


def load_marker(storage: Storage, streams: int, stream: int) -> StreamRecord | None:
    """Stream ``stream`` of ``streams``'s marker, if it is there and readable."""
    record = _load(storage, layout.marker_name(streams, stream))
    return record if record is not None and \
        (record.streams, record.stream) == (streams, stream) else None


def load_markers(storage: Storage, streams: int, names: list[str] | None = None
                 ) -> dict[int, StreamRecord]:
    names = storage.listdir() if names is None else names
    prefix = layout.marker_prefix(streams)
    markers = {}
    for name in names:
        if name.startswith(prefix):
            record = _load(storage, name)
            if record is not None and record.streams == streams:
                markers[record.stream] = record
    return markers


def best_progress(storage: Storage, stream: int, streams: int,
                  names: list[str] | None = None) -> StreamRecord | None:
    """The earlier run's progress on this stream that covers the most rows and whose shards
    are all present with the recorded sizes (checksums are verified when they are read).
    ``names``: the folder's listing if the caller has just made one."""
    found = _best(storage, names, layout.progress_prefix(streams, stream), lambda r: None)
    return found.get(None)


def progress_by_task(storage: Storage, names: list[str]) -> dict[str, StreamRecord]:
    """For each task of a delta build some run has progress on, the progress covering the most
    rows whose shards are all present with the recorded sizes (whatever the run's stream
    number for it was)."""
    found = _best(storage, names, "progress-", lambda r: r.task)
    found.pop(None, None)
    return found  # type: ignore[return-value]


def progress_records(storage: Storage, names: list[str], prefix: str = "progress-"
                     ) -> list[StreamRecord]:
    """The progress records among ``names`` (starting with ``prefix``), each assembled from
    its files (:data:`PROGRESS_PART`): file 0 and the next ones in order, up to the first that
    is missing, unreadable or not of the same run and stream (what a run recorded before a
    crash is always such a prefix: it writes a file only once the ones before are full)."""
    parts: dict[str, dict[int, str]] = {}
    for name in names:
        parsed = layout.progress_part(name) if name.startswith(prefix) else None
        if parsed is not None:
            parts.setdefault(parsed[0], {})[parsed[1]] = name
    records = []
    for files in parts.values():
        record = _load(storage, files[0]) if 0 in files else None
        if record is None:
            continue
        shards, schema, part = list(record.shards), record.schema, 1
        while part in files and len(shards) == part * PROGRESS_PART:
            more = _load(storage, files[part], part=part)
            if more is None or more._header() | {"schema": None} != \
                    record._header() | {"schema": None}:
                break
            shards.extend(more.shards)
            schema, part = more.schema, part + 1
        records.append(replace(record, shards=tuple(shards), schema=schema))
    return records


def _best(storage: Storage, names: list[str] | None, prefix: str,
          group: Callable[[StreamRecord], str | None]) -> dict[str | None, StreamRecord]:
    best: dict[str | None, StreamRecord] = {}
    names = storage.listdir() if names is None else names
    sizes: dict[str, int] | None = None  # one listing with sizes, not a HEAD for each shard
    for record in progress_records(storage, names, prefix):
        if not record.shards:
            continue
        key = group(record)
        if key in best and best[key].rows >= record.rows:
            continue
        if sizes is None:
            sizes = _listing(storage)[1]
        if missing_shards(storage, record.shards, sizes):
            continue
        best[key] = record
    return best


def assemble(markers: dict[int, StreamRecord], streams: int, *, fingerprint: str,
             **fields: Any) -> Manifest:
    """The manifest of a snapshot whose ``streams`` streams are all complete."""
    ordered = [markers[i] for i in range(streams)]
    schemas = [Schema.from_json(r.schema) for r in ordered if r.schema is not None]
    schema = None
    for other in schemas:
        schema = other if schema is None else merge_schemas(schema, other, where=fingerprint)
    shards = tuple(s for record in ordered for s in record.shards)
    # Which shards each stream wrote: readers with the same number of streams then read back
    # exactly the examples each stream wrote.
    layout_info = {"streams": streams, "stream_shards": [len(r.shards) for r in ordered]}
    return Manifest(fingerprint=fingerprint, schema=schema.to_json() if schema else None,
                    shards=shards, extra={**fields.pop("extra", {}), **layout_info}, **fields)


def stream_shards(manifest: Manifest, stream: int, streams: int) -> list[ShardInfo] | None:
    """The shards stream ``stream`` of ``streams`` wrote, if the snapshot was written by that
    many streams (else None)."""
    extra = manifest.extra
    counts = extra.get("stream_shards")
    if extra.get("streams") != streams or not isinstance(counts, list) or \
            len(counts) != streams or sum(counts) != len(manifest.shards) or \
            not all(isinstance(c, int) and c >= 0 for c in counts):
        return None
    start = sum(counts[:stream])
    return list(manifest.shards[start:start + counts[stream]])


def commit_fields(write: WriteOptions, *, key: str | None, name: str | None, fingerprint: str,
                  fingerprint_tree: dict | None, pipeline: str, run_id: str,
                  created_at: str | None = None) -> dict:
    """The manifest fields, besides shards and schema, that whoever commits records: pass
    them to :func:`try_commit`."""
    return dict(fingerprint=fingerprint, compression=write.compression,
                created_at=created_at or now_iso(), committed_at=now_iso(),
                writer=writer_identity(run_id), fingerprint_tree=fingerprint_tree,
                pipeline=pipeline, key=key, name=name)


def try_commit(storage: Storage, streams: int, *, fingerprint: str, **fields: Any
               ) -> Manifest | None:
    """Create the manifest if every stream is complete; return the committed manifest (ours or
    one committed concurrently), or None while streams are missing."""
    names, sizes = _listing(storage)  # one listing for the markers and the shards
    prefix = layout.marker_prefix(streams)
    if sum(name.startswith(prefix) for name in names) < streams:
        return None  # read no marker while some are missing: n streams finishing read n, not n^2
    markers = load_markers(storage, streams, names)
    if len(markers) < streams:
        return None
    manifest = assemble(markers, streams, fingerprint=fingerprint, **fields)
    missing = missing_shards(storage, manifest.shards, sizes)
    if missing:  # a stream's shards vanished after its marker: never commit what cannot be read
        if load_manifest(storage) is not None:
            return load_manifest(storage)
        raise StoreError(
            f"snapshot {storage.url}: {len(missing)} shard(s) listed by the streams' markers "
            f"are gone ({', '.join(missing[:3])}); nothing was committed. Run `snapcache purge "
            "--incomplete` and the pipeline again")
    try:
        # A lost answer is settled by the storage (the manifest read back: ours if it holds
        # these bytes), so that our commit is never reported as failed nor left untidied;
        # only a storage that stays unreachable leaves it open.
        created = storage.create_exclusive(layout.MANIFEST, manifest.dumps())
    except ConnectionError as e:
        raise StoreError(
            f"snapshot {storage.url}: could not tell whether its commit reached the storage "
            f"({e}). Every stream is complete: the next run reads the snapshot if it was "
            "committed, or commits it from the finished shards without computing them "
            "again") from e
    if created:
        log.info("committed snapshot %s: %d examples in %d shards", fingerprint,
                 manifest.num_examples, len(manifest.shards))
        cleanup(storage, manifest)
        return manifest
    return load_manifest(storage)


def cleanup(storage: Storage, manifest: Manifest) -> list[str]:
    """After a commit: remove progress records, stream markers, and shard files that the
    manifest does not list and that no live writer owns. Returns the removed names."""
    names = storage.listdir()  # one listing for the leases and the files
    live_runs = {lease.owner for lease in live_leases(storage, names) if lease.kind == "write"}
    keep = layout.with_pages(s.path for s in manifest.shards)
    removed = []
    for name in names:
        run = layout.run_of(name)
        stale_shard = run is not None and name not in keep and run not in live_runs
        # Another writer's temporary file may be on its way to becoming a marker or a
        # progress record right now: only purge --incomplete judges those, by age.
        bookkeeping = name.startswith(("progress-", "stream-")) and not layout.is_tmp(name)
        if stale_shard or bookkeeping:
            storage.remove(name)
            removed.append(name)
    return removed
