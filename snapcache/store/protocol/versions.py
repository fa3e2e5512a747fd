"""Delta snapshots on disk: a lineage folder holding versioned manifests over shared shards.

A *lineage* is the folder ``<root>/<lineage>/`` named by the fingerprint of a pipeline's code
with its file source counted only by kind (``from_files``, strict or not; ``from_parquet`` and
its columns), not by file list. Each time the source changes, a new *version* is committed::

    <root>/<lineage>/manifest-<v>.json          version v (format version 2), created exclusively
    <root>/<lineage>/units-<v>-<run>.arrow      its source record: one row per file (side record)
    <root>/<lineage>/<run>-<stream>-<seq>.arrow shards, shared by every version that lists them
    <root>/<lineage>/segment-<run>-<seq>.json   a segment finished by a build not yet committed
    <root>/<lineage>/lease-<n>-<i>-<gen>.json   write lease of stream i of n builders
    <root>/<lineage>/manifest.json              lineage marker (format 3, older readers refuse)
    <root>/<lineage>/reader-<run>.json          read leases

A *segment* is a group of units (files) computed together and the shards holding their
examples; a shard belongs to exactly one segment. A version lists its segments in order; the
next version reuses, in place, every segment whose files are all still present and unchanged,
and computes the rest. Shards no version lists are deleted only when no manifest refers to
them any more (:func:`referenced_shards`).

The side record is an Arrow IPC file (zstd) with columns ``path`` (string), ``size`` (int64),
``mtime_ns`` (int64, null on object stores), ``etag`` (string, null locally), ``xxh3_128``
(string, null unless strict) and ``segment`` (int32, index into the manifest's ``segments``):
a million files take a few MB instead of a manifest listing each one inline.
"""

from __future__ import annotations

import io
import json
import logging
import re
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

import pyarrow as pa
import pyarrow.ipc as ipc
import xxhash

from snapcache.errors import CorruptSnapshotError, UnknownFormatVersionError
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.protocol.lease import WriteLease, live_leases
from snapcache.store.protocol.records import StreamRecord, fence, remove_progress
from snapcache.store.manifest import (
    FORMAT, LINEAGE_MARKER_VERSION, WAY_OUT, Manifest, ShardInfo)

log = logging.getLogger(__name__)

_MANIFEST_RE = re.compile(r"^manifest-(\d{6})\.json$")
_UNITS_RE = re.compile(r"^units-(\d{6})-([0-9a-f]{8})\.arrow$")
_SEGMENT_RE = re.compile(r"^segment-([0-9a-f]{8})-(\d{6})\.json$")
_PROGRESS_RE = re.compile(r"^progress-\d{4,}-\d{4,}-([0-9a-f]{8})(?:\.\d+)?\.json$")

UNIT_COLUMNS = ("path", "size", "mtime_ns", "etag", "xxh3_128", "rows", "segment")
ROW_GROUP_COLUMNS = ("row_group", "row_group_rows", "file_size")
"""Extra columns of a source record whose units are Parquet row groups (format version 3)."""
_IDENTITY_COLUMNS = UNIT_COLUMNS[:5]
_UNIT_SCHEMA = pa.schema([("path", pa.string()), ("size", pa.int64()),
                          ("mtime_ns", pa.int64()), ("etag", pa.string()),
                          ("xxh3_128", pa.string()), ("rows", pa.int64()),
                          ("segment", pa.int32())])
_ROW_GROUP_SCHEMA = pa.schema(list(_UNIT_SCHEMA) + [
    ("row_group", pa.int32()), ("row_group_rows", pa.int64()), ("file_size", pa.int64())])
ROW_GROUPS_FORMAT_VERSION = 3
"""The format version of a version whose units are row groups (its source record has
:data:`ROW_GROUP_COLUMNS`): readers that know only format 2 refuse it with "upgrade"."""


def manifest_name(version: int) -> str:
    return f"manifest-{version:06d}.json"


def manifest_file(manifest: Manifest) -> str:
    """The file a committed manifest was read from: ``manifest.json``, or a version's."""
    return manifest_name(manifest.version) if manifest.version is not None else layout.MANIFEST


def units_name(version: int, run_id: str) -> str:
    return f"units-{version:06d}-{run_id}.arrow"


