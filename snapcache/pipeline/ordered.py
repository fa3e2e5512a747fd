"""Epochs over a committed snapshot in the snapshot's global order, with a state to resume.

A pipeline of the shape ``snapshot -> [map | filter | prefetch]* -> [shuffle] ->
[map | filter | batch | prefetch]*`` is run here instead of op by op: the snapshot is read in
epoch ``e``'s global order (:mod:`snapcache.store.order`; a seeded shuffle's ``(seed, e)``
and ``buffer_size`` define it, the rows in order without a shuffle), each stream reads its
share, and the element-wise ops below the shuffle run after the read (the same examples; the
order is the defined one). Every example carries its position in the stream's share through
the ops, so the iterator knows exactly how much of its share was consumed:
:meth:`OrderedIterator.state_dict` is a few numbers, and ``Dataset.iterate(state=...)``
starts at the next position without reading or computing anything before it.

With a seeded shuffle the writing epoch first completes the snapshot (every stream writes its
share without yielding, then waits for the commit) and then reads it like any later epoch, so
the order is the same whether the run wrote the snapshot or read it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import itertools
import secrets
import time
from typing import Any, Callable, Iterator, Sequence

from snapcache.pipeline import ops, streams, tagged
from snapcache.pipeline.completion import build_then_open, committed_reader
from snapcache.pipeline.shares import (
    first_needs, own_position, read_share, resumed_share, share_of_state)
from snapcache.runtime import stats
from snapcache.store.manifest import Manifest
from snapcache.store.order import EpochOrder, Share, ranges_length
from snapcache.store.ordered_read import layout_id, layout_of
from snapcache.store.reader import SnapshotReader

STATE_FORMAT = "snapcache-iterator"
STATE_VERSION = 1
"""Fields added to version 1 since (``layout``, see :func:`_check_layout`) are optional: a
state without them is read as before, so states saved by earlier releases still resume."""



def _element_wise(node: ops.Op) -> bool:
    """Runs the same after the read as before it: element-wise and keeps no copy."""
    t = node.traits
    return t.element_wise and not t.keeps_copy and not t.source


@dataclasses.dataclass(frozen=True)
class Shape:
    """A pipeline this module runs: its snapshot, the element-wise ops before the shuffle,
    the shuffle (if any) and the ops after it, each list from the bottom up."""

    snapshot: ops.SnapshotOp
    below: tuple[ops.Op, ...]
    shuffle: ops.ShuffleOp | None
    above: tuple[ops.Op, ...]

    @property
    def stages(self) -> tuple[ops.Op, ...]:
        """The pipeline's ops from the snapshot down, in order."""
        shuffle = (self.shuffle,) if self.shuffle is not None else ()
        return (self.snapshot,) + self.below + shuffle + self.above

    @property
    def columnar(self) -> bool:
        """No user function runs: batches can be cut from whole columns."""
        return all(o.function is None for o in self.below + self.above)

    @property
    def unit(self) -> int:
        """Positions one item takes, as far as items map to positions (no filter before a
        batch): the product of the batch sizes (``batch(4).batch(3)``: 12; up to the filter
        in ``batch(4).filter(f).batch(3)``: 4; 1 without a batch). Shares are cut in whole
        units, so that only the last stream's last item is short, as in one process."""
        size = 1
        for node in self.below + self.above:
            if isinstance(node, ops.BatchOp):
                size *= node.batch_size
            elif not node.traits.one_to_one:  # a filter: items no longer map to positions
                break
        return size

    @property
    def earlier_unit(self) -> int:
        """The unit of the states earlier releases saved: the first batch's size alone (no
        filter before it). A reading state of a batch of batches saved so resumes: its share
        and positions are its own (a writing state's positions were miscounted: refused)."""
        for node in self.below + self.above:
            if isinstance(node, ops.BatchOp):
                return node.batch_size
            if not node.traits.one_to_one:
                return 1
        return 1

    @property
    def least_yielding(self) -> int:
        """The fewest positions left at the end of a share that still yield an item: fewer
        are all dropped (``batch(..., drop_remainder=True)``). 1 when items do not map to
        positions (a filter)."""
        if not self.rows_per_item_fixed:
            return 1
        need = 1  # items the op after the one considered must get
        for node in reversed(self.below + self.above):
            if isinstance(node, ops.BatchOp):
                size = node.batch_size
                need = need * size if node.drop_remainder else (need - 1) * size + 1
        return need

    @property
    def window(self) -> int:
        return self.shuffle.buffer_size if self.shuffle is not None else 1

    @property
    def rows_per_item_fixed(self) -> bool:
        """Does an item always take the same number of the snapshot's rows (no filter between
        them)? Then streams that took as many items have read as many rows (lockstep)."""
        return all(node.traits.one_to_one or isinstance(node, ops.BatchOp)
                   for node in self.below + self.above)


