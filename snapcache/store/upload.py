"""Shards of a remote snapshot go up whole, in the background, while the next one is written.

On a remote filesystem (S3, ...) the writer does not stream a shard into a remote file: it
writes the shard into a :class:`Spool` (memory, or a local temporary file once it is large) and,
once finished, hands it to :class:`Uploads`, which stores it with one request (or a multipart
upload in parallel parts, see :meth:`snapcache.store.fs.Storage.upload`) on a thread of its
own. The writer meanwhile encodes and compresses the next shard on its caller's thread.

- **Bounded memory.** At most ``in_flight`` finished shards are uploading at once; handing over
  one more waits for the oldest, so the writer holds at most ``in_flight + 1`` shards.
- **In order, only what is stored.** Finished uploads are reported oldest first and only once
  every earlier one has finished too, so a progress record (and the commit after it) lists a
  prefix of the stream's shards that are all stored. A failed upload is raised, in the writer
  thread, at the next hand-over or at :meth:`Uploads.finish`; the shards after it are never
  reported.
"""

from __future__ import annotations

import collections
import io
import os
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from snapcache.store.fs import Storage
from snapcache.store.manifest import ShardInfo

SPOOL_BYTES = 256 << 20
"""A shard kept in memory up to this size; a larger one moves to a local temporary file."""


class Spool:
    """A write-only file for one shard: in memory, moved to a local temporary file once it
    holds more than ``limit`` bytes. :meth:`content` is what :meth:`Storage.upload` takes."""

    def __init__(self, limit: int | None = None):
        self._limit = SPOOL_BYTES if limit is None else limit
        self._memory: io.BytesIO | None = io.BytesIO()
        self._file: Any = None
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if self._memory is not None and self.size + view.nbytes > self._limit:
            self._file = tempfile.NamedTemporaryFile(prefix="snapcache-shard-", suffix=".arrow",
                                                     delete=False)
            self._file.write(self._memory.getbuffer())
            self._memory = None
        (self._memory if self._memory is not None else self._file).write(view)
        self.size += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        """Finish writing (the content stays until :meth:`discard`)."""
        if self._file is not None and not self._file.closed:
            self._file.close()

    def content(self) -> bytes | str:
        """The bytes written, or the name of the local file holding them."""
        if self._memory is not None:
            return self._memory.getvalue()
        self.close()
        return self._file.name

    def read(self) -> bytes:
        """All the bytes written (read back from the file if it moved to one)."""
        content = self.content()
        if isinstance(content, bytes):
            return content
        with open(content, "rb") as f:
            return f.read()

    def discard(self) -> None:
        """Drop the content (remove the temporary file, if any)."""
        self._memory = None
        if self._file is not None:
            self.close()
            try:
                os.remove(self._file.name)
            except OSError:
                pass
            self._file = None


class Uploads:
    """Uploads of finished shards to ``storage``, ``in_flight`` at most at once, reported in
    the order they were handed over.

    Example::

        uploads = Uploads(storage, in_flight=2)
        stored = uploads.submit(info, spool)   # may wait for the oldest upload
        stored += uploads.finish()             # every shard is stored (or an error raised)
    """

    def __init__(self, storage: Storage, in_flight: int):
        self.storage = storage
        self.in_flight = in_flight
        self._pool = ThreadPoolExecutor(in_flight, thread_name_prefix="snapcache-upload")
        self._pending: collections.deque[tuple[Future, ShardInfo]] = collections.deque()

    def submit(self, info: ShardInfo, spool: Spool) -> list[ShardInfo]:
        """Start uploading the finished shard ``info`` held in ``spool`` (discarded once
        uploaded). Returns the shards whose uploads finished meanwhile, in order; waits for
        the oldest if ``in_flight`` are under way; raises the error of a failed one."""
        stored = self._reap(wait=len(self._pending) >= self.in_flight)
        self._pending.append((self._pool.submit(self._upload, info.path, spool), info))
        return stored

    def finish(self) -> list[ShardInfo]:
        """Wait for every upload; the shards not reported yet, in order. Raises the first
        error (the later uploads are still waited for, and not reported)."""
        try:
            return self._reap(wait=True, every=True)
        finally:
            self.close()

    def close(self) -> None:
        """Stop: uploads not started are dropped, those under way are waited for (their
        shards are the writer's to remove, as with any unrecorded shard)."""
        for future, _ in self._pending:
            future.cancel()
        self._pool.shutdown(wait=True)
        self._pending.clear()

    def _upload(self, name: str, spool: Spool) -> None:
        try:
            self.storage.upload(name, spool.content())
        finally:
            spool.discard()

    def _reap(self, wait: bool, every: bool = False) -> list[ShardInfo]:
        stored = []
        while self._pending:
            future, info = self._pending[0]
            if not (wait or future.done()):
                break
            future.result()  # raises the upload's error
            self._pending.popleft()
            stored.append(info)
            wait = every
        return stored
