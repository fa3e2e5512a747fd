"""Reading a committed snapshot back.

Readers trust nothing but the manifest, and the manifest only as far as the files agree with it:
each shard's size and xxh3 checksum are checked (checksum unless ``verify=False``) before any
of its examples is yielded, and its row count and Arrow schema must match; where the manifest
indexes a shard's record batches, a batch read alone (random access; sequential reads of
local shards: :class:`~snapcache.store.batched_read.BatchedShard`; the first shard of a fresh
read on S3 as it streams in: :class:`~snapcache.store.batched_read.StreamingShard`) is checked
against its own checksum and decoded with the manifest's schema instead. Every record batch
is validated in full (offsets monotonic and inside their buffers, UTF-8 valid) before it is
handed out, with or without ``verify``: a checksum only proves the bytes are the ones the
manifest names, not that they are safe to index (a crafted shard with a matching checksum, or
damage with ``verify=False``, would otherwise read outside its buffers). Any damage surfaces as
:class:`CorruptSnapshotError` naming the shard and what to do.
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import pyarrow as pa
import xxhash

from snapcache import lifecycle
from snapcache.errors import CorruptSnapshotError
from snapcache.store.cache import ShardCache, shared_cache
from snapcache.store.decoder import Decoder
from snapcache.store.early_fetch import EarlyFetches
from snapcache.store.fs import Storage
from snapcache.store.manifest import Manifest, ShardInfo, load_manifest
from snapcache.store.options import ReadOptions
from snapcache.store.schema import Schema
from snapcache.store.shard_file import DAMAGE, ShardFile, about_shard, way_out
from snapcache.store.validate import BatchValidator

if TYPE_CHECKING:
    from snapcache.store.streamed import Streamed


log = logging.getLogger(__name__)

_READ_OPTIONS = pa.ipc.IpcReadOptions(use_threads=False)
_CHUNK = 16 << 20  # a multiple of every page size
PREFETCH_THREADS = 4
"""Shards :meth:`SnapshotReader.prefetch` copies at once."""
PREFETCH_START_TIMEOUT = 10.0
"""Seconds :meth:`SnapshotReader.prefetch` waits at most for its first copies to start."""


def checksum(buffer: Any, mapped: mmap.mmap | None = None) -> str:
    """``xxh3_64:<hex>`` of ``buffer``. With its memory map, hash in chunks and drop each
    chunk's pages from this process once hashed (the page cache keeps them), so verifying a
    large shard does not make it resident."""
    if mapped is None:
        return "xxh3_64:" + xxhash.xxh3_64(memoryview(buffer)).hexdigest()
    digest = xxhash.xxh3_64()
    view = memoryview(buffer)
    for offset in range(0, len(view), _CHUNK):
        digest.update(view[offset:offset + _CHUNK])
        mapped.madvise(mmap.MADV_DONTNEED, offset, min(_CHUNK, len(view) - offset))
    return "xxh3_64:" + digest.hexdigest()


class SnapshotReader:
    """Iterates the examples of a committed snapshot, shard by shard.

    Example::

        reader = SnapshotReader.open(Storage("/tmp/snaps").child(fingerprint))
        for example in reader:
            ...
    """

    def __init__(self, storage: Storage, manifest: Manifest, *, verify: bool = True,
                 read_ahead: int = 2, prefetch_bytes: int | None = None,
                 read_threads: int | None = None, cache: ShardCache | None = None):
        """``prefetch_bytes``: bytes held ahead of the consumer while reading (None: sized from
        the machine's memory); ``read_threads``: threads loading, verifying and decompressing
        shards (None: the usable CPUs); ``cache``: a local copy of remote shards
        (``snapshot(..., local_cache=DIR)``), unused on local disk."""
        self.storage = storage
        self.manifest = manifest
        self.verify = verify
        self.read_ahead = max(0, read_ahead)
        self.prefetch_bytes = prefetch_bytes
        self.read_threads = read_threads
        self.cache = cache
        self.schema = Schema.from_json(manifest.schema) if manifest.schema is not None else None
        self._decoder = Decoder(self.schema) if self.schema is not None else None
        self._arrow_schema = self.schema.arrow_schema() if self.schema is not None else None
        self._validator = BatchValidator(self.schema) if self.schema is not None else None
        self._maps: dict[str, mmap.mmap] = {}   # low-memory shards being read
        self._filler: _CacheFiller | None = None
        self.early = EarlyFetches(self)  # remote shards fetched ahead of a fresh read

    @classmethod
    def open(cls, storage: Storage, **kwargs: Any) -> "SnapshotReader":
        manifest = load_manifest(storage)
        if manifest is None:
            raise FileNotFoundError(f"no committed snapshot at {storage.url}")
        return cls(storage, manifest, **kwargs)

    def __len__(self) -> int:
        return self.manifest.num_examples

    def __iter__(self) -> Iterator[Any]:
        return self.examples()

    def examples(self, shards: Sequence[ShardInfo] | None = None) -> Iterator[Any]:
        decoder = self._decoder
        for batch in self.record_batches(shards):
            yield from decoder.rows(batch)  # type: ignore[union-attr]

    def examples_range(self, start: int = 0, stop: int | None = None) -> Iterator[Any]:
        """The examples with global row numbers in ``[start, stop)``; shards outside the range
        are not read at all."""
        total = self.manifest.num_examples
        stop = total if stop is None else min(stop, total)
        if start <= 0 and stop >= total:
            yield from self.examples()
            return
        chosen, first_row, offset = [], None, 0
        for shard in self.manifest.shards:
            if offset < stop and offset + shard.rows > start:
                chosen.append(shard)
                first_row = offset if first_row is None else first_row
            offset += shard.rows
        if not chosen:
            return
        position = first_row
        decoder = self._decoder
        for batch in self.record_batches(chosen):
            lo, hi = max(start - position, 0), min(stop - position, batch.num_rows)
            position += batch.num_rows
            if hi > lo:
                part = batch if (lo, hi) == (0, batch.num_rows) else batch.slice(lo, hi - lo)
                yield from decoder.rows(part)  # type: ignore[union-attr]
            if position >= stop:
                return

    def record_batches(self, shards: Sequence[ShardInfo] | None = None
                       ) -> Iterator[pa.RecordBatch]:
        """Record batches of ``shards`` (default: all, in manifest order), each shard verified
        before its first batch is yielded. Shards load, verify and decompress on background
        threads, ahead of the consumer by at most ``prefetch_bytes``
        (see :mod:`snapcache.store.batched_read`)."""
        from snapcache.store.batched_read import read_budget, record_batches

        shards = list(self.manifest.shards if shards is None else shards)
        if not shards:
            return iter(())
        threads, budget = read_budget(self.read_threads, self.prefetch_bytes)
        return record_batches(self, shards, threads=threads, budget=budget)

    def columns(self, shards: Sequence[ShardInfo] | None = None) -> Iterator[dict[str, Any]]:
        """The decoded columns (``{field: array or list}``) of each record batch of ``shards``,
        verified like :meth:`record_batches`."""
        decoder = self._decoder
        for batch in self.record_batches(shards):
            yield decoder.columns(batch)  # type: ignore[union-attr]

    @about_shard
    def open_shard(self, shard: ShardInfo, *, verify: bool | None = None,
                   low_memory: bool = False) -> ShardFile:
        """Load one shard and check it against the manifest (bytes, checksum, rows, record
        batches, schema); raise CorruptSnapshotError if not.

        ``low_memory``: a local shard's pages are dropped from this process as soon as they are
        hashed, and again by :meth:`release_pages` as its batches are decoded, so that resident
        memory stays within the prefetch budget even when one shard is larger than it.
        """
        return self._opened(shard, self.verify if verify is None else verify, low_memory)[1]

    def _opened(self, shard: ShardInfo, verify: bool, low_memory: bool
                ) -> tuple[pa.Buffer, ShardFile]:
        """(the shard's bytes, the shard opened from them): :meth:`open_shard`'s work."""
        where = self.where(shard)
        buffer = self._verified(shard, where, verify, low_memory)
        try:
            # Our own threads decode batches in parallel; Arrow's would only oversubscribe.
            reader = pa.ipc.open_file(buffer, options=_READ_OPTIONS)
            rows = reader.count_rows()
        except DAMAGE as e:
            raise CorruptSnapshotError(f"{where} is not a readable Arrow file "
                                       f"({type(e).__name__}: {e}). {way_out(self.storage)}"
                                       ) from None
        if rows != shard.rows:
            raise CorruptSnapshotError(f"{where} has {rows} rows, the manifest says "
                                       f"{shard.rows}. {way_out(self.storage)}")
        if shard.batch_rows is not None and reader.num_record_batches != len(shard.batch_rows):
            raise CorruptSnapshotError(
                f"{where} has {reader.num_record_batches} record batches, the manifest lists "
                f"{len(shard.batch_rows)}. {way_out(self.storage)}")
        if self._arrow_schema is not None and not reader.schema.equals(self._arrow_schema):
            raise CorruptSnapshotError(f"{where} does not have the manifest's schema. "
                                       f"{way_out(self.storage)}")
        return buffer, ShardFile(reader, self._validator, where, way_out(self.storage),
                                 shard.path)

    @about_shard
    def verified_shard(self, shard: ShardInfo) -> pa.Buffer:
        """The bytes of ``shard``, whole, checked against the manifest's checksum (unless
        ``verify=False``): remote shards through the node-local cache when one is configured,
        else one GET; CorruptSnapshotError naming the shard if they do not match."""
        return self._verified(shard, self.where(shard), self.verify, False)

    def _verified(self, shard: ShardInfo, where: str, verify: bool, low_memory: bool
                  ) -> pa.Buffer:
        buffer, mapped = self._load(shard, where)
        if low_memory and mapped is not None:
            self._maps[shard.path] = mapped
        if verify:
            actual = checksum(buffer, mapped if low_memory else None)
            if actual != shard.checksum and self.cached:
                # The local copy may be what is damaged: drop it and check the original.
                self.cache.discard(self._cache_key(shard))
                buffer, mapped = self._load(shard, where)
                actual = checksum(buffer)
            if actual != shard.checksum:
                raise CorruptSnapshotError(
                    f"{where} is corrupt: checksum {actual} != {shard.checksum} in the manifest. "
                    f"{way_out(self.storage)}")
        return buffer

    @about_shard
    def read_batch(self, shard: ShardInfo, index: int, *, whole: bool = True
                   ) -> pa.RecordBatch:
        """Record batch ``index`` of ``shard`` alone, for random access: only its bytes are
        read (a ranged GET on object stores, one read locally) and checked against the
        manifest's checksum of that batch, then validated and its rows counted, as a whole
        shard is before any of its rows is used. ``whole=False``: validated but for the
        tensors' shapes, which :meth:`check_batch` or decoding a row
        (:meth:`~snapcache.store.decoder.Decoder.row_at`) checks. Needs the shard's batch index
        (:attr:`ShardInfo.batch_index`) and a schema."""
        shard_where = self.where(shard)
        where = f"{shard_where} record batch {index}"
        if not shard.batch_index or self._arrow_schema is None:
            raise ValueError(f"{where}: the manifest has no checksum of this record batch; "
                             "read the shard whole (open_shard)")
        start, end = shard.batch_offsets[index], shard.batch_offsets[index + 1]
        data, cached = self._batch_bytes(shard, start, end, where)
        digest = xxhash.xxh3_64(memoryview(data)).hexdigest() if self.verify else None
        if cached and digest is not None and digest != shard.batch_checksums[index]:
            self.cache.discard(self._cache_key(shard))  # the local copy may be what is bad
            data, _ = self._batch_bytes(shard, start, end, where, use_cache=False)
            digest = None
        return self.batch_from_bytes(shard, index, data, whole=whole, digest=digest)

    @about_shard
    def batch_from_bytes(self, shard: ShardInfo, index: int, data: Any, *, whole: bool = True,
                         digest: str | None = None, verify: bool | None = None
                         ) -> pa.RecordBatch:
        """Record batch ``index`` of ``shard`` from its bytes ``data`` (``[batch_offsets[index],
        batch_offsets[index + 1])`` of the file): checked against the manifest's checksum of
        that batch (unless ``verify=False``, by default the reader's; ``digest``: the xxh3_64
        hex digest of ``data`` if the caller took it), decoded with the manifest's schema, its
        rows counted and validated (``whole``: as :meth:`read_batch`); CorruptSnapshotError
        naming the shard and the record batch if any of it fails."""
        shard_where = self.where(shard)
        where = f"{shard_where} record batch {index}"
        if self.verify if verify is None else verify:
            actual = digest or xxhash.xxh3_64(memoryview(data)).hexdigest()
            if actual != shard.batch_checksums[index]:
                raise CorruptSnapshotError(
                    f"{where} is corrupt: checksum {actual} != {shard.batch_checksums[index]} "
                    f"in the manifest. {way_out(self.storage)}")
        try:
            message = pa.ipc.read_message(pa.py_buffer(data))
            if message.type != "record batch":
                raise ValueError(f"an IPC {message.type} message where a record batch belongs")
            batch = pa.ipc.read_record_batch(message, self._arrow_schema)
        except DAMAGE as e:
            raise CorruptSnapshotError(f"{where} is damaged ({type(e).__name__}: {e}). "
                                       f"{way_out(self.storage)}") from None
        if batch.num_rows != shard.batch_rows[index]:
            raise CorruptSnapshotError(
                f"{where} has {batch.num_rows} rows, the manifest says "
                f"{shard.batch_rows[index]}. {way_out(self.storage)}")
        return ShardFile.checked(batch, index, self._validator, shard_where,
                                 way_out(self.storage), structure_only=not whole)

    @about_shard
    def row_at(self, shard: ShardInfo, index: int, batch: pa.RecordBatch, k: int) -> Any:
        """Example ``k`` of ``batch`` (record batch ``index`` of ``shard``, read with
        ``whole=False``), decoded alone and checked (:meth:`Decoder.row_at
        <snapcache.store.decoder.Decoder.row_at>`)."""
        try:
            return self._decoder.row_at(batch, k)  # type: ignore[union-attr]
        except CorruptSnapshotError as e:
            raise CorruptSnapshotError(f"{self.where(shard)} is corrupt: record batch {index}: "
                                       f"{e}. {way_out(self.storage)}") from None

    def _fill_cache(self, shard: ShardInfo) -> None:
        if self._filler is None:
            self._filler = _CacheFiller(self)
        self._filler.fill(shard)

    def prefetch(self, shards: Sequence[ShardInfo], *, started: int = 1,
                 timeout: float = PREFETCH_START_TIMEOUT) -> bool:
        """Copy ``shards`` that are not in the node-local cache yet into it, in this order, on
        background threads, for ``started`` readers about to read them (a DataLoader's
        workers: one that needs a shard being copied waits for the copy rather than fetching
        it again); as far as half the cache's limit, at most :data:`PREFETCH_THREADS` at once
        (each copy is held in memory whole). Returns once the first copies hold their shards'
        locks (or ``timeout`` seconds), so that readers starting now find them under way. True
        if the readers will fetch nothing themselves: every shard in the cache or on its way,
        one copy started for each reader; False without a node-local cache."""
        if not self.cached:
            return False
        assert self.cache is not None
        threads = min(max(1, started), PREFETCH_THREADS)
        room, first, queued = self.cache.limit_bytes // 2, [], 0
        for shard in shards:
            if self.cache.peek(self._cache_key(shard), shard.bytes) is not None:
                continue
            queued += 1
            room -= shard.bytes
            if room < 0:
                return False
            if self._filler is None:
                self._filler = _CacheFiller(self, threads=threads)
            event = self._filler.fill(shard)
            if event is not None and len(first) < threads:
                first.append(event)
        deadline = time.monotonic() + timeout
        for event in first:
            event.wait(max(0.0, deadline - time.monotonic()))
        return queued <= threads or started <= threads

    def wait_for_cache(self, timeout: float | None = None) -> bool:
        """Wait until the shards being copied into the node-local cache in the background
        (after a record batch of them was read alone) are there; False on timeout."""
        return self._filler is None or self._filler.wait(timeout)

    @about_shard
    def check_batch(self, shard: ShardInfo, index: int, batch: pa.RecordBatch
                    ) -> pa.RecordBatch:
        """``batch`` (record batch ``index`` of ``shard``, read with ``whole=False``) with its
        tensors' shapes validated too."""
        return ShardFile.checked(batch, index, self._validator, self.where(shard),
                                 way_out(self.storage))

    def _batch_bytes(self, shard: ShardInfo, start: int, end: int, where: str, *,
                     use_cache: bool = True) -> tuple[Any, bool]:
        """(bytes ``[start, end)`` of ``shard``, whether they came from the node-local cache)."""
        try:
            if use_cache and self.cached:
                copy = self.cache.peek(self._cache_key(shard), shard.bytes)
                if copy is not None:
                    return copy.slice(start, end - start), True
            data = self.storage.read_range(shard.path, start, end)
            if self.cached:  # later record batches of it: from the local copy
                self._fill_cache(shard)
        except FileNotFoundError:
            raise CorruptSnapshotError(f"{where}: the shard is missing "
                                       f"({self.storage.url_of(shard.path)}). "
                                       f"{way_out(self.storage)}") from None
        if len(data) != end - start:
            raise CorruptSnapshotError(f"{where}: the shard is shorter than the manifest says. "
                                       f"{way_out(self.storage)}")
        return data, False

    def in_cache(self, shard: ShardInfo) -> bool:
        """Whether remote ``shard`` is in the node-local cache now."""
        return self.cached and self.cache.peek(  # type: ignore[union-attr]
            self._cache_key(shard), shard.bytes) is not None

    def where(self, shard: ShardInfo) -> str:
        """How errors name ``shard``: ``snapshot <id> shard '<path>'``."""
        return f"snapshot {self.manifest.fingerprint[:12]} shard {shard.path!r}"

    @property
    def cached(self) -> bool:
        """Whether remote shards go through the node-local cache (never on local disk)."""
        return self.cache is not None and not self.storage.local

    def _cache_key(self, shard: ShardInfo) -> str:
        return f"{self.manifest.fingerprint}/{shard.path}"

    def release_pages(self, shard: ShardInfo) -> None:
        """Drop a low-memory shard's resident pages from this process. Always safe: the map is
        read-only and file-backed, so pages still in use fault back in from the page cache."""
        mapped = self._maps.get(shard.path)
        if mapped is not None:
            mapped.madvise(mmap.MADV_DONTNEED)

    def forget(self, shard: ShardInfo) -> None:
        self._maps.pop(shard.path, None)

    def _load(self, shard: ShardInfo, where: str) -> tuple[pa.Buffer, mmap.mmap | None]:
        mapped = None
        try:
            early = self.early.take_shard(shard)
            if early is not None:
                buffer = early.result()
            elif self.storage.local:
                buffer, mapped = self.storage.map_file(shard.path, shard.bytes)
            else:
                buffer = self.fetch_shard(shard)
        except FileNotFoundError:
            raise CorruptSnapshotError(f"{where} is missing ({self.storage.url_of(shard.path)}). "
                                       f"{way_out(self.storage)}") from None
        if buffer.size != shard.bytes:
            raise CorruptSnapshotError(
                f"{where} has {buffer.size} bytes, the manifest says {shard.bytes}. "
                f"{way_out(self.storage)}")
        return buffer, mapped

    @about_shard
    def fetch_shard(self, shard: ShardInfo, into: "Streamed | None" = None) -> pa.Buffer:
        """A remote shard's bytes: through the node-local cache if there is one. ``into``: its
        bytes taken as they stream in, if it is downloaded now (see :meth:`Storage.read_bytes
        <snapcache.store.fs.Storage.read_bytes>`)."""
        def fetch() -> Any:
            return self.storage.read_bytes(shard.path, shard.bytes, into)

        if self.cached:
            return self.cache.get(self._cache_key(shard), shard.bytes,  # type: ignore[union-attr]
                                  fetch, copy_in_background=True)
        return pa.py_buffer(fetch())

    @about_shard
    def check_shard(self, shard: ShardInfo) -> None:
        """Verify one shard completely: size, checksum, rows, schema, and every record batch
        validated as reading would (a crafted shard can carry a matching checksum); where the
        manifest indexes its record batches, each one as the readers that use the index read
        it (local sequential reads, ``snap[i]``): its bytes against its own checksum, decoded
        with the manifest's schema, its rows against ``batch_rows`` (:meth:`batch_from_bytes`,
        which they call). A shard can match its checksum while its index does not match it
        (an edited manifest): every read of it would then fail."""
        buffer, shard_file = self._opened(shard, True, False)
        for index in range(shard_file.num_record_batches):
            shard_file.get_batch(index)
        if shard.batch_index and shard.batch_offsets is not None:
            offsets = shard.batch_offsets
            for index, (start, end) in enumerate(zip(offsets, offsets[1:])):
                self.batch_from_bytes(shard, index, buffer.slice(start, end - start),
                                      verify=True)

    def verify_all(self) -> list[str]:
        """Check every shard; return one line per problem (empty if the snapshot is sound)."""
        problems = []
        for shard in self.manifest.shards:
            try:
                self.check_shard(shard)
            except CorruptSnapshotError as e:
                problems.append(str(e))
        return problems


class _CacheFiller:
    """Copies whole shards of a remote snapshot into the node-local cache on one background
    thread, each at most once per reader: random access reads a record batch alone (one ranged
    GET) and leaves the rest of its shard to come from the local copy. A copy is verified when
    it is used, like any cached copy; a failed copy is only logged (reads go to the store)."""

    def __init__(self, reader: SnapshotReader, threads: int = 1):
        self._storage, self._cache = reader.storage, reader.cache
        self._key = reader._cache_key
        self._lock = threading.Lock()
        self._started: set[str] = set()
        self._pending: list[Future] = []
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="snapcache-cache-fill")
        pool = self._pool
        forget = lifecycle.at_exit(lambda: pool.shutdown(wait=True, cancel_futures=True))
        weakref.finalize(self, lambda: (forget(), pool.shutdown(wait=False)))

    def fill(self, shard: ShardInfo) -> threading.Event | None:
        """Copy ``shard`` (once); an event set once its copy holds the shard's locks (or is
        over), or None if it was asked for before."""
        with self._lock:
            if shard.path in self._started or lifecycle.exiting():
                return None
            self._started.add(shard.path)
            self._pending = [f for f in self._pending if not f.done()]
            started = threading.Event()
            self._pending.append(self._pool.submit(self._copy, shard, started))
            return started

    def _copy(self, shard: ShardInfo, started: threading.Event) -> None:
        def fetch() -> bytes:
            started.set()  # the cache holds the shard's locks while this runs
            return self._storage.read_bytes(shard.path, shard.bytes)

        try:
            self._cache.get(self._key(shard), shard.bytes, fetch)
        except Exception as e:  # noqa: BLE001 - the cache is an optimisation: reads go on
            log.warning("could not copy %s into the local cache %s: %s",
                        self._storage.url_of(shard.path), self._cache, e)
        finally:
            started.set()

    def wait(self, timeout: float | None) -> bool:
        with self._lock:
            pending = list(self._pending)
        done, not_done = futures_wait(pending, timeout)
        return not not_done


def open_reader(storage: Storage, manifest: Manifest, read: ReadOptions | None = None
                ) -> SnapshotReader:
    """A reader of a committed snapshot configured by ``read`` (checksums, prefetch, and the
    node-local cache of remote shards)."""
    read = read or ReadOptions()
    cache = shared_cache(read.local_cache, read.local_cache_limit) \
        if read.local_cache is not None and not storage.local else None
    return SnapshotReader(storage, manifest, verify=read.verify,
                          prefetch_bytes=read.prefetch_bytes, cache=cache)
