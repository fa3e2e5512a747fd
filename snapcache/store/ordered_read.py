"""Reading a committed snapshot in a given order (:mod:`snapcache.store.order`), and reading
single rows of it (random access).

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
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from snapcache.errors import CorruptSnapshotError
from snapcache.store.batched_read import as_columns, open_sequential, read_budget
from snapcache.store.manifest import Manifest
from snapcache.store.order import EpochOrder, Layout, runs_of
from snapcache.store.random_access import NO_PAGES, HeldShards, PageRows, RemoteRows

log = logging.getLogger(__name__)
WHOLE_AFTER = 64
"""Rows of a record batch read alone (:mod:`snapcache.store.random_access`) before the next
one decodes the batch whole and keeps it (a later row is then an index): decoding a record
batch with Arrow and validating it costs ~300 us (16 or 256 rows a batch alike), a row then
~6 us; a row read alone from a held shard ~10 us once its batch's metadata is parsed (~20 us
the first time), ~50 us page by page. So a batch read rarely is never decoded, and one read
often costs at most about 1.5x what decoding it at once would have."""

if TYPE_CHECKING:
    from snapcache.store.reader import SnapshotReader


def layout_of(manifest: Manifest) -> Layout:
    """The blocks of a committed snapshot (its record batches when the manifest lists them)."""
    return Layout.from_shards([s.rows for s in manifest.shards],
                              [s.batch_rows for s in manifest.shards])


class _Shards:
    """Opened (verified) shards of one reader, shared by decoding threads; the least recently
    used are closed when more than ``budget`` bytes are open."""

    def __init__(self, reader: "SnapshotReader", budget: int):
        self.reader, self.budget = reader, budget
        self.ahead = False  # the shards are read front to back: hash each ahead from the start
        self._open: collections.OrderedDict[int, tuple[Any, list[int]]] = \
            collections.OrderedDict()
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
            where = self.reader.where(shard)
            count = file_reader.num_record_batches
            if shard.batch_rows is not None:
                if count != len(shard.batch_rows):
                    raise CorruptSnapshotError(
                        f"{where} has {count} record batches, the manifest lists "
                        f"{len(shard.batch_rows)}. Delete the snapshot folder "
                        f"({self.reader.storage.url}) to rebuild it")
                sizes = list(shard.batch_rows)
            else:  # older snapshots: learn the record batches' sizes by decoding them once
                sizes = [file_reader.get_batch(i).num_rows for i in range(count)]
            starts = [0]
            for size in sizes:
                starts.append(starts[-1] + size)
            with self._lock:
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
                sum(shards[i].bytes for i in self._open) + shards[index].bytes <= self.budget

    def _trim(self, keep: int) -> None:
        shards = self.reader.manifest.shards
        total = sum(shards[i].bytes for i in self._open)
        for i in list(self._open):
            if total <= self.budget:
                break
            if i != keep:
                del self._open[i]
                self.reader.forget(shards[i])
                total -= shards[i].bytes


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

    def estimate(self, block: int) -> int:
        """Decoded bytes of ``block`` (from the manifest's raw sizes)."""
        shard = self.reader.manifest.shards[int(self.layout.shard[block])]
        return max(1, (shard.raw_bytes or shard.bytes) * int(self.layout.rows[block])
                   // max(1, shard.rows))

    def _first_row(self, block: int) -> tuple[int, Any, list[int], int]:
        """(shard, its file reader, its record batches' first rows, the block's first row in
        the shard)."""
        layout = self.layout
        index = int(layout.shard[block])
        file_reader, starts = self.shards.get(index)
        batch_index = int(layout.batch[block])
        first = int(layout.offset[block]) + (starts[batch_index] if batch_index >= 0 else 0)
        return index, file_reader, starts, first

    def record_batch(self, index: int, file_reader: Any, starts: list[int], j: int
                     ) -> pa.RecordBatch:
        """Record batch ``j`` of shard ``index``, checked against the manifest's row count."""
        batch = file_reader.get_batch(j)
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
        index, file_reader, starts, first = self._first_row(block)
        rows = int(self.layout.rows[block])
        pieces = []
        # bisect: np.searchsorted would convert the list at every call (quadratic a shard)
        j = max(0, bisect.bisect_right(starts, first) - 1)
        damage = None
        while rows > sum(p.num_rows for p in pieces):
            try:
                batch = self.record_batch(index, file_reader, starts, j)
            except CorruptSnapshotError as e:
                if not pieces:
                    raise
                damage = e  # the rows before the damaged record batch still come out
                break
            lo = max(0, first - starts[j])
            hi = min(batch.num_rows, first + rows - starts[j])
            pieces.append(batch.slice(lo, hi - lo) if (lo, hi) != (0, batch.num_rows)
                          else batch)
            j += 1
        if damage is not None:
            return Damaged(self._finish(index, pieces), sum(p.num_rows for p in pieces),
                           damage)
        return self._finish(index, pieces)

    def _finish(self, index: int, pieces: list) -> Any:
        batch = pieces[0] if len(pieces) == 1 else pa.Table.from_batches(
            pieces).combine_chunks().to_batches()[0]
        shard = self.reader.manifest.shards[index]
        if self.shards.low_memory(shard):
            self.reader.release_pages(shard)
        decoder = self.reader._decoder
        assert decoder is not None
        if self.mode == "rows":
            return list(decoder.rows(batch))
        return as_columns(batch, decoder)


def gather(decoded: dict[int, Any], blocks: np.ndarray, offsets: np.ndarray, mode: str) -> Any:
    """The rows (``blocks[i]``, ``offsets[i]``) from decoded blocks: columns or a list."""
    if mode == "rows":
        return [decoded[b][o] for b, o in zip(blocks.tolist(), offsets.tolist())]
    first = decoded[int(blocks[0])]
    if len(decoded) == 1 or (blocks == blocks[0]).all():
        start = int(offsets[0])
        if np.array_equal(offsets, np.arange(start, start + len(offsets))):  # a view
            return {name: column[start:start + len(offsets)] for name, column in first.items()}
        return {name: column.take(offsets, axis=0) for name, column in first.items()}
    out = {name: np.empty((len(blocks), *column.shape[1:]), dtype=column.dtype)
           for name, column in first.items()}
    sort = np.argsort(blocks, kind="stable")
    sorted_blocks = blocks[sort]
    cuts = np.flatnonzero(np.diff(sorted_blocks)) + 1
    for where in np.split(sort, cuts):
        block = decoded[int(blocks[where[0]])]
        rows = offsets[where]
        for name, column in block.items():
            out[name][where] = column[rows]
    return out


def blocks_of(blocks: np.ndarray) -> list[int]:
    """The distinct blocks of a piece, ascending. Not ``np.unique``: its first call in a process
    imports ``numpy.ma`` (~30 ms, paid by the first epoch read), and a piece without a shuffle
    window lies in one block."""
    if not len(blocks):
        return []
    first = int(blocks[0])
    if first == int(blocks[-1]) and (blocks == first).all():
        return [first]
    return np.flatnonzero(np.bincount(blocks)).tolist()


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
                   ranges: Iterable[tuple[int, int]], *, mode: str, piece: int = 1024,
                   threads: int | None = None, budget: int | None = None
                   ) -> Iterator[tuple[int, int, Any]]:
    """``(start, stop, rows)`` for the positions of ``ranges`` in order, at most ``piece``
    positions (and never more than one shuffle window) at a time; ``rows`` are columns or a
    list of examples. Blocks load, verify and decode on ``threads`` threads ahead of the
    consumer, holding at most about ``budget`` bytes (half open shards, half decoded blocks).
    """
    threads, budget = read_budget(threads or reader.read_threads,
                                  budget or reader.prefetch_bytes)
    if order.seed is None:  # the rows in order: small record batches decode in runs
        order = EpochOrder(runs_of(order.layout, [(s.raw_bytes or s.bytes) / max(1, s.rows)
                                                  for s in reader.manifest.shards]),
                           None, order.epoch)
    decoder = BlockDecoder(reader, order.layout, mode, shard_budget=max(1, budget // 2))
    ranges = list(ranges)
    # An unshuffled epoch read in one stream reads every shard front to back: each shard's
    # verifier hashes ahead from the moment it is opened (the first record batches of a cold
    # shard come off the disk while the first is decoded, not after the second is asked for).
    decoder.shards.ahead = order.seed is None and all(
        b == c for (_, b), (c, _) in zip(ranges, ranges[1:]))

    def split() -> Iterator[tuple[int, int]]:
        for a, b in ranges:
            while a < b:
                # without a window, a piece is (part of) one block: sliced, not copied
                stop = min(b, order.boundary(a), a + piece if order.window > 1 else b)
                yield a, stop
                a = stop

    todo = split()
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="snapcache-read")
    ahead = _OpenAhead(order, ranges, decoder.shards, pool)
    # (start, stop, blocks and offsets a position, or None and the first row of a run, blocks)
    planned: collections.deque[tuple[int, int, Any, Any, list[int]]] = \
        collections.deque()
    futures: dict[int, Future] = {}
    last_use: dict[int, int] = {}
    held = 0
    serial = 0
    pending: tuple[int, int, Any, Any, list[int]] | None = None  # located, not yet planned
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
            # piece and decoded a second time for the next.
            while True:
                if pending is None:
                    nxt = next(todo, None)
                    if nxt is None:
                        break
                    a, b = nxt
                    run = order.run(a, b)  # rows of one block (no window): a slice, no arrays
                    if run is not None:
                        pending = (a, b, None, run[1], [run[0]])
                    else:
                        blocks, offsets = order.locate(a, b)
                        pending = (a, b, blocks, offsets, blocks_of(blocks))
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
                        futures[block] = pool.submit(decoder.decode, block)
                        held += decoder.estimate(block)
                    last_use[block] = serial
                planned.append(pending)
                pending = None
                serial += 1
            if not planned:
                return
            a, b, blocks, offsets, unique = planned.popleft()
            cut = None
            done = serial - len(planned) - 1
            decoded = {block: futures[block].result() for block in unique}
            for block in unique:
                if last_use[block] == done:
                    del futures[block], last_use[block]
                    held -= decoder.estimate(block)
            ahead.reached(unique)  # after the first piece: it does not delay the first batch
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


class RowAccess:
    """Random access to the rows of a committed snapshot. The first row of a record batch of a
    raw local shard with page checksums reads and verifies only the pages holding it
    (:mod:`snapcache.store.row_read`); elsewhere the first row of a record batch
    reads that record batch alone and checks it against its checksum in the manifest (or, in
    snapshots written before those were recorded, loads and verifies its whole shard, then
    kept open, least recently used first out, within half of ``budget`` bytes), decodes it
    once (zero-copy views where it can be) and keeps it, within the other half; any row of a
    kept batch is then an index into it. Raw shards are read row by row
    (:mod:`snapcache.store.random_access`: page by page, then from the shard held, mapped or
    fetched whole, within the first half) until a record batch has had :data:`WHOLE_AFTER`
    rows read alone; the next row reads it whole.

    Example::

        rows = RowAccess(SnapshotReader.open(storage))
        rows[17], rows.take([3, 1, 4])
    """

    def __init__(self, reader: "SnapshotReader", *, budget: int | None = None):
        self.reader, self._budget = reader, budget
        self._setup()

    def _setup(self) -> None:
        _, budget = read_budget(1, self._budget or self.reader.prefetch_bytes)
        self.layout = layout_of(self.reader.manifest)
        self._decoder = BlockDecoder(self.reader, self.layout, "rows", shard_budget=budget // 2)
        self._batch_budget = budget // 2
        # (shard, record batch) -> (row getter, or the _Read batch of a first row; bytes),
        # least recently used first
        self._batches: collections.OrderedDict[tuple[int, int], tuple[Any, int]] = \
            collections.OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self._count = self.layout.num_rows
        # shards held for rows read alone (random_access): mapped local ones, remote ones
        # fetched whole once read enough; within the other half of the budget
        self._shards_held = HeldShards(budget // 2)
        self._alone = PageRows.of(self.reader, self.layout, self._shards_held) or \
            RemoteRows.of(self.reader, self.layout, self._shards_held)

    def __getstate__(self) -> dict:
        # A copy in another process (a DataLoader worker started with spawn) opens its own
        # shards: open files, decoded batches and locks stay here.
        return {"reader": self.reader, "_budget": self._budget}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    def __len__(self) -> int:
        return self._count

    def _index(self, i: Any) -> int:
        if type(i) is int and 0 <= i < self._count:
            return i
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"a snapshot is indexed by int; got {type(i).__name__}")
        n = len(self)
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"index {i} out of range for a snapshot of {n} examples")
        return j

    def _locate(self, row: int) -> tuple[tuple[int, int], Any, int]:
        layout = self.layout
        block = int(np.searchsorted(layout.start, row, side="right") - 1)
        index, j = int(layout.shard[block]), int(layout.batch[block])
        shard = self.reader.manifest.shards[index]
        if j >= 0 and shard.batch_index:
            # The manifest has this record batch's checksum: read and verify it alone.
            remote = self._alone if isinstance(self._alone, RemoteRows) else None
            held = remote.held_batch(index) if remote is not None else None
            return (index, j), _Alone(self.reader, shard, j, held), row - int(layout.start[block])
        return self._decoder.locate(block, row - int(layout.start[block]))

    def _getter(self, key: tuple[int, int], load: Any) -> Any:
        """The row getter of record batch ``key`` (shard, batch), decoded on a miss (or when
        only one row of it was decoded so far)."""
        with self._lock:
            entry = self._batches.get(key)
            if entry is not None:
                self._batches.move_to_end(key)
                if not isinstance(entry[0], (_Read, _Seen)):
                    return entry[0]
        batch = entry[0].checked() if entry is not None and isinstance(entry[0], _Read) \
            else load()
        getter = self.reader._decoder.row_reader(batch)
        self._keep(key, getter, batch.nbytes)
        return getter

    def _keep(self, key: tuple[int, int], value: Any, size: int) -> None:
        with self._lock:
            old = self._batches.pop(key, None)
            if old is not None:
                self._held -= old[1]
            self._batches[key] = (value, size)
            self._held += size
            while self._held > self._batch_budget and len(self._batches) > 1:
                self._held -= self._batches.popitem(last=False)[1][1]

    def __getitem__(self, i: Any) -> Any:
        row = i if type(i) is int and 0 <= i < self._count else self._index(i)
        alone = self._alone
        if alone is not None:  # raw shards read row by row: see PageRows, RemoteRows
            b = bisect.bisect_right(alone.starts, row) - 1
            key = alone.key(b)
            if key is not None and self._alone_reads(key) < WHOLE_AFTER:
                value = self._read_alone(key, row - alone.starts[b])
                if value is not NO_PAGES:
                    return value
        key, load, k = self._locate(row)
        if isinstance(load, _Alone):
            with self._lock:
                known = key in self._batches
            if not known:
                # The first row of a record batch: decode that row alone (decoding them all
                # costs more than reading the batch); a second row decodes the batch (its
                # shard is not held: random_access.RemoteRows).
                batch = load(whole=False)
                row = self.reader.row_at(load.shard, load.index, batch, k)
                self._keep(key, _Read(load, batch), batch.nbytes)
                return row
        return self._getter(key, load)(k)

    def _alone_reads(self, key: tuple[int, int]) -> int:
        """How many rows of record batch ``key`` were read alone (WHOLE_AFTER if it is
        decoded, or read for a row, whole)."""
        entry = self._batches.get(key)
        if entry is None:
            return 0
        return entry[0].count if type(entry[0]) is _Seen else WHOLE_AFTER

    def _read_alone(self, key: tuple[int, int], k: int) -> Any:
        """Row ``k`` of record batch ``key`` read alone (its pages, or from its held shard;
        the batch's count of rows read alone goes up: see WHOLE_AFTER), or NO_PAGES if that
        is not possible (the caller reads the row with its record batch)."""
        value = self._alone.read(key, k)  # type: ignore[union-attr]
        if value is not NO_PAGES:
            with self._lock:
                entry = self._batches.get(key)
                if entry is None:
                    self._batches[key] = (_Seen(1), 0)
                elif type(entry[0]) is _Seen:
                    entry[0].count += 1
        return value

    def take(self, indices: Sequence[int]) -> list:
        """The examples at ``indices``, in that order; each record batch decoded at most
        once, and one asked for a single row it has not been read for before read like a
        first ``rows[i]`` (page by page where the shard allows)."""
        located = [self._locate(self._index(i)) for i in indices]
        count = collections.Counter(key for key, _, _ in located)
        alone = self._alone
        getters: dict[tuple[int, int], Any] = {}
        out = []
        for key, load, k in located:
            if count[key] == 1 and alone is not None and alone.paths[key[0]] and \
                    isinstance(load, _Alone) and self._alone_reads(key) < WHOLE_AFTER:
                value = self._read_alone(key, k)
                if value is not NO_PAGES:
                    out.append(value)
                    continue
            if key not in getters:
                getters[key] = self._getter(key, load)
            out.append(getters[key](k))
        return out


class _Alone:
    """Loads record batch ``index`` of ``shard`` alone (see :meth:`SnapshotReader.read_batch`)."""

    def __init__(self, reader: "SnapshotReader", shard: Any, index: int,
                 held: Callable[[int], Any] | None = None):
        self.reader, self.shard, self.index, self.held = reader, shard, index, held

    def __call__(self, whole: bool = True) -> pa.RecordBatch:
        data = None if self.held is None else self.held(self.index)
        if data is not None:  # its shard is held (fetched whole, verified): no request
            return self.reader.batch_from_bytes(self.shard, self.index, data, whole=whole)
        return self.reader.read_batch(self.shard, self.index, whole=whole)


class _Read:
    """A record batch read for one row: the rest of its validation is still to do."""

    def __init__(self, load: _Alone, batch: pa.RecordBatch):
        self.load, self.batch = load, batch

    def checked(self) -> pa.RecordBatch:
        return self.load.reader.check_batch(self.load.shard, self.load.index, self.batch)


class _Seen:
    """What :class:`RowAccess` keeps of a record batch rows of which were read alone (page by
    page, or from its held shard): how many; the batch itself is not read whole yet."""

    __slots__ = ("count",)

    def __init__(self, count: int):
        self.count = count
