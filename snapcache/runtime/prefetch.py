"""Prefetch: run the upstream iterator on a background thread, a bounded buffer ahead."""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterable, Iterator

from snapcache import lifecycle
from snapcache.runtime.autotune import BufferTuner

_DONE = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


def _resize(buffer: queue.Queue, size: int) -> None:
    with buffer.mutex:
        if buffer.maxsize != size:
            buffer.maxsize = size
            buffer.not_full.notify_all()


def prefetch(items: Iterable[Any], buffer_size: int, tuner: BufferTuner | None = None
             ) -> Iterator[Any]:
    """Yield the items of ``items``, produced up to ``buffer_size`` ahead on another thread.

    With a ``tuner`` (AUTOTUNE) the number of items held follows the observed item size, so
    the buffer stays within the tuner's byte budget.

    Exceptions from upstream are re-raised in the consumer. Closing this iterator (or dropping
    it) stops the producer after its current item and closes the upstream iterator on the
    producer's thread, so upstream ``finally`` blocks run.
    """
    buffer: queue.Queue = queue.Queue(maxsize=max(1, buffer_size))
    stop = threading.Event()
    source = iter(items)

    def produce() -> None:
        try:
            for count, item in enumerate(source):
                if tuner is not None and (count < 16 or not count & 63):
                    _resize(buffer, tuner.observe(item))
                while not stop.is_set():
                    try:
                        buffer.put(item, timeout=0.05)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    break
            else:
                _put_final(_DONE)
        except BaseException as e:  # handed to the consumer
            _put_final(_Failure(e))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _put_final(item: Any) -> None:
        while not stop.is_set():
            try:
                buffer.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    # At interpreter exit the producer must leave library code before finalization starts.
    thread = lifecycle.background(produce, stop.set, "snapcache-prefetch")
    try:
        while True:
            item = buffer.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join(timeout=0.2)  # a producer still busy ends on its own, and forgets itself
