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
import mmap
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import xxhash

from snapcache.errors import CorruptSnapshotError
from snapcache.machine import available_cpus, memory_budget
from snapcache.store.codec import Decoder, Schema
from snapcache.store.manifest import ShardInfo

if TYPE_CHECKING:
    from snapcache.store.reader import ShardFile, SnapshotReader

Columns = dict  # field name -> numpy array, all of one length


def read_budget(threads: int | None, budget: int | None) -> tuple[int, int]:
    """Resolve a reader's thread count and prefetch bytes; None means "from the machine"."""
    return threads or available_cpus(), budget or memory_budget()


class BatchedShard:
    """A compressed local shard read record batch by record batch: each record batch's bytes (a
    slice of the file's memory map) are checked against its checksum in the manifest, decoded
    with the manifest's schema and validated (:meth:`SnapshotReader.batch_from_bytes
    <snapcache.store.reader.SnapshotReader.batch_from_bytes>`) when it is asked for, so that
    reading, verifying and decompressing the record batches of one shard run in parallel on
    the read threads and overlap with the consumer, instead of the whole file being hashed
    before its first batch is decoded. No byte of a record batch is used before its checksum
    matched.

    Opening maps the file (its size must be the manifest's) and reads nothing. The bytes
    outside the record batches (the file's header and footer) are not used, so not read;
    ``snapcache verify`` checks the whole file's checksum. ``low_memory``: once a record batch
    is decoded, its pages and those before it are dropped from this process (decoded values
    are fresh memory, never views of the map), so that resident memory stays within the
    prefetch budget however large the shard. Same interface as
    :class:`~snapcache.store.reader.ShardFile`."""

    def __init__(self, reader: "SnapshotReader", shard: ShardInfo, *, low_memory: bool = False):
        self._reader, self._shard, self._low_memory = reader, shard, low_memory
        self._in_order = threading.Lock()
        self.num_record_batches = len(shard.batch_rows or ())
        self.schema = reader._arrow_schema
        # mapped (a local shard), a missing or resized file a CorruptSnapshotError
        self._buffer, self._map = reader._load(shard, reader.where(shard))

    def get_batch(self, index: int) -> pa.RecordBatch:
        start, end = self._shard.batch_offsets[index], self._shard.batch_offsets[index + 1]
        data = self._buffer.slice(start, end - start)
        digest = None
        if self._reader.verify:
            # Hashing faults the file's pages in. One thread at a time, in the order the batches
            # were asked for: the kernel's readahead then sees one sequential reader (threads
            # faulting in different parts of one map at once cost much more CPU and time on a
            # cold disk); decoding, the CPU-heavy part, runs in parallel.
            with self._in_order:
                digest = xxhash.xxh3_64(memoryview(data)).hexdigest()
        batch = self._reader.batch_from_bytes(self._shard, index, data, digest=digest)
        if self._low_memory and self._map is not None:
            # this batch's pages and those of the batches before it (hashed on other threads)
            self._map.madvise(mmap.MADV_DONTNEED, 0, end)
        return batch


def open_sequential(reader: "SnapshotReader", shard: ShardInfo, *, low_memory: bool = False
                    ) -> "BatchedShard | ShardFile":
    """``shard`` opened for reading its record batches in order: batch by batch
    (:class:`BatchedShard`) when it is a compressed shard on local disk whose record batches
    the manifest indexes, else whole (:meth:`SnapshotReader.open_shard
    <snapcache.store.reader.SnapshotReader.open_shard>`).

    Why not always: remote shards come whole through the node-local cache; shards written
    before the index existed have no batch checksums; and an uncompressed shard has nothing
    to decode in parallel (its batches are views of the file), so what bounds its read is the
    disk, which one sequential hash of the whole file drives best: read batch by batch it
    measured up to ~40% slower on a cold disk (``benchmarks/bench_cold.py``, the image rows:
    the whole-shard column), though its first batch comes ~10 ms sooner."""
    if reader.storage.local and shard.batch_index and shard.batch_offsets is not None \
            and reader.schema is not None and shard.compression in ("lz4", "zstd"):
        return BatchedShard(reader, shard, low_memory=low_memory)
    return reader.open_shard(shard, low_memory=low_memory)


def supports_batched(schema: Schema | None) -> bool:
    """True if every tensor field has one shape throughout the snapshot."""
    if schema is None:
        return False
    return all(f.kind != "tensor" or (f.shape is not None and None not in f.shape)
               for f in schema.fields)


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
                                                   low_memory=low_memory)))
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
    """One record batch as whole numpy columns; str/bytes fields as object arrays."""
    columns = decoder.columns(batch)
    for name, column in columns.items():
        if isinstance(column, list):
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
    iterators = []
    for spec in schema.fields:
        column = columns[spec.name]
        if spec.kind == "scalar" and spec.python or column.dtype == object:
            iterators.append(iter(column.tolist()))
        elif spec.kind == "tensor" and spec.ndim == 0:  # 0-d arrays stay 0-d arrays
            iterators.append(column[i, ...] for i in range(len(column)))
        else:
            iterators.append(iter(column))
    if schema.structure == "single":
        return iterators[0]
    if schema.structure == "tuple":
        return zip(*iterators)
    names = [f.name for f in schema.fields]
    return (dict(zip(names, values)) for values in zip(*iterators))