def match(op: ops.Op) -> Shape | None:
    """The shape of ``op``'s pipeline if this module can run it, else None."""
    chain = []
    node: ops.Op | None = op
    while node is not None and not isinstance(node, ops.SnapshotOp):
        chain.append(node)
        node = node.parent
    if node is None:
        return None
    chain.reverse()
    shuffles = [i for i, n in enumerate(chain) if isinstance(n, ops.ShuffleOp)]
    if len(shuffles) > 1:
        return None
    cut = shuffles[0] if shuffles else len(chain)
    below, above = chain[:cut], chain[cut + 1:] if shuffles else []
    if not shuffles:  # no shuffle: everything counts as "above"
        below, above = [], chain
    if not all(_element_wise(n) for n in below) or \
            not all(_element_wise(n) or isinstance(n, ops.BatchOp) for n in above):
        return None
    return Shape(node, tuple(below), chain[cut] if shuffles else None, tuple(above))


# -- the iterator ----------------------------------------------------------------------------
class OrderedIterator:
    """One stream's share of one epoch, in the global order; :meth:`state_dict` says where it
    is. Made by ``Dataset.iterate`` for pipelines of the shape :func:`match` accepts.

    ``items`` yields ``(position after the item, item)`` pairs, or with ``runs`` the rows of
    the share in runs, ``(position after the run, list of rows)`` (non-empty lists): the rows
    are then handed out from the run's list iterator, which
    :class:`~snapcache.pipeline.iterator.DatasetIterator` takes from :meth:`current_run` and
    hands out from directly; what is left of it says how much of the run was consumed."""

    def __init__(self, items: Iterator[tuple[int, Any]], state: dict, resumable: str | None,
                 on_close: Callable[[], None], *, runs: bool = False, least_yielding: int = 1):
        self._items = items
        self._state = state
        self._consumed = state["consumed"]
        # positions of the share (None while the snapshot is written: known at its commit),
        # and the fewest at its end that yield an item (Shape.least_yielding)
        self._count = None if state.get("writing") else share_of_state(state).count()
        self._least = least_yielding
        self._why_not = resumable
        self._on_close = on_close
        self._runs = runs
        self._rows: Iterator[Any] = iter(())  # the current run's rows not handed out yet

    def __iter__(self) -> "OrderedIterator":
        return self

    def __next__(self) -> Any:
        try:
            if self._runs:
                for row in self._rows:
                    return row
                self._consumed, rows = next(self._items)  # position after the run
                self._rows = iter(rows)
                return next(self._rows)
            position, value = next(self._items)
        except StopIteration:
            if self._count is not None:  # positions not handed out were dropped or filtered
                self._consumed = max(self._consumed, self._count)
            raise
        self._consumed = max(self._consumed, position)
        return value

    def current_run(self) -> Iterator[Any] | None:
        """The rest of the current run (shared: what is taken from it counts as consumed);
        None if the items do not come in runs."""
        return self._rows if self._runs else None

    @property
    def consumed(self) -> int:
        """Positions of the share consumed so far (those of the state it started from
        included). Positions at the share's end that will be dropped count as consumed, once
        the iteration reached them or nothing else is left: a resume on another number of
        streams must not share them out again."""
        consumed = self._consumed
        if self._runs:
            consumed -= self._rows.__length_hint__()  # type: ignore[attr-defined]
        if self._count is not None and self._count - consumed < self._least:
            return self._count
        return consumed

    def state_dict(self) -> dict:
        """Where this iterator is: JSON-serialisable, a few numbers; pass it to
        ``Dataset.iterate(state=...)`` to continue at the next example."""
        if self._why_not is not None:
            raise ValueError(f"this iteration cannot be resumed exactly: {self._why_not}")
        return {**self._state, "consumed": self.consumed}

    def close(self) -> None:
        self._rows = iter(())
        close = getattr(self._items, "close", None)
        if close is not None:
            close()
        self._on_close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def check_state(state: Any) -> dict:
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"not an iterator state (a dict from state_dict() with format "
                         f"{STATE_FORMAT!r}); got {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"iterator state version {state.get('version')!r} is not readable by "
                         f"this snapcache (reads {STATE_VERSION})")
    return state


