"""AUTOTUNE: parallelism and buffer sizes chosen from the machine and from what the run observes.

- The machine: :mod:`snapcache.machine` counts the CPUs this process may use (affinity mask and
  cgroup quota, not just ``os.cpu_count()``) and sizes byte-bounded buffers from its memory.
- What it observes: :class:`ThreadTuner` measures, for a map on threads, how much of each call's
  wall time is CPU time on the calling thread. A function that mostly waits (I/O, sleeps, GIL-free
  native code) gets more threads than cores, in proportion to its waiting; a function that burns
  CPU gets one thread a core. :class:`BufferTuner` turns the observed size of items into a count
  for a prefetch buffer bounded in bytes.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np

from snapcache.machine import available_cpus, memory_budget

MAX_THREADS_PER_CPU = 8


def nbytes_of(value: Any) -> int:
    """Approximate payload bytes of an example or batch (arrays, scalars, str/bytes, nesting)."""
    kind = type(value)
    if kind is np.ndarray:
        return value.nbytes
    if kind is dict:
        return sum(nbytes_of(v) for v in value.values())
    if kind is tuple or kind is list:
        return sum(nbytes_of(v) for v in value)
    if kind is bytes or kind is str:
        return len(value)
    if isinstance(value, np.generic):
        return value.itemsize
    return 8


class ThreadTuner:
    """Chooses how many calls of a thread-pool map run at once, from their CPU share.

    ``parallelism`` starts at the number of CPUs and is re-derived every ``period`` calls as
    ``cpus / cpu_share`` (clamped to ``[cpus, cpus * MAX_THREADS_PER_CPU]``), where
    ``cpu_share`` is the fraction of a call's wall time spent on the CPU of its thread.
    """

    def __init__(self, cpus: int | None = None, period: int = 16):
        self.cpus = cpus or available_cpus()
        self.limit = self.cpus * MAX_THREADS_PER_CPU
        self.parallelism = self.cpus
        self.period = period
        self._lock = threading.Lock()
        self._wall = 0.0
        self._cpu = 0.0
        self._calls = 0
        self.history: list[int] = [self.parallelism]

    def wrap(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``fn`` measured: each call reports its wall and thread CPU time."""

        def measured(item: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(item)
            finally:
                self.observe(time.perf_counter() - w0, time.thread_time() - c0)

        return measured

    def observe(self, wall: float, cpu: float) -> None:
        with self._lock:
            self._wall += wall
            self._cpu += min(cpu, wall)
            self._calls += 1
            if self._calls % self.period:
                return
            share = self._cpu / self._wall if self._wall > 0 else 1.0
            wanted = self.cpus / max(share, 1 / MAX_THREADS_PER_CPU)
            new = int(min(self.limit, max(self.cpus, round(wanted))))
            if new != self.parallelism:
                self.parallelism = new
                self.history.append(new)
            self._wall *= 0.5  # weigh recent calls more
            self._cpu *= 0.5


class BufferTuner:
    """A prefetch buffer's item count from a byte budget and the observed item size."""

    def __init__(self, budget: int | None = None, low: int = 2, high: int = 1024):
        self.budget = budget or memory_budget()
        self.low, self.high = low, high
        self._mean: float | None = None
        self.size = max(low, 8)

    def observe(self, item: Any) -> int:
        n = max(1, nbytes_of(item))
        self._mean = n if self._mean is None else 0.9 * self._mean + 0.1 * n
        self.size = int(min(self.high, max(self.low, self.budget // max(1.0, self._mean))))
        return self.size