def segment_name(run_id: str, seq: int) -> str:
    return f"segment-{run_id}-{seq:06d}.json"


def is_lineage(names: Iterable[str]) -> bool:
    """True if a folder listing holds a versioned manifest (a delta lineage folder)."""
    return any(_MANIFEST_RE.match(n) for n in names)


def versions(storage: Storage, names: Sequence[str] | None = None) -> list[int]:
    """The committed versions of a lineage folder, oldest first."""
    names = storage.listdir() if names is None else names
    return sorted(int(m.group(1)) for n in names if (m := _MANIFEST_RE.match(n)))


def load_version(storage: Storage, version: int) -> Manifest | None:
    name = manifest_name(version)
    try:
        data = storage.read_bytes(name)
    except FileNotFoundError:
        return None
    try:
        manifest = Manifest.loads(data, where=storage.url_of(name))
        if manifest.version != version or manifest.source is None:
            raise CorruptSnapshotError(f"{storage.url_of(name)}: not version {version} of a "
                                       "delta snapshot (version or source record missing)")
    except CorruptSnapshotError as e:
        # The way out of a damaged version is not the whole snapshot's (WAY_OUT): say it.
        text = str(e).replace(WAY_OUT, "").rstrip(" .")
        error = CorruptSnapshotError(f"{text}. {way_out(storage, version)}")
        error.manifest = name  # (on_corrupt="rebuild" withdraws it)
        raise error from None
    return manifest


def way_out(storage: Storage, version: int, record: bool = False) -> str:
    """What to do about version ``version`` of the lineage folder ``storage`` whose manifest
    (``record``: whose source record) is damaged: an old version goes with ``purge
    --old-versions``; the newest is withdrawn and built again by ``on_corrupt="rebuild"`` (a
    damaged record is met only by the next build of a changed source, which needs it)."""
    root, _, lineage = storage.url.rpartition("/")
    try:
        numbers = versions(storage)
    except OSError:
        numbers = []
    whole = f"or delete the whole snapshot with `snapcache purge {root} {lineage[:12]}`"
    if numbers and version < numbers[-1]:
        return (f"Version {version} is an old version of snapshot {lineage[:12]} (the newest, "
                f"version {numbers[-1]}, does not need it): `snapcache purge {root} "
                "--old-versions` removes it, with the old versions of the root's other delta "
                "snapshots (add --dry-run to list them first)")
    if record:
        return (f"Version {version} still reads back, but the next build of a changed source "
                "compares the source with this record: run that build with snapshot(..., "
                f"on_corrupt=\"rebuild\"), which withdraws version {version} and computes "
                f"again what only it held; {whole}")
    return (f"Iterate the pipeline with snapshot(..., on_corrupt=\"rebuild\"): it withdraws "
            f"version {version} and builds it again, reusing what older versions hold; {whole}")


def still_unreadable(storage: Storage, name: str) -> bytes | None:
    """The bytes of version manifest ``name`` if that version still cannot be used: its
    manifest or its source record cannot be read (None: it reads now, another process having
    committed that version again, or it is gone). A manifest in a newer format is not
    unreadable this way: it raises UnknownFormatVersionError, and is never withdrawn."""
    data = None
    try:
        data = storage.read_bytes(name)
        manifest = load_version(storage, int(_MANIFEST_RE.match(name).group(1)))
        if manifest is not None:
            read_units(storage, manifest)
    except CorruptSnapshotError:
        return data
    except OSError:
        pass
    return None


def newest(storage: Storage, names: Sequence[str] | None = None) -> Manifest | None:
    """The newest committed version, or None if the lineage has none."""
    found = versions(storage, names)
    return load_version(storage, found[-1]) if found else None


def find_version(storage: Storage, digest: str, names: Sequence[str] | None = None
                 ) -> Manifest | None:
    """The newest version built from exactly the source whose unit digest is ``digest``.

    A damaged manifest of an old version is passed over with a warning (once a process): no
    version needs it, and were it the one built from this source, the next build makes
    that version again from the newest one's segments. A damaged newest version raises
    (``on_corrupt`` decides what to do about it)."""
    found = versions(storage, names)
    for version in reversed(found):
        try:
            manifest = load_version(storage, version)
        except CorruptSnapshotError as e:
            if version == found[-1]:
                raise
            _warn_passed_over(storage, version, e)
            continue
        if manifest is not None and manifest.source.get("digest") == digest:
            return manifest
    return None


