"""Fast reads of a committed snapshot: parallel shard readers, a prefetch buffer bounded in
bytes, shard-order and window shuffles, and batches cut straight from Arrow record batches.

The pieces are generators over *column chunks*: one decoded record batch as a dict
``{field: numpy array (n, *shape) | object array}``, every field with the same number of rows.
Cutting batches and shuffling are numpy slicing, ``concatenate`` and ``take`` on whole columns:
no Python work per example. A batch that lies inside one record batch is a read-only view of
its buffers (zero copy); one that spans record batches is a fresh array.

Only snapshots whose tensors each have one fixed shape can be cut this way
(:func:`supports_batched`); ragged ones go through the example-by-example path, whose ``batch``
explains how to pad them.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import xxhash

from snapcache import lifecycle
from snapcache.machine import available_cpus, memory_budget
from snapcache.store.decoder import Decoder
from snapcache.store.manifest import ShardInfo
from snapcache.store.schema import Schema

if TYPE_CHECKING:
    from snapcache.store.reader import SnapshotReader
    from snapcache.store.shard_file import ShardFile

log = logging.getLogger(__name__)

Columns = dict  # field name -> numpy array, all of one length


def read_budget(threads: int | None, budget: int | None) -> tuple[int, int]:
    """Resolve a reader's thread count and prefetch bytes; None means "from the machine"."""
    return threads or available_cpus(), budget or memory_budget()


class BatchedShard:
    """A local shard read record batch by record batch: each record batch's bytes (a slice of
    the file's memory map) are checked against its checksum in the manifest, decoded with the
    manifest's schema and validated (:meth:`SnapshotReader.batch_from_bytes
    <snapcache.store.reader.SnapshotReader.batch_from_bytes>`) when it is asked for, so that
    the consumer takes the first record batches of a shard while the rest of it is still being
    read, and the record batches of a compressed shard are decompressed in parallel on the read
    threads. No byte of a record batch is used before its checksum matched.

    With ``verify``, a :class:`_Verifier` thread hashes the record batches asked for and, while
    they are asked for in order, those after them, front to back, ahead of decoding (the
    kernel then sees one sequential reader, whose read-ahead keeps the disk busy as a plain
    sequential read does); :meth:`get_batch` waits only for the digest of its own record
    batch. Without ``verify``, decoding reads the bytes.

    Opening maps the file (its size must be the manifest's). The bytes outside the record
    batches (the file's header and footer) are not used, so not read; ``snapcache verify``
    checks the whole file's checksum. ``low_memory``: pages are dropped from this process once
    hashed and once their record batch is decoded (the page cache keeps them; decoded views of
    an uncompressed shard fault them back in as they are used), so that resident memory stays
    within the prefetch budget however large the shard. Same interface as
    :class:`~snapcache.store.shard_file.ShardFile`, plus :meth:`close` (stops the verifier)."""

    def __init__(self, reader: "SnapshotReader", shard: ShardInfo, *, low_memory: bool = False,
                 ahead: bool = False):
        self._reader, self._shard, self._low_memory = reader, shard, low_memory
        self.num_record_batches = len(shard.batch_rows or ())
        self.schema = reader._arrow_schema
        # mapped (a local shard), a missing or resized file a CorruptSnapshotError
        self._buffer, self._map = reader._load(shard, reader.where(shard))
        self._verifier = _Verifier(shard, self._buffer, self._map, low_memory, ahead) \
            if reader.verify and self.num_record_batches else None
        if self._verifier is not None:  # an abandoned read stops hashing ahead
            weakref.finalize(self, self._verifier.abandon)

    def get_batch(self, index: int, whole: bool = True) -> pa.RecordBatch:
        """Record batch ``index``, verified and validated (``whole=False``: all but the
        tensors' shapes, see :meth:`SnapshotReader.batch_from_bytes`)."""
        start, end = self._shard.batch_offsets[index], self._shard.batch_offsets[index + 1]
        data = self._buffer.slice(start, end - start)
        digest = self._verifier.digest(index) if self._verifier is not None else None
        batch = self._reader.batch_from_bytes(self._shard, index, data, digest=digest,
                                              whole=whole)
        if self._low_memory and self._map is not None:
            # this batch's pages and those of the batches before it
            self._map.madvise(mmap.MADV_DONTNEED, 0, end)
        return batch

    def close(self) -> None:
        """Stop hashing ahead (record batches already returned stay valid)."""
        if self._verifier is not None:
            self._verifier.stop()


