"""Ops that change when examples are produced, not what: ``prefetch`` and ``cache``."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from snapcache.options import AUTOTUNE
from snapcache.pipeline.ops.base import Op, Traits, closing, runs, upstream
from snapcache.runtime.autotune import BufferTuner
from snapcache.runtime.prefetch import prefetch

AUTOTUNE_PREFETCH = 8


@dataclass(frozen=True, eq=False)
class PrefetchOp(Op):
    buffer_size: int = 1
    kind: ClassVar[str] = "prefetch"
    TRAITS: ClassVar = Traits(element_wise=True, one_to_one=True, length="keep",
                              structure_preserving=True, content=False)
    not_fingerprinted: ClassVar = ("buffer_size",)

    def describe(self) -> str:
        return "prefetch"


@runs(PrefetchOp)
def run_prefetch(op: PrefetchOp, epoch: int) -> Iterator[Any]:
    if op.buffer_size == AUTOTUNE:
        return prefetch(upstream(op, epoch), AUTOTUNE_PREFETCH, tuner=BufferTuner())
    return prefetch(upstream(op, epoch), op.buffer_size)


class CacheState:
    """The in-memory copy filled by a cache op's first complete epoch (not part of the spec)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[Any] | None = None


@dataclass(frozen=True, eq=False)
class CacheOp(Op):
    state: CacheState = field(default_factory=CacheState)
    kind: ClassVar[str] = "cache"
    TRAITS: ClassVar = Traits(element_wise=True, one_to_one=True, keeps_copy=True,
                              length="keep", structure_preserving=True, content=False)
    not_fingerprinted: ClassVar = ("state",)

    def describe(self) -> str:
        return "cache"


@runs(CacheOp)
def run_cache(op: CacheOp, epoch: int) -> Iterator[Any]:
    state = op.state
    if state.items is not None:
        return iter(state.items)
    source = upstream(op, epoch)

    def fill() -> Iterator[Any]:
        items = []
        for item in source:
            items.append(item)
            yield item
        with state.lock:
            if state.items is None:
                state.items = items

    return closing(source, fill())
