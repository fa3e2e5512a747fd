"""Gathering the rows of a piece of an epoch's order from decoded blocks
(:mod:`snapcache.store.ordered_read`): block by block, or from a shuffle window decoded whole.

A shuffled piece takes its rows from every block of its shuffle window. With record batches of a
few megabytes that is a few blocks; with small ones (a small ``record_batch_size``, chosen for
fast random access) it is hundreds, and decoding and gathering them one by one costs ~60 Python
and numpy calls each. Such a window is decoded as a :class:`Window`: its blocks' rows laid end
to end in their sequence, in a few parts of whole blocks (one task each), every part one Arrow
concatenation and one conversion to columns; a piece is then one ``take`` a part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from snapcache.store.order import EpochOrder

ASSEMBLE_BLOCKS = 8
"""A shuffle window is decoded whole (:class:`Window`) only when it spans at least this many
blocks..."""
ASSEMBLE_BLOCK_BYTES = 1 << 20
"""...of at most this many decoded bytes on average: larger blocks already cost little per row."""


def gather(decoded: dict[int, Any], blocks: np.ndarray, offsets: np.ndarray, mode: str) -> Any:
    """The rows (``blocks[i]``, ``offsets[i]``) from decoded blocks: columns or a list."""
    if mode == "rows":
        return [decoded[b][o] for b, o in zip(blocks.tolist(), offsets.tolist())]
    first = decoded[int(blocks[0])]
    if len(decoded) == 1 or (blocks == blocks[0]).all():
        start = int(offsets[0])
        if np.array_equal(offsets, np.arange(start, start + len(offsets))):  # a view
            return {name: column[start:start + len(offsets)] for name, column in first.items()}
        return {name: column.take(offsets, axis=0) for name, column in first.items()}
    out = {name: np.empty((len(blocks), *column.shape[1:]), dtype=column.dtype)
           for name, column in first.items()}
    sort = np.argsort(blocks, kind="stable")
    sorted_blocks = blocks[sort]
    cuts = np.flatnonzero(np.diff(sorted_blocks)) + 1
    for where in np.split(sort, cuts):
        block = decoded[int(blocks[where[0]])]
        rows = offsets[where]
        for name, column in block.items():
            out[name][where] = column[rows]
    return out


def blocks_of(blocks: np.ndarray) -> list[int]:
    """The distinct blocks of a piece, ascending. Not ``np.unique``: its first call in a process
    imports ``numpy.ma`` (~30 ms, paid by the first epoch read), and a piece without a shuffle
    window lies in one block."""
    if not len(blocks):
        return []
    first = int(blocks[0])
    if first == int(blocks[-1]) and (blocks == first).all():
        return [first]
    return np.flatnonzero(np.bincount(blocks)).tolist()


Span = tuple[int, int, int]
"""``(block, lo, hi)``: rows ``[lo, hi)`` of a block."""


@dataclass(frozen=True)
class Window:
    """The shuffle window of positions ``[first, stop)`` decoded whole: the rows of its blocks
    (``blocks``, in their sequence before the shuffle) laid end to end, in ``parts`` of whole
    blocks (``spans`` each); part ``i`` holds the window's rows ``[starts[i], starts[i + 1])``.

    Example::

        window = Window.of(order, *order.window_of(a), parts=2)
        decoded = [decode(spans) for spans in window.spans]   # columns, one dict a part
        rows = window.take(decoded, window.rows(order, a, b))   # positions [a, b)
    """

    first: int
    stop: int
    blocks: tuple[int, ...]
    spans: tuple[tuple[Span, ...], ...]
    starts: tuple[int, ...]

    @classmethod
    def of(cls, order: EpochOrder, first: int, stop: int, *, parts: int) -> "Window":
        blocks, lo, hi = order.window_blocks(first, stop)
        sizes = order.layout.rows[blocks].astype(np.int64)
        begin = np.zeros(len(blocks), dtype=np.int64)
        end = sizes.copy()
        begin[0], end[-1] = lo, hi
        ends = np.cumsum(end - begin)          # window row after each block
        total = int(ends[-1])
        # cut after the block whose end is nearest each equal share of the rows
        cuts = sorted({int(np.searchsorted(ends, total * i / parts)) + 1
                       for i in range(1, max(1, parts))} - {len(blocks)})
        spans, starts, k0 = [], [0], 0
        for k1 in [*cuts, len(blocks)]:
            spans.append(tuple((int(blocks[k]), int(begin[k]), int(end[k]))
                               for k in range(k0, k1)))
            starts.append(int(ends[k1 - 1]))
            k0 = k1
        return cls(first, stop, tuple(int(b) for b in blocks), tuple(spans), tuple(starts))

    def rows(self, order: EpochOrder, start: int, stop: int) -> np.ndarray:
        """The window's rows at positions ``[start, stop)`` (inside the window)."""
        return order.sequence_positions(start, stop) - self.first

    def take(self, decoded: list[dict[str, np.ndarray]], rows: np.ndarray
             ) -> dict[str, np.ndarray]:
        """The window's ``rows`` as columns from its decoded parts (columns, one dict a part)."""
        if len(decoded) == 1:
            return {name: column[rows] for name, column in decoded[0].items()}
        which = np.searchsorted(self.starts, rows, side="right") - 1
        out = {name: np.empty((len(rows), *column.shape[1:]), dtype=column.dtype)
               for name, column in decoded[0].items()}
        for i, part in enumerate(decoded):
            mask = which == i
            if not mask.any():
                continue
            at = rows[mask] - self.starts[i]
            for name, column in part.items():
                out[name][mask] = column[at]
        return out
