"""Reading a committed snapshot in a given order (:mod:`snapcache.store.order`); single rows
of it (random access) are read by :mod:`snapcache.store.row_access` on the same decoder.

A reader decodes *blocks* (a record batch of a shard, see :class:`~snapcache.store.order.Layout`)
on background threads, ahead of the consumer, and gathers the rows of each piece of positions
from them: as whole numpy columns (``mode="columns"``, for snapshots whose tensors have one
shape, see :func:`~snapcache.store.batched_read.supports_batched`) or as examples
(``mode="rows"``). Each shard is verified (size, checksum, rows, schema) before any of its rows
is used, as every read path does.
"""

from __future__ import annotations

import bisect
import collections
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import xxhash

from snapcache.errors import CorruptSnapshotError
from snapcache.store.batched_read import as_columns, open_sequential, read_budget
from snapcache.store.gather import (ASSEMBLE_BLOCK_BYTES, ASSEMBLE_BLOCKS, Span, Window,
                                    blocks_of, gather)
from snapcache.store.manifest import Manifest
from snapcache.store.order import PIECE_ROWS, EpochOrder, Layout, runs_of

log = logging.getLogger(__name__)
if TYPE_CHECKING:
    from snapcache.store.reader import SnapshotReader


def layout_of(manifest: Manifest) -> Layout:
    """The blocks of a committed snapshot (its record batches when the manifest lists them).
    Their count follows from the manifest alone, which :class:`Manifest` bounds; memory this
    process cannot give them is a :class:`CorruptSnapshotError` too, never a raw error."""
    try:
        return Layout.from_shards([s.rows for s in manifest.shards],
                                  [s.batch_rows for s in manifest.shards])
    except (MemoryError, OverflowError) as e:
        raise CorruptSnapshotError(
            f"snapshot {manifest.fingerprint[:12]}: its manifest's {manifest.num_examples} "
            f"rows in {len(manifest.shards)} shards cannot be laid out ({type(e).__name__}): "
            "the manifest is damaged or was edited. Delete the snapshot with `snapcache "
            f"purge {manifest.fingerprint[:12]}` and rerun the pipeline to rebuild it") from None


def layout_id(manifest: Manifest) -> str:
    """What decides which example sits at each position of a committed snapshot's epoch
    orders, as 16 hex digits: the shards in manifest order, each with its rows, its record
    batches' rows (the blocks of :func:`layout_of`) and its checksum (the rows it holds, in
    their order). Equal for copies of one commit and for a rebuild that wrote the same bytes;
    different when the snapshot was rebuilt by another number of streams, with another
    ``shard_size``, or from an upstream whose order or values vary between runs."""
    digest = xxhash.xxh3_64()
    for shard in manifest.shards:  # "<rows> <checksum> <record batches>;" then their rows
        known = shard.batch_rows is not None
        digest.update(f"{shard.rows} {shard.checksum} "
                      f"{len(shard.batch_rows) if known else -1};".encode())
        if known:
            digest.update(np.asarray(shard.batch_rows, np.int64).tobytes())
    return digest.hexdigest()