def shards_in_read_order(op: ops.Op, reader: SnapshotReader, epoch: int,
                         specs: Sequence[streams.StreamSpec], balance: str | None = None
                         ) -> list[int]:
    """The shards of ``reader``'s snapshot in the order streams ``specs``, reading a fresh epoch
    of ``op`` together, first need them (:func:`snapcache.pipeline.shares.first_needs`): the
    order to fetch them in for those streams. The manifest's order where the order is not
    known here (a pipeline this module does not run, an unseeded shuffle of one stream)."""
    shape = match(op)
    seed = shape.shuffle.seed if shape is not None and shape.shuffle is not None else None
    if shape is None or (shape.shuffle is not None and seed is None and len(specs) == 1):
        return list(range(len(reader.manifest.shards)))
    order = EpochOrder(layout_of(reader.manifest), seed, epoch, shape.window)
    return first_needs(order, [read_share(reader.manifest, spec, shuffled=seed is not None,
                                          window=shape.window, unit=shape.unit,
                                          balance=balance) for spec in specs],
                       len(reader.manifest.shards))


def iterate(shape: Shape, epoch: int, spec: streams.StreamSpec | None, *,
            state: dict | None = None, balance: str | None = None) -> "_Deferred | None":
    """Run ``shape`` for one epoch (or the rest of ``state``'s); None when the snapshot is
    not committed and nothing requires the global order or balanced shares (the writing
    epoch then streams)."""
    spec = spec or streams.StreamSpec()
    snapshot, shuffle = shape.snapshot, shape.shuffle
    seed = shuffle.seed if shuffle is not None else None
    if state is not None:
        check_state(state)
        epoch, seed = state["epoch"], state["seed"]
    committed = committed_reader(snapshot)
    if committed is None and balance is None and (shuffle is None or shuffle.seed is None):
        if state is None:
            return None  # the writing epoch streams the examples as they are computed
        if state.get("writing"):  # and so does its rest, still being written
            return _Deferred(lambda: _writing_again(shape, epoch, spec, state))
    # Nothing is built, leased or read before the first example is asked for.
    return _Deferred(lambda: _start(shape, epoch, spec, state, balance, seed, committed))


class _Deferred:
    """An :class:`OrderedIterator` started at the first ``next`` (or ``state_dict``)."""

    def __init__(self, start: Callable[[], OrderedIterator]):
        self._start, self._iterator, self._closed = start, None, False
        self._context = contextvars.copy_context()  # the stats recorder, as when built

    def _get(self) -> OrderedIterator:
        if self._iterator is None:
            self._iterator = self._context.run(self._start)
        return self._iterator

    def __iter__(self) -> "_Deferred":
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        return next(self._get())

    def state_dict(self) -> dict:
        return self._get().state_dict()

    def current_run(self) -> Iterator[Any] | None:
        """The started iterator's :meth:`OrderedIterator.current_run`."""
        return self._iterator.current_run() if self._iterator is not None else None

    def close(self) -> None:
        self._closed = True
        if self._iterator is not None:
            self._iterator.close()


