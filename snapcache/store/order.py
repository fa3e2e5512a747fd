"""The order of an epoch over a committed snapshot, and each stream's share of it: pure
functions of the snapshot's row layout and a few integers (no I/O).

**Blocks.** The rows of a snapshot (shards in manifest order, concatenated) are cut into
blocks: each record batch of each shard is one block when the manifest records the record
batches' row counts (``ShardInfo.batch_rows``), else fixed blocks of :data:`FALLBACK_BLOCK`
rows that never cross a shard. A block is what a reader decodes at once.

**Epoch order.** With a seed, epoch ``e`` permutes the blocks with ``rng(seed, e)``, lays them
end to end, and permutes every window of ``window`` consecutive positions of that sequence with
its own ``rng(seed, e, w)``. The order is a function of ``(layout, seed, e, window)`` only: not
of the number of workers or ranks reading it, nor of whether the run wrote the snapshot.
Without a seed the order is the rows in order. :meth:`EpochOrder.locate` maps a range of
positions to (block, row in block) in O(range + window) time.

**Shares.** A run that is resumed reads only what is left of the epoch: a list of position
ranges (``[(0, N)]`` for a fresh epoch). Stream ``k`` of ``n`` takes chunks of ``chunk``
consecutive positions of that sequence, round-robin; the tail that does not fill a round is
split evenly in units of ``unit`` positions (the batch size when batches are cut per stream,
so there is one partial batch per epoch, not one per stream). Streams' shares are disjoint and
together cover the sequence; every stream's share differs every epoch because the order does.
"""

from __future__ import annotations

import bisect
import weakref
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

FALLBACK_BLOCK = 4096
"""Rows of a block when the manifest does not record record-batch sizes (older snapshots)."""

DEFAULT_CHUNK = 4096
"""Positions a stream takes at once when nothing asks otherwise (no window shuffle)."""

Ranges = tuple[tuple[int, int], ...]


# -- blocks ------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Layout:
    """The blocks of a snapshot: block ``b`` is rows ``[start[b], start[b] + rows[b])``, in
    shard ``shard[b]``, record batch ``batch[b]`` (or -1 when not known), starting at row
    ``offset[b]`` of that batch or, for fallback blocks, of the shard."""

    start: np.ndarray
    rows: np.ndarray
    shard: np.ndarray
    batch: np.ndarray
    offset: np.ndarray

    @classmethod
    def from_shards(cls, shard_rows: Sequence[int],
                    batch_rows: Sequence[Sequence[int] | None] | None = None) -> "Layout":
        """``shard_rows[i]`` rows in shard i; ``batch_rows[i]`` its record batches' rows
        (None when unknown)."""
        # Record batches: lists extended a shard at a time, made arrays once (a snapshot of
        # 64 KiB record batches has thousands: a loop per block was most of opening it for
        # random access). Fallback blocks: arrays, no Python object a block (how many there are
        # follows from a row count alone; the manifest bounds it: manifest.MAX_UNLISTED_ROWS).
        parts: list[tuple[np.ndarray, ...]] = []
        rows: list[int] = []
        shard: list[int] = []
        batch: list[int] = []

        def flush() -> None:
            if rows:
                parts.append((np.asarray(rows, np.int64), np.asarray(shard, np.int64),
                              np.asarray(batch, np.int64), np.zeros(len(rows), np.int64)))
                del rows[:], shard[:], batch[:]

        for i, total in enumerate(shard_rows):
            known = batch_rows[i] if batch_rows is not None else None
            if known is not None and sum(known) == total:
                kept = range(len(known)) if 0 not in known else \
                    [j for j, r in enumerate(known) if r > 0]
                rows.extend(known if 0 not in known else [known[j] for j in kept])
                batch.extend(kept)
                shard.extend([i] * len(kept))
            elif total > 0:
                flush()
                starts = np.arange(0, total, FALLBACK_BLOCK, dtype=np.int64)
                parts.append((np.minimum(FALLBACK_BLOCK, total - starts),
                              np.full(len(starts), i, np.int64),
                              np.full(len(starts), -1, np.int64), starts))
        flush()
        if not parts:
            parts.append(tuple(np.zeros(0, np.int64) for _ in range(4)))
        counts, shards, batches, offsets = (np.concatenate(arrays) for arrays in zip(*parts))
        start = np.zeros(len(counts), np.int64)
        np.cumsum(counts[:-1], out=start[1:])
        return cls(start, counts, shards, batches, offsets)

    @property
    def num_rows(self) -> int:
        return int(self.start[-1] + self.rows[-1]) if len(self.rows) else 0

    @property
    def num_blocks(self) -> int:
        return len(self.rows)


