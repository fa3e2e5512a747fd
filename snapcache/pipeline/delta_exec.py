"""Running a delta snapshot: a file source computed unit by unit, versions reusing shards.

When a snapshot's upstream is a source made of files (``Traits.units``) followed only by
element-wise ops that keep no copy (:func:`snapcache.pipeline.ops.delta_source`), the
snapshot lives in a *lineage* folder named by the upstream's code fingerprint (the files do not
count) and holds versions (see :mod:`snapcache.store.protocol.versions`):

1. the source's files are listed (one ``stat`` each, or a listing on S3) and keyed;
2. a version built from exactly these files is read;
3. otherwise the newest version is compared with the source
   (:func:`~snapcache.pipeline.delta_plan.survey`): segments whose units are all unchanged are
   kept; a segment that lost units has its other units' rows copied when each unit's rows are
   known (:func:`~snapcache.pipeline.delta_segment.unit_rows_of`), else those units are
   computed again; new and changed units are computed. What is to compute or copy is cut into
   *tasks* of at most :data:`~snapcache.pipeline.delta_plan.SEGMENT_UNITS` units, the same way
   by every builder;
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

Step 3 is :mod:`snapcache.pipeline.delta_plan`; each task's segment (computed, resumed from an
interrupted run's progress, or copied) is :mod:`snapcache.pipeline.delta_segment`; this module
runs the build: it finds or waits for a version, takes leases, and commits the version
manifest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from snapcache.errors import LeaseLostError
from snapcache.pipeline import ops, streams
from snapcache.pipeline.delta_plan import SourceUnits, Work, source_units, survey
from snapcache.pipeline.delta_segment import run_task
from snapcache.pipeline.snapshot_exec import (
    check_root, make_folder, open_reader, read_only_examples, root_errors, stream_rows)
from snapcache.store import layout
from snapcache.store.fs import Storage
from snapcache.store.manifest import DELTA_FORMAT_VERSION, Manifest
from snapcache.store.protocol import WriteLease, commit_fields, versions
from snapcache.store.protocol.negotiate import Poll
from snapcache.store.protocol.versions import SegmentRecord as Segment
from snapcache.store.schema import Schema, merge_schemas

log = logging.getLogger("snapcache")


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
        return read_only_examples(ops.run(op.parent, epoch,
                                          streams.StreamSpec(spec.index, spec.count)))
    return stream_rows(open_reader(storage, manifest, options), op, spec)  # held while op can read


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
                    segment = run_task(op, epoch, storage, units, task, run_id=run_id,
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
