"""The ops after a snapshot's read, over (position, value) pairs, for :mod:`.ordered`.

Every item of an ordered epoch carries its position in the stream's share, so that the
iterator knows how much of its share was consumed. :func:`items` reads the share and runs the
pipeline's ops after the snapshot over those pairs: the map and filter ops rebuilt to see only
the value (:class:`TaggedMap`, :class:`TaggedFilter`, still named after the user's function),
the batch to carry its last position (:class:`TaggedBatch`). Without a user function the rows
are cut from whole columns instead (:func:`_columnar`): batches, or runs of rows handed out one
by one.

An exception of a user function is noted with the example it was raised on, named by the
position its item carries (:class:`Positions`): the same number in the epoch whichever stream
read it, not the item's index in this stream's share.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Sequence

from snapcache.pipeline import ops, streams
from snapcache.pipeline.shares import piece_rows
from snapcache.runtime import stats
from snapcache.runtime.batch import pad_stacked, stack
from snapcache.runtime.errors import mark_position
from snapcache.runtime.shuffle import buffer_shuffle, epoch_rng
from snapcache.store import batched_read
from snapcache.store.order import EpochOrder, Share
from snapcache.store.ordered_read import ordered_pieces
from snapcache.store.reader import SnapshotReader

if TYPE_CHECKING:
    from snapcache.pipeline.ordered import Shape


def depth(op: ops.Op) -> int:
    """The stage of ``op`` (its ops below it) in ``Dataset.stats()``."""
    return len(ops.lineage(op)) - 1


def items(shape: "Shape", reader: SnapshotReader, order: EpochOrder, share: Share, skip: int,
           epoch: int, local_shuffle: bool, built: bool
           ) -> tuple[Iterator[tuple[int, Any]], bool]:
    """(position after the item in the share, item) pairs, or (position after the run, rows)
    pairs when the second value is True (see :class:`~snapcache.pipeline.ordered.OrderedIterator`).

    Each of the pipeline's stages is counted for ``Dataset.stats()`` where its work is done:
    the ops after the snapshot run over (position, value) pairs as the stages they stand for;
    the read is the snapshot's stage, unless this epoch ``built`` the snapshot (then its
    stage counted the examples as it wrote them, once)."""
    columnar = shape.columnar and batched_read.supports_batched(reader.schema,
                                                                ragged=_pads_columns(shape))
    pieces = ordered_pieces(reader, order, share.pieces(skip), mode="columns" if columnar
                            else "rows", piece=piece_rows(share.unit))
    positions = Positions(order, share, local_shuffle)
    if columnar:
        return _columnar_counted(shape, reader, pieces, skip, epoch, local_shuffle, built,
                                 positions)
    tagged = _tag(pieces, skip)
    if local_shuffle:
        tagged = buffer_shuffle(tagged, shape.window, epoch_rng(None, epoch))
    return run_tagged(shape.stages[1:], tagged, shape.snapshot, epoch, counted=not built,
                       positions=positions), False


def _pads_columns(shape: "Shape") -> bool:
    """Whether the batch that whole columns are cut into (:func:`_columnar`) is a
    ``padded_batch``, which stacks the rows of columns whose arrays differ in shape."""
    if any(isinstance(n, ops.BatchOp) for n in shape.below):
        return False
    batch = next((n for n in shape.above if isinstance(n, ops.BatchOp)), None)
    return batch is not None and batch.padding is not None


def run_tagged(nodes: Sequence[ops.Op], items: Iterator[tuple[int, Any]], below: ops.Op,
                epoch: int, *, counted: bool, positions: "Positions") -> Iterator[tuple[int, Any]]:
    """``nodes`` (the pipeline's ops right after ``below``) run over the (position, value)
    pairs ``items``, each counted for ``Dataset.stats()`` as its own stage; ``items`` are
    counted as ``below``'s stage when ``counted`` (else they were counted already). Errors
    name their example by ``positions``."""
    from snapcache.pipeline import plan

    top: ops.Op = ops.IterableSource(parent=None, items=_Once(items))
    for node in nodes:
        top = _tagged_op(node, top, positions)
        if node.traits.batch_dims:  # the items after it are batches
            positions = dataclasses.replace(positions, batched=True)
    recorder = stats.current.get()
    token = stats.current.set(recorder.standing_in(
        depth(below), skip=() if counted else {0}, payload=_value)) \
        if isinstance(recorder, stats.Recorder) else None
    try:
        return plan.iterate(top, epoch, streams.StreamSpec())
    finally:
        if token is not None:
            stats.current.reset(token)


def _value(item: tuple[int, Any]) -> Any:
    return item[1]


def _rows(columns: dict) -> int:
    return len(next(iter(columns.values())))


def _tag(pieces: Iterator[tuple[int, int, list]], skip: int) -> Iterator[tuple[int, Any]]:
    position = skip
    for a, b, rows in pieces:
        for row in rows:
            position += 1
            yield position, row


RUN = 1024
"""Rows a run holds at most (see :class:`~snapcache.pipeline.ordered.OrderedIterator`): made
together, handed out one by one."""


def _columnar_counted(shape: "Shape", reader: SnapshotReader, pieces, skip: int, epoch: int,
                      local_shuffle: bool, built: bool, positions: "Positions"
                      ) -> tuple[Iterator[tuple[int, Any]], bool]:
    """:func:`_columnar`'s items and whether they are runs, each stage counted: those up to
    the first batch by the rows of the column chunks, the batch by batch (the snapshot's stage
    not when this epoch ``built`` it). Every op after the first batch that changes the items
    (a second batch) runs over its (position, batch) pairs, as on the row path; the ops that
    change nothing right after the first batch (prefetch: the read prefetches already) are
    only counted."""
    batch = next((n for n in shape.above if isinstance(n, ops.BatchOp)), None)
    chunks: Iterator[dict] = (columns for _, _, columns in pieces)
    if local_shuffle:
        chunks = batched_read.window_shuffle(chunks, shape.window, epoch_rng(None, 0))
    stages = shape.stages[1:] if built else shape.stages
    cut = stages.index(batch) if batch is not None else len(stages)
    for node in stages[:cut]:
        chunks = ops.counted(node, chunks, size=_rows)
    items = _columnar(reader.schema, pieces, chunks, skip, batch)
    if batch is None:
        return items, True
    after = shape.stages[shape.stages.index(batch) + 1:]
    run = next((i for i, node in enumerate(after) if node.content), len(after))
    for node in (batch,) + after[:run]:
        items = ops.counted(node, items, payload=_value)
    if run < len(after):
        # the batches carry the count of rows before them; with each stream's share shuffled
        # on its own (local_shuffle) that is no row's position
        positions = dataclasses.replace(positions, batched=True, known=not local_shuffle)
        items = run_tagged(after[run:], items, after[run - 1] if run else batch, epoch,
                            counted=False, positions=positions)
    return items, False


def _columnar(schema: Any, pieces, chunks: Iterator[dict], skip: int,
              batch: ops.BatchOp | None) -> Iterator[tuple[int, Any]]:
    """Batches cut from whole columns, ``(position after it, batch)``; without a batch op the
    rows in runs of at most :data:`RUN`, ``(position after the run, rows)``."""
    position = skip
    try:
        if batch is None:
            for columns in chunks:
                n = _rows(columns)
                for start in range(0, n, RUN):
                    part = columns if n <= RUN else \
                        {name: column[start:start + RUN] for name, column in columns.items()}
                    run = batched_read.row_list(part, schema)
                    position += len(run)
                    yield position, run
            return
        for columns in batched_read.cut_batches(chunks, batch.batch_size, batch.drop_remainder):
            position += _rows(columns)
            value = batched_read.as_structure(columns, schema)
            yield position, value if batch.padding is None else pad_stacked(value, batch.padding)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
        pieces.close()


class _Once:
    """An iterator that a one-off source op can iterate (once)."""

    def __init__(self, iterator: Iterator[Any]):
        self._iterator = iterator

    def __iter__(self) -> Iterator[Any]:
        return self._iterator


def _map_value(fn: Callable[[Any], Any], item: tuple[int, Any]) -> tuple[int, Any]:
    try:  # free unless it raises (Python 3.11+)
        return item[0], fn(item[1])
    except Exception as error:
        mark_position(error, item[0])  # which example: Positions reads it
        raise


def _keep_value(predicate: Callable[[Any], bool], item: tuple[int, Any]) -> bool:
    try:
        return predicate(item[1])
    except Exception as error:
        mark_position(error, item[0])
        raise


@dataclasses.dataclass(frozen=True)
class Positions:
    """The words an error note names its example by (a ``Locate`` of
    :mod:`snapcache.runtime.errors`), from the position the failing item carried: the position
    after it in this stream's ``share``, which is here turned into its position in the epoch's
    ``order`` and the snapshot row there. ``batched``: the items are batches (the position is
    that of their last example); ``known=False``: the positions name no row (batches cut from
    a share each stream shuffled on its own), so the item's index in the share is said.
    Computed only when an exception is."""

    order: EpochOrder | None  # None: known=False
    share: Share
    local_shuffle: bool
    batched: bool = False
    known: bool = True

    def __call__(self, index: int, position: int | None) -> str:
        if position is None or not self.known:  # None: not carried back by a worker process
            item = "batch" if self.batched else "example"
            if self.share.streams == 1:
                return f"{item} #{index} of this epoch"
            return (f"{item} #{index} of this stream's share (stream {self.share.index} of "
                    f"{self.share.streams})")
        at = self._epoch_position(position - 1)
        row = int(self.order.rows(at, at + 1)[0])
        if self.local_shuffle:  # each stream shuffled its share: no position in the epoch
            what = "the batch whose last example is" if self.batched else "the example"
            return f"{what} at row {row} of the snapshot"
        what = "the batch whose last example is" if self.batched else "example"
        return f"{what} #{at} of this epoch" + (f" (row {row} of the snapshot)"
                                                 if row != at else "")

    def _epoch_position(self, offset: int) -> int:
        """The epoch position at ``offset`` of this stream's share."""
        for a, b in self.share.pieces():
            if offset < b - a:
                return a + offset
            offset -= b - a
        raise IndexError(f"offset {offset} past the end of the share")


def _tagged_op(node: ops.Op, parent: ops.Op, positions: Positions) -> ops.Op:
    """``node`` rebuilt over ``parent`` so that it passes (position, value) pairs; a map or
    filter still names the user's function in errors (its ``describe()`` is ``node``'s), and
    the example by ``positions``."""
    if isinstance(node, ops.MapOp):
        return _rebuilt(TaggedMap, node, parent, fn=functools.partial(_map_value, node.fn),
                        label=node.describe(), positions=positions)
    if isinstance(node, ops.FilterOp):
        return _rebuilt(TaggedFilter, node, parent,
                        predicate=functools.partial(_keep_value, node.predicate),
                        label=node.describe(), positions=positions)
    if isinstance(node, ops.BatchOp):
        return _rebuilt(TaggedBatch, node, parent)
    if isinstance(node, ops.ShuffleOp):
        return _rebuilt(TaggedShuffle, node, parent)
    return dataclasses.replace(node, parent=parent)


def _rebuilt(cls: type, node: ops.Op, parent: ops.Op, **changes: Any) -> ops.Op:
    """An op of ``cls`` (a subclass of ``node``'s class) with ``node``'s fields, over
    ``parent``, with ``changes``."""
    fields = {f.name: getattr(node, f.name) for f in dataclasses.fields(node) if f.init}
    return cls(**{**fields, "parent": parent, **changes})


@dataclasses.dataclass(frozen=True, eq=False)
class _Labelled:
    """A user's map or filter rebuilt over (position, value) pairs, labelled as the user's op
    (``label``: its ``describe()``) wherever a label is shown (errors, progress), and locating
    a failing example by its position (``positions``)."""

    label: str = ""
    positions: Any = None  # Positions

    def describe(self) -> str:
        return self.label

    def locate(self) -> Any:
        return self.positions


@dataclasses.dataclass(frozen=True, eq=False)
class TaggedMap(_Labelled, ops.MapOp):
    """``map`` over (position, value) pairs: ``fn`` maps the value."""

    not_fingerprinted: ClassVar = ops.MapOp.not_fingerprinted + ("label", "positions")


@dataclasses.dataclass(frozen=True, eq=False)
class TaggedFilter(_Labelled, ops.FilterOp):
    """``filter`` over (position, value) pairs: ``predicate`` tests the value."""

    not_fingerprinted: ClassVar = ops.FilterOp.not_fingerprinted + ("label", "positions")


ops.runs(TaggedMap)(ops.RUNNERS[ops.MapOp])
ops.runs(TaggedFilter)(ops.RUNNERS[ops.FilterOp])


@dataclasses.dataclass(frozen=True, eq=False)
class TaggedBatch(ops.BatchOp):
    """``batch`` over (position, value) pairs: each batch carries its last position."""


@ops.runs(TaggedBatch)
def run_tagged_batch(op: TaggedBatch, epoch: int) -> Iterator[Any]:
    source = ops.upstream(op, epoch)

    def body() -> Iterator[tuple[int, Any]]:
        chunk: list[tuple[int, Any]] = []
        for item in source:
            chunk.append(item)
            if len(chunk) == op.batch_size:
                yield chunk[-1][0], stack([v for _, v in chunk], op.padding)
                chunk = []
        if chunk and not op.drop_remainder:
            yield chunk[-1][0], stack([v for _, v in chunk], op.padding)

    return ops.closing(source, body())


@dataclasses.dataclass(frozen=True, eq=False)
class TaggedShuffle(ops.ShuffleOp):
    """The shuffle's place among the ops over (position, value) pairs: the read already put
    them in the epoch's order, so they pass through unchanged (counted as the shuffle's
    stage by ``Dataset.stats()``)."""


@ops.runs(TaggedShuffle)
def run_tagged_shuffle(op: TaggedShuffle, epoch: int) -> Iterator[Any]:
    return ops.upstream(op, epoch)
