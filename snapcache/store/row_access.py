"""Random access to the rows of a committed snapshot (:class:`RowAccess`): ``rows[i]`` and
``rows.take(indices)`` over the record batches of its shards, read page by page, alone or whole
(:mod:`snapcache.store.row_read`, :mod:`snapcache.store.random_access`), decoded with the
ordered reader's :class:`~snapcache.store.ordered_read.BlockDecoder`."""

from __future__ import annotations

import bisect
import collections
import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from snapcache.store.batched_read import read_budget
from snapcache.store.ordered_read import BlockDecoder, layout_of
from snapcache.store.random_access import NO_PAGES, HeldShards, PageRows, RemoteRows

if TYPE_CHECKING:
    from snapcache.store.reader import SnapshotReader

WHOLE_AFTER = 64
"""Rows of a record batch read alone (:mod:`snapcache.store.random_access`) before the next
one decodes the batch whole and keeps it (a later row is then an index): decoding a record
batch with Arrow and validating it costs ~300 us (16 or 256 rows a batch alike), a row then
~6 us; a row read alone from a held shard ~10 us once its batch's metadata is parsed (~20 us
the first time), ~50 us page by page. So a batch read rarely is never decoded, and one read
often costs at most about 1.5x what decoding it at once would have."""


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
