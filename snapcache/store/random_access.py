"""Rows read alone (``snap[i]``) from shards held for random access.

A first ``snap[i]`` reads only what its row needs: on local disk the pages holding it
(:mod:`snapcache.store.row_read`), remotely its record batch (one ranged GET). A warm random
read must not pay that again and again: a snapshot written with small record batches (a
configuration users pick for random access) makes most warm reads the first read of their
record batch. So a shard that keeps being read is *held*, and rows of a held shard are decoded
from it (:meth:`RowDecoder.decode <snapcache.store.row_read.RowDecoder.decode>`) without a
system call or a request:

- a raw local shard with page checksums is mapped read-only from its second row read alone in
  a handle on (its first is a few ``pread`` calls, cheaper than mapping it); a small one is
  checked whole against its checksum then, else each page is checked against its page
  checksum the first time a row uses it, then marked checked
  (:func:`~snapcache.store.row_read.map_shard`, :class:`~snapcache.store.row_read.Held`);
- a raw remote shard is fetched whole once its record batches read alone have cost what
  fetching it whole costs (:data:`REQUEST_BYTES`: each ranged read counts as its bytes plus
  the bytes one request is worth), through the node-local cache when one is configured (its
  locking, eviction and "never the only copy" rules apply as to any read), and verified
  against the shard's checksum before any row is decoded from it. Like renting before buying,
  a shard read only a few times is never fetched whole (a cold ``snap[i]`` stays one ranged
  GET), and one read often costs at most about twice what fetching it at once would have.

Held shards are bounded: :class:`HeldShards` keeps at most ``budget`` bytes of them (half the
read budget, :attr:`ReadOptions.prefetch_bytes <snapcache.store.options.ReadOptions>`) and
at most :data:`MAX_HELD` shards, least recently used dropped first; a shard larger than the
budget is never held (its rows are read alone as before). Dropping one never invalidates rows
handed out: they are views that keep their memory alive. A shard dropped starts counting its
ranged reads again.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

from snapcache.errors import CorruptSnapshotError
from snapcache.store.layout import pages_name
from snapcache.store.shard_file import way_out
from snapcache.store.row_read import Held, RowDecoder, load_pages, map_shard, read_row, \
    readable_alone

if TYPE_CHECKING:
    from snapcache.store.manifest import ShardInfo
    from snapcache.store.order import Layout
    from snapcache.store.reader import SnapshotReader

log = logging.getLogger(__name__)
NO_PAGES = object()  # a row read alone is not possible here: the caller reads its record batch
EAGER_PAGE_TABLES = 32
"""Snapshots of at most this many shards with page checksum files have them read when opened
(one small file each), so that a first ``snap[i]`` reads only its pages; larger ones read a
shard's page table when a row of it is first read (once per handle)."""
MAX_HELD = 64
"""Shards held at most, whatever their size: a mapped one keeps a file descriptor open."""
REQUEST_BYTES = 1 << 20
"""What one ranged read of a remote shard costs, in bytes of transfer: an object store's
time to first byte (10-30 ms on S3) is what 1-3 MB take to arrive on one connection, and on
the loopback server a 64 KiB ranged GET takes about what a 1 MiB one does. A remote shard is
fetched whole once its ranged reads have cost its size (:class:`RemoteRows`)."""


class HeldShards:
    """Shards held for row reads (:class:`~snapcache.store.row_read.Held`), at most
    ``budget`` bytes and :data:`MAX_HELD` shards of them, least recently used dropped first;
    safe to share by threads (one shard is made once even when several threads ask for it)."""

    def __init__(self, budget: int):
        self.budget, self.most = budget, MAX_HELD
        self._held: collections.OrderedDict[int, tuple[Held, int, Callable[[], None] | None]] = \
            collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._making: dict[int, threading.Lock] = collections.defaultdict(threading.Lock)

    def __len__(self) -> int:
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def fits(self, size: int) -> bool:
        return size <= self.budget

    def get(self, index: int) -> Held | None:
        with self._lock:
            entry = self._held.get(index)
            if entry is None:
                return None
            self._held.move_to_end(index)
            return entry[0]

    def hold(self, index: int, size: int, make: Callable[[], Held],
             dropped: Callable[[], None] | None = None) -> Held:
        """Shard ``index`` (``size`` bytes, at most the budget), made by ``make`` unless held;
        the least recently used others are dropped to stay within the budget (``dropped``
        is called when this one is)."""
        with self._lock:
            lock = self._making[index]
        with lock:
            held = self.get(index)
            if held is not None:
                return held
            held = make()
            gone = []
            with self._lock:
                self._held[index] = (held, size, dropped)
                self._bytes += size
                while (self._bytes > self.budget or len(self._held) > self.most) and \
                        len(self._held) > 1:
                    _, (_, bytes_, callback) = self._held.popitem(last=False)
                    self._bytes -= bytes_
                    gone.append(callback)
            for callback in gone:
                if callback is not None:
                    callback()
            return held