def _start(shape: Shape, epoch: int, spec: streams.StreamSpec, state: dict | None,
           balance: str | None, seed: int | None, reader: SnapshotReader | None
           ) -> OrderedIterator:
    snapshot, shuffle = shape.snapshot, shape.shuffle
    built = reader is None
    if built:
        began = time.perf_counter()
        reader = build_then_open(snapshot, epoch, spec)
        _charge_build(shape, time.perf_counter() - began)
    fingerprint = reader.manifest.snapshot_id
    if state is not None and state.get("writing"):
        return _resume_writing(shape, reader, spec, state, built)
    why_not = None
    local_shuffle = False
    if shuffle is not None and seed is None:
        if spec.count == 1:
            seed = secrets.randbits(63)  # drawn once; recorded in the state
        else:
            local_shuffle = True
            why_not = ("an unseeded shuffle read by several streams is shuffled by each "
                       "stream on its own; give the shuffle a seed")
    for node in shape.below + shape.above:
        if not node.traits.order_preserving:
            why_not = (f"{node.describe()} does not keep the order (deterministic=False): no "
                       "prefix of its outputs is known to be consumed")
    order = EpochOrder(layout_of(reader.manifest), None if local_shuffle else seed, epoch,
                       shape.window)
    total = len(order)
    if state is not None:
        if state["snapshot"] != fingerprint:
            raise ValueError(_other_snapshot(state["snapshot"], fingerprint))
        _check_layout(state, reader.manifest)
        if state["num_examples"] != total or state["window"] != shape.window or \
                state["unit"] not in (shape.unit, shape.earlier_unit):
            raise ValueError(
                "the iterator state was saved by a pipeline with another shuffle buffer or "
                "batch size (or for another snapshot size); resume with the same pipeline")
        share, skip = resumed_share(state, spec, window=shape.window, unit=shape.unit,
                                    balance=balance)
    else:
        share = read_share(reader.manifest, spec, shuffled=seed is not None and not local_shuffle,
                           window=shape.window, unit=shape.unit, balance=balance)
        skip = 0
    record = {"format": STATE_FORMAT, "version": STATE_VERSION, "snapshot": fingerprint,
              "num_examples": total, "epoch": epoch, "seed": seed, "window": shape.window,
              "ranges": [list(r) for r in share.ranges], "streams": share.streams,
              "stream": share.index, "chunk": share.chunk, "unit": share.unit,
              "balance": share.balance, "consumed": skip,
              "bounds": list(share.bounds) if share.bounds is not None else None,
              "rows_per_item_fixed": shape.rows_per_item_fixed}
    return _reading(shape, reader, order, share, skip, epoch, local_shuffle, record, why_not,
                    built)


def _charge_build(shape: Shape, seconds: float) -> None:
    """The stages after the snapshot waited for it to be completed (their first items came
    after that): ``Dataset.stats()`` counts the time in theirs. The snapshot's own stage, and
    those before it, counted it as they wrote."""
    recorder = stats.current.get()
    if isinstance(recorder, stats.Recorder):
        recorder.charge(range(tagged.depth(shape.snapshot) + 1, tagged.depth(shape.stages[-1]) + 1),
                        seconds)


def writing(shape: Shape, epoch: int, spec: streams.StreamSpec | None,
            iterator: Iterator[Any]) -> OrderedIterator:
    """The writing epoch's iterator (the snapshot streams its examples as they are computed)
    with a state: stream ``k`` yields its rows in the order it writes them, which is the order
    it reads them back in from the committed snapshot (see :func:`read_share`)."""
    from snapcache.pipeline import plan

    spec = spec or streams.StreamSpec()
    record = _writing_record(shape, epoch, spec, plan.snapshot_id(shape.snapshot), 0)
    unit = shape.unit  # positions an item takes (a filter makes the state refused: why_not)
    items = ((k * unit, item) for k, item in enumerate(iterator, 1))

    def on_close() -> None:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()

    return OrderedIterator(_closing_items(items, on_close), record, _writing_why_not(shape),
                           on_close)


