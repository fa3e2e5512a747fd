"""Parallel map on a pool of worker processes, for pure-Python work that holds the GIL.

Choices, and why:

- **forkserver** start method on Linux (spawn elsewhere). ``fork`` starts workers fastest but
  copies a parent that runs threads (prefetch, shard readers, the snapshot writer), and a child
  forked while one of them holds a lock can deadlock. The fork server is a clean,
  single-threaded process started once; each worker is forked from it in milliseconds, with
  numpy and snapcache already imported (preloaded).
- **Chunks** of examples per task: one round trip through the pool costs ~0.1 ms of latency
  and ~0.5 ms of the parent's CPU (its executor threads, pickling), more than a tiny function.
  The chunk size adapts to the measured time per example, aiming at tasks of ~30 ms: with
  ~10 ms tasks the parent took 0.15-0.25 s of CPU for 2 s of work, taken from the cores the
  workers run on (1,000 calls of 2 ms on 2 workers, 2 cores); with 30 ms, ~0.05 s. Expensive
  functions still go one at a time, keeping order latency low.
- **Shared memory** for large numpy results: a worker writes each array of at least
  ``SHM_THRESHOLD`` bytes into a POSIX shared-memory segment and sends only its name, dtype and
  shape. The parent maps the segment, unlinks it at once (the mapping lives on while the array
  does) and hands out an array backed by it: no copy of the bytes through a pipe. Segments are
  named with a per-iterator prefix, so whatever is left after an error or an abandoned epoch
  (a result never collected, a worker killed mid-write) is found and removed on close.
- Errors: a worker's exception is re-raised in the consumer with its type, the worker's
  traceback (as ``__cause__``) and a note naming the op and the example's position; the
  examples before it are yielded first. Exceptions that cannot travel between processes, a
  worker killed by a signal, a parent killed with its workers running, and a script without a
  main guard are handled in :mod:`.process_safety`.
- Segments are unregistered from multiprocessing's resource tracker as soon as they are
  created (the parent or a worker's parent watch removes them), so the tracker has nothing to
  warn about.
"""

from __future__ import annotations

import collections
import mmap
import multiprocessing
import os
import pickle
import sys
import time
import uuid
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import resource_tracker, shared_memory
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from snapcache.runtime import process_safety
from snapcache.runtime.errors import Locate, annotate
from snapcache.runtime.parallel import next_done

SHM_THRESHOLD = 64 << 10
"""numpy results of at least this many bytes travel through shared memory."""

TARGET_TASK_SECONDS = 0.03
MAX_CHUNK = 1024
_SHM_DIR = "/dev/shm"


def check_picklable(fn: Callable[..., Any], what: str = "map's fn") -> None:
    """Raise a clear TypeError now if ``fn`` cannot be sent to a worker process."""
    try:
        pickle.dumps(fn)
    except Exception as e:
        name = getattr(fn, "__qualname__", type(fn).__name__)
        raise TypeError(
            f"{what} {name!r} cannot be sent to worker processes ({type(e).__name__}: {e}). "
            "executor='process' needs a picklable function: define it at module level (not a "
            "lambda, closure or local function), or use executor='thread'") from None


def mp_context() -> multiprocessing.context.BaseContext:
    if sys.platform.startswith("linux"):
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["numpy", "snapcache.runtime.process"])
        return ctx
    return multiprocessing.get_context("spawn")


# -- worker side -------------------------------------------------------------------------------
class _Shared:
    """A numpy array parked in a shared-memory segment (what crosses the pipe instead)."""

    __slots__ = ("name", "dtype", "shape", "nbytes")

    def __init__(self, name: str, dtype: str, shape: tuple, nbytes: int):
        self.name, self.dtype, self.shape, self.nbytes = name, dtype, shape, nbytes

    def __reduce__(self):
        return (_Shared, (self.name, self.dtype, self.shape, self.nbytes))