AHEAD_BYTES = 32 << 20
"""How far past the furthest record batch asked for a shard's verifier hashes on its own."""
SLACK = 8
"""Record batches between the first and the furthest asked for that may not have been asked
for (yet) while the read still counts as sequential: parallel decoding asks for the next few
in any order."""


class _Verifier:
    """Hashes the record batches of one mapped shard on its own thread
    (``snapcache-read_verify``), publishing each digest as it is taken: first the batches
    asked for and not hashed yet (lowest first), then, once two or more were asked for and
    they are sequential (or from the moment it starts, with ``ahead``: the reader said it
    reads the shard front to back), the rest from the first asked for on, front to back, up to
    :data:`AHEAD_BYTES` past the furthest asked for, so that the disk streams ahead of
    decoding as for a plain sequential read. A read that jumps (a shuffled epoch, one stream's
    share of several) ends the thread once it has hashed what was asked for: the readers then
    hash what they ask for themselves, and nothing is read that is not asked for.

    The thread also ends when every batch is hashed, when :meth:`stop` is called (the read was
    closed) or its :class:`BatchedShard` is collected (the read was abandoned), or at
    interpreter exit. A record batch asked for that it will not hash (ended, failed, or in a
    forked child, where the thread does not exist) is hashed by the one asking."""

    def __init__(self, shard: ShardInfo, buffer: pa.Buffer, mapped: "mmap.mmap | None",
                 low_memory: bool, ahead: bool = False):
        self._offsets = list(shard.batch_offsets)
        count = len(self._offsets) - 1
        self._digests: list[str | None] = [None] * count
        self._asked: set[int] = set()    # asked for, not hashed yet
        self._wanted = [False] * count   # ever asked for
        self._count = 0                  # how many were ever asked for
        self._first = self._furthest = -1  # the first and the furthest asked for
        self._sequential = True          # whether those asked for leave (almost) no gaps
        self._ahead = ahead              # hash ahead before two batches were asked for
        self._next = 0                   # the next batch to hash ahead
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._stopped = threading.Event()  # asked to stop, or done
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._run, args=(memoryview(buffer), mapped if low_memory else None),
            name="snapcache-read_verify", daemon=True)
        self._forget = lifecycle.at_exit(self.stop)
        try:
            self._thread.start()
        except BaseException:  # e.g. at interpreter exit
            self._forget()
            self._stopped.set()
            raise

    def _choose(self) -> int | None:
        """The batch to hash next, if any now (called holding the lock)."""
        digests, offsets = self._digests, self._offsets
        while self._asked:
            index = min(self._asked)
            self._asked.discard(index)
            if digests[index] is None:  # not hashed ahead meanwhile
                return index
        self._next = max(self._next, self._first)  # never before the first asked for
        while self._next < len(digests) and digests[self._next] is not None:
            self._next += 1
        if self._sequential and (self._count >= 2 or self._ahead) and \
                self._next < len(digests) and \
                offsets[self._next] < offsets[self._furthest + 1] + AHEAD_BYTES:
            return self._next
        return None

    def _run(self, view: memoryview, mapped: "mmap.mmap | None") -> None:
        offsets, digests = self._offsets, self._digests
        try:
            while True:
                with self._cond:
                    index = self._choose()
                    while index is None:
                        if self._stopped.is_set() or None not in digests or \
                                not self._sequential:
                            return  # stopped, every batch hashed, or the askers hash
                        self._cond.wait()
                        index = self._choose()
                    if self._stopped.is_set():
                        return
                start, end = offsets[index], offsets[index + 1]
                digest = xxhash.xxh3_64(view[start:end]).hexdigest()
                if mapped is not None:  # hashed: drop its pages from this process
                    first = start - start % mmap.PAGESIZE
                    mapped.madvise(mmap.MADV_DONTNEED, first, end - first)
                with self._cond:
                    digests[index] = digest
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - raised by digest() in the reading thread
            with self._cond:
                self._error = e
        finally:
            with self._cond:
                self._stopped.set()
                self._cond.notify_all()
            self._forget()

    def digest(self, index: int) -> str | None:
        """The xxh3_64 hex digest of record batch ``index``'s bytes, once hashed; None if this
        verifier will not hash it (the caller hashes it)."""
        if os.getpid() != self._pid:
            return None
        with self._cond:
            self._note(index)
            if self._digests[index] is None and not self._stopped.is_set():
                self._asked.add(index)
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._digests[index] is not None or
                                    self._stopped.is_set())
            if self._digests[index] is not None:
                return self._digests[index]
            if self._error is not None:
                raise self._error
        return None

    def _note(self, index: int) -> None:
        """Record that ``index`` was asked for; the read stops being sequential once more than
        :data:`SLACK` batches between the first and the furthest asked for were never asked
        for (called holding the lock)."""
        if self._wanted[index]:
            return
        self._wanted[index] = True
        self._count += 1
        self._first = index if self._first < 0 else min(self._first, index)
        self._furthest = max(self._furthest, index)
        if self._furthest - self._first + 1 - self._count > SLACK:
            self._sequential = False

    def abandon(self) -> None:
        """Stop hashing, without waiting."""
        with self._cond:
            self._stopped.set()
            self._cond.notify_all()

    def stop(self) -> None:
        """Stop hashing and wait for the thread (it finishes the record batch it is on)."""
        self.abandon()
        if self._pid == os.getpid() and self._thread is not threading.current_thread():
            self._thread.join()


