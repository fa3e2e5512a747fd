"""``interleave``: each example replaced by the examples of ``fn(example)``, read in turn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

from snapcache.machine import available_cpus
from snapcache.options import AUTOTUNE
from snapcache.pipeline.ops.base import (Op, Traits, callable_name, closing, input_positions,
                                         runs, upstream)
from snapcache.runtime.interleave import interleave


@dataclass(frozen=True, eq=False)
class InterleaveOp(Op):
    fn: Callable[[Any], Any] = None  # type: ignore[assignment]
    cycle_length: int = 1
    block_length: int = 1
    num_parallel_calls: int | None = None
    deterministic: bool = True
    kind: ClassVar[str] = "interleave"
    fingerprint_functions: ClassVar = ("fn",)
    fingerprint_args: ClassVar = ("cycle_length", "block_length")
    not_fingerprinted: ClassVar = ("num_parallel_calls", "deterministic")

    @property
    def traits(self) -> Traits:
        return Traits(order_preserving=self.deterministic, per_input=True)

    @property
    def function(self) -> Any:
        return self.fn

    def describe(self) -> str:
        return f"interleave `{callable_name(self.fn)}`"


@runs(InterleaveOp)
def run_interleave(op: InterleaveOp, epoch: int) -> Iterator[Any]:
    source = upstream(op, epoch)
    cycle = available_cpus() if op.cycle_length == AUTOTUNE else op.cycle_length
    if op.num_parallel_calls == AUTOTUNE:
        parallelism = 2 * cycle  # the open sources plus as many opened ahead
    else:
        parallelism = op.num_parallel_calls or 1
    return closing(source, interleave(
        _as_iterable(op.fn, epoch), source, cycle_length=cycle, block_length=op.block_length,
        parallelism=parallelism, deterministic=op.deterministic, label=op.describe(),
        locate=input_positions(op)))


def _as_iterable(fn: Callable[[Any], Any], epoch: int) -> Callable[[Any], Any]:
    """Let interleave's function return a Dataset (iterated as this epoch) or any iterable."""

    def opened(element: Any) -> Any:
        result = fn(element)
        iterate = getattr(result, "iterate", None)
        return iterate(epoch) if callable(iterate) else result

    return opened
