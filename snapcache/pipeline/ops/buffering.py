"""Ops that change when examples are produced, not what: ``prefetch`` and ``cache``."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from snapcache.options import AUTOTUNE
from snapcache.pipeline import streams
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
    """The in-memory copy filled by a cache op's first complete single-stream epoch (not part
    of the spec)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[Any] | None = None


@dataclass(frozen=True, eq=False)
class CacheOp(Op):
    """Keep the examples of the first complete epoch in memory and replay them.

    Only an epoch run as one stream (``StreamSpec.trivial``: the whole epoch, no DataLoader
    workers beyond one, one rank, nothing skipped) fills the cache or replays it. Run as one
    of several streams, the op passes its upstream through: each stream computes its share.

    Why not a cache per stream: what a stream's share holds is not fixed. It changes with the
    epoch (a seeded shuffle upstream), with the state of a snapshot upstream (written by these
    streams, or committed by another number of them) and with a resume (``skip``); and the
    streams run in separate processes (DataLoader workers, ranks) whose caches would fill in
    different epochs (a worker whose share ended first, a rank that stopped early). Shares
    replayed from different epochs would repeat some examples and lose others. The whole epoch
    is the one thing every single-stream iteration yields, whatever epoch filled it: that copy
    is replayed exactly once by anyone who asks for all of it, and never taken for a share (a
    DataLoader's workers, forked from a process that filled it, each compute their share).
    """

    state: CacheState = field(default_factory=CacheState)
    kind: ClassVar[str] = "cache"
    TRAITS: ClassVar = Traits(element_wise=True, one_to_one=True, keeps_copy=True,
                              length="keep", structure_preserving=True, content=False)
    not_fingerprinted: ClassVar = ("state",)

    def describe(self) -> str:
        return "cache"


@runs(CacheOp)
def run_cache(op: CacheOp, epoch: int) -> Iterator[Any]:
    if not streams.current().trivial:  # one stream's share: never stored, never replayed
        return upstream(op, epoch)
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
