"""Op specs: what each pipeline step is, as immutable data with declared traits, declared
fingerprint fields and a registered runner. One module per op family:

- :mod:`~snapcache.pipeline.ops.base`: :class:`Op`, :class:`Traits`, the runner registry;
- :mod:`~snapcache.pipeline.ops.sources`: from_iterable, from_generator, range, from_files,
  from_parquet, from_torch;
- :mod:`~snapcache.pipeline.ops.elementwise`: map, filter;
- :mod:`~snapcache.pipeline.ops.batch`, :mod:`~snapcache.pipeline.ops.shuffle`;
- :mod:`~snapcache.pipeline.ops.slicing`: take, shard, repeat;
- :mod:`~snapcache.pipeline.ops.interleave`;
- :mod:`~snapcache.pipeline.ops.buffering`: prefetch, cache;
- :mod:`~snapcache.pipeline.ops.snapshot`.

Everything else decides by asking ops for their traits (``op.traits``), never by listing op
types; the derived decisions (stream splitting, resume, length) are the functions below.
"""

from snapcache.pipeline.ops.base import (RUNNERS, Op, Traits, callable_name, closing, counted,
                                         from_source, keeps_positions, lineage, run, runs,
                                         strided, upstream)
from snapcache.pipeline.ops.batch import BatchOp
from snapcache.pipeline.ops.buffering import CacheOp, CacheState, PrefetchOp
from snapcache.pipeline.ops.elementwise import FilterOp, MapOp
from snapcache.pipeline.ops.interleave import InterleaveOp
from snapcache.pipeline.ops.shuffle import ShuffleOp
from snapcache.pipeline.ops.slicing import REPEAT_EPOCH_STRIDE, RepeatOp, ShardOp, TakeOp
from snapcache.pipeline.ops.snapshot import SnapshotOp, copied_snapshot, snapshot_below
from snapcache.pipeline.ops.sources import (FilesSource, GeneratorSource, IterableSource,
                                            ParquetSource, RangeSource, TorchSource)

__all__ = [
    "RUNNERS", "Op", "Traits", "callable_name", "closing", "counted", "lineage", "run", "runs",
    "upstream",
    "BatchOp", "CacheOp", "CacheState", "PrefetchOp", "FilterOp", "MapOp", "InterleaveOp",
    "ShuffleOp", "REPEAT_EPOCH_STRIDE", "RepeatOp", "ShardOp", "TakeOp", "SnapshotOp",
    "snapshot_below", "copied_snapshot", "FilesSource", "GeneratorSource", "IterableSource", "ParquetSource",
    "RangeSource", "TorchSource", "splittable", "strided", "resumable", "known_length",
    "delta_source", "rebase",
]


def splittable(op: Op | None) -> bool:
    """True if running the pipeline up to ``op`` as N streams, each on its share of the
    source, yields the same examples as one run: only element-wise ops after the source, and
    selections by position (take, shard) of a strided upstream (:func:`strided`)."""
    return op is None or all(
        node.traits.source or node.traits.element_wise or
        (node.traits.by_position and strided(node.parent)) for node in lineage(op))


def resumable(op: Op | None) -> bool:
    """True if the pipeline up to ``op`` can start at its k-th output by skipping k source
    examples: a seekable source, then only one-to-one, order-preserving ops that keep no copy
    (after a ``map(deterministic=False)`` the first k outputs are not the first k inputs)."""
    return from_source(op, lambda t: t.seekable, keeps_positions)


def known_length(op: Op | None) -> int | None:
    """How many items one epoch of the pipeline up to ``op`` yields, when that is knowable
    without running it (each op's length rule applied from the source down)."""
    if op is None:
        return None
    n: int | None = None
    for node in lineage(op):
        n = node.length(n)
    return n


def delta_source(op: Op | None) -> Op | None:
    """The source of the pipeline up to ``op`` if a delta snapshot can build it unit by unit:
    a source made of units (files) followed only by ops whose every output comes from one
    input alone (element-wise, or ``per_input`` such as interleave) and that keep no copy.
    None otherwise."""
    if op is None:
        return None
    chain = lineage(op)
    source = chain[0]
    if not source.traits.units:
        return None
    if all((node.traits.element_wise or node.traits.per_input) and not node.traits.keeps_copy
           for node in chain[1:]):
        return source
    return None


def rebase(op: Op, source: Op) -> Op:
    """The pipeline up to ``op`` with its source replaced by ``source`` (a copy of each op, with
    no memo of the original)."""
    import dataclasses

    node = source
    for step in lineage(op)[1:]:
        node = dataclasses.replace(step, parent=node)
    return node