_passed_over: set[tuple[str, int]] = set()


def _warn_passed_over(storage: Storage, version: int, error: CorruptSnapshotError) -> None:
    if (storage.url, version) not in _passed_over:
        _passed_over.add((storage.url, version))
        log.warning("%s. Passed over meanwhile: the newer versions do not need it", error)


# -- the source record ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Unit:
    """One file of a version's source and the segment holding its examples."""

    identity: dict     # path, size, and mtime_ns / etag / xxh3_128 when known
    segment: int
    rows: int | None = None   # its examples (consecutive in its segment), when known


def has_row_groups(identities: Iterable[dict]) -> bool:
    """True if these unit identities are Parquet row groups (not whole files)."""
    return any(i.get("row_group") is not None for i in identities)


def encode_units(units: Sequence[Unit]) -> bytes:
    groups = has_row_groups(u.identity for u in units)
    schema = _ROW_GROUP_SCHEMA if groups else _UNIT_SCHEMA
    columns: dict[str, list] = {name: [] for name in schema.names}
    for unit in units:
        for name in _IDENTITY_COLUMNS:
            columns[name].append(unit.identity.get(name))
        columns["rows"].append(unit.rows)
        columns["segment"].append(unit.segment)
        if groups:
            columns["row_group"].append(unit.identity.get("row_group"))
            columns["row_group_rows"].append(unit.identity.get("rows"))
            columns["file_size"].append(unit.identity.get("file_size"))
    table = pa.Table.from_pydict(columns, schema=schema)
    sink = io.BytesIO()
    with ipc.new_file(sink, schema,
                      options=ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table, max_chunksize=1 << 16)
    return sink.getvalue()


def read_units(storage: Storage, manifest: Manifest) -> list[Unit]:
    """The source record of a version, checked against its checksum. CorruptSnapshotError
    naming the version's manifest (``error.manifest``: ``on_corrupt="rebuild"`` withdraws
    that version) and the way out."""
    try:
        return _read_units(storage, manifest)
    except CorruptSnapshotError as e:
        version = int(manifest.version or 0)
        error = CorruptSnapshotError(f"{e}. {way_out(storage, version, record=True)}")
        error.manifest = manifest_name(version)
        raise error from None


def _read_units(storage: Storage, manifest: Manifest) -> list[Unit]:
    source = manifest.source or {}
    name = source.get("record")
    where = storage.url_of(str(name))
    if not isinstance(name, str) or not _UNITS_RE.match(name):
        raise CorruptSnapshotError(f"{storage.url}: version {manifest.version} names no valid "
                                   f"source record ({name!r})")
    try:
        data = storage.read_bytes(name)
    except FileNotFoundError:
        raise CorruptSnapshotError(f"{where}: the source record of version "
                                   f"{manifest.version} is missing") from None
    if checksum(data) != source.get("record_checksum"):
        raise CorruptSnapshotError(f"{where}: the source record of version "
                                   f"{manifest.version} is damaged (checksum {checksum(data)} "
                                   f"!= {source.get('record_checksum')} in its manifest)")
    try:
        table = ipc.open_file(pa.py_buffer(data)).read_all()
    except pa.ArrowInvalid as e:
        raise CorruptSnapshotError(f"{where}: unreadable source record ({e})") from None
    groups = table.schema.names == list(UNIT_COLUMNS + ROW_GROUP_COLUMNS)
    if table.schema.names != list(UNIT_COLUMNS) and not groups:
        raise CorruptSnapshotError(f"{where}: unexpected columns {table.schema.names}")
    columns = {name: table.column(name).to_pylist() for name in table.schema.names}
    segments = len(manifest.segments or ())
    units = []
    for i in range(table.num_rows):
        identity = {name: columns[name][i] for name in _IDENTITY_COLUMNS
                    if columns[name][i] is not None}
        if groups:
            identity.update({"row_group": columns["row_group"][i],
                             "rows": columns["row_group_rows"][i],
                             "file_size": columns["file_size"][i]})
        segment = columns["segment"][i]
        if not 0 <= segment < segments:
            raise CorruptSnapshotError(f"{where}: row {i} names segment {segment} of "
                                       f"{segments}")
        units.append(Unit(identity, segment, columns["rows"][i]))
    return units


