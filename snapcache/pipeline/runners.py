"""The fast ways of reading a committed snapshot.

Each op module registers its runner (see :mod:`snapcache.pipeline.ops`); this module registers,
in place of the example-by-example ``batch`` and ``shuffle`` runners, ones that read this
stream's share of a committed snapshot directly below them in the epoch's global order
(:mod:`snapcache.store.order`) as whole Arrow columns (see :mod:`snapcache.store.batched_read`)
and fall back to the generic runners otherwise.
"""

from __future__ import annotations

import secrets
from typing import Any, Iterator

from snapcache.pipeline import ops, snapshot_exec, streams
from snapcache.pipeline.completion import committed_reader
from snapcache.pipeline.shares import piece_rows, read_share
from snapcache.pipeline.ops import batch as batch_op, shuffle as shuffle_op
from snapcache.runtime.batch import pad_stacked
from snapcache.runtime.shuffle import epoch_rng
from snapcache.store import batched_read
from snapcache.store.order import EpochOrder
from snapcache.store.ordered_read import layout_of, ordered_pieces


def _fast_columns(snapshot: ops.SnapshotOp, shuffle: ops.ShuffleOp | None, epoch: int,
                  unit: int = 1, ragged: bool = False) -> tuple[Iterator[dict], Any] | None:
    """This stream's share of ``snapshot`` in the epoch's global order, as column chunks, when
    it is committed and fixed-shape, or ``ragged`` allowed (a ``padded_batch`` stacks them;
    see :mod:`snapcache.pipeline.ordered`)."""
    reader = committed_reader(snapshot)
    if reader is None or not batched_read.supports_batched(reader.schema, ragged=ragged):
        return None
    spec = streams.current()
    window = shuffle.buffer_size if shuffle is not None else 1
    seed = shuffle.seed if shuffle is not None else None
    local = shuffle is not None and seed is None and spec.count > 1
    if shuffle is not None and seed is None and not local:
        seed = secrets.randbits(63)
    order = EpochOrder(layout_of(reader.manifest), None if local else seed, epoch, window)
    share = read_share(reader.manifest, spec, shuffled=seed is not None, window=window,
                               unit=unit)

    def chunks() -> Iterator[dict]:
        with snapshot_exec.read_session(reader, snapshot, order, share):
            pieces = ordered_pieces(reader, order, share.pieces(), mode="columns",
                                    piece=piece_rows(share.unit))
            try:
                columns = (c for _, _, c in pieces)
                if local:  # unseeded, several streams: each shuffles its own share
                    columns = batched_read.window_shuffle(columns, window, epoch_rng(None, epoch))
                yield from columns
            finally:
                pieces.close()

    # The snapshot's stage and the shuffle's: this read does their work.
    counted = ops.counted(snapshot, chunks(), size=_rows)
    if shuffle is not None:
        counted = ops.counted(shuffle, counted, size=_rows)
    return counted, reader.schema


def _rows(columns: dict) -> int:
    return len(next(iter(columns.values())))


@ops.runs(ops.BatchOp)
def run_batch(op: ops.BatchOp, epoch: int) -> Iterator[Any]:
    """``snapshot -> [shuffle] -> batch``: batches cut from whole columns; else the generic way."""
    below = ops.snapshot_below(op)
    fast = _fast_columns(*below, epoch, unit=op.batch_size, ragged=op.padding is not None) \
        if below is not None else None
    if fast is None:
        return batch_op.run_batch(op, epoch)
    chunks, schema = fast

    def body() -> Iterator[Any]:
        try:
            for columns in batched_read.cut_batches(chunks, op.batch_size, op.drop_remainder):
                batch = batched_read.as_structure(columns, schema)
                yield batch if op.padding is None else pad_stacked(batch, op.padding)
        finally:
            chunks.close()

    return body()


@ops.runs(ops.ShuffleOp)
def run_shuffle(op: ops.ShuffleOp, epoch: int) -> Iterator[Any]:
    """``snapshot -> shuffle``: the snapshot in the epoch's global order; else the generic way."""
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
