"""Shuffling as pure functions of (items, rng): easy to test, reproducible from a seed."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import numpy as np


def epoch_rng(seed: int | None, epoch: int) -> np.random.Generator:
    """The generator for one epoch: derived from ``(seed, epoch)``, or fresh entropy if unseeded."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([seed, epoch])


def buffer_shuffle(items: Iterable[Any], buffer_size: int, rng: np.random.Generator
                   ) -> Iterator[Any]:
    """tf.data-style shuffle: keep a buffer of ``buffer_size`` items, emit a random one, refill.

    Every input item is emitted exactly once; memory holds at most ``buffer_size`` items.
    """
    buffer: list[Any] = []
    # Draw random indices in blocks: one numpy call per 1024 items, not one per item.
    block: list[float] = []
    for item in items:
        if len(buffer) < buffer_size:
            buffer.append(item)
            continue
        if not block:
            block = rng.random(1024).tolist()
        j = int(block.pop() * buffer_size)
        yield buffer[j]
        buffer[j] = item
    order = rng.permutation(len(buffer))
    for j in order:
        yield buffer[j]