PIECE_ROWS = 1024
"""Positions an ordered read takes at a time, at least (``ordered_pieces``' ``piece``): its
first batch comes once they are decoded."""
RUN_BYTES = 4 << 20
"""An unshuffled read decodes runs of consecutive small record batches of a shard, up to about
this many decoded bytes, as one block (:func:`runs_of`)."""
_runs: "weakref.WeakKeyDictionary[Layout, Layout]" = weakref.WeakKeyDictionary()


def runs_of(layout: Layout, row_bytes: Sequence[float]) -> Layout:
    """``layout`` with each run of consecutive record batches of one shard smaller than
    :data:`RUN_BYTES` (decoded; ``row_bytes[i]``: a row of shard ``i``) merged into one block
    of up to about that size: the blocks an unshuffled read decodes. Every record batch costs a block's
    Python (read, verify, validate, decode, plan, hand over: ~0.3 ms), which dominated reading
    small ones (64 KiB record batches: 1,563 blocks an epoch of 200,000 token rows). Rows keep
    their positions (an unshuffled epoch's order is the rows in order whatever the blocks), so
    this changes no order and no saved state; shuffled reads keep the record batches as blocks
    (their order is drawn over them). A shard's first record batch stays a block of its own:
    a read starting at a shard has its first batch once that record batch alone is read and
    decoded (on S3, as soon as its bytes have arrived, while the rest of the shard downloads:
    :meth:`EarlyFetches.start <snapcache.store.early_fetch.EarlyFetches.start>`). ``layout``
    itself when nothing merges."""
    found = _runs.get(layout)
    if found is not None:
        return found
    per_row = row_bytes
    rows, shard, batch, offset = [], [], [], []
    size, last_batch = 0.0, -1
    for b in range(layout.num_blocks):
        i, j, o, n = (int(layout.shard[b]), int(layout.batch[b]), int(layout.offset[b]),
                      int(layout.rows[b]))
        if rows and j >= 0 and o == 0 and shard[-1] == i and batch[-1] > 0 and \
                last_batch + 1 == j and size + n * per_row[i] <= RUN_BYTES:
            rows[-1] += n
            size += n * per_row[i]
        else:
            rows.append(n)
            shard.append(i)
            batch.append(j)
            offset.append(o)
            size = n * per_row[i]
        last_batch = j
    if len(rows) == layout.num_blocks:
        merged = layout
    else:
        counts = np.asarray(rows, dtype=np.int64)
        start = np.zeros(len(counts), np.int64)
        np.cumsum(counts[:-1], out=start[1:])
        as_array = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
        merged = Layout(start, counts, as_array(shard), as_array(batch), as_array(offset))
    _runs[layout] = merged
    return merged



def _seed_words(seed: int) -> int:
    return seed % (1 << 64)  # numpy's SeedSequence takes non-negative integers


