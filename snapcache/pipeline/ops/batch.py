"""``batch``: consecutive examples stacked per key, with its (example-by-example) runner.

Reading a committed snapshot directly below runs faster through whole Arrow columns: see
:mod:`snapcache.pipeline.runners`, which registers the snapshot-aware runner in place of this
one and falls back to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

from snapcache.pipeline.ops.base import Op, Traits, closing, runs, upstream
from snapcache.runtime.batch import Padding, batch_examples


@dataclass(frozen=True, eq=False)
class BatchOp(Op):
    batch_size: int = 1
    drop_remainder: bool = False
    padding: Padding | None = None
    """``padded_batch``: arrays of different shapes padded (None: ``batch``, they must agree)."""
    kind: ClassVar[str] = "batch"
    TRAITS: ClassVar = Traits(length="rule", structure_preserving=True, batch_dims=1,
                              per_stream=True)
    fingerprint_args: ClassVar = ("batch_size", "drop_remainder")
    fingerprint_args_if_set: ClassVar = ("padding",)

    def describe(self) -> str:
        if self.padding is not None:
            return f"padded_batch({self.batch_size}, {self.padding.describe()})"
        return f"batch({self.batch_size})"

    def length(self, upstream: int | None) -> int | None:
        if upstream is None:
            return None
        return upstream // self.batch_size if self.drop_remainder else \
            -(-upstream // self.batch_size)


@runs(BatchOp)
def run_batch(op: BatchOp, epoch: int) -> Iterator[Any]:
    source = upstream(op, epoch)
    return closing(source, batch_examples(source, op.batch_size, op.drop_remainder,
                                          op.padding))