def _park(value: Any, prefix: str, counter: list[int]) -> Any:
    """Replace large arrays inside ``value`` (dicts, tuples, lists) by shared-memory handles."""
    kind = type(value)
    if kind is np.ndarray:
        if value.nbytes < SHM_THRESHOLD or value.dtype.hasobject:
            return value
        counter[0] += 1
        name = f"{prefix}{os.getpid()}_{counter[0]}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=value.nbytes)
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        try:
            np.ndarray(value.shape, value.dtype, buffer=shm.buf)[...] = value
        finally:
            shm.close()
        return _Shared(name, value.dtype.str, value.shape, value.nbytes)
    if kind is dict:
        return {k: _park(v, prefix, counter) for k, v in value.items()}
    if kind is tuple or kind is list:
        return kind(_park(v, prefix, counter) for v in value)
    return value


_reseeded = False


def _reseed_once() -> None:
    """Give this worker process random draws of its own: numpy's and torch's global
    generators, reseeded from the operating system's entropy once per process. Workers are
    forked from one fork server, and each epoch starts fresh ones, so a random augmentation
    (``np.random.rand()``, ``torch.rand()``) would otherwise draw the same numbers in every
    worker and every epoch. (Python's ``random`` is reseeded by the fork itself.) Called at a
    worker's first chunk, once ``fn`` is unpickled, so a torch it imports is seeded too."""
    global _reseeded
    if _reseeded:
        return
    _reseeded = True
    np.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def _run_chunk(fn: Callable[[Any], Any], items: list[Any], start: int, prefix: str
               ) -> tuple[list[Any], float, dict | None]:
    """Worker entry point: ``fn`` over ``items``; large arrays parked in shared memory. A
    failure stops the chunk: the results before it come back with its report."""
    _reseed_once()
    t0 = time.perf_counter()
    out = []
    counter = [0]
    for offset, item in enumerate(items):
        process_safety.mark(prefix, start + offset)
        try:
            out.append(_park(fn(item), f"{prefix}{start + offset}_", counter))
        except Exception as e:
            return out, time.perf_counter() - t0, process_safety.failure(e, start + offset)
    return out, time.perf_counter() - t0, None


# -- parent side -------------------------------------------------------------------------------
def _attach(handle: _Shared) -> np.ndarray:
    """The array behind a handle; the segment's name is removed at once."""
    path = os.path.join(_SHM_DIR, handle.name)
    dtype = np.dtype(handle.dtype)
    if os.path.isdir(_SHM_DIR) and os.path.exists(path):
        fd = os.open(path, os.O_RDWR)
        try:
            mapped = mmap.mmap(fd, handle.nbytes) if handle.nbytes else None
        finally:
            os.close(fd)
            _unlink(handle.name)
        if mapped is None:
            return np.empty(handle.shape, dtype)
        return np.frombuffer(mapped, dtype=dtype).reshape(handle.shape)
    shm = shared_memory.SharedMemory(name=handle.name)  # other POSIX systems: copy out
    try:
        return np.ndarray(handle.shape, dtype, buffer=shm.buf).copy()
    finally:
        shm.close()
        # not shm.unlink(): that would also unregister it, and the worker already did
        shared_memory._posixshmem.shm_unlink(shm._name)  # type: ignore[attr-defined]


def _unlink(name: str) -> None:
    try:
        os.unlink(os.path.join(_SHM_DIR, name))
    except FileNotFoundError:
        pass


def _unpark(value: Any) -> Any:
    kind = type(value)
    if kind is _Shared:
        return _attach(value)
    if kind is dict:
        return {k: _unpark(v) for k, v in value.items()}
    if kind is tuple or kind is list:
        return kind(_unpark(v) for v in value)
    return value


def _discard(value: Any) -> None:
    kind = type(value)
    if kind is _Shared:
        _unlink(value.name)
    elif kind is dict:
        for v in value.values():
            _discard(v)
    elif kind is tuple or kind is list:
        for v in value:
            _discard(v)


