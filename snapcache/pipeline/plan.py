"""From op specs to running iterators, and from upstream ops to fingerprints.

``iterate(op, epoch)`` builds the generator chain for one epoch. At a snapshot op the graph is
cut: the upstream part is fingerprinted; if ``<root>/<fingerprint>/`` holds a committed snapshot
it is read instead of running the upstream ops, otherwise the upstream runs and its examples are
teed into a :class:`~snapcache.store.writer.SnapshotWriter`, committed when the epoch ends.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Iterator

from snapcache.fingerprint import FingerprintNode
from snapcache.fingerprint.tree import combine, leaf, pipeline_root
from snapcache.options import AUTOTUNE, resolve_parallelism
from snapcache.pipeline import ops, streams
from snapcache.pipeline.snapshot_exec import run_snapshot
from snapcache.pipeline.streams import StreamSpec
from snapcache.runtime.batch import batch_examples
from snapcache.runtime.errors import annotate
from snapcache.runtime import stats
from snapcache.runtime.autotune import BufferTuner, ThreadTuner, available_cpus
from snapcache.runtime.parallel import parallel_map
from snapcache.runtime.prefetch import prefetch
from snapcache.runtime.process import process_map
from snapcache.runtime.shuffle import buffer_shuffle, epoch_rng

log = logging.getLogger("snapcache")

AUTOTUNE_PREFETCH = 8


# -- fingerprints ------------------------------------------------------------------------------
def labelled_ops(op: ops.Op) -> list[tuple[str, ops.Op]]:
    """The content ops from the source to ``op`` with their human labels
    ("source", "map #1 `decode`", ...)."""
    labelled = []
    position = 0
    for node in ops.lineage(op):
        if not node.content:
            continue
        if isinstance(node, ops.SOURCES):
            labelled.append(("source", node))
        else:
            position += 1
            labelled.append((f"{node.kind} #{position}" + _named(node), node))
    return labelled


def _named(node: ops.Op) -> str:
    fn = getattr(node, "fn", None) or getattr(node, "predicate", None)
    return f" `{ops.callable_name(fn)}`" if fn is not None else ""


def pipeline_fingerprint(op: ops.Op) -> FingerprintNode:
    """The fingerprint tree of everything up to and including ``op``."""
    nodes = [combine(label, node.fingerprint_children(label), kind=f"op:{node.kind}",
                     summary=node.describe())
             for label, node in labelled_ops(op)]
    return pipeline_root(nodes)


def keyed_fingerprint(key: str) -> FingerprintNode:
    """A user-named version replaces the computed fingerprint (``snapshot(path, key=...)``)."""
    return combine("snapshot key", [leaf("key", "user-key", key.encode(), summary=key)],
                   kind="keyed")


def snapshot_tree(op: ops.SnapshotOp) -> FingerprintNode:
    """What a snapshot op keys on: the user's ``key``, else its upstream pipeline."""
    assert op.parent is not None
    return keyed_fingerprint(op.options.key) if op.options.key else pipeline_fingerprint(op.parent)


def last_snapshot(op: ops.Op) -> ops.SnapshotOp | None:
    """The snapshot op closest to ``op`` in its lineage, if any."""
    for node in reversed(ops.lineage(op)):
        if isinstance(node, ops.SnapshotOp):
            return node
    return None


def describe_pipeline(op: ops.Op) -> str:
    return " -> ".join(node.describe() for node in ops.lineage(op))


# -- execution ---------------------------------------------------------------------------------
def iterate(op: ops.Op, epoch: int, stream: StreamSpec | None = None) -> Iterator[Any]:
    """A fresh iterator over one epoch of the pipeline ending at ``op``; with ``stream``,
    only that stream's share of the examples (see :mod:`snapcache.pipeline.streams`)."""
    if stream is None:
        return _instrument(op, _RUNNERS[type(op)](op, epoch))
    token = streams.set_current(stream)
    try:
        return _instrument(op, _RUNNERS[type(op)](op, epoch))
    finally:
        streams.reset(token)


def _instrument(op: ops.Op, iterator: Iterator[Any]) -> Iterator[Any]:
    """Count what passes through this stage when ``Dataset.stats()`` is collecting."""
    recorder = stats.current.get()
    if recorder is None:
        return iterator
    return recorder.wrap(len(ops.lineage(op)) - 1, op.describe(), iterator)


def _upstream(op: ops.Op, epoch: int) -> Iterator[Any]:
    assert op.parent is not None
    return iterate(op.parent, epoch)


def _closing(source: Iterator[Any], body: Iterator[Any]) -> Iterator[Any]:
    """Yield from ``body``; close ``source`` however this generator ends."""
    try:
        yield from body
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def _run_iterable(op: ops.IterableSource, epoch: int) -> Iterator[Any]:
    return streams.split(op.items)