# -- the epoch's order -------------------------------------------------------------------------
class EpochOrder:
    """Epoch ``epoch``'s permutation of the rows of ``layout``; identity when ``seed`` is None.

    Example::

        order = EpochOrder(layout, seed=0, epoch=3, window=10_000)
        blocks, offsets = order.locate(0, 256)      # the first 256 positions
        rows = order.rows(0, 256)                   # the same as global row numbers
    """

    def __init__(self, layout: Layout, seed: int | None, epoch: int, window: int = 1):
        if window < 1:
            raise ValueError(f"window must be >= 1; got {window}")
        self.layout, self.seed, self.epoch = layout, seed, epoch
        self.window = window if seed is not None else 1
        n = layout.num_blocks
        if seed is None:
            self._perm = np.arange(n, dtype=np.int64)
        else:
            rng = np.random.default_rng([_seed_words(seed), epoch, 0])
            self._perm = rng.permutation(n).astype(np.int64)
        sizes = layout.rows[self._perm]
        self._end = np.cumsum(sizes)           # end position of the j-th block in the order
        self._begin = self._end - sizes
        self._windows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self.layout.num_rows

    def _window_perm(self, w: int) -> np.ndarray:
        perm = self._windows.get(w)
        if perm is None:
            size = min(self.window, len(self) - w * self.window)
            rng = np.random.default_rng([_seed_words(self.seed), self.epoch, 1, w])  # type: ignore[arg-type]
            perm = rng.permutation(size).astype(np.int64)
            if len(self._windows) >= 4:
                self._windows.pop(next(iter(self._windows)))
            self._windows[w] = perm
        return perm

    def boundary(self, position: int) -> int:
        """The first position after ``position`` where a new block or window starts: pieces
        cut there read from one block (window 1) or one window."""
        if self.window > 1:
            return (position // self.window + 1) * self.window
        j = int(np.searchsorted(self._end, position, side="right"))
        return int(self._end[j]) if j < len(self._end) else len(self)

    def sequence_positions(self, start: int, stop: int) -> np.ndarray:
        """Where positions ``[start, stop)`` sit in the block sequence (before the window
        shuffle)."""
        positions = np.arange(start, stop, dtype=np.int64)
        if self.window == 1 or stop <= start:
            return positions
        out = np.empty_like(positions)
        w = start // self.window
        while w * self.window < stop:
            lo, hi = max(start, w * self.window), min(stop, (w + 1) * self.window)
            base = w * self.window
            out[lo - start:hi - start] = base + self._window_perm(w)[lo - base:hi - base]
            w += 1
        return out

    def window_of(self, position: int) -> tuple[int, int]:
        """``(first, stop)``: the positions of the shuffle window holding ``position``."""
        first = position // self.window * self.window
        return first, min(len(self), first + self.window)

    def window_blocks(self, first: int, stop: int) -> tuple[np.ndarray, int, int]:
        """``(blocks, lo, hi)``: the blocks of the window of positions ``[first, stop)`` in
        their sequence before its shuffle; the window starts at row ``lo`` of the first and
        ends before row ``hi`` of the last. Position ``p`` of the window is row
        ``sequence_positions(p, p + 1) - first`` of their rows laid end to end from there."""
        j0 = int(np.searchsorted(self._end, first, side="right"))
        j1 = int(np.searchsorted(self._end, stop - 1, side="right"))
        return (self._perm[j0:j1 + 1], first - int(self._begin[j0]),
                stop - int(self._begin[j1]))

    def locate(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(block, row within the block) of positions ``[start, stop)``."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"positions [{start}, {stop}) outside an epoch of {len(self)}")
        s = self.sequence_positions(start, stop)
        j = np.searchsorted(self._end, s, side="right")
        return self._perm[j], s - self._begin[j]

    def run(self, start: int, stop: int) -> tuple[int, int] | None:
        """``(block, row)`` when positions ``[start, stop)`` are the consecutive rows of one
        block from ``row`` on (no window, within one block: what :meth:`locate` would give,
        without an array a position); else None."""
        if self.window > 1 or not 0 <= start < stop <= len(self):
            return None
        j = int(np.searchsorted(self._end, start, side="right"))
        if stop > int(self._end[j]):
            return None
        return int(self._perm[j]), start - int(self._begin[j])

    def blocks_in(self, start: int, stop: int) -> np.ndarray:
        """The blocks positions ``[start, stop)`` read, in the order their first rows come
        (with a window, those of the whole windows the range touches: a superset)."""
        if stop <= start:
            return self._perm[:0]
        if self.window > 1:
            start = start // self.window * self.window
            stop = min(len(self), -(-stop // self.window) * self.window)
        first = int(np.searchsorted(self._end, start, side="right"))
        last = int(np.searchsorted(self._end, stop - 1, side="right"))
        return self._perm[first:last + 1]

    def rows(self, start: int, stop: int) -> np.ndarray:
        """The global row numbers at positions ``[start, stop)``."""
        blocks, offsets = self.locate(start, stop)
        return self.layout.start[blocks] + offsets


# -- streams' shares ---------------------------------------------------------------------------
def choose_chunk(length: int, streams: int, window: int = 1, unit: int = 1) -> int:
    """Positions a stream takes at once: a whole shuffle window when every stream gets at least
    two (each window is then decoded by one stream only), else smaller so streams stay balanced;
    always a multiple of ``unit``."""
    target = window if window > 1 else DEFAULT_CHUNK
    target = max(unit, -(-target // unit) * unit)
    if streams > 1 and length < 2 * streams * target:
        target = max(unit, (length // (2 * streams)) // unit * unit)
    return target


def _normalise(ranges: Sequence[Sequence[int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        a, b = int(a), int(b)
        if b <= a:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


@dataclass(frozen=True)
class Share:
    """Stream ``index`` of ``streams``' part of the positions ``ranges`` (in that order).

    ``bounds`` (``streams + 1`` sequence offsets), when given, makes stream ``k``'s share the
    one contiguous part ``[bounds[k], bounds[k + 1])`` instead of chunks (a snapshot read by as
    many streams as wrote it: each reads back what it wrote).

    ``balance``: None (shares differ by at most ``unit`` plus the last unit's remainder),
    ``"drop"`` (every share cut to the smallest, a whole number of units) or ``"pad"`` (every
    share filled to the largest with the first positions of ``ranges`` again), so that every
    stream, hence every rank, gets the same count.
    """

    ranges: Ranges
    streams: int = 1
    index: int = 0
    chunk: int = DEFAULT_CHUNK
    unit: int = 1
    balance: str | None = None
    bounds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not (1 <= self.streams and 0 <= self.index < self.streams):
            raise ValueError(f"stream index must be in [0, streams); got {self.index} of "
                             f"{self.streams}")
        if self.unit < 1 or self.chunk < self.unit or self.chunk % self.unit:
            raise ValueError(f"chunk ({self.chunk}) must be a positive multiple of unit "
                             f"({self.unit})")
        if self.balance not in (None, "drop", "pad"):
            raise ValueError(f"balance must be None, 'drop' or 'pad'; got {self.balance!r}")
        object.__setattr__(self, "ranges", _normalise(self.ranges))
        if self.bounds is not None:
            bounds = tuple(int(b) for b in self.bounds)
            if len(bounds) != self.streams + 1 or bounds[0] != 0 or \
                    bounds[-1] != self.length or list(bounds) != sorted(bounds):
                raise ValueError(f"bounds must be {self.streams + 1} increasing offsets from 0 "
                                 f"to {self.length}; got {self.bounds!r}")
            object.__setattr__(self, "bounds", bounds)

    @classmethod
    def of(cls, ranges: Sequence[Sequence[int]], streams: int, index: int, *, window: int = 1,
           unit: int = 1, balance: str | None = None) -> "Share":
        ranges = _normalise(ranges)
        length = sum(b - a for a, b in ranges)
        return cls(ranges, streams, index, choose_chunk(length, streams, window, unit), unit,
                   balance)

    @property
    def length(self) -> int:
        """Positions in ``ranges`` (what all streams share)."""
        return sum(b - a for a, b in self.ranges)

    # Pieces are computed in "sequence" coordinates (0 .. length) and mapped to positions.
    def _tail(self, k: int) -> tuple[int, int, int]:
        n, c, u = self.streams, self.chunk, self.unit
        rounds = self.length // (n * c)
        t0 = rounds * n * c
        units = (self.length - t0) // u
        lo = t0 + u * (units * k // n)
        hi = t0 + u * (units * (k + 1) // n)
        if k == n - 1:
            hi = self.length
        return rounds, lo, hi

    def _natural(self, k: int) -> Iterator[tuple[int, int]]:
        # one at a time: a snapshot of billions of rows read in windows of a hundred has tens
        # of millions of them, and a reader wants the first ones first
        if self.bounds is not None:
            a, b = self.bounds[k], self.bounds[k + 1]
            if b > a:
                yield a, b
            return
        n, c = self.streams, self.chunk
        rounds, lo, hi = self._tail(k)
        for r in range(rounds):
            yield (r * n + k) * c, (r * n + k + 1) * c
        if hi > lo:
            yield lo, hi

    def _natural_count(self, k: int) -> int:
        if self.bounds is not None:
            return self.bounds[k + 1] - self.bounds[k]
        rounds, lo, hi = self._tail(k)
        return rounds * self.chunk + hi - lo

    def count(self, k: int | None = None) -> int:
        """Positions stream ``k`` (default: this one) reads in this share."""
        k = self.index if k is None else k
        if self.balance is None:
            return self._natural_count(k)
        counts = [self._natural_count(i) for i in range(self.streams)]
        if self.balance == "pad":
            return max(counts)
        least = min(counts)
        return least if least == max(counts) else least // self.unit * self.unit

    def sequence_pieces(self, k: int | None = None) -> Iterator[tuple[int, int]]:
        """Stream ``k``'s pieces in sequence coordinates, balanced; padding wraps around."""
        k = self.index if k is None else k
        want = self.count(k)
        got = 0
        for a, b in self._natural(k):
            if got >= want:
                break
            b = min(b, a + want - got)
            yield a, b
            got += b - a
        while got < want and self.length:  # pad: the sequence's first positions again
            take = min(want - got, self.length)
            yield 0, take
            got += take

    def to_positions(self, a: int, b: int) -> list[tuple[int, int]]:
        """Sequence coordinates ``[a, b)`` as position ranges."""
        out = []
        offset = 0
        for lo, hi in self.ranges:
            size = hi - lo
            x, y = max(a, offset), min(b, offset + size)
            if y > x:
                out.append((lo + x - offset, lo + y - offset))
            offset += size
            if offset >= b:
                break
        return out

    def pieces(self, skip: int = 0, k: int | None = None) -> Iterator[tuple[int, int]]:
        """Stream ``k``'s position ranges in reading order, after its first ``skip``."""
        for a, b in self.sequence_pieces(k):
            if skip >= b - a:
                skip -= b - a
                continue
            a, skip = a + skip, 0
            yield from self.to_positions(a, b)

    def remaining(self, consumed: Sequence[int]) -> Ranges:
        """What is left of ``ranges`` once stream ``k`` has read its first ``consumed[k]``
        positions (padding read twice does not count), in order: the ``ranges`` a resumed job,
        with any number of streams, shares out."""
        if len(consumed) != self.streams:
            raise ValueError(f"need one count per stream ({self.streams}); got {len(consumed)}")
        taken: list[tuple[int, int]] = []
        for k, c in enumerate(consumed):
            for a, b in self.sequence_pieces(k):
                if c <= 0:
                    break
                taken.append((a, min(b, a + c)))
                c -= b - a
        taken.sort()
        left, cursor = [], 0
        for a, b in taken:
            if a > cursor:
                left.append((cursor, a))
            cursor = max(cursor, b)
        if cursor < self.length:
            left.append((cursor, self.length))
        return _normalise([r for a, b in left for r in self.to_positions(a, b)])


def ranges_length(ranges: Sequence[Sequence[int]]) -> int:
    return sum(int(b) - int(a) for a, b in ranges)


def locate_row(shard_starts: Sequence[int], row: int) -> tuple[int, int]:
    """(shard, row within it) of global ``row``; ``shard_starts`` are the shards' first rows."""
    i = bisect.bisect_right(shard_starts, row) - 1
    return i, row - shard_starts[i]
