"""Parallel map on a thread pool, order-preserving unless told otherwise.

Threads suit functions that release the GIL (numpy, image decoding, I/O). A bounded window of
in-flight calls keeps memory bounded; abandoning the iterator cancels what has not started.
"""

from __future__ import annotations

import collections
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterable, Iterator

from snapcache.runtime.autotune import ThreadTuner
from snapcache.runtime.errors import Locate, annotate


def parallel_map(fn: Callable[[Any], Any], items: Iterable[Any], *, workers: int,
                 deterministic: bool = True, label: str = "map",
                 window: int | None = None, tuner: ThreadTuner | None = None,
                 locate: Locate | None = None) -> Iterator[Any]:
    """Yield ``fn(item)`` for each item, computed by ``workers`` threads.

    With ``deterministic=True`` results come in input order; otherwise as soon as each is ready.
    At most ``window`` (default ``2 * workers``) calls are in flight. With a ``tuner``
    (AUTOTUNE), the number in flight follows ``tuner.parallelism`` as it adapts. An exception
    of ``fn`` is raised with a note naming ``label`` and the example (``locate``, see
    :func:`~snapcache.runtime.errors.annotate`).
    """
    if workers <= 1 and tuner is None:
        yield from serial_map(fn, items, label=label, locate=locate)
        return
    if tuner is not None:
        fn = tuner.wrap(fn)
        workers = tuner.limit
    fixed_window = window or 2 * workers
    source = iter(items)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="snapcache-map")
    in_flight: collections.deque[tuple[int, Future]] = collections.deque()
    position = 0
    exhausted = False
    try:
        while True:
            window = tuner.parallelism if tuner is not None else fixed_window
            while not exhausted and len(in_flight) < window:
                try:
                    item = next(source)
                except StopIteration:
                    exhausted = True
                    break
                in_flight.append((position, pool.submit(fn, item)))
                position += 1
            if not in_flight:
                return
            index, future = next_done(in_flight, deterministic)
            error = future.exception()
            if error is not None:
                raise annotate(error, label, index, locate)
            yield future.result()
    finally:
        for _, future in in_flight:
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)


def next_done(in_flight: collections.deque[tuple[int, Future]], deterministic: bool
              ) -> tuple[int, Future]:
    """Take the next call to deliver: the oldest (waiting for it) if ``deterministic``, else
    whichever finishes first. Items are ``(position, future)``."""
    if deterministic:
        return in_flight.popleft()
    wait([f for _, f in in_flight], return_when=FIRST_COMPLETED)
    done = next(item for item in in_flight if item[1].done())
    in_flight.remove(done)
    return done


def serial_map(fn: Callable[[Any], Any], items: Iterable[Any], *, label: str = "map",
               locate: Locate | None = None) -> Iterator[Any]:
    for index, item in enumerate(items):
        try:
            result = fn(item)
        except Exception as e:
            raise annotate(e, label, index, locate)
        yield result
