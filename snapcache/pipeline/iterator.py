"""The iterator ``iter(ds)`` and ``ds.iterate()`` return, and its lifecycle.

Nothing runs before the first ``next()``: no fingerprint I/O, no lease, no read, no thread.
The epoch's generator chain is built then, and everything it holds (write and read leases,
writer and reader threads, prefetch threads, open shards) is given back when the iterator is
exhausted, closed (``close()``, ``with``), garbage-collected, or when the interpreter exits
(see :mod:`snapcache.lifecycle`), whichever comes first.

Example::

    with ds.iterate() as it:
        for step, batch in zip(range(100), it):
            train_step(batch)
        saved = it.state_dict()         # resumable pipelines: ds.iterate(state=saved)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

from snapcache import lifecycle

if TYPE_CHECKING:
    from snapcache.runtime.stats import Recorder


class Deferred:
    """An iterator that builds its source with ``start()`` at the first ``next()``."""

    def __init__(self, start: Callable[[], Iterator[Any]]):
        self._start: Callable[[], Iterator[Any]] | None = start
        self._it: Iterator[Any] | None = None

    def __iter__(self) -> "Deferred":
        return self

    def __next__(self) -> Any:
        if self._it is None:
            if self._start is None:
                raise StopIteration
            start, self._start = self._start, None
            self._it = iter(start())
        return next(self._it)

    @property
    def started(self) -> bool:
        return self._it is not None

    def close(self) -> None:
        self._start = None
        it, self._it = self._it, None
        close = getattr(it, "close", None)
        if close is not None:
            close()


_EMPTY: Iterator[Any] = iter(())


class DatasetIterator:
    """One epoch of a pipeline (see the module docstring for what it holds and when it lets
    go). ``state_dict()`` says where it is, for pipelines that can be resumed.

    Items may come in *runs*: when ``items`` has a ``current_run()`` method, it is called
    after each item taken from ``items`` and returns a plain iterator over the items that
    follow it and are already made (a list's iterator: the rows of a record batch), or None
    if ``items`` never has any. Those are handed out straight from it, without passing
    through the layers of ``items`` one by one (they share that iterator, so ``items`` still
    knows exactly what was consumed); when the run is used up, the next item is asked of
    ``items`` again. Handing out a run's item cannot fail: errors come from ``items``.

    ``recorder`` (the one ``Dataset.stats()`` reads) is told what the consumer sees: each wait
    for ``items``, each item and run handed out, and the end of the epoch, exhausted or
    closed before it."""

    def __init__(self, items: Iterator[Any], recorder: "Recorder | None" = None):
        self._items = items
        self._recorder = recorder
        self._run: Iterator[Any] = _EMPTY
        self._runs: Callable[[], Iterator[Any] | None] | None = \
            getattr(items, "current_run", None)
        self._closed = False
        self._forget = lifecycle.close_at_exit(self)

    def __iter__(self) -> "DatasetIterator":
        return self

    def __next__(self) -> Any:
        for item in self._run:  # the current run's next item, if any
            return item
        if self._closed:
            raise StopIteration
        recorder = self._recorder
        start = time.perf_counter()
        try:
            item = next(self._items)
        except StopIteration:
            if recorder is not None:
                recorder.waited(start, time.perf_counter())
                recorder.end(finished=True)
            self.close()
            raise
        except BaseException:
            if recorder is not None:
                recorder.waited(start, time.perf_counter())
            self.close()  # an epoch that failed holds nothing
            raise
        run = None
        if self._runs is not None:
            run = self._runs()
            if run is None:  # items that never come in runs
                self._runs = None
            else:
                self._run = run
        if recorder is not None:
            recorder.waited(start, time.perf_counter())
            recorder.handed(run)
        return item

    def state_dict(self) -> dict:
        """Where this iterator is: a small JSON-serialisable dict for
        ``Dataset.iterate(state=...)``. ValueError if this pipeline cannot be resumed exactly
        (the message says why)."""
        get = getattr(self._items, "state_dict", None)
        if get is None:
            raise ValueError(
                "this iteration cannot be resumed exactly: only pipelines snapshot -> map / "
                "filter / shuffle / batch / prefetch keep a position")
        return get()

    def close(self) -> None:
        """Stop the epoch: release its leases, stop its threads, discard a shard being
        written (finished shards stay for the next run). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._recorder is not None:
            self._recorder.end(finished=False)  # no-op after the end of the epoch
        self._run = _EMPTY
        self._forget()
        close = getattr(self._items, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "DatasetIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at collection time
            pass