def checksum(data: bytes) -> str:
    return f"xxh3_64:{xxhash.xxh3_64_hexdigest(data)}"


# -- segments finished by a build (for a resumed build after a crash) ----------------------------
@dataclass(frozen=True)
class SegmentRecord:
    """A segment a build finished: its units' keys and identities, its shards, its schema."""

    units: tuple[tuple[str, dict], ...]   # (unit key, identity)
    shards: tuple[ShardInfo, ...]
    schema: dict | None
    unit_rows: tuple[int, ...] | None = None
    """Examples of each unit, consecutive in unit order, when the pipeline makes that known
    (then a removed or changed file's rows can be left out by copying the others)."""

    rows = StreamRecord.rows

    def dumps(self) -> bytes:
        return json.dumps({"units": [list(u) for u in self.units],
                           "shards": [asdict(s) for s in self.shards],
                           "schema": self.schema,
                           "unit_rows": list(self.unit_rows) if self.unit_rows else None}
                          ).encode()

    @classmethod
    def loads(cls, data: bytes, *, where: str) -> "SegmentRecord":
        try:
            doc = json.loads(data)
            units = tuple((str(k), dict(i)) for k, i in doc["units"])
            shards = tuple(ShardInfo(**s) for s in doc["shards"])
        except (ValueError, TypeError, KeyError) as e:
            raise CorruptSnapshotError(f"{where}: unreadable segment record ({e})") from None
        if not all(layout.is_safe_shard_path(s.path) for s in shards):
            raise CorruptSnapshotError(f"{where}: unsafe shard path in a segment record")
        rows = doc.get("unit_rows")
        if rows is not None and (len(rows) != len(units) or
                                 sum(rows) != sum(s.rows for s in shards)):
            rows = None  # inconsistent: the segment is still usable whole
        return cls(units, shards, doc.get("schema"), tuple(rows) if rows else None)


def write_segment(storage: Storage, written: Any, record: SegmentRecord, *, seq: int) -> None:
    """Record a finished segment (``written``: the writer's stream record of its shards), in
    place of the writer's progress record."""
    storage.write_atomic(segment_name(written.run_id, seq), record.dumps())
    remove_progress(storage, written)


def finished_segments(storage: Storage, names: Sequence[str]) -> list[SegmentRecord]:
    """Segments earlier (crashed or interrupted) builds finished, whose shards all exist with
    their recorded sizes; unreadable records are ignored with a warning."""
    present = set(names)
    found = []
    for name in sorted(n for n in names if _SEGMENT_RE.match(n)):
        try:
            record = SegmentRecord.loads(storage.read_bytes(name), where=storage.url_of(name))
        except FileNotFoundError:
            continue
        except CorruptSnapshotError as e:
            log.warning("ignoring %s", e)
            continue
        if all(s.path in present and storage.size(s.path) == s.bytes for s in record.shards):
            found.append(record)
    return found


# -- commit and clean-up ---------------------------------------------------------------------------
def commit_version(storage: Storage, manifest: Manifest, units: Sequence[Unit], *,
                   run_id: str, lease: WriteLease | None) -> bool:
    """Commit ``manifest`` (whose ``version`` is the next one) with its source record: fenced by
    ``lease`` (re-checked after the record is written), every listed shard checked present with
    its size, then ``manifest-<v>.json`` created exclusively. False if another build committed
    that version first (the caller builds on top of it)."""
    assert manifest.version is not None and manifest.source is not None
    record = encode_units(units)
    name = units_name(manifest.version, run_id)
    storage.write_atomic(name, record)
    manifest = _with_record(manifest, name, record)
    fence(storage, manifest, lease)  # the lease generation, then every listed shard
    storage.create_exclusive(layout.MANIFEST, lineage_marker(manifest))  # once per lineage
    if storage.create_exclusive(manifest_name(manifest.version), manifest.dumps()):
        log.info("committed version %d of %s: %d examples in %d shards", manifest.version,
                 storage.url, manifest.num_examples, len(manifest.shards))
        return True
    storage.remove(name)
    return False


