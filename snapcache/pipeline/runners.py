"""The fast ways of reading a committed snapshot, and the progress of a writing epoch.

Each op module registers its runner (see :mod:`snapcache.pipeline.ops`); this module registers,
in place of the example-by-example ``batch`` and ``shuffle`` runners, ones that read a
committed snapshot directly below them as whole Arrow columns (see
:mod:`snapcache.store.batched_read`) and fall back to the generic runners otherwise.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from snapcache.pipeline import ops, plan, snapshot_exec, streams
from snapcache.pipeline.ops import batch as batch_op, shuffle as shuffle_op
from snapcache.runtime.progress import DefaultDisplay, track
from snapcache.runtime.shuffle import epoch_rng
from snapcache.store import batched_read, layout
from snapcache.store.fs import Storage
from snapcache.store.reader import SnapshotReader, load_manifest


def _open_committed(op: ops.SnapshotOp) -> SnapshotReader | None:
    """A reader of ``op``'s snapshot if it is committed and this iterator reads all of it."""
    if not streams.current().trivial:
        return None  # a stream's share of a snapshot: the example-by-example path handles it
    storage = Storage(op.path, op.options.storage_options).child(plan.snapshot_tree(op).digest)
    manifest = load_manifest(storage)
    if manifest is None:
        return None
    return snapshot_exec.open_reader(storage, manifest, op.options)


def _fast_columns(snapshot: ops.SnapshotOp, shuffle: ops.ShuffleOp | None, epoch: int
                  ) -> tuple[Iterator[dict], Any] | None:
    """Column chunks of ``snapshot``, shuffled if asked, when it is committed and fixed-shape."""
    reader = _open_committed(snapshot)
    if reader is None or not batched_read.supports_batched(reader.schema):
        return None
    rng = epoch_rng(shuffle.seed, epoch) if shuffle is not None else None
    shards = batched_read.shard_order(reader.manifest.shards, rng)

    def chunks() -> Iterator[dict]:
        with snapshot_exec.read_session(reader, layout.new_run_id(), snapshot.options.coordination.lease_ttl):
            columns = batched_read.column_chunks(reader.record_batches(shards),
                                                 reader._decoder)  # type: ignore[arg-type]
            if shuffle is not None and shuffle.buffer_size > 1:
                columns = batched_read.window_shuffle(columns, shuffle.buffer_size, rng)
            yield from columns

    return chunks(), reader.schema


@ops.runs(ops.BatchOp)
def run_batch(op: ops.BatchOp, epoch: int) -> Iterator[Any]:
    """``snapshot -> [shuffle] -> batch``: batches cut from whole columns; else the generic way."""
    below = ops.snapshot_below(op)
    fast = _fast_columns(*below, epoch) if below is not None else None
    if fast is None:
        return batch_op.run_batch(op, epoch)
    chunks, schema = fast

    def body() -> Iterator[Any]:
        try:
            for columns in batched_read.cut_batches(chunks, op.batch_size, op.drop_remainder):
                yield batched_read.as_structure(columns, schema)
        finally:
            chunks.close()

    return body()


@ops.runs(ops.ShuffleOp)
def run_shuffle(op: ops.ShuffleOp, epoch: int) -> Iterator[Any]:
    """``snapshot -> shuffle``: shard order and window shuffled per epoch; else the generic way."""
    below = ops.snapshot_below(op)
    fast = _fast_columns(below[0], op, epoch) if below is not None and below[1] is None \
        else None
    if fast is None:
        return shuffle_op.run_shuffle(op, epoch)
    chunks, schema = fast

    def body() -> Iterator[Any]:
        try:
            for columns in chunks:
                yield from batched_read.rows_of(columns, schema)
        finally:
            chunks.close()

    return body()


def known_length(op: ops.Op | None) -> int | None:
    """How many items one epoch of the pipeline up to ``op`` yields, when that is knowable
    without running it (for the progress bar's ETA); see :func:`snapcache.pipeline.ops.known_length`."""
    return ops.known_length(op)


def with_progress(op: ops.SnapshotOp, iterate: Callable[..., Iterator[Any]]
                  ) -> Callable[..., Iterator[Any]]:
    """``iterate`` for a snapshot's upstream, reporting progress as it computes (the writing
    epoch: a committed snapshot never runs its upstream)."""
    setting = op.options.progress
    if setting is False:
        return iterate
    label = op.options.name or op.path

    def iterate_tracked(node: ops.Op, epoch: int, *args: Any, **kwargs: Any) -> Iterator[Any]:
        spec = streams.current()
        total = known_length(node)
        if total is not None and not spec.trivial:
            total = len(range(spec.index, total, spec.count)) - spec.skip
        callback = setting if callable(setting) else DefaultDisplay()
        return track(iterate(node, epoch, *args, **kwargs), label, total, callback)

    return iterate_tracked