class _Shards:
    """Opened (verified) shards of one reader, shared by decoding threads; the least recently
    used are closed when more than ``budget`` bytes are open."""

    def __init__(self, reader: "SnapshotReader", budget: int):
        self.reader, self.budget = reader, budget
        self.ahead = False  # the shards are read front to back: hash each ahead from the start
        self._open: collections.OrderedDict[int, tuple[Any, list[int]]] = \
            collections.OrderedDict()
        self._open_bytes = 0  # of the shards in _open: kept, not summed at each look
        self._locks: dict[int, threading.Lock] = collections.defaultdict(threading.Lock)
        self._lock = threading.Lock()

    def get(self, index: int) -> tuple[Any, list[int]]:
        """(file reader, first row of each record batch) of shard ``index``."""
        with self._lock:
            lock = self._locks[index]
        with lock:
            with self._lock:
                if index in self._open:
                    self._open.move_to_end(index)
                    return self._open[index]
            shard = self.reader.manifest.shards[index]
            # A shard larger than the budget is read in low-memory mode: its pages are dropped
            # from this process as they are hashed and after each block is decoded.
            file_reader = open_sequential(self.reader, shard, low_memory=self.low_memory(shard),
                                          ahead=self.ahead)
            if shard.batch_rows is not None:  # the file has as many (open_shard checks)
                sizes = list(shard.batch_rows)
            else:  # older snapshots: learn the record batches' sizes by decoding them once
                sizes = [file_reader.get_batch(i).num_rows
                         for i in range(file_reader.num_record_batches)]
            starts = [0]
            for size in sizes:
                starts.append(starts[-1] + size)
            with self._lock:
                if index not in self._open:
                    self._open_bytes += shard.bytes
                self._open[index] = (file_reader, starts)
                self._trim(keep=index)
            return file_reader, starts

    def low_memory(self, shard: Any) -> bool:
        return shard.bytes > self.budget

    def close(self) -> None:
        """The read is over: stop reading ahead in the open shards (see
        :meth:`BatchedShard.close <snapcache.store.batched_read.BatchedShard.close>`)."""
        with self._lock:
            opened = [file_reader for file_reader, _ in self._open.values()]
        for file_reader in opened:
            getattr(file_reader, "close", lambda: None)()

    def fits(self, index: int) -> bool:
        """True if shard ``index`` is not open and opening it evicts no open shard."""
        shards = self.reader.manifest.shards
        with self._lock:
            return index not in self._open and \
                self._open_bytes + shards[index].bytes <= self.budget

    def _trim(self, keep: int) -> None:
        if self._open_bytes <= self.budget:
            return
        shards = self.reader.manifest.shards
        for i in list(self._open):
            if self._open_bytes <= self.budget:
                break
            if i != keep:
                del self._open[i]
                self._open_bytes -= shards[i].bytes
                self.reader.forget(shards[i])


class Damaged:
    """A block whose record batches are sound up to one that is not: the ``rows`` decoded
    before it (``value``: columns or examples), then ``error``. A reader hands those rows out,
    then raises, as when each record batch is its own block."""

    def __init__(self, value: Any, rows: int, error: CorruptSnapshotError):
        self.value, self.rows, self.error = value, rows, error


