"""Ops that choose which examples pass, by position: ``take``, ``shard``, ``repeat``."""

from __future__ import annotations

import contextvars
import itertools
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

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
                              prefix=True)
    fingerprint_args: ClassVar = ("count",)

    def describe(self) -> str:
        return f"take({self.count})"

    def length(self, upstream: int | None) -> int | None:
        return None if upstream is None else min(upstream, self.count)


@runs(TakeOp)
def run_take(op: TakeOp, epoch: int) -> Iterator[Any]:
    # The streams (DataLoader workers, ranks) take the first ``count`` together, not each.
    spec = streams.current()
    if spec.trivial or strided(op.parent):  # by position: the ones of this stream below count
        count = len(range(spec.index + spec.count * spec.skip, op.count, spec.count))
        source = upstream(op, epoch)
    elif spec.index == 0:  # no stream knows its examples' positions: stream 0 takes them all
        count = max(0, op.count - spec.skip)
        source = run(op.parent, epoch, streams.StreamSpec(skip=spec.skip))
    else:
        return iter(())
    return closing(source, itertools.islice(source, count))


@dataclass(frozen=True, eq=False)
class ShardOp(Op):
    num_shards: int = 1
    index: int = 0
    kind: ClassVar[str] = "shard"
    TRAITS: ClassVar = Traits(length="rule", structure_preserving=True, per_stream=True)
    fingerprint_args: ClassVar = ("num_shards", "index")

    def describe(self) -> str:
        return f"shard({self.num_shards}, {self.index})"

    def length(self, upstream: int | None) -> int | None:
        if upstream is None:
            return None
        return max(0, -(-(upstream - self.index) // self.num_shards))


@runs(ShardOp)
def run_shard(op: ShardOp, epoch: int) -> Iterator[Any]:
    source = upstream(op, epoch)
    return closing(source, itertools.islice(source, op.index, None, op.num_shards))


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