def _run_generator(op: ops.GeneratorSource, epoch: int) -> Iterator[Any]:
    produced = op.fn(*op.args, **op.kwargs)
    try:
        iter(produced)
    except TypeError:
        raise TypeError(
            f"from_generator: {ops.callable_name(op.fn)}(...) returned "
            f"{type(produced).__name__}, not an iterable; pass a generator function") from None
    return streams.split(produced)


def _run_range(op: ops.RangeSource, epoch: int) -> Iterator[Any]:
    return iter(streams.split_range(op.start, op.stop, op.step))


def _run_files(op: ops.FilesSource, epoch: int) -> Iterator[Any]:
    return streams.split(op.urls)


def _run_map(op: ops.MapOp, epoch: int) -> Iterator[Any]:
    source = _upstream(op, epoch)
    if op.executor == "process":
        workers = available_cpus() if op.num_parallel_calls == AUTOTUNE else \
            resolve_parallelism(op.num_parallel_calls, what="num_parallel_calls")
        return _closing(source, process_map(op.fn, source, workers=workers,
                                            deterministic=op.deterministic, label=op.describe()))
    tuner = ThreadTuner() if op.num_parallel_calls == AUTOTUNE else None
    workers = resolve_parallelism(op.num_parallel_calls, what="num_parallel_calls")
    return _closing(source, parallel_map(op.fn, source, workers=workers, tuner=tuner,
                                         deterministic=op.deterministic, label=op.describe()))


def _run_filter(op: ops.FilterOp, epoch: int) -> Iterator[Any]:
    source = _upstream(op, epoch)

    def body() -> Iterator[Any]:
        for index, item in enumerate(source):
            try:
                keep = op.predicate(item)
            except Exception as e:
                raise annotate(e, op.describe(), index)
            if keep:
                yield item

    return _closing(source, body())


def _run_batch(op: ops.BatchOp, epoch: int) -> Iterator[Any]:
    source = _upstream(op, epoch)
    return _closing(source, batch_examples(source, op.batch_size, op.drop_remainder))


def _run_shuffle(op: ops.ShuffleOp, epoch: int) -> Iterator[Any]:
    source = _upstream(op, epoch)
    return _closing(source, buffer_shuffle(source, op.buffer_size, epoch_rng(op.seed, epoch)))


def _run_take(op: ops.TakeOp, epoch: int) -> Iterator[Any]:
    source = _upstream(op, epoch)
    return _closing(source, itertools.islice(source, op.count))


def _run_prefetch(op: ops.PrefetchOp, epoch: int) -> Iterator[Any]:
    if op.buffer_size == AUTOTUNE:
        return prefetch(_upstream(op, epoch), AUTOTUNE_PREFETCH, tuner=BufferTuner())
    return prefetch(_upstream(op, epoch), op.buffer_size)


def _run_cache(op: ops.CacheOp, epoch: int) -> Iterator[Any]:
    state = op.state
    if state.items is not None:
        return iter(state.items)
    source = _upstream(op, epoch)

    def fill() -> Iterator[Any]:
        items = []
        for item in source:
            items.append(item)
            yield item
        with state.lock:
            if state.items is None:
                state.items = items

    return _closing(source, fill())


def _run_snapshot(op: ops.SnapshotOp, epoch: int) -> Iterator[Any]:
    assert op.parent is not None
    return run_snapshot(op, epoch, runners.with_progress(op, iterate), tree=snapshot_tree(op),
                        labelled=labelled_ops(op), describe=describe_pipeline(op.parent))


_RUNNERS: dict[type, Callable[[Any, int], Iterator[Any]]] = {
    ops.IterableSource: _run_iterable,
    ops.GeneratorSource: _run_generator,
    ops.RangeSource: _run_range,
    ops.FilesSource: _run_files,
    ops.MapOp: _run_map,
    ops.FilterOp: _run_filter,
    ops.BatchOp: _run_batch,
    ops.ShuffleOp: _run_shuffle,
    ops.TakeOp: _run_take,
    ops.PrefetchOp: _run_prefetch,
    ops.CacheOp: _run_cache,
    ops.SnapshotOp: _run_snapshot,
}

# Runners of the parallel runtime and the fast snapshot reads (they use the helpers above).
from snapcache.pipeline import runners  # noqa: E402

_RUNNERS.update(runners.RUNNERS)

# Sources from the ecosystem (Parquet, torch datasets).
from snapcache.pipeline import ecosystem  # noqa: E402

_RUNNERS.update(ecosystem.RUNNERS)