def _writing_why_not(shape: Shape) -> str | None:
    """Why a writing epoch's state would not resume exactly (None: it does)."""
    why_not = None
    for node in shape.below + shape.above:
        if not (node.traits.one_to_one or isinstance(node, ops.BatchOp)) or \
                not node.traits.order_preserving:
            why_not = (f"{node.describe()} runs during the writing epoch: items do not map to "
                       "positions of the snapshot")
    if shape.shuffle is not None:
        why_not = "an unseeded shuffle's writing epoch is not resumable; give it a seed"
    for node in ops.lineage(shape.snapshot.parent):
        if node.order_varies():
            why_not = (f"{node.describe()} before the snapshot yields in an order that varies "
                       "between runs, so a resumed writing epoch would not write its rows in "
                       "the order they were yielded; make it keep the order (deterministic="
                       "True, a seeded shuffle), or checkpoint at the end of the epoch")
    return why_not


def _writing_record(shape: Shape, epoch: int, spec: streams.StreamSpec, snapshot: str,
                    consumed: int) -> dict:
    return {"format": STATE_FORMAT, "version": STATE_VERSION, "writing": True,
            "snapshot": snapshot, "epoch": epoch, "seed": None, "window": shape.window,
            "streams": spec.count, "stream": spec.index, "unit": shape.unit,
            "consumed": consumed}


def _check_writing_state(state: dict, shape: Shape, spec: streams.StreamSpec,
                         snapshot: str) -> None:
    if state["snapshot"] != snapshot:
        raise ValueError(_other_snapshot(state["snapshot"], snapshot))
    if state["streams"] != spec.count or state["unit"] != shape.unit:
        raise ValueError(
            f"a state saved while the snapshot was being written resumes only with the same "
            f"streams ({state['streams']}) and batch size; got {spec.count} streams: resume "
            "with as many streams (workers x ranks), or start the epoch again")


def _writing_again(shape: Shape, epoch: int, spec: streams.StreamSpec, state: dict
                   ) -> OrderedIterator:
    """The rest of a writing epoch whose snapshot is still not committed, streamed as a fresh
    writing epoch streams it: the stream writes its share (or replays or reads back what an
    earlier run of it wrote, or computes it while another process writes it), and hands on
    the rows after the ``consumed`` ones, through the ops after the snapshot. Each stream goes
    on at once: none waits for the others' shares before it yields (a DataLoader fetching
    from its workers in turn would wait on a worker that waits for the commit)."""
    from snapcache.pipeline import plan

    fingerprint = plan.snapshot_id(shape.snapshot)
    _check_writing_state(state, shape, spec, fingerprint)
    skip = own_position(state, spec.index)
    rows = plan.iterate(shape.snapshot, epoch, spec)
    pairs = enumerate(itertools.islice(rows, skip, None), skip + 1)
    share = Share(((0, 0),), spec.count, spec.index, shape.unit, shape.unit)
    positions = tagged.Positions(None, share, False, known=False)
    items = tagged.run_tagged(shape.stages[1:], pairs, shape.snapshot, epoch, counted=False,
                               positions=positions)

    def on_close() -> None:
        close = getattr(rows, "close", None)
        if close is not None:
            close()

    return OrderedIterator(_closing_items(items, on_close),
                           _writing_record(shape, epoch, spec, fingerprint, skip),
                           _writing_why_not(shape), on_close)


def _other_snapshot(saved: str, current: str) -> str:
    """Why a saved iterator state does not fit this pipeline's snapshot. A delta snapshot's id
    is ``<lineage>:<source files digest>``: the same lineage means the same code, other files."""
    lineage, _, files = saved.partition(":")
    now_lineage, _, now_files = current.partition(":")
    if files and now_files and lineage == now_lineage:
        return (f"the iterator state was saved reading delta snapshot {lineage[:12]} built from "
                f"other source files (files digest {files[:12]}; now {now_files[:12]}): files "
                "were added, changed or removed since, and a position in that version is not "
                "one in this one. Resume with the files as they were, or start a fresh epoch")
    return (f"the iterator state belongs to snapshot {lineage[:12]}, but this pipeline reads "
            f"snapshot {now_lineage[:12]} (a different upstream or data); resume with the "
            "pipeline that saved the state, or start a fresh epoch")