def open_sequential(reader: "SnapshotReader", shard: ShardInfo, *, low_memory: bool = False,
                    ahead: bool = False) -> "BatchedShard | ShardFile":
    """``shard`` opened for reading its record batches in order: batch by batch
    (:class:`BatchedShard`) when it is a shard on local disk whose record batches the manifest
    indexes, else whole (:meth:`SnapshotReader.open_shard
    <snapcache.store.reader.SnapshotReader.open_shard>`): remote shards come whole through
    the node-local cache, and shards written before the index existed have no batch checksums.

    Batch by batch, the consumer takes the first record batches while the rest of the shard is
    read, and compressed record batches decode in parallel; a shard read whole is hashed in
    full before its first batch is decoded (``benchmarks/bench_cold.py`` compares both).

    ``ahead``: the caller will read the shard's record batches front to back (an unshuffled
    epoch): its verifier starts hashing them, front to back, as soon as it is opened, instead
    of once two record batches were asked for in order (see :class:`_Verifier`)."""
    if reader.storage.local and shard.batch_index and shard.batch_offsets is not None \
            and reader.schema is not None:
        return BatchedShard(reader, shard, low_memory=low_memory, ahead=ahead)
    if not reader.storage.local and reader.early.has_stream(shard):
        return StreamingShard(reader, shard, low_memory=low_memory)
    return reader.open_shard(shard, low_memory=low_memory)


