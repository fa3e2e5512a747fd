"""A snapshot writer's recorder thread: shards flushed to the disk and progress records
written, one task at a time, in order, off the writer's caller's thread.

A progress record is a PUT on S3 or a durable write on local disk (tens of milliseconds on
a busy disk or on real S3, for each shard), and before it, on local disk, the bytes of the
shards it adds are flushed to the disk (``fdatasync``): every marker and manifest lists only
recorded shards, so a power loss never leaves one listing a shard whose bytes were still only
in the page cache. A shard in progress is also flushed early, every :data:`FLUSH_BYTES`
written (:meth:`Recorder.flush_early`), so that the flush that must finish before its record
(and at the end of an epoch, before the commit) has little left to write.

The first failure stops the recorder: nothing is written after it (a later record would
otherwise rewrite only its newest progress file over a record that failed half-way), and the
failure is raised by :meth:`Recorder.check` or :meth:`Recorder.wait` on the caller's thread.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from snapcache.store.fs import Storage
from snapcache.store.local_files import flush_to_disk
from snapcache.store.protocol import StreamRecord, write_progress

FLUSH_BYTES = 32 << 20
"""Bytes of a local shard written between two early flushes of it to the disk."""


class Recorder:
    """The recorder thread of one writer, started with its first task."""

    def __init__(self, storage: Storage):
        self._storage = storage
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._error: BaseException | None = None

    def record(self, paths: list[str], record: StreamRecord, recorded: int) -> None:
        """Flush the shards at ``paths`` to the disk (local), then write ``record`` as the
        progress record (``recorded``: its shards in the progress files written before)."""
        def task() -> None:
            for path in paths:
                self._storage.make_durable(path)
            write_progress(self._storage, record, recorded)
        self._submit(task)

    def flush_early(self, fd: int) -> None:
        """Flush what was written to the file open as ``fd`` (a descriptor of the recorder's
        own, closed once used, so that the file may be renamed or closed meanwhile)."""
        def task() -> None:
            try:
                flush_to_disk(fd)
            finally:
                os.close(fd)
        try:
            self._submit(task, on_skip=lambda: os.close(fd))
        except BaseException:
            os.close(fd)
            raise

    def check(self) -> None:
        """Raise the first failure of a task, if one failed (without waiting)."""
        self._pending = [f for f in self._pending if not f.done()]
        if self._error is not None:
            raise self._error

    def wait(self) -> None:
        """Wait for every task handed over; raise the first failure."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.exception()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """:meth:`wait`, then end the thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def _submit(self, task: Callable[[], Any], on_skip: Callable[[], Any] | None = None
                ) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="snapcache-record")

        def run() -> None:
            if self._error is not None:  # a task before failed: nothing more is written
                if on_skip is not None:
                    on_skip()
                return
            try:
                task()
            except BaseException as e:  # raised on the caller's thread by check or wait
                self._error = e

        self._pending.append(self._pool.submit(run))
