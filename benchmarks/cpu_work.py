"""Module-level functions for the process-map and first-epoch benchmarks (picklable)."""

from __future__ import annotations

import time

import numpy as np


def python_work(i):
    """Pure-Python CPU work holding the GIL, ~2 ms."""
    total = 0
    for k in range(25_000):
        total += (k * i) % 7
    return total


def image_after_1ms(i):
    """An image-like example after 1 ms of CPU-bound preprocessing."""
    end = time.perf_counter() + 0.001
    while time.perf_counter() < end:
        pass
    rng = np.random.default_rng(i)
    return {"image": rng.integers(0, 64, (128, 128, 3), dtype=np.uint8), "label": np.int64(i)}
