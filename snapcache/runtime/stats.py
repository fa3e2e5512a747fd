"""Per-stage statistics of one epoch, and the one number that says if input is the bottleneck.

Every stage's iterator is wrapped by :meth:`Recorder.wrap`, which counts what passes through
and the time spent inside the stage's ``next()`` (that time includes the stages above it, unless
a prefetch or parallel stage decouples them). The consumer's side is recorded by the iterator it
pulls from: how many items it was handed, how long it waited for them, and whether the epoch
ran to its end. :attr:`EpochStats.input_wait_fraction` is that wait over the epoch's wall time:
near 0 means the model is the bottleneck, near 1 means the input pipeline is.

Stages are the user's ops, keyed by their depth in the pipeline (0 = the source) and named as
``explain`` names them ("map #1 `decode`"). Where an epoch runs internal ops in their place (a
snapshot read in the epoch's global order runs the ops after it over (position, example)
pairs), those ops are counted as the stages they stand for (:meth:`Recorder.standing_in`).

Bytes are estimated from every 8th item, so counting stays cheap on fast pipelines.
"""

from __future__ import annotations

import contextvars
import operator
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Collection, Iterable, Iterator, Sequence

from snapcache.runtime.autotune import nbytes_of

_SAMPLE_MASK = 7

current: contextvars.ContextVar["Recorder | StandIn | None"] = contextvars.ContextVar(
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
    _pulls: int = field(default=0, repr=False)
    _sampled_items: int = field(default=0, repr=False)
    _sampled_bytes: int = field(default=0, repr=False)


@dataclass
class EpochStats:
    """Statistics of one epoch: ``ds.stats()`` after (or during) iterating ``ds``.

    ``examples`` are the items the consumer was handed, ``wall_seconds`` run from its first
    ``next()`` to the end of the epoch (or to now, while it runs), ``finished`` says whether
    the epoch ran to its end (False while it runs, and for an epoch closed or abandoned
    before its end).

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
        d["stages"] = [{k: v for k, v in stage.items() if not k.startswith("_")}
                       for stage in d["stages"]]
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


Size = Callable[[Any], int]


class Recorder:
    """Collects :class:`StageStats` for the stages of one epoch, and the consumer's side.

    ``labels`` names the stages, one a depth from the source down. A stage re-created
    mid-epoch (by ``repeat``, a delta snapshot's tasks) adds to the same entry; stages that
    do not run (those above a committed snapshot that is read) are not listed.
    """

    def __init__(self, labels: Sequence[str]) -> None:
        self._labels = list(labels)
        self._stages: dict[int, StageStats] = {}
        self._started: float | None = None
        self._ended: float | None = None
        self._finished = False
        self._waited = 0.0
        self._handed = 0  # items handed out one by one, and those of runs handed out whole
        self._run: Iterator[Any] | None = None
        self._run_size = 0

    # -- the stages --------------------------------------------------------------------------
    def wrap(self, depth: int, iterator: Iterator[Any], *, size: Size | None = None,
             payload: Callable[[Any], Any] | None = None) -> Iterator[Any]:
        """``iterator``, counted as the stage at ``depth``. ``size(item)`` is how many
        examples an item stands for (a chunk of rows; default 1); ``payload(item)`` is what
        its bytes are estimated from (default the item)."""
        return self._count(self._stage(depth), iterator, size, payload)

    def charge(self, depths: Iterable[int], seconds: float) -> None:
        """Add ``seconds`` to the time in ``next()`` of the stages at ``depths``: they waited
        that long for something that ran outside their iterators (a snapshot completed
        before it is read in the epoch's order)."""
        for depth in depths:
            self._stage(depth).seconds += seconds

    def standing_in(self, offset: int, *, skip: Collection[int] = (),
                    payload: Callable[[Any], Any] | None = None) -> "StandIn":
        """A recorder for a chain of internal ops that stands for the stages from ``offset``
        down: its op at depth ``d`` is counted as the stage at ``offset + d``, except the
        depths in ``skip`` (counted elsewhere)."""
        return StandIn(self, offset, frozenset(skip), payload)

    def _stage(self, depth: int) -> StageStats:
        stage = self._stages.get(depth)
        if stage is None:
            label = self._labels[depth] if depth < len(self._labels) else f"stage {depth}"
            stage = self._stages[depth] = StageStats(label)
        return stage

    @staticmethod
    def _count(stage: StageStats, iterator: Iterator[Any], size: Size | None,
               payload: Callable[[Any], Any] | None) -> Iterator[Any]:
        clock = time.perf_counter
        try:
            while True:
                t0 = clock()
                try:
                    item = next(iterator)
                except StopIteration:
                    stage.seconds += clock() - t0
                    return
                stage.seconds += clock() - t0
                n = 1 if size is None else size(item)
                if not stage._pulls & _SAMPLE_MASK:
                    stage._sampled_items += n
                    stage._sampled_bytes += nbytes_of(item if payload is None else payload(item))
                stage._pulls += 1
                stage.examples += n
                yield item
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    # -- the consumer ------------------------------------------------------------------------
    def waited(self, start: float, end: float) -> None:
        """The consumer waited from ``start`` to ``end`` (``time.perf_counter`` times) for an
        item or for the end of the epoch; the epoch began at its first wait."""
        if self._started is None:
            self._started = start
        self._waited += end - start

    def handed(self, run: Iterator[Any] | None = None) -> None:
        """One item was handed to the consumer, then (if given) the items of ``run``, an
        iterator with a length hint that the consumer takes them from: what is left of it
        when the next item is asked for, or at the end, was not handed out."""
        self._handed += 1
        if run is not None:
            self._close_run()
            self._run, self._run_size = run, operator.length_hint(run)

    def end(self, finished: bool) -> None:
        """The epoch ended: ran to its end (``finished``), or was closed before it. Only
        the first call counts."""
        if self._ended is not None:
            return
        self._ended = time.perf_counter()
        self._finished = finished and self._started is not None
        self._close_run()

    def _close_run(self) -> None:
        if self._run is not None:
            self._handed += self._run_size - operator.length_hint(self._run)
            self._run = None

    def _examples(self) -> int:
        if self._run is None:
            return self._handed
        return self._handed + self._run_size - operator.length_hint(self._run)

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
        return EpochStats(stages=stages, wall_seconds=wall, input_wait_seconds=self._waited,
                          examples=self._examples(), finished=self._finished)


class StandIn:
    """What :meth:`Recorder.standing_in` returns: ``wrap`` counts an internal op's iterator as
    the user's stage it stands for."""

    def __init__(self, recorder: Recorder, offset: int, skip: frozenset[int],
                 payload: Callable[[Any], Any] | None) -> None:
        self._recorder, self._offset, self._skip, self._payload = \
            recorder, offset, skip, payload

    def wrap(self, depth: int, iterator: Iterator[Any], *, size: Size | None = None,
             payload: Callable[[Any], Any] | None = None) -> Iterator[Any]:
        if depth in self._skip:
            return iterator
        return self._recorder.wrap(self._offset + depth, iterator, size=size,
                                   payload=payload or self._payload)
