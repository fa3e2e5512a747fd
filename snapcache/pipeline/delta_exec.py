"""Running a delta snapshot: a file source computed unit by unit, versions reusing shards.

When a snapshot's upstream is a source made of files (``Traits.units``) followed only by
element-wise ops that keep no copy (:func:`snapcache.pipeline.ops.delta_source`), the
snapshot lives in a *lineage* folder named by the upstream's code fingerprint (the files do not
count) and holds versions (see :mod:`snapcache.store.protocol.versions`):

1. the source's files are listed (one ``stat`` each, or a listing on S3) and keyed;
2. a version built from exactly these files is read;
3. otherwise the newest version is compared with the source (:func:`survey`): segments
   whose units are all unchanged are kept; a segment that lost units has its other units'
   rows copied when each unit's rows are known (:func:`unit_rows_of`), else those units are
   computed again; new and changed units are computed. What is to compute or copy is cut into
   *tasks* of at most :data:`SEGMENT_UNITS` units, the same way by every builder;
4. stream ``i`` of ``n`` (DataLoader workers x ranks, a Ray task) computes tasks ``i, i + n,
   ...`` under its write lease ``lease-<n>-<i>-<gen>.json`` (a second process of the same
   stream waits, or computes without writing with ``on_busy="compute"``), each task written
   to its own shards and recorded (``segment-<run>-<seq>.json``) and fenced by the lease;
   then the tasks of streams whose lease nobody holds (not started, or dead) - so a build
   never waits on a stream that is gone, and a crashed build's recorded tasks are reused;
5. whoever finds every task recorded commits the version under its lease: the kept and
   copied segments of the newest version first (their shards in place), then the new ones in
   source order, created exclusively, fenced.

The epoch that builds a version yields its examples once it is committed, in its order.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import xxhash

from snapcache.errors import CorruptSnapshotError, LeaseLostError
from snapcache.fingerprint.units import (
    UnitDiff, describe_delta, diff_units, occurrence_keys, unit_key, unit_label, units_digest)
from snapcache.pipeline import interrupt, ops, streams
from snapcache.pipeline.snapshot_exec import (
    _read, check_root, make_folder, open_reader, root_errors)
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.manifest import DELTA_FORMAT_VERSION, Manifest
from snapcache.store.protocol import (
    StreamRecord, WriteLease, commit_fields, missing_shards, progress_by_task, versions,
    write_progress)
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
        return tuple(occurrence_keys([unit_key(i) for i in self.identities]))

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
    keys = occurrence_keys([unit_key(u.identity) for u in units])  # numbered as the source's
    grouped: list[list[tuple[str, versions.Unit]]] = [[] for _ in base.segments or ()]
    for key, unit in zip(keys, units):
        grouped[unit.segment].append((key, unit))
    segments, start = [], 0
    for spec, members in zip(base.segments or (), grouped):
        shards = tuple(base.shards[start:start + spec["shards"]])
        start += spec["shards"]
        rows = [u.rows for _, u in members]
        known = None not in rows and sum(rows) == sum(s.rows for s in shards)  # type: ignore
        segments.append(Segment(tuple((key, u.identity) for key, u in members),
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


def plan_build(units: SourceUnits, base: Manifest | None, segments: Sequence[Segment]) -> Plan:
    """Which segments of the base version stay, which units to compute. A segment stays when
    every one of its units is still in the source, unchanged; a segment that lost some, whose
    rows per unit are known, has its other units' rows copied. (Segments a build that died
    recorded are found again by :func:`survey`: the next build cuts the same tasks.)"""
    current = set(units.keys)
    old = [(unit_label(identity), key) for seg in segments for key, identity in seg.units]
    diff = diff_units(old, list(zip((unit_label(i) for i in units.identities), units.keys)))
    reused: list[Segment] = []
    copied: list[tuple[Segment, tuple[int, ...]]] = []
    covered: set[str] = set()
    for seg in segments:
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
@dataclass(frozen=True)
class Task:
    """One segment a build produces: source units computed (``compute``: indices into the
    source's units), or the units ``kept`` of a base segment ``copy`` copied. Tasks are cut the
    same way by every stream of a build (from the newest version and the source), so stream
    ``i`` of ``n`` owns tasks ``i, i + n, ...`` and a finished task is recognised by its units'
    keys whoever recorded it."""

    seq: int
    compute: tuple[int, ...] = ()
    copy: Segment | None = None
    kept: tuple[int, ...] = ()

    def keys(self, units: SourceUnits) -> tuple[str, ...]:
        if self.copy is not None:
            return tuple(self.copy.units[i][0] for i in self.kept)
        return tuple(units.keys[i] for i in self.compute)


@dataclass
class Work:
    """Where the build of the version of ``units`` stands: the plan against the newest
    version, its tasks, and the segments already recorded for them (by any stream, or by a
    build that died)."""

    plan: Plan
    segments: list[Segment]
    tasks: list[Task]
    done: dict[tuple[str, ...], Segment]
    units: SourceUnits
    storage: Storage | None = None
    names: list[str] = field(default_factory=list)  # the lineage folder's listing

    @functools.cached_property
    def progress(self) -> dict[str, StreamRecord]:
        """Interrupted runs' progress on tasks, by task digest (:func:`task_digest`)."""
        if self.storage is None or not any(n.startswith("progress-") for n in self.names):
            return {}
        return progress_by_task(self.storage, self.names)

    def pending(self, stream: int, count: int) -> list[Task]:
        return [t for t in self.tasks if t.seq % count == stream
                and t.keys(self.units) not in self.done]

    @property
    def complete(self) -> bool:
        return all(t.keys(self.units) in self.done for t in self.tasks)


def survey(storage: Storage, units: SourceUnits, previous: Work | None = None) -> Work:
    """The plan of the next version and which of its tasks are recorded already (the plan of
    ``previous`` is kept when no version was committed since)."""
    names = storage.listdir()
    numbers = versions.versions(storage, names)
    base_version = previous.plan.base.version if previous and previous.plan.base else None
    if previous is not None and (numbers[-1] if numbers else None) == base_version:
        plan, segments, tasks = previous.plan, previous.segments, previous.tasks
    else:
        base = versions.load_version(storage, numbers[-1]) if numbers else None
        segments = base_segments(storage, base)
        plan = plan_build(units, base, segments)
        chunks = _chunks(plan.compute, units)
        tasks = [Task(seq, compute=tuple(chunk)) for seq, chunk in enumerate(chunks)]
        tasks += [Task(len(chunks) + n, copy=seg, kept=kept)
                  for n, (seg, kept) in enumerate(plan.copied)]
    wanted = {t.keys(units) for t in tasks}
    done = {}
    for record in versions.finished_segments(storage, names):
        keys = tuple(key for key, _ in record.units)
        if keys in wanted:
            done.setdefault(keys, record)
    return Work(plan, segments, tasks, done, units, storage, names)


def run_delta(op: ops.SnapshotOp, epoch: int, *, source: ops.Op, lineage, describe: str
              ) -> Iterator[Any]:
    """One epoch of a delta snapshot op (see the module docstring)."""
    options = op.options
    storage = check_root(op).child(lineage.digest)
    units = source_units(source, lambda: storage)
    spec = streams.current()
    make_folder(op, storage)
    manifest = _negotiate(op, epoch, storage, units, source=source, lineage=lineage,
                          describe=describe, stream=spec.index, count=spec.count)
    if manifest is None:  # on_busy="compute": another process builds it
        return ops.run(op.parent, epoch, streams.StreamSpec(spec.index, spec.count))
    return _read(open_reader(storage, manifest, options), op, spec)  # held while op can read


def _negotiate(op: ops.SnapshotOp, epoch: int, storage: Storage, units: SourceUnits, *,
               source: ops.Op, lineage, describe: str, stream: int, count: int
               ) -> Manifest | None:
    """The version built from ``units``: found, built here (this stream's tasks, then those
    of streams nobody is building), or built by other streams or processes (waited for)."""
    coordination = op.options.coordination
    poll = Poll(coordination.wait_timeout)
    while True:
        found = versions.find_version(storage, units.digest)
        if found is not None:
            return found
        progress = advance(op, epoch, storage, units, stream=stream, count=count,
                           source=source, lineage=lineage, describe=describe, steal=True)
        if progress.manifest is not None:
            return progress.manifest
        if progress.busy and coordination.on_busy == "compute":
            log.info("delta snapshot %s is being built by another process: computing without "
                     "writing", storage.url)
            return None
        poll.check(f"a version of delta snapshot {storage.url}", storage)
        poll.sleep()


@dataclass(frozen=True)
class Progress:
    """What :func:`advance` did: the committed version (or None), whether this stream's lease
    was held by another process, the examples it wrote, the streams with tasks left."""

    manifest: Manifest | None
    busy: bool = False
    written: int = 0
    missing: tuple[int, ...] = ()


def advance(op: ops.SnapshotOp, epoch: int, storage: Storage, units: SourceUnits, *,
            stream: int, count: int, source: ops.Op, lineage, describe: str,
            steal: bool = False, compute: bool = True) -> Progress:
    """Do what stream ``stream`` of ``count`` can for the version of ``units``: compute its
    pending tasks under its write lease (``lease-<count>-<stream>-<gen>.json``, fencing each
    segment), then with ``steal`` those of other streams whose lease nobody holds (a stream
    not started, or dead); commit the version once every task is recorded (``compute=False``:
    only that)."""
    run_id = layout.new_run_id()
    ttl = op.options.coordination.lease_ttl
    work = survey(storage, units)
    busy, written = False, 0
    own: WriteLease | None = None  # this stream's lease, held until the commit
    order = [stream] + ([j for j in range(count) if j != stream] if steal else [])
    try:
        for j in order if compute else ():
            if not work.pending(j, count):
                continue
            with root_errors(op, storage):
                lease = WriteLease.acquire(storage, run_id=run_id, stream=j, streams=count,
                                           ttl=ttl)
            if lease is None:
                busy = busy or j == stream
                continue
            if j == stream:
                own = lease
            try:
                found = versions.find_version(storage, units.digest)
                if found is not None:
                    return Progress(found, busy, written)
                work = survey(storage, units, work)  # what others recorded meanwhile
                pending = work.pending(j, count)
                if pending:
                    log.info("delta snapshot %s: %s%s", storage.url, work.plan.describe(),
                             f" (stream {j} of {count}: {len(pending)} segments)"
                             if count > 1 else "")
                for task in pending:
                    segment = _run_task(op, epoch, storage, units, task, run_id=run_id,
                                        source=source, lease=lease, work=work)
                    work.done[task.keys(units)] = segment
                    written += segment.rows
            except LeaseLostError as e:  # taken over: its new holder goes on; so do we
                log.warning("delta snapshot %s: stream %d of %d: %s", storage.url, j, count, e)
                busy = busy or j == stream
                if lease is own:
                    own = None
            finally:
                if lease is not own:
                    lease.release()
        if not work.complete:
            missing = tuple(j for j in range(count) if work.pending(j, count))
            return Progress(None, busy, written, missing)
        if own is None:
            with root_errors(op, storage):
                own = WriteLease.acquire(storage, run_id=run_id, stream=stream, streams=count,
                                         ttl=ttl)
            if own is None:  # its holder commits
                return Progress(None, True, written)
        try:
            return Progress(_commit(op, storage, units, work, run_id=run_id, lineage=lineage,
                                    describe=describe, lease=own), busy, written)
        except LeaseLostError as e:  # taken over before the fence: its new holder commits
            log.warning("delta snapshot %s: %s", storage.url, e)
            own = None
            return Progress(None, True, written)
    finally:
        if own is not None:
            own.release()


def _commit(op: ops.SnapshotOp, storage: Storage, units: SourceUnits, work: Work, *,
            run_id: str, lineage, describe: str, lease: WriteLease) -> Manifest | None:
    """Commit the version whose every task is recorded (fenced by ``lease``); None if another
    build committed that version number first (the caller surveys again)."""
    found = versions.find_version(storage, units.digest)
    if found is not None:
        return found
    reused = {id(seg) for seg in work.plan.reused}
    copies = {id(t.copy): work.done[t.keys(units)] for t in work.tasks if t.copy is not None}
    # The base version's order: its kept segments, and its salvaged ones where they were; then
    # the new ones, in source order.
    ordered = [seg if id(seg) in reused else copies[id(seg)] for seg in work.segments
               if id(seg) in reused or id(seg) in copies]
    ordered += [work.done[t.keys(units)] for t in work.tasks if t.copy is None]
    base = work.plan.base
    manifest = _assemble(ordered, storage, units, lineage, base, run_id=run_id,
                         describe=describe, options=op.options)
    # Each unit as the source has it now (a kept row group's file may have been rewritten: its
    # record must carry the file's current stamp, see ParquetSource.unit_identities).
    current = dict(zip(units.keys, units.identities))
    unit_rows = [versions.Unit(current.get(key, identity), i,
                               seg.unit_rows[k] if seg.unit_rows else None)
                 for i, seg in enumerate(ordered) for k, (key, identity) in enumerate(seg.units)]
    if not versions.commit_version(storage, manifest, unit_rows, run_id=run_id, lease=lease):
        return versions.find_version(storage, units.digest)
    versions.cleanup(storage, run_id)
    return versions.load_version(storage, manifest.version)


def _chunks(indices: Sequence[int], units: SourceUnits) -> list[list[int]]:
    size = max(SEGMENT_UNITS, -(-len(indices) // MAX_SEGMENTS_PER_BUILD))
    return [list(indices[i:i + size]) for i in range(0, len(indices), size)]


def _run_task(op: ops.SnapshotOp, epoch: int, storage: Storage, units: SourceUnits,
              task: Task, *, run_id: str, source: ops.Op, lease: WriteLease,
              work: Work | None = None) -> Segment:
    """One task: its segment written (shards, then its record), fenced by ``lease``."""
    if task.copy is not None:
        segment = _copy(storage, task.copy, task.kept, op.options, run_id=run_id, lease=lease,
                        seq=task.seq)
    else:
        earlier = work.progress.get(task_digest(task.keys(units))) if work else None
        segment = _compute(op, epoch, storage, units, task.compute, seq=task.seq,
                           run_id=run_id, source=source, lease=lease, earlier=earlier)
    _crash_hook(task.seq)
    lease.check()
    return segment


def task_digest(keys: Sequence[str]) -> str:
    """The digest a task's progress records carry: of its units' keys, in order."""
    return xxhash.xxh3_128_hexdigest("\0".join(keys).encode())


def _compute(op: ops.SnapshotOp, epoch: int, storage: Storage, units: SourceUnits,
             chunk: Sequence[int], *, seq: int, run_id: str, source: ops.Op,
             lease: WriteLease | None, earlier: StreamRecord | None = None) -> Segment:
    """Run the upstream on the units ``chunk`` only: one segment. ``earlier``: an interrupted
    run's progress on the same units; when each unit's rows are known, its shards that end on
    a unit's last row are kept and the upstream runs on the units after them only."""
    known = all(node.traits.order_preserving and node.traits.length != "unknown"
                for node in ops.lineage(op.parent)[1:])
    chosen = [units.identities[i] for i in chunk]
    members = tuple((units.keys[i], units.identities[i]) for i in chunk)
    unit_rows = unit_rows_of(op.parent, source, chosen) if known else None
    task = task_digest([key for key, _ in members])
    start, resume = _resumable(earlier, unit_rows) if unit_rows is not None else (0, None)
    if resume is not None:
        # This run's record of them at once: the clean-up after another build's commit keeps
        # what live runs' records list (they are named by the run that wrote them). Then
        # check they are still there (that clean-up may have listed the folder before).
        resume = dataclasses.replace(resume, stream=seq, streams=seq + 1, run_id=run_id,
                                     task=task)
        write_progress(storage, resume)
        if missing_shards(storage, resume.shards):
            start, resume = 0, None
    if resume is not None:
        log.info("delta snapshot %s: %d of %d files of a segment were computed by an "
                 "interrupted run: computing the other %d", storage.url, start, len(chosen),
                 len(chosen) - start)
    writer = SnapshotWriter(storage, fingerprint=storage.url.rsplit("/", 1)[-1],
                            options=op.options.write, stream=seq, streams=seq + 1,
                            run_id=run_id, lease=lease, resume=resume, task=task)
    upstream = ops.run(ops.rebase(op.parent, source.with_units(chosen[start:])), epoch,
                       streams.StreamSpec()) if start < len(chosen) else iter(())
    with interrupt.keeps_written(writer, upstream):  # (for the next run: see _resumable)
        for example in upstream:
            writer.write(example)
        record = writer.finish()
    if unit_rows is not None and sum(unit_rows) != record.rows:
        unit_rows = None  # the ops' length rules disagree with what was written
    segment = Segment(members, record.shards, record.schema, unit_rows)
    versions.write_segment(storage, record, segment, seq=seq)
    return segment


def _resumable(earlier: StreamRecord | None, unit_rows: Sequence[int]
               ) -> tuple[int, StreamRecord | None]:
    """How many of a task's units an interrupted run's shards hold, and those shards: the
    longest run of its shards ending on a unit's last row (a shard that ends inside a unit is
    computed again, with the units after it)."""
    if earlier is None:
        return 0, None
    ends: dict[int, int] = {}  # rows of the first k units -> k
    total = 0
    for k, rows in enumerate(unit_rows, 1):
        total += rows
        ends[total] = k
    units = shards = rows = 0
    for j, shard in enumerate(earlier.shards, 1):
        rows += shard.rows
        if rows in ends:
            units, shards = ends[rows], j
    if not units:
        return 0, None
    return units, dataclasses.replace(earlier, shards=earlier.shards[:shards])


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
        source=versions.version_source(
            units.kind, len(units.keys), units.size, units.digest,
            files=len({str(i["path"]) for i in units.identities}) if units.row_groups
            else None),
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
