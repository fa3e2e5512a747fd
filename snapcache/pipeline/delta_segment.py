"""One task of a delta build: its segment written, fenced by the stream's write lease.

A task of new or changed units runs the upstream on those units only; its examples go to the
task's own shards, then its segment record (``segment-<run>-<seq>.json``). When a run that was
interrupted left progress records for the same units (they carry :func:`task_digest`, the
digest of the units' keys) and each unit's rows are known without running the ops
(:func:`unit_rows_of`), that run's shards ending on a unit's last row are kept and only the
units after them are computed. A task of a base segment that lost units copies the rows of the
units it keeps from that segment's shards (read back, checksums verified, written again).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Iterator, Sequence

import xxhash

from snapcache.pipeline import interrupt, ops, streams
from snapcache.pipeline.delta_plan import SourceUnits, Task, Work
from snapcache.store.fs import Storage
from snapcache.store.manifest import Manifest
from snapcache.store.protocol import (
    StreamRecord, WriteLease, missing_shards, versions, write_progress)
from snapcache.store.protocol.versions import SegmentRecord as Segment
from snapcache.store.reader import SnapshotReader
from snapcache.store.writer import SnapshotWriter

log = logging.getLogger("snapcache")


def run_task(op: ops.SnapshotOp, epoch: int, storage: Storage, units: SourceUnits,
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
    chosen = [units.identities[i] for i in chunk]
    members = tuple((units.keys[i], units.identities[i]) for i in chunk)
    unit_rows = unit_rows_of(op.parent, source, chosen)
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
    upstream = _run_part(op, source, chosen[start:], epoch) if start < len(chosen) else iter(())
    with interrupt.keeps_written(writer, upstream):  # (for the next run: see _resumable)
        for example in upstream:
            writer.write(example)
        record = writer.finish()
    if unit_rows is not None and sum(unit_rows) != record.rows:
        unit_rows = None  # the ops' length rules disagree with what was written
    segment = Segment(members, record.shards, record.schema, unit_rows)
    versions.write_segment(storage, record, segment, seq=seq)
    return segment


def _run_part(op: ops.SnapshotOp, source: ops.Op, units: Sequence[dict], epoch: int
              ) -> Iterator[Any]:
    """The upstream run on ``units`` (files, or Parquet row groups) only, as one stream; an
    error in it says which part of the epoch its example number counts in
    (:func:`streams.part`)."""
    first = units[0]
    if first.get("row_group") is None:
        kind, where = "files", first["path"]
    else:
        kind, where = "row groups", f"{first['path']} row group {first['row_group']}"
    token = streams.set_part(f"a delta segment (computed from its {len(units)} {kind} from "
                             f"{where} on)")
    try:
        return ops.run(ops.rebase(op.parent, source.with_units(units)), epoch,
                       streams.StreamSpec())
    finally:
        streams.reset_part(token)


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
