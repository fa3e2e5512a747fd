"""Remote shards fetched ahead of a fresh read's first need of them.

A fresh read of a snapshot on an object store takes a read lease (a few requests) before it
reads its first shard. :class:`EarlyFetches` starts the GET of that shard beside the lease's
requests, and, when the shard is large, takes its body as it streams in: the record batch the
read needs first is usable once the bytes up to its end have arrived, so the read's first
batch waits for them, not for the whole shard. Nothing here trusts the bytes: the read that
takes them checks them against the manifest like any others (the whole shard against its
checksum, the record batch against its own).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from snapcache.store.manifest import ShardInfo

if TYPE_CHECKING:
    from snapcache.store.reader import SnapshotReader

log = logging.getLogger(__name__)

EARLY_BATCH_SHARD_BYTES = 16 << 20
"""Remote shards at least this large have the record batch a fresh read needs first handed
over as soon as it has arrived (:meth:`EarlyFetches.start`). One S3 connection delivers ~100
MB/s: a default 64 MB shard takes ~0.6 s. Smaller shards come whole, without the streamed
body's copy into one buffer (``benchmarks/bench_first_batch.py`` measures both)."""


def _settle(future: Future, outcome: Any) -> None:
    """Give ``future`` its result (or exception), unless it has one already."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass


def in_background(fetch: Callable[[], Any]) -> Future:
    """A future of ``fetch()``, called on a new daemon thread (its exception, if any, is raised
    by ``result()``)."""
    future: Future = Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
        try:
            future.set_result(fetch())
        except BaseException as e:  # noqa: BLE001 - raised again by the read that uses it
            future.set_exception(e)

    threading.Thread(target=run, name="snapcache-fetch-early", daemon=True).start()
    return future


class EarlyFetches:
    """The shards (and the record batch read first of some, as soon as it has arrived) one
    :class:`SnapshotReader <snapcache.store.reader.SnapshotReader>` fetches ahead, each held
    until the read that needs it takes it, or :meth:`clear`. Nothing on local disk."""

    def __init__(self, reader: "SnapshotReader"):
        self._reader = reader
        self._shards: dict[str, Future] = {}                  # path -> its whole bytes
        # path -> (index, the shard's bytes up to that record batch's end, once arrived)
        self._batches: dict[str, tuple[int, Future]] = {}

    def start(self, shard: ShardInfo, batch: int | None = None) -> None:
        """Start fetching remote ``shard`` on a background thread now, for the reader's first
        read of it: its GET then overlaps the requests a read makes before its first shard
        (the read lease). Through the node-local cache when there is one, as the read itself
        would (one download a node).

        ``batch``: the record batch of it the read needs first (a read gives it when that
        record batch holds all its first batch waits for). When the shard is not in the
        node-local cache, is at least :data:`EARLY_BATCH_SHARD_BYTES` and that record batch
        ends in its first half, the shard's GET hands over its body as it streams in, and
        that record batch is usable as soon as the bytes up to its end have arrived
        (:meth:`batch`): the read's first batch waits for them, not for the whole shard. One
        GET, no byte fetched twice."""
        reader = self._reader
        if reader.storage.local or shard.path in self._shards:
            return
        head = arrived = None
        if batch is not None and self._alone_pays(shard, batch):
            arrived = Future()
            self._batches[shard.path] = (batch, arrived)
            head = (shard.batch_offsets[batch + 1], lambda view: _settle(arrived, view))

        def fetch() -> pa.Buffer:
            try:
                return reader.fetch_shard(shard, head)
            finally:  # the head did not come alone (a cached copy, a failure): say so
                if arrived is not None:
                    _settle(arrived, OSError("the record batch did not arrive before its shard"))

        self._shards[shard.path] = in_background(fetch)

    def _alone_pays(self, shard: ShardInfo, batch: int) -> bool:
        reader = self._reader
        if not shard.batch_index or reader.schema is None or \
                not 0 <= batch < len(shard.batch_rows) or shard.bytes < EARLY_BATCH_SHARD_BYTES:
            return False
        if 2 * shard.batch_offsets[batch + 1] > shard.bytes:
            return False
        return not reader.in_cache(shard)

    def take_shard(self, shard: ShardInfo) -> Future | None:
        """The fetch of ``shard`` started for this read, once (None if none was)."""
        return self._shards.pop(shard.path, None)

    def has_batch(self, shard: ShardInfo) -> bool:
        """Whether a record batch of ``shard`` is handed over ahead of it that no read took
        yet."""
        return shard.path in self._batches

    def batch(self, shard: ShardInfo, index: int) -> pa.RecordBatch | None:
        """Record batch ``index`` of ``shard`` once the shard's bytes up to its end have
        arrived, once: checked against that record batch's checksum in the manifest, decoded
        and validated (:meth:`SnapshotReader.batch_from_bytes
        <snapcache.store.reader.SnapshotReader.batch_from_bytes>`). None if it is not the one
        handed over ahead, or the shard came otherwise (from the node-local cache, or its GET
        failed first): the read then takes it from the whole shard, which says what is
        wrong."""
        early = self._batches.get(shard.path)
        if early is None or early[0] != index or self._batches.pop(shard.path, None) is not early:
            return None
        reader = self._reader
        try:
            head = early[1].result()
        except OSError as e:
            log.debug("%s record batch %d: %s; read from the whole shard",
                      reader.where(shard), index, e)
            return None
        start, end = shard.batch_offsets[index], shard.batch_offsets[index + 1]
        return reader.batch_from_bytes(shard, index, head[start:end])

    def pending(self) -> bool:
        """Whether anything fetched is still held (no read took it)."""
        return bool(self._shards or self._batches)

    def clear(self) -> None:
        """Forget what was fetched that no read took."""
        self._shards.clear()
        self._batches.clear()