def lineage_marker(manifest: Manifest) -> bytes:
    """The ``manifest.json`` of a lineage folder: not a snapshot manifest but a marker of format
    version :data:`~snapcache.store.manifest.LINEAGE_MARKER_VERSION`, which releases that only
    know ``manifest.json`` refuse with "upgrade snapcache" (so they never take the folder for
    an abandoned write and purge it); this release looks for ``manifest-<v>.json`` first."""
    return json.dumps({
        "format": FORMAT, "format_version": LINEAGE_MARKER_VERSION,
        "fingerprint": manifest.fingerprint,
        "lineage": {"versions": "manifest-<v>.json", "first_version": manifest.version},
        "pipeline": manifest.pipeline, "created_at": manifest.created_at,
        "library_version": manifest.library_version}, indent=1).encode()


def _with_record(manifest: Manifest, name: str, record: bytes) -> Manifest:
    from dataclasses import replace

    return replace(manifest, source={**manifest.source, "record": name,
                                     "record_bytes": len(record),
                                     "record_checksum": checksum(record)})


@dataclass(frozen=True)
class Unreadable:
    """A committed version whose manifest this release cannot read: damaged, or (``newer``)
    written by a newer snapcache (not damaged: upgrade to read it)."""

    version: int
    problem: str
    newer: bool = False


def referenced(storage: Storage, names: Sequence[str] | None = None,
               skip: Iterable[int] = ()) -> set[str]:
    """Every file some committed version (but those in ``skip``) needs: its manifest, its
    source record and its shards. A shard's reference count is the number of versions listing
    it; it may be deleted only when that is zero. What a version that cannot be read lists is
    unknown, so while there is one every shard stays (see :func:`survey`)."""
    return survey(storage, names, skip)[0]


def survey(storage: Storage, names: Sequence[str] | None = None, skip: Iterable[int] = ()
           ) -> tuple[set[str], tuple[Unreadable, ...]]:
    """:func:`referenced`, and the versions (but those in ``skip``) that cannot be read. Those
    are never skipped as if they listed nothing: every shard of the folder and their source
    records are counted as needed, so no clean-up or purge deletes what a damaged manifest
    (perhaps to be restored) or a newer release's version may list."""
    names = storage.listdir() if names is None else names
    skip = set(skip)
    needed: set[str] = set()
    unreadable: list[Unreadable] = []
    for version in versions(storage, names):
        if version in skip:
            continue
        try:
            manifest = load_version(storage, version)
        except CorruptSnapshotError as e:
            unreadable.append(Unreadable(version, str(e)))
            continue
        except UnknownFormatVersionError as e:
            unreadable.append(Unreadable(version, str(e), newer=True))
            continue
        if manifest is None:
            continue
        needed.add(manifest_name(version))
        needed.add(str(manifest.source.get("record")))
        needed.update(layout.with_pages(s.path for s in manifest.shards))
    if unreadable:
        numbers = {u.version for u in unreadable}
        for name in names:
            units = _UNITS_RE.match(name)
            if (layout.run_of(name) is not None and not layout.is_tmp(name)) or \
                    (units is not None and int(units.group(1)) in numbers):
                needed.add(name)
    return needed, tuple(unreadable)


def record_owner(name: str) -> str | None:
    """The build run a segment record, progress record or source record belongs to (None for
    other files)."""
    record = _SEGMENT_RE.match(name) or _PROGRESS_RE.match(name)
    units = _UNITS_RE.match(name)
    return record.group(1) if record else units.group(2) if units else None


def owner_of(name: str) -> str | None:
    """The writer run a file of a lineage folder belongs to: a shard's (or its page file's),
    a segment, progress or source record's; None for other files."""
    return layout.run_of(name) or record_owner(name)