class _RowsAlone:
    """What both kinds of rows read alone share: the row decoder compiled from the schema, the
    record batches' first rows, and which (shard, record batch) each block is."""

    def __init__(self, reader: "SnapshotReader", layout: "Layout", usable: list[bool],
                 held: HeldShards):
        self.reader, self.held, self.usable = reader, held, usable
        self.decoder = RowDecoder(reader.schema)  # type: ignore[arg-type]
        self.starts = layout.start.tolist()
        self._shard, self._batch = layout.shard.tolist(), layout.batch.tolist()

    def key(self, block: int) -> tuple[int, int] | None:
        """(shard, record batch) of ``block`` if its rows can be read alone here, else None."""
        shard, batch = self._shard[block], self._batch[block]
        return (shard, batch) if batch >= 0 and self.usable[shard] else None


class PageRows(_RowsAlone):
    """The rows read alone from raw local shards with page checksums: a shard's first row read
    alone in a handle reads only its pages (``pread``), later ones decode from the shard
    mapped and held (see the module docstring). Everything that does not depend on the row is
    prepared when the snapshot is opened: the row decoder compiled from the schema, the record
    batches' first rows, shards and indexes as lists, and the shards' page tables when there
    are few (:data:`EAGER_PAGE_TABLES`)."""

    def __init__(self, reader: "SnapshotReader", layout: "Layout", usable: list[bool],
                 held: HeldShards):
        super().__init__(reader, layout, usable, held)
        self.paths = [reader.storage.full(shard.path) if ok else ""  # "": not page by page
                      for shard, ok in zip(reader.manifest.shards, usable)]
        self.tables: dict[int, Any] = {}  # shard -> its verified page table, or NO_PAGES
        self.read_once: set[int] = set()  # shards a row was read alone from (by pread)
        if reader.verify and sum(usable) <= EAGER_PAGE_TABLES:
            for index, ok in enumerate(usable):  # read now: a first row then reads its pages
                if ok:
                    try:
                        self._table(index)
                    except CorruptSnapshotError:
                        pass  # said by the first read of a row of that shard

    @classmethod
    def of(cls, reader: "SnapshotReader", layout: "Layout", held: HeldShards
           ) -> "PageRows | None":
        """For ``reader``'s snapshot if any of its shards can be read that way, else None."""
        if reader.schema is None or not reader.storage.local:
            return None
        usable = [readable_alone(shard, True) for shard in reader.manifest.shards]
        return cls(reader, layout, usable, held) if any(usable) else None

    def read(self, key: tuple[int, int], k: int) -> Any:
        """Row ``k`` of record batch ``key``, or NO_PAGES if its shard's page checksum file
        is missing or damaged (the row is then read with its record batch)."""
        index, batch = key
        reader = self.reader
        shard = reader.manifest.shards[index]
        table = self._table(index) if reader.verify else None
        if table is NO_PAGES:
            return NO_PAGES
        path = self.paths[index]
        held = self.held.get(index)
        if held is None:
            if index in self.read_once and self.held.fits(shard.bytes):
                return read_row(self.decoder, path, shard, batch, k, table=table,
                                names=lambda: (reader.where(shard), way_out(reader.storage)),
                                held=lambda: self.held.hold(
                                    index, shard.bytes, lambda: map_shard(path, shard, table)))
            self.read_once.add(index)
        return read_row(self.decoder, path, shard, batch, k, table=table,
                        names=lambda: (reader.where(shard), way_out(reader.storage)),
                        held=None if held is None else lambda: held)

    def _table(self, index: int) -> Any:
        table = self.tables.get(index)
        if table is None:
            shard, reader = self.reader.manifest.shards[index], self.reader
            table = load_pages(self.paths[index], shard,
                               lambda: (reader.where(shard), way_out(reader.storage)))
            if table is None:
                log.warning("%s: its page checksum file %s is missing or damaged; its rows are "
                            "read with their record batches", reader.where(shard),
                            pages_name(self.paths[index]))
                table = NO_PAGES
            self.tables[index] = table
        return table