class ChunkSizer:
    """Picks how many examples go in one task from the measured seconds per example."""

    def __init__(self, initial: int = 1, target: float = TARGET_TASK_SECONDS):
        self.size = initial
        self.target = target
        self._per_item: float | None = None

    def observe(self, items: int, seconds: float) -> None:
        per_item = seconds / max(1, items)
        self._per_item = per_item if self._per_item is None else \
            0.7 * self._per_item + 0.3 * per_item
        ideal = self.target / max(self._per_item, 1e-7)
        self.size = int(min(MAX_CHUNK, max(1, ideal)))


def process_map(fn: Callable[[Any], Any], items: Iterable[Any], *, workers: int,
                deterministic: bool = True, label: str = "map",
                chunk_size: int | None = None, locate: Locate | None = None) -> Iterator[Any]:
    """Yield ``fn(item)`` for each item, computed by ``workers`` processes.

    ``chunk_size=None`` adapts the number of examples per task to what the function costs.
    Closing the iterator (or an error) stops the workers and removes every shared-memory
    segment they made. Errors name ``label`` and the example (``locate``, see
    :func:`~snapcache.runtime.errors.annotate`).
    """
    process_safety.check_main_guard()
    source = iter(items)
    sizer = ChunkSizer() if chunk_size is None else None
    fixed = chunk_size or 1
    prefix = f"snapcache_{uuid.uuid4().hex[:10]}_"
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp_context(),
                               initializer=process_safety.watch_parent,
                               initargs=(os.getpid(), prefix))
    processes: dict[int, Any] = {}   # every worker started, to learn how a dead one died
    # Enough chunks in flight that no worker idles while the consumer takes results.
    window = 2 * workers
    in_flight: collections.deque[tuple[int, Future]] = collections.deque()
    ready: collections.deque[Any] = collections.deque()
    position = 0
    exhausted = False
    try:
        while True:
            while not exhausted and len(in_flight) < window:
                size = sizer.size if sizer is not None else fixed
                chunk = []
                for item in source:
                    chunk.append(item)
                    if len(chunk) >= size:
                        break
                if len(chunk) < size:
                    exhausted = True
                if not chunk:
                    break
                try:
                    future = pool.submit(_run_chunk, fn, chunk, position, prefix)
                except BrokenProcessPool:
                    # A worker died before this chunk went out: the chunks in flight end with
                    # the same error and report it, after yielding what was computed before.
                    if not in_flight:
                        raise process_safety.died(prefix, list(processes.values()), label,
                                                  position, locate) from None
                    exhausted = True
                    break
                in_flight.append((position, future))
                processes.update(getattr(pool, "_processes", None) or {})
                position += len(chunk)
            if not in_flight:
                return
            start, future = next_done(in_flight, deterministic)
            error = future.exception()
            if isinstance(error, BrokenProcessPool):
                raise process_safety.died(prefix, list(processes.values()), label, start,
                                          locate) from None
            if error is not None:
                raise annotate(error, label, start, locate)
            results, seconds, failed = future.result()
            if sizer is not None and failed is None:
                sizer.observe(len(results), seconds)
            ready.extend(results)
            while ready:
                yield _unpark(ready.popleft())
            if failed is not None:
                raise process_safety.rebuild(failed, label, locate)
    finally:
        for value in ready:
            _discard(value)
        _shutdown(pool, [f for _, f in in_flight])
        process_safety.sweep(prefix)


def _shutdown(pool: ProcessPoolExecutor, futures: list[Future], grace: float = 2.0) -> None:
    """Stop the pool: cancel what has not started, drop finished results, kill stragglers."""
    for f in futures:
        f.cancel()
    running = [f for f in futures if not f.cancelled()]
    if running:
        wait(running, timeout=grace)
    for f in running:
        if f.done() and not f.cancelled() and f.exception() is None:
            for value in f.result()[0]:
                _discard(value)
    processes = list(getattr(pool, "_processes", {}).values())
    if any(not f.done() for f in running):
        for p in processes:  # a function that does not finish: do not wait for it
            if p.is_alive():
                p.terminate()
    pool.shutdown(wait=True, cancel_futures=True)
    for p in processes:
        p.join(timeout=5)
