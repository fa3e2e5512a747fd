"""Runners for the parallel runtime's ops and for the fast ways of reading a snapshot.

:mod:`snapcache.pipeline.plan` holds the table from op type to runner; this module adds to it
(``RUNNERS``): interleave, shard, repeat, and ``batch``/``shuffle`` runners that read this
stream's share of a committed snapshot directly below them in the epoch's global order
(:mod:`snapcache.store.order`) as whole Arrow columns (see :mod:`snapcache.store.batched_read`)
and fall back to the example-by-example runners otherwise.
"""

from __future__ import annotations

import contextvars
import itertools
import secrets
from typing import Any, Callable, Iterator

from snapcache.options import AUTOTUNE
from snapcache.pipeline import ops, ordered, plan, snapshot_exec, streams
from snapcache.runtime.autotune import available_cpus
from snapcache.runtime.interleave import interleave
from snapcache.runtime.progress import DefaultDisplay, track
from snapcache.runtime.shuffle import epoch_rng
from snapcache.store import batched_read, layout
from snapcache.store.order import EpochOrder
from snapcache.store.ordered_read import layout_of, ordered_pieces

REPEAT_EPOCH_STRIDE = 1 << 40
"""Repetition ``r > 0`` of epoch ``e`` runs the upstream as epoch ``e + r * stride``, so seeded
shuffles above a ``repeat`` draw a new order each repetition, reproducibly."""


def _fast_columns(snapshot: ops.SnapshotOp, shuffle: ops.ShuffleOp | None, epoch: int,
                  unit: int = 1) -> tuple[Iterator[dict], Any] | None:
    """This stream's share of ``snapshot`` in the epoch's global order, as column chunks, when
    it is committed and fixed-shape (see :mod:`snapcache.pipeline.ordered`)."""
    reader = ordered.committed_reader(snapshot)
    if reader is None or not batched_read.supports_batched(reader.schema):
        return None
    spec = streams.current()
    window = shuffle.buffer_size if shuffle is not None else 1
    seed = shuffle.seed if shuffle is not None else None
    local = shuffle is not None and seed is None and spec.count > 1
    if shuffle is not None and seed is None and not local:
        seed = secrets.randbits(63)
    order = EpochOrder(layout_of(reader.manifest), None if local else seed, epoch, window)
    share = ordered.read_share(reader.manifest, spec, shuffled=seed is not None, window=window,
                               unit=unit)

    def chunks() -> Iterator[dict]:
        with snapshot_exec.read_session(reader, layout.new_run_id(), snapshot.options.lease_ttl):
            pieces = ordered_pieces(reader, order, share.pieces(), mode="columns",
                                    piece=max(1024, unit))
            try:
                columns = (c for _, _, c in pieces)
                if local:  # unseeded, several streams: each shuffles its own share
                    columns = batched_read.window_shuffle(columns, window, epoch_rng(None, epoch))
                yield from columns
            finally:
                pieces.close()

    return chunks(), reader.schema


def _snapshot_below(op: ops.Op) -> tuple[ops.SnapshotOp, ops.ShuffleOp | None] | None:
    parent = op.parent
    shuffle = None
    if isinstance(parent, ops.ShuffleOp):
        shuffle, parent = parent, parent.parent
    if isinstance(parent, ops.SnapshotOp):
        return parent, shuffle
    return None


def run_batch(op: ops.BatchOp, epoch: int) -> Iterator[Any]:
    """``snapshot -> [shuffle] -> batch``: batches cut from whole columns; else the generic way."""
    below = _snapshot_below(op)
    fast = _fast_columns(*below, epoch, unit=op.batch_size) if below is not None else None
    if fast is None:
        return plan._run_batch(op, epoch)
    chunks, schema = fast

    def body() -> Iterator[Any]:
        try:
            for columns in batched_read.cut_batches(chunks, op.batch_size, op.drop_remainder):
                yield batched_read.as_structure(columns, schema)
        finally:
            chunks.close()

    return body()


