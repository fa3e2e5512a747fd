"""Ops that choose which examples pass, by position: ``take``, ``shard``, ``repeat``."""

from __future__ import annotations

import contextvars
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

from snapcache.pipeline import streams
from snapcache.pipeline.ops.base import Op, Traits, closing, run, runs, strided, upstream

REPEAT_EPOCH_STRIDE = 1 << 40
"""Repetition ``r > 0`` of epoch ``e`` runs the upstream as epoch ``e + r * stride``, so seeded
shuffles above a ``repeat`` draw a new order each repetition, reproducibly."""


@dataclass(frozen=True, eq=False)
class TakeOp(Op):
    count: int = 0
    kind: ClassVar[str] = "take"
    TRAITS: ClassVar = Traits(length="rule", structure_preserving=True, per_stream=True,
                              prefix=True, by_position=True)
    fingerprint_args: ClassVar = ("count",)

    def describe(self) -> str:
        return f"take({self.count})"

    def length(self, upstream: int | None) -> int | None:
        return None if upstream is None else min(upstream, self.count)


def _by_position(op: Op, epoch: int,
                select: Callable[[Iterator[Any], int, int], Iterator[Any]]) -> Iterator[Any]:
    """Run ``op``, which selects examples by their position in the epoch (take, shard), as the
    current stream: the streams (DataLoader workers, ranks) together select what one stream
    would. ``select(source, first, step)`` picks from ``source``, whose items are at the
    positions ``first``, ``first + step``, ... of the epoch: this stream's own after a strided
    upstream (:func:`strided`); otherwise stream 0 runs the whole upstream and selects alone,
    and the other streams yield nothing."""
    spec = streams.current()
    if spec.trivial or strided(op.parent):
        first, step = spec.index + spec.count * spec.skip, spec.count
        source = upstream(op, epoch)
    elif spec.index == 0:
        first, step = spec.skip, 1
        source = run(op.parent, epoch, streams.StreamSpec(skip=spec.skip))
    else:
        return iter(())
    return closing(source, select(source, first, step))


@runs(TakeOp)
def run_take(op: TakeOp, epoch: int) -> Iterator[Any]:
    return _by_position(op, epoch, lambda source, first, step: itertools.islice(
        source, len(range(first, op.count, step))))


@dataclass(frozen=True, eq=False)
class ShardOp(Op):
    num_shards: int = 1
    index: int = 0
    kind: ClassVar[str] = "shard"
    TRAITS: ClassVar = Traits(length="rule", structure_preserving=True, per_stream=True,
                              by_position=True)
    fingerprint_args: ClassVar = ("num_shards", "index")

    def describe(self) -> str:
        return f"shard({self.num_shards}, {self.index})"

    def length(self, upstream: int | None) -> int | None:
        if upstream is None:
            return None
        return max(0, -(-(upstream - self.index) // self.num_shards))


@runs(ShardOp)
def run_shard(op: ShardOp, epoch: int) -> Iterator[Any]:
    def select(source: Iterator[Any], first: int, step: int) -> Iterator[Any]:
        # the items at positions first + step * t with position % num_shards == index: a
        # pattern that repeats every num_shards / gcd(step, num_shards) items
        n = op.num_shards
        pattern = [(first + step * t) % n == op.index for t in range(n // math.gcd(step, n))]
        return itertools.compress(source, itertools.cycle(pattern))
    return _by_position(op, epoch, select)


@dataclass(frozen=True, eq=False)
class RepeatOp(Op):
    count: int | None = None
    kind: ClassVar[str] = "repeat"
    TRAITS: ClassVar = Traits(length="rule", structure_preserving=True)
    fingerprint_args: ClassVar = ("count",)

    def describe(self) -> str:
        return "repeat()" if self.count is None else f"repeat({self.count})"

    def length(self, upstream: int | None) -> int | None:
        if upstream is None or self.count is None:
            return None
        return upstream * self.count


@runs(RepeatOp)
def run_repeat(op: RepeatOp, epoch: int) -> Iterator[Any]:
    # Upstream iterators are built lazily, one a repetition: in the context (stream, stats)
    # this one was built in.
    context = contextvars.copy_context()

    def body() -> Iterator[Any]:
        counter = itertools.count() if op.count is None else range(op.count)
        for r in counter:
            source = context.run(upstream, op, epoch + r * REPEAT_EPOCH_STRIDE)
            empty = True
            try:
                for item in source:
                    empty = False
                    yield item
            finally:
                close = getattr(source, "close", None)
                if close is not None:
                    close()
            if empty and op.count is None:
                return  # repeating an empty dataset forever would hang

    return body()
