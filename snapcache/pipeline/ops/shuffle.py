"""``shuffle``: a buffer shuffle, a new order each epoch (reproducible with a seed).

Reading a committed snapshot directly below shuffles shards and column windows instead: see
:mod:`snapcache.pipeline.runners`, which registers the snapshot-aware runner in place of this
one and falls back to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

from snapcache.pipeline.ops.base import Op, Traits, closing, runs, upstream
from snapcache.runtime.shuffle import buffer_shuffle, epoch_rng


@dataclass(frozen=True, eq=False)
class ShuffleOp(Op):
    buffer_size: int = 1
    seed: int | None = None
    kind: ClassVar[str] = "shuffle"
    TRAITS: ClassVar = Traits(order_preserving=False, length="keep", structure_preserving=True)
    fingerprint_args: ClassVar = ("buffer_size", "seed")

    def describe(self) -> str:
        return f"shuffle({self.buffer_size})"

    def randomness_problems(self) -> list[str]:
        return ["is an unseeded shuffle"] if self.seed is None else []

    def order_varies(self) -> bool:
        return self.seed is None  # a seed fixes the order of each epoch


@runs(ShuffleOp)
def run_shuffle(op: ShuffleOp, epoch: int) -> Iterator[Any]:
    source = upstream(op, epoch)
    return closing(source, buffer_shuffle(source, op.buffer_size, epoch_rng(op.seed, epoch)))