def run_shuffle(op: ops.ShuffleOp, epoch: int) -> Iterator[Any]:
    """``snapshot -> shuffle``: the snapshot in the epoch's global order; else the generic way."""
    fast = _fast_columns(op.parent, op, epoch) if isinstance(op.parent, ops.SnapshotOp) \
        else None
    if fast is None:
        return plan._run_shuffle(op, epoch)
    chunks, schema = fast

    def body() -> Iterator[Any]:
        try:
            for columns in chunks:
                yield from batched_read.rows_of(columns, schema)
        finally:
            chunks.close()

    return body()


def run_interleave(op: ops.InterleaveOp, epoch: int) -> Iterator[Any]:
    source = plan._upstream(op, epoch)
    cycle = available_cpus() if op.cycle_length == AUTOTUNE else op.cycle_length
    if op.num_parallel_calls == AUTOTUNE:
        parallelism = 2 * cycle  # the open sources plus as many opened ahead
    else:
        parallelism = op.num_parallel_calls or 1
    return plan._closing(source, interleave(
        _as_iterable(op.fn, epoch), source, cycle_length=cycle, block_length=op.block_length,
        parallelism=parallelism, deterministic=op.deterministic, label=op.describe()))


def _as_iterable(fn: Callable[[Any], Any], epoch: int) -> Callable[[Any], Any]:
    """Let interleave's function return a Dataset (iterated as this epoch) or any iterable."""

    def opened(element: Any) -> Any:
        result = fn(element)
        iterate = getattr(result, "iterate", None)
        return iterate(epoch) if callable(iterate) else result

    return opened


def run_shard(op: ops.ShardOp, epoch: int) -> Iterator[Any]:
    source = plan._upstream(op, epoch)
    return plan._closing(source, itertools.islice(source, op.index, None, op.num_shards))


def run_repeat(op: ops.RepeatOp, epoch: int) -> Iterator[Any]:
    # Upstream iterators are built lazily, one a repetition: in the context (stream, stats)
    # this one was built in.
    context = contextvars.copy_context()

    def body() -> Iterator[Any]:
        counter = itertools.count() if op.count is None else range(op.count)
        for r in counter:
            source = context.run(plan._upstream, op, epoch + r * REPEAT_EPOCH_STRIDE)
            empty = True
            try:
                for item in source:
                    empty = False
                    yield item
            finally:
                close = getattr(source, "close", None)
                if close is not None:
                    close()
            if empty and op.count is None:
                return  # repeating an empty dataset forever would hang

    return body()


def known_length(op: ops.Op | None) -> int | None:
    """How many items one epoch of the pipeline up to ``op`` yields, when that is knowable
    without running it (for the progress bar's ETA)."""
    if op is None:
        return None
    if isinstance(op, ops.RangeSource):
        return len(range(op.start, op.stop, op.step))
    if isinstance(op, ops.IterableSource):
        return len(op.items) if hasattr(op.items, "__len__") else None
    if isinstance(op, ops.FilesSource):
        return len(op.urls)
    if isinstance(op, (ops.MapOp, ops.PrefetchOp, ops.CacheOp, ops.SnapshotOp, ops.ShuffleOp)):
        return known_length(op.parent)
    n = known_length(op.parent)
    if n is None:
        return None
    if isinstance(op, ops.BatchOp):
        return n // op.batch_size if op.drop_remainder else -(-n // op.batch_size)
    if isinstance(op, ops.TakeOp):
        return min(n, op.count)
    if isinstance(op, ops.ShardOp):
        return max(0, -(-(n - op.index) // op.num_shards))
    if isinstance(op, ops.RepeatOp) and op.count is not None:
        return n * op.count
    return None


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


RUNNERS: dict[type, Callable[[Any, int], Iterator[Any]]] = {
    ops.InterleaveOp: run_interleave,
    ops.ShardOp: run_shard,
    ops.RepeatOp: run_repeat,
    ops.BatchOp: run_batch,
    ops.ShuffleOp: run_shuffle,
    ordered.TaggedBatch: ordered.run_tagged_batch,
}
