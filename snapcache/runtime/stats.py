"""Per-stage statistics of one epoch, and the one number that says if input is the bottleneck.

Every stage's iterator is wrapped by :meth:`Recorder.wrap`, which counts what passes through
and the time spent inside the stage's ``next()`` (that time includes the stages above it, unless
a prefetch or parallel stage decouples them). The outermost stage's time is how long the
consumer waited on input; :attr:`EpochStats.input_wait_fraction` is that wait over the epoch's
wall time: near 0 means the model is the bottleneck, near 1 means the input pipeline is.

Bytes are estimated from every 8th item, so counting stays cheap on fast pipelines.
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from snapcache.runtime.autotune import nbytes_of

_SAMPLE_MASK = 7

current: contextvars.ContextVar["Recorder | None"] = contextvars.ContextVar(
    "snapcache_stats_recorder", default=None)


@dataclass
class StageStats:
    """What passed through one stage of the pipeline during one epoch."""

    stage: str
    examples: int = 0
    bytes: int = 0
    seconds: float = 0.0
    """Time spent inside this stage's ``next()``, including the stages it pulls from."""
    examples_per_second: float = 0.0
    mb_per_second: float = 0.0
    _sampled_items: int = field(default=0, repr=False)
    _sampled_bytes: int = field(default=0, repr=False)


@dataclass
class EpochStats:
    """Statistics of one epoch: ``ds.stats()`` after (or during) iterating ``ds``.

    Example::

        for batch in ds:
            train_step(batch)
        s = ds.stats()
        print(s)                          # a table, one row a stage
        s.input_wait_fraction             # 0.02: the model is the bottleneck, not the input
    """

    stages: list[StageStats]
    wall_seconds: float
    input_wait_seconds: float
    examples: int
    finished: bool

    @property
    def input_wait_fraction(self) -> float:
        return self.input_wait_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for stage in d["stages"]:
            stage.pop("_sampled_items")
            stage.pop("_sampled_bytes")
        d["input_wait_fraction"] = self.input_wait_fraction
        return d

    def __str__(self) -> str:
        lines = [f"epoch: {self.examples} items in {self.wall_seconds:.3f} s; consumer waited "
                 f"{self.input_wait_seconds:.3f} s on input "
                 f"({100 * self.input_wait_fraction:.1f}% of the time)"
                 + ("" if self.finished else " (epoch not finished)"),
                 f"{'stage':<40} {'items':>10} {'items/s':>12} {'MB':>10} {'MB/s':>9} "
                 f"{'time in next() s':>17}"]
        for s in self.stages:
            lines.append(f"{s.stage[:40]:<40} {s.examples:>10} {s.examples_per_second:>12.1f} "
                         f"{s.bytes / 1e6:>10.2f} {s.mb_per_second:>9.1f} {s.seconds:>17.3f}")
        return "\n".join(lines)


class Recorder:
    """Collects :class:`StageStats` for the stages of one epoch.

    Stages are keyed by their depth in the pipeline (0 = the source); ``top`` is the depth of
    the stage the consumer pulls from. A stage re-created mid-epoch (by ``repeat``) adds to
    the same entry.
    """

    def __init__(self, top: int) -> None:
        self._top = top
        self._stages: dict[int, StageStats] = {}
        self._started: float | None = None
        self._ended: float | None = None

    def wrap(self, depth: int, label: str, iterator: Iterator[Any]) -> Iterator[Any]:
        stage = self._stages.get(depth)
        if stage is None:
            stage = self._stages[depth] = StageStats(label)
        return self._count(stage, iterator, depth == self._top)

    def _count(self, stage: StageStats, iterator: Iterator[Any], outer: bool) -> Iterator[Any]:
        clock = time.perf_counter
        if outer and self._started is None:
            self._started = clock()
        try:
            while True:
                t0 = clock()
                try:
                    item = next(iterator)
                except StopIteration:
                    stage.seconds += clock() - t0
                    if outer:
                        self._ended = clock()
                    return
                stage.seconds += clock() - t0
                if not stage.examples & _SAMPLE_MASK:
                    stage._sampled_items += 1
                    stage._sampled_bytes += nbytes_of(item)
                stage.examples += 1
                yield item
        finally:
            if outer and self._ended is None:
                self._ended = clock()
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def snapshot(self) -> EpochStats:
        """The numbers so far (the stages listed from the source to the consumer)."""
        now = time.perf_counter()
        start = self._started if self._started is not None else now
        end = self._ended if self._ended is not None else now
        wall = max(0.0, end - start)
        stages = []
        for _, s in sorted(self._stages.items()):
            estimate = (s._sampled_bytes * s.examples // s._sampled_items
                        if s._sampled_items else 0)
            stages.append(StageStats(
                s.stage, s.examples, estimate, s.seconds,
                s.examples / wall if wall > 0 else 0.0,
                estimate / 1e6 / wall if wall > 0 else 0.0))
        outer = self._stages.get(self._top)
        return EpochStats(stages=stages, wall_seconds=wall,
                          input_wait_seconds=outer.seconds if outer else 0.0,
                          examples=outer.examples if outer else 0,
                          finished=self._ended is not None)