class StreamingShard:
    """A remote shard streaming in for a read (:meth:`EarlyFetches.start
    <snapcache.store.early_fetch.EarlyFetches.start>`): each record batch comes from its bytes
    as soon as they have arrived, checked against its own checksum
    (:meth:`SnapshotReader.batch_from_bytes
    <snapcache.store.reader.SnapshotReader.batch_from_bytes>`), as a local shard's
    (:class:`BatchedShard`), while the rest of the shard is still downloading. If the shard
    comes otherwise (from the node-local cache, or its GET failed), from the whole shard,
    opened and checked whole (:meth:`~snapcache.store.reader.SnapshotReader.open_shard`). A
    read's first batch then waits for the bytes it needs, not for the whole shard. Same
    interface as :class:`~snapcache.store.shard_file.ShardFile`."""

    def __init__(self, reader: "SnapshotReader", shard: ShardInfo, *, low_memory: bool = False):
        self._reader, self._shard, self._low_memory = reader, shard, low_memory
        self.num_record_batches = len(shard.batch_rows)
        self._stream = reader.early.take_stream(shard)
        self._whole: Any = None
        self._lock = threading.Lock()

    def get_batch(self, index: int, whole: bool = True) -> pa.RecordBatch:
        stream = self._stream
        if stream is not None:
            start, end = self._shard.batch_offsets[index], self._shard.batch_offsets[index + 1]
            arrived = stream.wait_for(end)
            if arrived is not None:
                if stream.complete:  # every record batch comes from it: no whole shard held
                    self._reader.early.take_shard(self._shard)
                return self._reader.batch_from_bytes(self._shard, index, arrived[start:end],
                                                     whole=whole)
            log.debug("%s did not stream in; read whole", self._reader.where(self._shard))
            self._stream = None
        return self._open().get_batch(index, whole)

    def _open(self) -> Any:
        with self._lock:
            if self._whole is None:
                self._whole = self._reader.open_shard(self._shard, low_memory=self._low_memory)
            return self._whole


def supports_batched(schema: Schema | None, *, ragged: bool = False) -> bool:
    """True if every tensor field has one shape throughout the snapshot; with ``ragged``
    (a ``padded_batch`` will stack them), also when some vary: their columns are object
    arrays of the rows' arrays (:func:`as_columns`)."""
    if schema is None:
        return False
    return ragged or not any(f.varies for f in schema.fields)


def shard_order(shards: Sequence[ShardInfo], rng: np.random.Generator | None
                ) -> list[ShardInfo]:
    """The shards in manifest order, or permuted by ``rng`` (the per-epoch shard shuffle)."""
    if rng is None:
        return list(shards)
    return [shards[i] for i in rng.permutation(len(shards))]


