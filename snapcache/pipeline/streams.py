"""Which share of the examples this iterator produces: stream ``index`` of ``count``.

Cooperating writers (DataLoader workers, ranks, cluster tasks) each run the pipeline for one
stream. Sources then yield every ``count``-th example starting at ``index`` (after skipping
``skip`` examples of the stream when a snapshot resumes a crashed run), and a committed snapshot
gives each stream a contiguous ``1/count`` of its rows.

The spec travels through a context variable while the iterator chain is built: runners build
their upstream eagerly, in the caller's thread, so sources see it.
"""

from __future__ import annotations

import itertools
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass(frozen=True)
class StreamSpec:
    index: int = 0
    count: int = 1
    skip: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.count, int) and self.count >= 1 and
                isinstance(self.index, int) and 0 <= self.index < self.count):
            raise ValueError(f"stream index must be in [0, count) with count >= 1; got "
                             f"index={self.index!r}, count={self.count!r}")

    @property
    def trivial(self) -> bool:
        return self.count == 1 and self.skip == 0

    def row_range(self, total: int) -> tuple[int, int]:
        """The contiguous rows of a ``total``-row snapshot that this stream reads."""
        return total * self.index // self.count, total * (self.index + 1) // self.count


_CURRENT: ContextVar[StreamSpec | None] = ContextVar("snapcache_stream", default=None)


def current() -> StreamSpec:
    return _CURRENT.get() or StreamSpec()


def set_current(spec: StreamSpec | None):
    return _CURRENT.set(spec)


def reset(token) -> None:
    _CURRENT.reset(token)


_PART: ContextVar[str | None] = ContextVar("snapcache_part", default=None)


def part() -> str | None:
    """What the iterator chain being built runs over when it is a part of the epoch that no
    stream spec describes (a delta snapshot's segment: some of the source's files), in words
    for error notes; None otherwise."""
    return _PART.get()


def set_part(words: str | None):
    return _PART.set(words)


def reset_part(token) -> None:
    _PART.reset(token)


def indexable(items: Any) -> bool:
    """True if ``items`` is read by index: it has ``__getitem__`` and ``__len__`` (a list, a
    numpy array, a map-style torch dataset), and is not a snapcache ``Dataset``, whose
    ``__getitem__`` only says to iterate it (its class sets ``_snapcache_iterable_only``)."""
    return hasattr(items, "__getitem__") and hasattr(items, "__len__") and \
        not getattr(type(items), "_snapcache_iterable_only", False)


def split(items: Any) -> Iterator[Any]:
    """This stream's share of a source's items (indexed access where the source allows)."""
    spec = current()
    if spec.trivial:
        return iter(items)
    start = spec.index + spec.count * spec.skip
    if indexable(items):
        return (items[i] for i in range(start, len(items), spec.count))
    return itertools.islice(iter(items), start, None, spec.count)


def split_range(start: int, stop: int, step: int) -> range:
    spec = current()
    first = spec.index + spec.count * spec.skip
    return range(start + step * first, stop, step * spec.count)