class BlockDecoder:
    """Decodes one block of a snapshot at a time into columns or examples (or
    :class:`Damaged`: the rows before a damaged record batch of a block of several)."""

    def __init__(self, reader: "SnapshotReader", layout: Layout, mode: str, shard_budget: int):
        if mode not in ("columns", "rows"):
            raise ValueError(f"mode must be 'columns' or 'rows'; got {mode!r}")
        self.reader, self.layout, self.mode = reader, layout, mode
        self.shards = _Shards(reader, shard_budget)

    def estimate(self, block: int | tuple[Span, ...]) -> int:
        """Decoded bytes of ``block`` or of a part of a window (its spans), from the manifest's
        raw sizes."""
        if isinstance(block, tuple):
            return sum(self._bytes(b, hi - lo) for b, lo, hi in block)
        return self._bytes(block, int(self.layout.rows[block]))

    def _bytes(self, block: int, rows: int) -> int:
        shard = self.reader.manifest.shards[int(self.layout.shard[block])]
        return max(1, (shard.raw_bytes or shard.bytes) * rows // max(1, shard.rows))

    def _first_row(self, block: int) -> tuple[int, Any, list[int], int]:
        """(shard, its file reader, its record batches' first rows, the block's first row in
        the shard)."""
        layout = self.layout
        index = int(layout.shard[block])
        file_reader, starts = self.shards.get(index)
        batch_index = int(layout.batch[block])
        first = int(layout.offset[block]) + (starts[batch_index] if batch_index >= 0 else 0)
        return index, file_reader, starts, first

    def record_batch(self, index: int, file_reader: Any, starts: list[int], j: int,
                     whole: bool = True) -> pa.RecordBatch:
        """Record batch ``j`` of shard ``index``, checked against the manifest's row count
        (``whole=False``: validated but for the tensors' shapes)."""
        batch = file_reader.get_batch(j, whole)
        if batch.num_rows != starts[j + 1] - starts[j]:
            shard = self.reader.manifest.shards[index]
            raise CorruptSnapshotError(
                f"{self.reader.where(shard)} record batch {j} has {batch.num_rows} rows, the manifest says "
                f"{starts[j + 1] - starts[j]}. Delete the snapshot folder "
                f"({self.reader.storage.url}) to rebuild it")
        return batch

    def locate(self, block: int, offset: int) -> tuple[tuple[int, int], Any, int]:
        """((shard, record batch), a loader of that verified record batch, row in it) for
        row ``offset`` of ``block``."""
        index, file_reader, starts, first = self._first_row(block)
        row = first + offset
        j = bisect.bisect_right(starts, row) - 1
        return ((index, j), lambda: self.record_batch(index, file_reader, starts, j),
                row - starts[j])

    def decode(self, block: int) -> Any:
        pieces: list[pa.RecordBatch] = []
        try:
            for piece in self._slices(block, 0, int(self.layout.rows[block])):
                pieces.append(piece)
        except CorruptSnapshotError as e:
            if not pieces:
                raise
            # the rows before the damaged record batch still come out
            return Damaged(self._finish((int(self.layout.shard[block]),), pieces),
                           sum(p.num_rows for p in pieces), e)
        return self._finish((int(self.layout.shard[block]),), pieces)

    def decode_spans(self, spans: tuple[Span, ...]) -> Any:
        """Rows ``[lo, hi)`` of each ``(block, lo, hi)``, laid end to end as columns (a part of
        a :class:`~snapcache.store.gather.Window`): each record batch verified and checked
        alone but for its tensors' shapes, then one concatenation, one shape check and one
        conversion for them all (in ``mode="rows"``, examples). Raises on any damage without
        saying which rows are sound: the caller decodes the blocks one by one to find out."""
        pieces = [piece for block, lo, hi in spans
                  for piece in self._slices(block, lo, hi, whole=False)]
        return self._finish({int(self.layout.shard[block]) for block, _, _ in spans}, pieces,
                            shapes=True)

    def _slices(self, block: int, lo: int, hi: int, whole: bool = True
                ) -> Iterator[pa.RecordBatch]:
        """Rows ``[lo, hi)`` of ``block``, a slice of each record batch holding some, in order,
        each batch read and checked as it comes (:meth:`record_batch`)."""
        index, file_reader, starts, first = self._first_row(block)
        a, b = first + lo, first + hi
        # bisect: np.searchsorted would convert the list at every call (quadratic a shard)
        j = max(0, bisect.bisect_right(starts, a) - 1)
        while a < b:
            batch = self.record_batch(index, file_reader, starts, j, whole)
            lo_j, hi_j = a - starts[j], min(b, starts[j + 1]) - starts[j]
            yield batch if (lo_j, hi_j) == (0, batch.num_rows) \
                else batch.slice(lo_j, hi_j - lo_j)
            a = starts[j + 1]
            j += 1

    def _finish(self, shards: Iterable[int], pieces: list, *, shapes: bool = False) -> Any:
        """Slices of record batches of ``shards`` as one batch, decoded (``shapes``: the
        tensors' shapes checked first, the slices were checked but for them); pages of
        low-memory shards released."""
        batch = pieces[0] if len(pieces) == 1 else pa.Table.from_batches(
            pieces).combine_chunks().to_batches()[0]
        validator = self.reader._validator
        if shapes and validator is not None:
            validator.check_shapes(batch)
        for index in shards:
            shard = self.reader.manifest.shards[index]
            if self.shards.low_memory(shard):
                self.reader.release_pages(shard)
        decoder = self.reader._decoder
        assert decoder is not None
        if self.mode == "rows":
            return list(decoder.rows(batch))
        return as_columns(batch, decoder)


class _OpenAhead:
    """Opens (maps and verifies) the next shard the reading will reach while the consumer is
    still on the one before, so that on a cold disk reading and hashing a shard overlaps with
    decoding and consuming the previous one instead of following it. One shard ahead, only when
    it fits the open-shard budget beside the open ones (never evicting one); a shard that fails
    to open raises where its rows are read, after the rows before it."""

    def __init__(self, order: EpochOrder, ranges: Sequence[tuple[int, int]], shards: _Shards,
                 pool: ThreadPoolExecutor):
        self._shards, self._pool, self._layout = shards, pool, order.layout
        self._sequence: list[int] = []  # shards in the order the reading first reaches them
        self._rank: dict[int, int] = {}
        for a, b in ranges:
            for shard in self._layout.shard[order.blocks_in(a, b)].tolist():
                if shard not in self._rank:
                    self._rank[shard] = len(self._sequence)
                    self._sequence.append(shard)
        self._next = 0

    def reached(self, blocks: list[int]) -> None:
        """The consumer is at ``blocks``: open the shard after theirs if it fits."""
        rank = max(self._rank.get(int(self._layout.shard[b]), -1) for b in blocks)
        self._next = max(self._next, rank + 1)
        if self._next < len(self._sequence) and self._shards.fits(self._sequence[self._next]):
            future = self._pool.submit(self._shards.get, self._sequence[self._next])
            future.add_done_callback(_ignore_failure)  # read again, and raised, in order
            self._next += 1


def _ignore_failure(future: Future) -> None:
    if not future.cancelled():
        future.exception()


def ordered_pieces(reader: "SnapshotReader", order: EpochOrder,
                   ranges: Iterable[tuple[int, int]], *, mode: str, piece: int = PIECE_ROWS,
                   threads: int | None = None, budget: int | None = None
                   ) -> Iterator[tuple[int, int, Any]]:
    """``(start, stop, rows)`` for the positions of ``ranges`` in order, at most ``piece``
    positions (and never more than one shuffle window) at a time; ``rows`` are columns or a
    list of examples. Blocks load, verify and decode on ``threads`` threads ahead of the
    consumer, holding at most about ``budget`` bytes (half open shards, half decoded blocks).
    A shuffle window of many small blocks read as columns is decoded whole, in ``threads``
    parts (:class:`~snapcache.store.gather.Window`).
    """
    threads, budget = read_budget(threads or reader.read_threads,
                                  budget or reader.prefetch_bytes)
    row_bytes = np.array([(s.raw_bytes or s.bytes) / max(1, s.rows)
                          for s in reader.manifest.shards])
    if order.seed is None:  # the rows in order: small record batches decode in runs
        order = EpochOrder(runs_of(order.layout, row_bytes.tolist()), None, order.epoch)
    decoder = BlockDecoder(reader, order.layout, mode, shard_budget=max(1, budget // 2))
    ranges = _joined(ranges)
    # An unshuffled epoch read in one stream reads every shard front to back: each shard's
    # verifier hashes ahead from the moment it is opened (the first record batches of a cold
    # shard come off the disk while the first is decoded, not after the second is asked for).
    decoder.shards.ahead = order.seed is None and len(ranges) <= 1

    def to_assemble(a: int, b: int) -> Window | None:
        """The window of position ``a`` to decode whole, if it pays: columns, many small
        blocks, within a quarter of the budget, and mostly read by ``[a, b)`` (a resumed
        read past most of a window reads its rows block by block)."""
        first, stop = order.window_of(a)
        if mode != "columns" or order.window == 1 or \
                2 * (min(b, stop) - max(a, first)) < stop - first:
            return None
        blocks, lo, hi = order.window_blocks(first, stop)
        layout = order.layout
        size = float(np.dot(layout.rows[blocks], row_bytes[layout.shard[blocks]]))
        if len(blocks) < ASSEMBLE_BLOCKS or size > ASSEMBLE_BLOCK_BYTES * len(blocks) or \
                size > budget // 4:
            return None
        return Window.of(order, first, stop, parts=max(1, threads))

    def split() -> Iterator[tuple[int, int, Window | None]]:
        for a, b in ranges:
            window, window_stop = None, -1
            while a < b:
                if order.window > 1 and a >= window_stop:
                    window, window_stop = to_assemble(a, b), order.window_of(a)[1]
                # without a window, a piece is (part of) one block: sliced, not copied
                stop = min(b, order.boundary(a), a + piece if order.window > 1 else b)
                yield a, stop, window
                a = stop

    todo = split()
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="snapcache-read")
    ahead = _OpenAhead(order, ranges, decoder.shards, pool)
    # (start, stop, blocks and offsets a position, or None and the first row of a run, or
    # None and the window's rows; what to decode: blocks, or a window's parts; the window)
    planned: collections.deque[tuple[int, int, Any, Any, list, Window | None]] = \
        collections.deque()
    futures: dict[Any, Future] = {}
    last_use: dict[Any, int] = {}
    held = 0
    serial = 0
    pending: tuple[int, int, Any, Any, list, Window | None] | None = None  # not yet planned
    broken: tuple[Window, dict[int, Any]] | None = None  # a window decoded block by block
    try:
        while True:
            # Plan a few pieces ahead, and further while they come from few blocks (pieces of
            # one block are cheap to plan; decoding must stay a few blocks ahead of the
            # consumer), within half the budget. The first piece alone: its blocks then
            # decode without the next ones competing for the CPU (on a busy machine they
            # doubled the time to the first batch); the rest is planned when the consumer
            # comes back for the second piece, long before it has used the first block.
            # A piece whose blocks are all planned already is planned whatever the budget (it
            # costs no decoding; up to the planning depth, and one beside the first piece):
            # otherwise the block of a first piece that ends inside it was dropped with that
            # piece and decoded a second time for the next (the same for a window's parts).
            while True:
                if pending is None:
                    nxt = next(todo, None)
                    if nxt is None:
                        break
                    a, b, window = nxt
                    run = order.run(a, b)  # rows of one block (no window): a slice, no arrays
                    if window is not None:
                        pending = (a, b, None, window.rows(order, a, b), list(window.spans),
                                   window)
                    elif run is not None:
                        pending = (a, b, None, run[1], [run[0]], None)
                    else:
                        blocks, offsets = order.locate(a, b)
                        pending = (a, b, blocks, offsets, blocks_of(blocks), None)
                unique = pending[4]
                started = serial > len(planned)  # the consumer took its first piece
                free = all(block in futures for block in unique) and \
                    len(planned) < (4 * max(1, threads) if started else 2)
                if planned and not free and not (started and held < budget // 2 and (
                        len(planned) < 4 * max(1, threads) or
                        len(futures) <= 2 * max(1, threads))):
                    break
                for block in unique:
                    if block not in futures:
                        futures[block] = pool.submit(
                            decoder.decode_spans if isinstance(block, tuple) else
                            decoder.decode, block)
                        held += decoder.estimate(block)
                    last_use[block] = serial
                planned.append(pending)
                pending = None
                serial += 1
            if not planned:
                return
            a, b, blocks, offsets, unique, window = planned.popleft()
            cut = None
            done = serial - len(planned) - 1
            decoded = {block: _outcome(futures[block].result) for block in unique}
            for block in unique:
                if last_use[block] == done:
                    del futures[block], last_use[block]
                    held -= decoder.estimate(block)
            # after the first piece: it does not delay the first batch
            ahead.reached(list(window.blocks) if window is not None else unique)
            if window is not None:
                parts = list(decoded.values())
                if not any(isinstance(part, BaseException) for part in parts):
                    yield a, b, window.take(parts, offsets)
                    continue
                # Damaged: decode the window block by block, on this thread, once; its pieces
                # then come out as they would have without the window, up to the first that
                # needs a damaged block, which raises what that block's decoding raised.
                if broken is None or broken[0] is not window:
                    broken = (window, {block: _outcome(partial(decoder.decode, block))
                                       for block in window.blocks})
                blocks, offsets = order.locate(a, b)
                decoded = {block: broken[1][block] for block in blocks_of(blocks)}
            for block in decoded.values():
                if isinstance(block, BaseException):
                    raise block
            if blocks is None:
                block = decoded[unique[0]]
                if isinstance(block, Damaged):  # sound rows up to block.rows, then the error
                    if offsets >= block.rows:
                        raise block.error
                    if offsets + b - a > block.rows:
                        b, cut = a + block.rows - offsets, block.error
                    block = block.value
                part = {name: column[offsets:offsets + b - a] for name, column in block.items()} \
                    if mode == "columns" else block[offsets:offsets + b - a]
                yield a, b, part
                if cut is not None:
                    raise cut
            else:
                for block in decoded.values():
                    if isinstance(block, Damaged):
                        raise block.error
                yield a, b, gather(decoded, blocks, offsets, mode)
    finally:
        for future in futures.values():
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        decoder.shards.close()


def _joined(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` with each run of adjoining ones joined (a stream's share may come as many)."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        elif a < b:
            out.append((a, b))
    return out


def _outcome(call: Callable[[], Any]) -> Any:
    """What ``call()`` returns, or the exception it raised (re-raised where it is used)."""
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - handed back to be raised in order
        return e