def record_batches(reader: "SnapshotReader", shards: Sequence[ShardInfo], *, threads: int,
                   budget: int) -> Iterator[pa.RecordBatch]:
    """The record batches of ``shards`` in order, loaded, verified and decompressed by
    ``threads`` threads ahead of the consumer.

    What is held ahead is bounded by ``budget`` bytes: half for open shard files, half for
    decoded record batches (estimated from the manifest's raw sizes), and at least one of
    each so the reader always makes progress.
    """
    # A shard that is large against the budget is read in low-memory mode: its mapped pages
    # are dropped as it is hashed and decoded, instead of staying resident until it is done.
    low_memory = any(s.bytes > budget // 2 for s in shards)
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="snapcache-read")
    opening: collections.deque[tuple[ShardInfo, Future]] = collections.deque()
    decoding: collections.deque[tuple[Future, int, ShardInfo | None]] = collections.deque()
    todo = collections.deque(shards)
    open_bytes = 0
    decoded_bytes = 0
    current: tuple[ShardInfo, Any, int] | None = None  # shard, file reader, next batch index
    started = False
    try:
        while True:
            # Until the first batch is out, open one shard at a time: opening the next (hashing
            # all its bytes) would compete with decoding the first for the same cores.
            while todo and (open_bytes == 0 or (started and
                                                open_bytes + todo[0].bytes <= budget // 2)):
                shard = todo.popleft()
                opening.append((shard, pool.submit(open_sequential, reader, shard,
                                                   low_memory=low_memory, ahead=True)))
                open_bytes += shard.bytes
            while len(decoding) < 2 * max(1, threads) and (
                    not decoding or decoded_bytes < budget // 2):
                if current is None:
                    if not opening:
                        break
                    shard, future = opening[0]
                    if decoding and (not future.done() or future.exception() is not None):
                        break  # do not wait; a failed shard raises after the batches before it
                    opening.popleft()
                    file_reader = future.result()
                    current = (shard, file_reader, 0)
                shard, file_reader, index = current
                count = file_reader.num_record_batches
                if index >= count:  # an empty shard
                    current = None
                    open_bytes -= shard.bytes
                    continue
                estimate = (shard.raw_bytes or shard.bytes) // max(1, count)
                last = index + 1 == count
                task = _decode_releasing if low_memory else _decode
                decoding.append((pool.submit(task, reader, file_reader, index, shard), estimate,
                                 shard if last else None))
                decoded_bytes += estimate
                current = None if last else (shard, file_reader, index + 1)
            if not decoding:
                return
            future, estimate, finished = decoding.popleft()
            batch = future.result()
            decoded_bytes -= estimate
            if finished is not None:
                open_bytes -= finished.bytes
                reader.forget(finished)
            started = True
            yield batch
    finally:
        for _, future in opening:
            future.cancel()
        for future, _, _ in decoding:
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        # stop reading ahead in the shards opened (those still opening: when collected)
        opened = [current[1]] if current is not None else []
        opened += [f.result() for _, f in opening if f.done() and not f.cancelled()
                   and f.exception() is None]
        for file_reader in opened:
            getattr(file_reader, "close", lambda: None)()


def _decode(reader: "SnapshotReader", file_reader: Any, index: int, shard: ShardInfo
            ) -> pa.RecordBatch:
    return file_reader.get_batch(index)


def _decode_releasing(reader: "SnapshotReader", file_reader: Any, index: int,
                      shard: ShardInfo) -> pa.RecordBatch:
    batch = file_reader.get_batch(index)
    reader.release_pages(shard)
    return batch


def column_chunks(batches: Iterator[pa.RecordBatch], decoder: Decoder) -> Iterator[Columns]:
    """Each record batch as whole numpy columns; str/bytes fields as object arrays."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        yield as_columns(batch, decoder)


def as_columns(batch: pa.RecordBatch, decoder: Decoder) -> Columns:
    """One record batch as whole numpy columns; str/bytes fields, and tensor fields whose
    shape varies between rows, as object arrays (of the rows' arrays: also in a record batch
    whose rows happen to share one shape, so that columns of several concatenate)."""
    columns = decoder.columns(batch)
    for name, column in columns.items():
        if name in decoder.varying:
            if not isinstance(column, list) and column.dtype == object:
                continue
            columns[name] = np.fromiter(column, dtype=object, count=len(column))
        elif isinstance(column, list):
            array = np.empty(len(column), dtype=object)
            array[:] = column
            columns[name] = array
    return columns


def _rows(columns: Columns) -> int:
    return len(next(iter(columns.values())))


def _concat(pieces: list[Columns]) -> Columns:
    if len(pieces) == 1:
        return pieces[0]
    return {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}


def window_shuffle(chunks: Iterator[Columns], buffer_size: int, rng: np.random.Generator
                   ) -> Iterator[Columns]:
    """A buffer shuffle done on whole columns.

    Rows gather into a window of at least ``2 * buffer_size`` rows; the window is permuted,
    its first part emitted and its last ``buffer_size`` rows carried into the next window, so
    a row can travel arbitrarily far, as with a sliding shuffle buffer. Every row is emitted
    exactly once; memory holds about two windows.
    """
    carry: Columns | None = None
    pieces: list[Columns] = []
    rows = 0
    for chunk in chunks:
        pieces.append(chunk)
        rows += _rows(chunk)
        if rows < 2 * buffer_size:
            continue
        window = ([carry] if carry is not None else []) + pieces
        order = rng.permutation(sum(_rows(p) for p in window))
        emit, keep = order[:-buffer_size], order[-buffer_size:]
        yield _gather(window, emit)
        carry = _gather(window, keep)
        pieces, rows = [], buffer_size
    rest = ([carry] if carry is not None else []) + pieces
    if rest:
        yield _gather(rest, rng.permutation(sum(_rows(p) for p in rest)))


def _gather(pieces: list[Columns], order: np.ndarray) -> Columns:
    """Rows ``order`` of the pieces' concatenation, without building the concatenation:
    every row is copied once, straight into the result."""
    if len(pieces) == 1:
        return {name: column.take(order, axis=0) for name, column in pieces[0].items()}
    out = {name: np.empty((len(order), *column.shape[1:]), dtype=column.dtype)
           for name, column in pieces[0].items()}
    start = 0
    for piece in pieces:
        stop = start + _rows(piece)
        where = np.flatnonzero((order >= start) & (order < stop))
        if len(where):
            rows = order[where] - start
            for name, column in piece.items():
                out[name][where] = column[rows]
        start = stop
    return out


def cut_batches(chunks: Iterator[Columns], batch_size: int, drop_remainder: bool = False
                ) -> Iterator[Columns]:
    """Batches of ``batch_size`` rows: slices of a chunk when they fit in it, else one
    concatenation of the pieces."""
    pending: list[Columns] = []
    pending_rows = 0
    for chunk in chunks:
        n = _rows(chunk)
        start = 0
        if pending:
            take = min(batch_size - pending_rows, n)
            pending.append({k: v[:take] for k, v in chunk.items()})
            pending_rows += take
            start = take
            if pending_rows < batch_size:
                continue
            yield _concat(pending)
            pending, pending_rows = [], 0
        while n - start >= batch_size:
            yield {k: v[start:start + batch_size] for k, v in chunk.items()}
            start += batch_size
        if start < n:
            pending.append({k: v[start:] for k, v in chunk.items()})
            pending_rows += n - start
    if pending and not drop_remainder:
        yield _concat(pending)


def as_structure(columns: Columns, schema: Schema) -> Any:
    """A batch of columns in the structure examples were written in (dict, tuple, single)."""
    if schema.structure == "dict":
        return columns
    values = [columns[f.name] for f in schema.fields]
    return tuple(values) if schema.structure == "tuple" else values[0]


def rows_of(columns: Columns, schema: Schema) -> Iterator[Any]:
    """The examples of a column chunk, one by one, as :meth:`Decoder.rows` would give them."""
    iterators = _field_values(columns, schema)
    if schema.structure == "single":
        return iterators[0]
    if schema.structure == "tuple":
        return zip(*iterators)
    names = [f.name for f in schema.fields]
    return (dict(zip(names, values)) for values in zip(*iterators))


def row_list(columns: Columns, schema: Schema) -> list:
    """``list(rows_of(columns, schema))``, made faster: dicts of up to three fields are built
    by a comprehension with the names as locals (half the time of ``dict(zip(...))`` a row,
    which a one-by-one read of small examples pays for every example)."""
    values = _field_values(columns, schema)
    names = [f.name for f in schema.fields]
    if schema.structure != "dict" or len(names) > 3:
        return list(rows_of(columns, schema))
    if len(names) == 1:
        (n0,), (v0,) = names, values
        return [{n0: a} for a in v0]
    if len(names) == 2:
        n0, n1 = names
        return [{n0: a, n1: b} for a, b in zip(*values)]
    n0, n1, n2 = names
    return [{n0: a, n1: b, n2: c} for a, b, c in zip(*values)]


def _field_values(columns: Columns, schema: Schema) -> list[Iterator[Any]]:
    """Per field, an iterator over its values as examples hold them."""
    iterators = []
    for spec in schema.fields:
        column = columns[spec.name]
        if spec.kind == "scalar" and spec.python or column.dtype == object:
            iterators.append(iter(column.tolist()))
        elif spec.kind == "tensor" and spec.ndim == 0:  # 0-d arrays stay 0-d arrays
            iterators.append(column[i, ...] for i in range(len(column)))
        else:
            iterators.append(iter(column))
    return iterators