def _check_layout(state: dict, manifest: Manifest) -> None:
    """Refuse ``state`` if the snapshot it was saved reading had another layout: then the same
    positions are other examples. A state without ``layout`` (saved by a release that did not
    record it) is taken as those releases took it, unchecked."""
    saved = state.get("layout")
    if saved is not None and saved != layout_id(manifest):
        raise ValueError(
            f"snapshot {manifest.fingerprint[:12]} was rebuilt with another layout since this "
            "iterator state was saved (it was lost or purged and written again, by another "
            "number of workers or ranks, with another shard_size, or from an upstream whose "
            "output varies between runs): its epoch order differs, so the state's position "
            "would repeat some examples and skip others. Start the epoch again: iterate "
            "without the state (ds.iterate(epoch), to_torch() without state=)")


def _resume_writing(shape: Shape, reader: SnapshotReader, spec: streams.StreamSpec,
                    state: dict, built: bool) -> OrderedIterator:
    """The rest of a writing epoch, now that the snapshot is complete: the stream's rows in
    the order it wrote them, after the first ``consumed`` (this stream's entry of
    ``consumed_by_stream`` in a whole job's state, ``job_state``)."""
    _check_writing_state(state, shape, spec, reader.manifest.snapshot_id)
    share = read_share(reader.manifest, spec, shuffled=False, unit=shape.unit)
    if spec.count > 1 and share.bounds is None:
        raise ValueError(
            f"snapshot {reader.manifest.fingerprint[:12]} was committed by another job with "
            f"another number of streams: the positions of a state saved while it was being "
            "written do not apply; start the epoch again")
    order = EpochOrder(layout_of(reader.manifest), None, state["epoch"], 1)
    skip = own_position(state, spec.index)
    record = {"format": STATE_FORMAT, "version": STATE_VERSION,
              "snapshot": reader.manifest.snapshot_id, "num_examples": len(order),
              "epoch": state["epoch"], "seed": None, "window": 1,
              "ranges": [list(r) for r in share.ranges], "streams": share.streams,
              "stream": share.index, "chunk": share.chunk, "unit": share.unit,
              "balance": None, "consumed": skip,
              "bounds": list(share.bounds) if share.bounds is not None else None}
    return _reading(shape, reader, order, share, skip, state["epoch"], False, record, None,
                    built)


def _reading(shape: Shape, reader: SnapshotReader, order: EpochOrder, share: Share, skip: int,
             epoch: int, local_shuffle: bool, record: dict, why_not: str | None, built: bool
             ) -> OrderedIterator:
    """The iterator over ``share`` after ``skip``, holding a read lease until it is closed.
    ``built``: this epoch completed the snapshot before reading it."""
    from snapcache.pipeline.snapshot_exec import read_session

    record = {**record, "layout": layout_id(reader.manifest)}  # see _check_layout
    session = read_session(reader, shape.snapshot, order, share, skip)
    session.__enter__()
    items, runs = tagged.items(shape, reader, order, share, skip, epoch, local_shuffle, built)
    closed = []

    def on_close() -> None:
        if not closed:
            closed.append(True)
            session.__exit__(None, None, None)

    return OrderedIterator(_closing_items(items, on_close), record, why_not, on_close,
                           runs=runs, least_yielding=shape.least_yielding)


def _closing_items(items: Iterator[tuple[int, Any]], on_close: Callable[[], None]
                   ) -> Iterator[tuple[int, Any]]:
    try:
        yield from ops.closing(items, items)
    finally:
        on_close()


def total_positions(state: dict) -> int:
    return ranges_length(state["ranges"])
