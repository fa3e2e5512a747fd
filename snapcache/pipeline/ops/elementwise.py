"""Element-wise transformations: ``map`` and ``filter``, with their runners."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

from snapcache.errors import warn
from snapcache.fingerprint import detect_randomness
from snapcache.machine import available_cpus
from snapcache.options import AUTOTUNE, resolve_parallelism
from snapcache.pipeline.ops.base import (Op, Traits, callable_name, closing, input_positions,
                                         runs, upstream)
from snapcache.runtime.autotune import ThreadTuner
from snapcache.runtime.errors import Locate, annotate
from snapcache.runtime.parallel import parallel_map
from snapcache.runtime.process import process_map

MAP_IN_ORDER = Traits(element_wise=True, one_to_one=True, length="keep")
MAP_AS_COMPLETED = Traits(element_wise=True, one_to_one=True, order_preserving=False,
                          length="keep")


@dataclass(frozen=True, eq=False)
class MapOp(Op):
    fn: Callable[[Any], Any] = None  # type: ignore[assignment]
    num_parallel_calls: int | None = None
    deterministic: bool = True
    executor: str = "thread"
    kind: ClassVar[str] = "map"
    fingerprint_functions: ClassVar = ("fn",)
    not_fingerprinted: ClassVar = ("num_parallel_calls", "deterministic", "executor")

    @property
    def traits(self) -> Traits:
        # deterministic=False yields results as they complete: the same examples, another order.
        return MAP_IN_ORDER if self.deterministic else MAP_AS_COMPLETED

    @property
    def function(self) -> Any:
        return self.fn

    def describe(self) -> str:
        return f"map `{callable_name(self.fn)}`"

    def randomness_problems(self) -> list[str]:
        return list(detect_randomness(self.fn))

    def locate(self) -> Locate | None:
        """How an error note names the example at one of this run's inputs (built by the
        runner, in the stream it runs in: :func:`~snapcache.pipeline.ops.base.input_positions`)."""
        return input_positions(self)


@runs(MapOp)
def run_map(op: MapOp, epoch: int) -> Iterator[Any]:
    source = upstream(op, epoch)
    locate = op.locate()
    if op.executor == "process" and _processes_allowed(op):
        workers = available_cpus() if op.num_parallel_calls == AUTOTUNE else \
            resolve_parallelism(op.num_parallel_calls, what="num_parallel_calls")
        return closing(source, process_map(op.fn, source, workers=workers,
                                           deterministic=op.deterministic, label=op.describe(),
                                           locate=locate))
    tuner = ThreadTuner() if op.num_parallel_calls == AUTOTUNE else None
    workers = resolve_parallelism(op.num_parallel_calls, what="num_parallel_calls")
    return closing(source, parallel_map(op.fn, source, workers=workers, tuner=tuner,
                                        deterministic=op.deterministic, label=op.describe(),
                                        locate=locate))


_warned_daemon = False


def _processes_allowed(op: MapOp) -> bool:
    """False, with a warning once a process, inside a daemonic process (a DataLoader worker):
    it cannot start processes, so ``executor="process"`` runs on threads there."""
    global _warned_daemon
    if not multiprocessing.current_process().daemon:
        return True
    if not _warned_daemon:
        _warned_daemon = True
        warn(f"{op.describe()} has executor='process' but runs inside a DataLoader worker (a "
             "daemonic process, which cannot start processes): it runs on threads there, and "
             "the DataLoader's workers are the processes. Pass executor='thread' to say so, or "
             "num_workers=0 to the DataLoader to keep the map's processes", RuntimeWarning)
    return False


@dataclass(frozen=True, eq=False)
class FilterOp(Op):
    predicate: Callable[[Any], bool] = None  # type: ignore[assignment]
    kind: ClassVar[str] = "filter"
    TRAITS: ClassVar = Traits(element_wise=True, structure_preserving=True)
    fingerprint_functions: ClassVar = ("predicate",)

    @property
    def function(self) -> Any:
        return self.predicate

    def describe(self) -> str:
        return f"filter `{callable_name(self.predicate)}`"

    def randomness_problems(self) -> list[str]:
        return list(detect_randomness(self.predicate))

    def locate(self) -> Locate | None:
        """As :meth:`MapOp.locate`."""
        return input_positions(self)


@runs(FilterOp)
def run_filter(op: FilterOp, epoch: int) -> Iterator[Any]:
    source = upstream(op, epoch)
    locate = op.locate()

    def body() -> Iterator[Any]:
        for index, item in enumerate(source):
            try:
                keep = op.predicate(item)
            except Exception as e:
                raise annotate(e, op.describe(), index, locate)
            if keep:
                yield item

    return closing(source, body())
