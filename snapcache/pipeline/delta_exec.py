"""Running a delta snapshot: a file source computed unit by unit, versions reusing shards.

When a snapshot's upstream is a source made of files (``Traits.units``) followed only by
element-wise ops that keep no copy (:func:`snapcache.pipeline.ops.delta_source`), the
snapshot lives in a *lineage* folder named by the upstream's code fingerprint (the files do not
count) and holds versions (see :mod:`snapcache.store.protocol.versions`):

1. the source's files are listed (one ``stat`` each, or a listing on S3) and keyed;
2. a version built from exactly these files is read;
3. otherwise the build lease of the lineage is taken (one builder at a time; others wait, or
   compute without writing with ``on_busy="compute"``), the newest version is compared with the
   source: segments whose files are all unchanged are kept; a segment that lost files has its
   other files' rows copied when each file's rows are known (:func:`unit_rows_of`), else those
   files are computed again; new and changed files are computed: the upstream runs on those
   files alone, a segment of at most :data:`SEGMENT_UNITS` files at a time, each segment written
   to its own shards and recorded (``segment-<run>-<seq>.json``) so a crashed build's finished
   segments are reused by the next;
4. the new version lists the kept and copied segments of the newest version first (their
   shards in place), then the new ones in source order, and is committed exclusively, fenced by
   the lease.

The epoch that builds a version yields its examples once it is committed, in its order.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from snapcache.errors import CorruptSnapshotError
from snapcache.fingerprint.units import (
    UnitDiff, describe_delta, diff_units, unit_key, unit_label, units_digest)
from snapcache.pipeline import ops, streams
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.manifest import DELTA_FORMAT_VERSION, Manifest, ShardInfo
from snapcache.store.protocol import WriteLease, commit_fields, versions
from snapcache.store.protocol.negotiate import Poll
from snapcache.store.protocol.versions import SegmentRecord as Segment
from snapcache.store.schema import Schema, merge_schemas
from snapcache.store.writer import SnapshotWriter

log = logging.getLogger("snapcache")

SEGMENT_UNITS = 256
"""Files per segment: what a removed or changed file costs its segment-mates (their rows are
copied, or recomputed when each file's rows are not known)."""
MAX_SEGMENTS_PER_BUILD = 9_000


@dataclass(frozen=True)
class SourceUnits:
    """A unit source's files as the delta build sees them: identity of each, in order; their
    keys are computed when a build or ``explain`` compares them with a version."""

    kind: str
    identities: tuple[dict, ...]

    @functools.cached_property
    def digest(self) -> str:
        return units_digest(self.identities)

    @functools.cached_property
    def keys(self) -> tuple[str, ...]:
        return tuple(unit_key(i) for i in self.identities)

    @property
    def size(self) -> int:
        """Bytes of the source: its files' (each counted once for row groups)."""
        files = {str(i["path"]): i.get("file_size", i.get("size")) for i in self.identities}
        return sum(int(size or 0) for size in files.values())

    @functools.cached_property
    def row_groups(self) -> bool:
        return versions.has_row_groups(self.identities)

    @property
    def noun(self) -> str:
        return "row group" if self.row_groups else "file"


def source_units(source: ops.Op, lineage: Callable[[], Storage] | None = None) -> SourceUnits:
    """The units of ``source`` (taken once per source op object). Sources whose identities
    cost reads (Parquet row groups) reuse those of the newest version of the lineage folder
    (``lineage()``) for the files that did not change."""
    def known() -> list[dict]:
        folder = lineage() if lineage is not None else None
        try:
            base = versions.newest(folder) if folder is not None else None
            return [u.identity for u in versions.read_units(folder, base)] if base else []
        except CorruptSnapshotError as e:
            log.warning("not reusing the unit identities of %s: %s", folder.url, e)
            return []

    def compute() -> SourceUnits:
        identities = tuple(source.unit_identities(known))
        return SourceUnits(source.kind, identities)

    return source.memo("source_units", compute)


def base_segments(storage: Storage, base: Manifest | None) -> list[Segment]:
    """The segments of a committed version, with their units."""
    if base is None:
        return []
    units = versions.read_units(storage, base)
    grouped: list[list[versions.Unit]] = [[] for _ in base.segments or ()]
    for unit in units:
        grouped[unit.segment].append(unit)
    segments, start = [], 0
    for spec, members in zip(base.segments or (), grouped):
        shards = tuple(base.shards[start:start + spec["shards"]])
        start += spec["shards"]
        rows = [u.rows for u in members]
        known = None not in rows and sum(rows) == sum(s.rows for s in shards)  # type: ignore
        segments.append(Segment(tuple((unit_key(u.identity), u.identity) for u in members),
                                shards, base.schema if shards else None,
                                tuple(rows) if known else None))  # type: ignore[arg-type]
    return segments


@dataclass(frozen=True)
class Plan:
    """What a build will do: segments reused in place, units computed."""

    base: Manifest | None
    diff: UnitDiff
    reused: tuple[Segment, ...]
    compute: tuple[int, ...]          # indices into the source's units, in source order
    total: int
    copied: tuple[tuple[Segment, tuple[int, ...]], ...] = ()
    """Segments with removed or changed files whose other files' rows are copied (their
    indices in the segment), not recomputed: the rows of each file are known."""

    @property
    def reused_rows(self) -> int:
        return sum(s.rows for s in self.reused) + sum(
            s.unit_rows[i] for s, kept in self.copied for i in kept)  # type: ignore[index]

    @property
    def reused_units(self) -> int:
        return sum(len(s.units) for s in self.reused) + sum(len(k) for _, k in self.copied)

    def reused_share(self) -> float:
        """Reused examples over the examples expected (units computed are estimated at the
        base version's mean examples per unit)."""
        base_units = self.base.source.get("units", 0) if self.base is not None else 0
        per_unit = self.base.num_examples / base_units if base_units else 1.0
        expected = self.reused_rows + per_unit * len(self.compute)
        return self.reused_rows / expected if expected else 1.0

    noun: str = "file"

    def describe(self) -> str:
        return describe_delta(self.diff, computing=len(self.compute), total=self.total,
                              reusing=self.reused_units, reused_share=self.reused_share(),
                              noun=self.noun)


def plan_build(units: SourceUnits, base: Manifest | None, segments: Sequence[Segment],
               recovered: Sequence[Segment] = ()) -> Plan:
    """Which segments of the base version (and of crashed builds) stay, which units to compute.
    A segment stays when every one of its units is still in the source, unchanged; a segment
    that lost some, whose rows per unit are known, has its other units' rows copied."""
    current = set(units.keys)
    old = {unit_label(identity): key for seg in segments for key, identity in seg.units}
    diff = diff_units(old, list(zip((unit_label(i) for i in units.identities), units.keys)))
    reused: list[Segment] = []
    copied: list[tuple[Segment, tuple[int, ...]]] = []
    covered: set[str] = set()
    for seg in list(segments) + list(recovered):
        keys = {key for key, _ in seg.units}
        if keys and keys <= current and not keys & covered:
            reused.append(seg)
            covered |= keys
    for seg in segments:  # then what can be salvaged from the base version's other segments
        if seg in reused or seg.unit_rows is None:
            continue
        kept = tuple(i for i, (key, _) in enumerate(seg.units)
                     if key in current and key not in covered)
        if kept:
            copied.append((seg, kept))
            covered |= {seg.units[i][0] for i in kept}
    compute = tuple(i for i, key in enumerate(units.keys) if key not in covered)
    return Plan(base, diff, tuple(reused), compute, len(units.keys), tuple(copied), units.noun)


# -- running -----------------------------------------------------------------------------------
def run_delta(op: ops.SnapshotOp, epoch: int, *, source: ops.Op, lineage, describe: str
              ) -> Iterator[Any]:
    """One epoch of a delta snapshot op (see the module docstring)."""
    from snapcache.pipeline.snapshot_exec import _read, open_reader

    options = op.options
    storage = Storage(op.path, options.storage_options).child(lineage.digest)
    units = source_units(source, lambda: storage)
    run_id = layout.new_run_id()
    spec = streams.current()
    manifest = _negotiate(op, epoch, storage, units, run_id=run_id, source=source,
                          lineage=lineage, describe=describe)
    if manifest is None:  # on_busy="compute": another process builds it
        return ops.run(op.parent, epoch, streams.StreamSpec(spec.index, spec.count))
    return _read(open_reader(storage, manifest, options), op, spec)  # held while op can read


def _negotiate(op: ops.SnapshotOp, epoch: int, storage: Storage, units: SourceUnits, *,
               run_id: str, source: ops.Op, lineage, describe: str) -> Manifest | None:
    """The version built from ``units``: found, built here, or built by another process."""
    coordination = op.options.coordination
    poll = Poll(coordination.wait_timeout)
    while True:
        found = versions.find_version(storage, units.digest)
        if found is not None:
            return found
        lease = WriteLease.acquire(storage, run_id=run_id, ttl=coordination.lease_ttl)
        if lease is not None:
            try:
                found = versions.find_version(storage, units.digest)
                if found is not None:
                    return found
                built = build(op, epoch, storage, units, run_id=run_id, source=source,
                              lineage=lineage, describe=describe, lease=lease)
            finally:
                lease.release()
            if built is not None:
                return built
            continue  # another build committed the version we meant to: start again on it
        if coordination.on_busy == "compute":
            log.info("delta snapshot %s is being built by another process: computing without "
                     "writing", storage.url)
            return None
        poll.check(f"a version of delta snapshot {storage.url}", storage)
        poll.sleep()


def build(op: ops.SnapshotOp, epoch: int, storage: Storage, units: SourceUnits, *, run_id: str,
          source: ops.Op, lineage, describe: str, lease: WriteLease | None) -> Manifest | None:
    """Build and commit the next version (the caller holds the lineage's build lease); None if
    another build committed that version number first."""
    names = storage.listdir()
    base = versions.newest(storage, names)
    segments = base_segments(storage, base)
    recovered = versions.finished_segments(storage, names)
    plan = plan_build(units, base, segments, recovered)
    log.info("delta snapshot %s: %s", storage.url, plan.describe())
    new = _compute(op, epoch, storage, units, plan.compute, run_id=run_id, source=source,
                   lease=lease)
    copies = {id(seg): _copy(storage, seg, kept, op.options, run_id=run_id, lease=lease,
                             seq=len(new) + n)
              for n, (seg, kept) in enumerate(plan.copied)}
    reused = {id(seg) for seg in plan.reused}
    # The base version's order: its kept segments, and its salvaged ones where they were; then
    # the segments of crashed builds and the new ones, in source order.
    ordered = [seg if id(seg) in reused else copies[id(seg)] for seg in segments
               if id(seg) in reused or id(seg) in copies]
    ordered += [seg for seg in plan.reused if seg not in segments] + new
    manifest = _assemble(ordered, storage, units, lineage, base, run_id=run_id,
                         describe=describe, options=op.options)
    # Each unit as the source has it now (a kept row group's file may have been rewritten: its
    # record must carry the file's current stamp, see ParquetSource.unit_identities).
    current = dict(zip(units.keys, units.identities))
    unit_rows = [versions.Unit(current.get(key, identity), i,
                               seg.unit_rows[k] if seg.unit_rows else None)
                 for i, seg in enumerate(ordered) for k, (key, identity) in enumerate(seg.units)]
    if not versions.commit_version(storage, manifest, unit_rows, run_id=run_id, lease=lease):
        return None
    versions.cleanup(storage, run_id)
    return versions.load_version(storage, manifest.version)


def _chunks(indices: Sequence[int], units: SourceUnits) -> list[list[int]]:
    size = max(SEGMENT_UNITS, -(-len(indices) // MAX_SEGMENTS_PER_BUILD))
    return [list(indices[i:i + size]) for i in range(0, len(indices), size)]


def _compute(op: ops.SnapshotOp, epoch: int, storage: Storage, units: SourceUnits,
             indices: Sequence[int], *, run_id: str, source: ops.Op,
             lease: WriteLease | None) -> list[Segment]:
    """Run the upstream on the files ``indices`` only, a segment at a time."""
    segments = []
    chunks = _chunks(indices, units)
    known = all(node.traits.order_preserving and node.traits.length != "unknown"
                for node in ops.lineage(op.parent)[1:])
    for seq, chunk in enumerate(chunks):
        chosen = [units.identities[i] for i in chunk]
        writer = SnapshotWriter(storage, fingerprint=storage.url.rsplit("/", 1)[-1],
                                options=op.options.write, stream=seq, streams=len(chunks),
                                run_id=run_id, lease=lease)
        upstream = ops.run(ops.rebase(op.parent, source.with_units(chosen)), epoch,
                           streams.StreamSpec())
        try:
            for example in upstream:
                writer.write(example)
            record = writer.finish()
        finally:
            writer.abort()  # no-op once finished
            close = getattr(upstream, "close", None)
            if close is not None:
                close()
        members = tuple((units.keys[i], units.identities[i]) for i in chunk)
        unit_rows = unit_rows_of(op.parent, source, chosen) if known else None
        if unit_rows is not None and sum(unit_rows) != record.rows:
            unit_rows = None  # the ops' length rules disagree with what was written
        segment = Segment(members, record.shards, record.schema, unit_rows)
        versions.write_segment(storage, record, segment, seq=seq)
        _crash_hook(seq)
        segments.append(segment)
        if lease is not None:
            lease.check()
    return segments


def unit_rows_of(upstream: ops.Op, source: ops.Op, units: Sequence[dict]
                 ) -> tuple[int, ...] | None:
    """Examples each of ``units`` yields through the upstream, in order, when the ops say it
    without running them: the source knows each unit's length (from_files: one; Parquet: the
    row group's rows in the footer), then only order-preserving ops with a length rule (map).
    None otherwise (a filter, an interleave): the rows of each unit in a segment are then
    unknown."""
    chain = ops.lineage(upstream)[1:]
    if not all(node.traits.order_preserving and node.traits.length != "unknown"
               for node in chain):
        return None
    lengths = source.unit_lengths(units)
    if lengths is None:
        return None
    rows = []
    for n in lengths:
        for node in chain:
            n = node.length(n)
            if n is None:
                return None
        rows.append(n)
    return tuple(rows)


def _copy(storage: Storage, segment: Segment, kept: Sequence[int], options, *, run_id: str,
          lease: WriteLease | None, seq: int) -> Segment:
    """A new segment holding the rows of ``segment``'s units ``kept`` only, copied from its
    shards (read back, checksums verified, and written again): a removed or changed file costs
    no recomputation of the others."""
    from snapcache.store.reader import SnapshotReader

    assert segment.unit_rows is not None
    wanted = set(kept)
    keep_rows = [i in wanted for i, rows in enumerate(segment.unit_rows) for _ in range(rows)]
    partial = Manifest(fingerprint=storage.url.rsplit("/", 1)[-1], schema=segment.schema,
                       shards=segment.shards, compression="", created_at="", committed_at="",
                       writer={})
    writer = SnapshotWriter(storage, fingerprint=partial.fingerprint, options=options.write,
                            stream=seq, streams=seq + 1, run_id=run_id, lease=lease)
    try:
        for keep, example in zip(keep_rows, SnapshotReader(storage, partial).examples()):
            if keep:
                writer.write(example)
        record = writer.finish()
    finally:
        writer.abort()
    members = tuple(segment.units[i] for i in kept)
    copy = Segment(members, record.shards, record.schema,
                   tuple(segment.unit_rows[i] for i in kept))
    versions.write_segment(storage, record, copy, seq=seq)
    return copy


def _crash_hook(seq: int) -> None:
    """Tests: ``SNAPCACHE_TEST_DELTA_PAUSE=<file>`` makes the build create ``<file>`` after its
    first segment and wait until it is deleted (so a test can kill the builder at a known
    point)."""
    import os

    path = os.environ.get("SNAPCACHE_TEST_DELTA_PAUSE")
    if not path or seq != 0:
        return
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    while os.path.exists(path):
        time.sleep(0.01)


def _assemble(segments: Sequence[Segment], storage: Storage, units: SourceUnits, lineage,
              base: Manifest | None, *, run_id: str, describe: str, options) -> Manifest:
    schema = None
    for seg in segments:
        if seg.schema is not None:
            other = Schema.from_json(seg.schema)
            schema = other if schema is None else merge_schemas(schema, other,
                                                                where=storage.url)
    fields = commit_fields(options.write, key=None, name=options.name,
                           fingerprint=lineage.digest, fingerprint_tree=lineage.to_json(),
                           pipeline=describe, run_id=run_id)
    fields["created_at"] = base.created_at if base is not None else fields["created_at"]
    return Manifest(
        schema=schema.to_json() if schema is not None else None,
        shards=tuple(s for seg in segments for s in seg.shards),
        format_version=versions.ROW_GROUPS_FORMAT_VERSION if units.row_groups
        else DELTA_FORMAT_VERSION,
        version=(base.version if base is not None else 0) + 1,
        source=versions.version_source(units.kind, len(units.keys), units.size, units.digest),
        segments=tuple({"shards": len(seg.shards), "units": len(seg.units), "rows": seg.rows}
                       for seg in segments),
        **fields)


def explain_delta(storage: Storage, units: SourceUnits) -> tuple[Manifest | None, Plan | None]:
    """For ``explain``: the version matching the source (a hit), else the plan of the next build
    against the newest version (None when the lineage has no version yet)."""
    names = storage.listdir()
    hit = versions.find_version(storage, units.digest, names)
    if hit is not None:
        return hit, None
    base = versions.newest(storage, names)
    if base is None:
        return None, None
    return None, plan_build(units, base, base_segments(storage, base))
