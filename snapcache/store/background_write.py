"""A local file whose bytes reach the disk on a thread of its own, one record batch at a time.

The writer encodes, compresses and checksums a record batch on its caller's thread
(:mod:`snapcache.store.writer`), and the kernel's copy of the bytes into the page cache is the
part left that a second core can take (~0.2 ms a MB on bare metal, ~1.5 ms a MB into fresh
memory on a virtual machine). :class:`BackgroundFile` collects what is written between two
:meth:`~BackgroundFile.flush` calls (one record batch: Arrow hands its large buffers over
without copying them) and hands the pieces to its thread, which writes them with one
``os.writev``.

Why so coarse: a Python thread needs the GIL back after every blocking call, and behind a
consumer that releases the GIL often and briefly (numpy's random generators) it may wait long
for it, each release waking it for nothing and slowing the consumer. The thread here needs the
GIL twice a record batch (taking the next one, and after writing it), where writing each piece
through Python file objects and hashes needed it dozens of times.

Bounded: at most :data:`IN_FLIGHT` record batches are held for the thread; one more waits.
A failed write (a full disk) is raised on the caller's thread, at the next flush or at close.

Used for local shards of large rows only (``writer.BACKGROUND_ROW_BYTES``): behind a map of
small rows, which releases the GIL many times an example, even two waits a record batch cost
more than the copy saves.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

IN_FLIGHT = 2
"""Record batches handed to the thread and not yet written, at most."""

_SMALL = 64 << 10
"""Pieces smaller than this are copied together (IPC metadata, padding), larger ones are kept
as they are (Arrow's buffers, zero-copy)."""

_IOV_MAX = 512  # os.writev takes at most IOV_MAX (1024 on Linux) pieces at once

_END = object()


class BackgroundFile:
    """A write-only binary file (``write``/``flush``/``close``) that a thread writes out.

    Example::

        f = BackgroundFile(path)
        f.write(header); f.write(big_buffer)
        f.flush()          # hands both to the thread
        f.close()          # waits until everything is written; raises its error if any
    """

    def __init__(self, path: str):
        # 0o666 and the umask decide, as for a file made by open(path, "wb")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self._pieces: list[Any] = []
        self._small = bytearray()
        self._queue: queue.Queue = queue.Queue(maxsize=IN_FLIGHT)
        self._error: BaseException | None = None
        self._dropped = False  # abandoned: what is pending is not written
        self._thread: threading.Thread | None = None
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        if size < _SMALL:
            self._small += view
        else:
            if self._small:
                self._pieces.append(bytes(self._small))
                self._small.clear()
            self._pieces.append(view)  # keeps ``data`` alive until written
        return size

    def fileno(self) -> int:
        return self._fd

    def flush(self) -> None:
        """Hand what was written since the last flush to the thread (waits while
        :data:`IN_FLIGHT` record batches are not written yet)."""
        self._raise_error()
        if self._small:
            self._pieces.append(bytes(self._small))
            self._small.clear()
        if not self._pieces:
            return
        pieces, self._pieces = self._pieces, []
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="snapcache-file",
                                            daemon=True)
            self._thread.start()
        self._queue.put(pieces)

    def close(self) -> None:
        """Write everything, wait for it, close the file; the first error raised here."""
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self.closed = True
            self._stop()
            os.close(self._fd)
        self._raise_error()

    def abandon(self) -> None:
        """Stop without writing what is pending (the file is about to be removed)."""
        if self.closed:
            return
        self.closed = True
        self._pieces, self._small = [], bytearray()
        self._stop(drop=True)
        os.close(self._fd)

    def _stop(self, drop: bool = False) -> None:
        if self._thread is None:
            return
        self._dropped = drop
        self._queue.put(_END)
        self._thread.join()
        self._thread = None

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            pieces = self._queue.get()
            if pieces is _END:
                return
            if self._error is not None or self._dropped:
                continue  # failed or abandoned: nothing more is written
            try:
                _write_all(self._fd, pieces)
            except BaseException as e:  # raised on the caller's thread
                self._error = e


def _write_all(fd: int, pieces: list[Any]) -> None:
    """Write ``pieces`` in order, whole (``os.writev`` may write less than asked)."""
    while pieces:
        batch = pieces[:_IOV_MAX]
        written = os.writev(fd, batch)
        total = sum(memoryview(p).nbytes for p in batch)
        if written == total:
            pieces = pieces[len(batch):]
            continue
        rest = []
        for piece in pieces:
            view = memoryview(piece).cast("B")
            if written >= view.nbytes:
                written -= view.nbytes
                continue
            rest.append(view[written:])
            written = 0
        pieces = rest