def cleanup(storage: Storage, committed_run: str) -> list[str]:
    """After ``committed_run`` committed a version: remove segment records, progress records,
    source records, and shards no version lists and no other live writer owns or holds.
    Returns the removed names."""
    names = storage.listdir()
    needed = referenced(storage, names)
    live_runs = {lease.owner for lease in live_leases(storage) if lease.kind == "write"}
    live_runs.discard(committed_run)
    needed |= held_by(storage, names, live_runs)
    doomed = [name for name in names if name not in needed and
              (owner := owner_of(name)) is not None and owner not in live_runs]
    if doomed:
        # A build may have started since the listing and kept some of these shards as its own
        # (a killed run's, see delta_segment._compute): look at the live runs' records again.
        now = storage.listdir()
        runs = {lease.owner for lease in live_leases(storage) if lease.kind == "write"}
        runs.discard(committed_run)
        kept = held_by(storage, [n for n in now if n not in names or
                                 record_owner(n) in runs - live_runs], runs)
        doomed = [name for name in doomed if name not in kept and owner_of(name) not in runs]
    for name in doomed:
        storage.remove(name)
    return doomed


def held_by(storage: Storage, names: Sequence[str], runs: set[str]) -> set[str]:
    """The shards the segment and progress records of live ``runs`` list: a build resuming an
    interrupted run's task keeps that run's finished shards (named by it) as its own."""
    held: set[str] = set()
    for name in names:
        segment = _SEGMENT_RE.match(name)
        if not (segment or _PROGRESS_RE.match(name)) or record_owner(name) not in runs:
            continue
        try:
            data = storage.read_bytes(name)
            where = storage.url_of(name)
            part = 0 if segment else layout.progress_part(name)[1]  # type: ignore[index]
            record: Any = SegmentRecord.loads(data, where=where) if segment else \
                StreamRecord.loads(data, where=where, part=part)
        except (FileNotFoundError, CorruptSnapshotError):
            continue
        held.update(layout.with_pages(s.path for s in record.shards))
    return held


def withdraw_listing(storage: Storage, shard: str) -> list[int]:
    """Take back the commit of every version that lists ``shard`` (found corrupt): their
    manifests are removed, newest first, so no reader opens them and the next build does not
    keep their segments; their shards go with the clean-up after the next commit. Returns the
    versions withdrawn."""
    withdrawn = []
    for version in reversed(versions(storage)):
        try:
            manifest = load_version(storage, version)
        except (CorruptSnapshotError, UnknownFormatVersionError):
            manifest = None  # unreadable: not known to list it, never withdrawn here
        if manifest is not None and any(s.path == shard for s in manifest.shards):
            storage.remove(manifest_name(version))
            withdrawn.append(version)
    return withdrawn


def delete_versions(storage: Storage, drop: Iterable[int], *, dry_run: bool = False,
                    only: set[str] | None = None) -> list[str]:
    """Delete versions ``drop`` and every file only they referenced: a shard another version
    lists stays. Manifests go first, so an interrupted delete never leaves a version listing a
    missing shard. ``only``: remove none but these names (what a confirmed plan listed).
    Returns the names removed (with ``dry_run``: that would be)."""
    names = storage.listdir()
    drop = set(drop) & set(versions(storage, names))
    needed = referenced(storage, names, skip=drop)  # by every version that stays
    live_runs = {lease.owner for lease in live_leases(storage) if lease.kind == "write"}
    manifests = [manifest_name(v) for v in sorted(drop)]
    others = []
    for name in names:
        if name in needed or name in manifests or (only is not None and name not in only):
            continue
        owner = owner_of(name)
        if owner is not None and owner not in live_runs:
            others.append(name)
    if not dry_run:
        for name in manifests + others:
            storage.remove(name)
    return manifests + others


def shard_bytes(manifests: Sequence[Manifest]) -> tuple[int, int]:
    """(bytes of the shards the manifests list, each shard counted once; bytes of the shards
    that more than one of them lists)."""
    sizes: dict[str, int] = {}
    listed: dict[str, int] = {}
    for manifest in manifests:
        for shard in manifest.shards:
            sizes[shard.path] = shard.bytes
            listed[shard.path] = listed.get(shard.path, 0) + 1
    return sum(sizes.values()), sum(sizes[p] for p, n in listed.items() if n > 1)


def version_source(kind: str, units: int, size: int, digest: str,
                   files: int | None = None) -> dict[str, Any]:
    """The ``source`` field of a version's manifest, before its record is attached
    (``files``: the number of files, when units are Parquet row groups)."""
    source = {"kind": kind, "units": units, "bytes": size, "digest": digest}
    if files is not None:
        source["files"] = files
    return source
