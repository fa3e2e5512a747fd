"""Remote shards fetched ahead of a fresh read's first need of them.

A fresh read of a snapshot on an object store takes a read lease (a few requests) before it
reads its first shard. :class:`EarlyFetches` starts the GET of that shard beside the lease's
requests, and, when the shard is large, takes its body as it streams in: each record batch is
usable once its bytes have arrived, so the read's first batch waits for the bytes it needs,
not for the whole shard. Nothing here trusts the bytes: the read that takes them checks them
against the manifest like any others (a record batch against its own checksum, as a local
shard's; the whole shard against its checksum when it is read whole).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from snapcache.store.streamed import Streamed
from snapcache.store.manifest import ShardInfo

if TYPE_CHECKING:
    from snapcache.store.reader import SnapshotReader

STREAMED_SHARD_BYTES = 16 << 20
"""Remote shards at least this large stream in for a fresh read: each record batch is usable as
soon as it has arrived (:meth:`EarlyFetches.start`). One S3 connection delivers ~100
MB/s: a default 64 MB shard takes ~0.6 s. Smaller shards come whole, without the streamed
body's copy into one buffer (``benchmarks/bench_first_batch.py`` measures both)."""


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
    """The shards one :class:`SnapshotReader <snapcache.store.reader.SnapshotReader>` fetches
    ahead (and of some, their bytes as they stream in), each held until the read that needs it
    takes it, or :meth:`clear`. Nothing on local disk."""

    def __init__(self, reader: "SnapshotReader"):
        self._reader = reader
        self._shards: dict[str, Future] = {}       # path -> its whole bytes
        self._streams: dict[str, Streamed] = {}    # path -> its bytes as they arrive

    def start(self, shard: ShardInfo) -> None:
        """Start fetching remote ``shard`` on a background thread now, for the reader's first
        read of it: its GET then overlaps the requests a read makes before its first shard
        (the read lease). Through the node-local cache when there is one, as the read itself
        would (one download a node).

        When the shard is not in the node-local cache, is at least
        :data:`STREAMED_SHARD_BYTES` and the manifest indexes its record batches, the GET's
        body is taken as it streams in, and each record batch is usable as soon as its bytes
        have arrived (:meth:`take_stream`): the read's first batch waits for the bytes it
        needs, not for the whole shard. One GET, no byte fetched twice."""
        reader = self._reader
        if reader.storage.local or shard.path in self._shards:
            return
        streamed = None
        if self._stream_pays(shard):
            streamed = self._streams[shard.path] = Streamed(shard.bytes)

        def fetch() -> pa.Buffer:
            try:
                return reader.fetch_shard(shard, streamed)
            finally:  # done, failed, or never streamed (a copy in the node-local cache)
                if streamed is not None:
                    streamed.finish()

        self._shards[shard.path] = in_background(fetch)

    def _stream_pays(self, shard: ShardInfo) -> bool:
        reader = self._reader
        return bool(shard.batch_index) and reader.schema is not None and \
            shard.bytes >= STREAMED_SHARD_BYTES and not reader.in_cache(shard)

    def take_shard(self, shard: ShardInfo) -> Future | None:
        """The fetch of ``shard`` started for this read, once (None if none was)."""
        return self._shards.pop(shard.path, None)

    def has_stream(self, shard: ShardInfo) -> bool:
        """Whether ``shard`` is streaming in for a read that did not take it yet."""
        return shard.path in self._streams

    def take_stream(self, shard: ShardInfo) -> Streamed | None:
        """Once: ``shard``'s bytes as they stream in (:meth:`Streamed.wait_for
        <snapcache.store.streamed.Streamed.wait_for>` gives None past what arrived if the
        shard came otherwise: from the node-local cache, or its GET failed); None if it does
        not stream."""
        return self._streams.pop(shard.path, None)

    def pending(self) -> bool:
        """Whether anything fetched is still held (no read took it)."""
        return bool(self._shards or self._streams)

    def clear(self) -> None:
        """Forget what was fetched that no read took."""
        self._shards.clear()
        self._streams.clear()