def fetchable_whole(shard: "ShardInfo") -> bool:
    """Whether rows of the remote ``shard`` can be decoded from it fetched whole: a raw shard
    whose manifest entry indexes its record batches."""
    return shard.compression == "none" and shard.batch_checksums is not None \
        and shard.batch_rows is not None and shard.batch_offsets is not None


class RemoteRows(_RowsAlone):
    """The rows read alone from raw remote shards once held: each of a shard's record batches
    read alone (a ranged read, by the caller) adds its bytes plus :data:`REQUEST_BYTES` to
    what the shard has cost; a row asked for once that reaches the shard's size fetches it
    whole (:meth:`SnapshotReader.verified_shard
    <snapcache.store.reader.SnapshotReader.verified_shard>`: verified against its checksum,
    through the node-local cache if configured) and holds it; rows of held shards are decoded
    from it. Shards larger than the held budget are never held."""

    def __init__(self, reader: "SnapshotReader", layout: "Layout", usable: list[bool],
                 held: HeldShards):
        super().__init__(reader, layout, usable, held)
        self.paths = [reader.storage.url_of(shard.path) if ok else ""
                      for shard, ok in zip(reader.manifest.shards, usable)]
        self.spent = [0] * len(usable)  # bytes' worth of ranged reads, by shard
        self._lock = threading.Lock()

    @classmethod
    def of(cls, reader: "SnapshotReader", layout: "Layout", held: HeldShards
           ) -> "RemoteRows | None":
        if reader.schema is None or reader.storage.local:
            return None
        usable = [fetchable_whole(shard) and held.fits(shard.bytes)
                  for shard in reader.manifest.shards]
        return cls(reader, layout, usable, held) if any(usable) else None

    def read(self, key: tuple[int, int], k: int) -> Any:
        """Row ``k`` of record batch ``key`` from its held shard, fetched now if it has cost
        enough; NO_PAGES (counting the ranged read the caller then makes) if not held."""
        index, batch = key
        reader = self.reader
        shard = reader.manifest.shards[index]
        held = self.held.get(index)
        if held is None:
            with self._lock:
                spent = self.spent[index]
                if spent < shard.bytes:
                    self.spent[index] = spent + REQUEST_BYTES + \
                        shard.batch_offsets[batch + 1] - shard.batch_offsets[batch]  # type: ignore
                    return NO_PAGES
        return read_row(self.decoder, self.paths[index], shard, batch, k, table=None,
                        names=lambda: (reader.where(shard), way_out(reader.storage)),
                        held=lambda: held or self.held.hold(
                            index, shard.bytes,
                            lambda: Held(reader.verified_shard(shard), shard, None),
                            dropped=lambda: self._dropped(index)))

    def _dropped(self, index: int) -> None:
        """Shard ``index`` is no longer held: its ranged reads count from nothing again (a
        shard dropped for others is not fetched again at its next row)."""
        with self._lock:
            self.spent[index] = 0

    def held_batch(self, index: int) -> Callable[[int], Any]:
        """What gives the bytes of a record batch of shard ``index`` if the shard is held (a
        second row of it decodes the batch from there: no request), else None."""
        shard = self.reader.manifest.shards[index]

        def batch_bytes(batch: int) -> Any:
            held = self.held.get(index)
            if held is None:
                return None
            return held.view[shard.batch_offsets[batch]:shard.batch_offsets[batch + 1]]
        return batch_bytes
