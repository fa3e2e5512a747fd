"""A GET's body that other threads read from while it still streams in.

Backend-neutral: both S3 clients (:mod:`snapcache.store.fs_obstore`, :mod:`snapcache.store.fs_s3`)
fill it, :class:`~snapcache.store.early_fetch.EarlyFetches` hands it to the read.
"""

from __future__ import annotations

import mmap
import threading
from typing import Any, Union

Body = Union[mmap.mmap, bytearray, bytes]
"""What a streamed GET gives back (:meth:`Streamed.result`): the buffer, or a copy of what came
if that was not the size said."""

STREAM_CHUNK = 1 << 20
"""Bytes a streamed GET hands over at a time (:class:`Streamed`)."""


class Streamed:
    """The body of one GET of a file of ``size`` bytes, taken chunk by chunk into one buffer
    that other threads read from as it fills: :meth:`wait_for` gives a view of the bytes up to
    a point as soon as they are in (a remote shard's record batches while the rest of it
    still downloads; nothing is copied for them). The buffer is never written again where a
    view looks. A body longer or shorter than ``size`` comes back from :meth:`result` as what it
    holds, for the caller's size check to name; the one that fills it calls :meth:`finish`
    when it is done or failed, whatever happened.

    The buffer is anonymous memory whose pages the kernel zeroes as they are first written,
    by the thread that takes the body in, chunk by chunk: a ``bytearray(size)`` is zeroed whole
    by whoever makes it (~30 ms for a 61 MB shard here, on the read's own thread, before its
    GET had even started)."""

    def __init__(self, size: int):
        self._buffer: "mmap.mmap | bytearray" = _anonymous(size) if size else bytearray()
        self._view = memoryview(self._buffer)
        self._at = 0
        self._extra: list[bytes] = []
        self._done = False
        self._cond = threading.Condition()

    def add(self, chunk: Any) -> None:
        n = len(chunk)
        if self._extra or self._at + n > len(self._buffer):
            self._extra.append(bytes(chunk))
            return
        self._view[self._at:self._at + n] = chunk
        with self._cond:
            self._at += n
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify_all()

    @property
    def complete(self) -> bool:
        """Whether the whole body is in, as long as said."""
        return self._done and not self._extra and self._at == len(self._buffer)

    def wait_for(self, end: int) -> memoryview | None:
        """A view of bytes ``[0, end)`` once they are in; None if the body ended (or failed)
        before them."""
        with self._cond:
            self._cond.wait_for(lambda: self._at >= end or self._done)
            return self._view[:end] if self._at >= end else None

    def result(self) -> Body:
        if self._extra or self._at != len(self._buffer):
            return bytes(self._view[:self._at]) + b"".join(self._extra)
        return self._buffer


def _anonymous(size: int) -> mmap.mmap:
    """``size`` bytes of zeroed memory whose pages are taken as they are first written. Private
    where the platform says so: a forked child gets a copy-on-write view, as of any other
    memory, not one the parent keeps writing into (and faults cost less than in a shared map)."""
    if hasattr(mmap, "MAP_PRIVATE"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mmap.mmap(-1, size)
