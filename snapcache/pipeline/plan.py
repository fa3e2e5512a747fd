"""From op specs to running iterators, and from upstream ops to fingerprints.

``iterate(op, epoch)`` builds the generator chain for one epoch. At a snapshot op the graph is
cut: the upstream part is fingerprinted; if ``<root>/<fingerprint>/`` holds a committed snapshot
it is read instead of running the upstream ops, otherwise the upstream runs and its examples are
teed into a :class:`~snapcache.store.writer.SnapshotWriter`, committed when the epoch ends.
"""

from __future__ import annotations

import itertools
import logging
import warnings
import weakref
from typing import Any, Callable, Iterator

from snapcache.errors import RandomnessWarning
from snapcache.fingerprint import FingerprintNode, detect_randomness
from snapcache.fingerprint.tree import combine, leaf, pipeline_root
from snapcache.options import AUTOTUNE, resolve_parallelism
from snapcache.pipeline import ops
from snapcache.runtime.batch import batch_examples
from snapcache.runtime.errors import annotate
from snapcache.runtime.parallel import parallel_map
from snapcache.runtime.prefetch import prefetch
from snapcache.runtime.shuffle import buffer_shuffle, epoch_rng
from snapcache.store.fs import Storage
from snapcache.store.reader import SnapshotReader, load_manifest
from snapcache.store.writer import SnapshotWriter

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
def iterate(op: ops.Op, epoch: int) -> Iterator[Any]:
    """A fresh iterator over one epoch of the pipeline ending at ``op``."""
    return _RUNNERS[type(op)](op, epoch)


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
    return iter(op.items)


def _run_generator(op: ops.GeneratorSource, epoch: int) -> Iterator[Any]:
    produced = op.fn(*op.args, **op.kwargs)
    try:
        return iter(produced)
    except TypeError:
        raise TypeError(
            f"from_generator: {ops.callable_name(op.fn)}(...) returned "
            f"{type(produced).__name__}, not an iterable; pass a generator function") from None


def _run_range(op: ops.RangeSource, epoch: int) -> Iterator[Any]:
    return iter(range(op.start, op.stop, op.step))


def _run_files(op: ops.FilesSource, epoch: int) -> Iterator[Any]:
    return iter(op.urls)


def _run_map(op: ops.MapOp, epoch: int) -> Iterator[Any]:
    source = _upstream(op, epoch)
    workers = resolve_parallelism(op.num_parallel_calls, what="num_parallel_calls")
    return _closing(source, parallel_map(op.fn, source, workers=workers,
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
    size = AUTOTUNE_PREFETCH if op.buffer_size == AUTOTUNE else op.buffer_size
    return prefetch(_upstream(op, epoch), size)


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


_warned: "weakref.WeakSet[ops.Op]" = weakref.WeakSet()


def _warn_randomness(op: ops.SnapshotOp) -> None:
    if op in _warned:
        return
    _warned.add(op)
    for label, node in labelled_ops(op):
        problems = []
        if isinstance(node, ops.ShuffleOp) and node.seed is None:
            problems.append("is an unseeded shuffle")
        fn = getattr(node, "fn", None) or getattr(node, "predicate", None)
        if isinstance(node, (ops.MapOp, ops.FilterOp)):
            problems.extend(detect_randomness(fn))
        for problem in problems:
            warnings.warn(
                f"{label} {problem}: its random draws are frozen into the snapshot at "
                f"{op.path} and replayed every epoch. Move it after .snapshot(), or seed it.",
                RandomnessWarning, stacklevel=4)


def _run_snapshot(op: ops.SnapshotOp, epoch: int) -> Iterator[Any]:
    assert op.parent is not None
    options = op.options
    tree = snapshot_tree(op)
    if not options.key:
        _warn_randomness(op)
    storage = Storage(op.path, options.storage_options).child(tree.digest)
    manifest = load_manifest(storage)
    if manifest is not None:
        log.debug("snapshot hit: %s", storage.url)
        return SnapshotReader(storage, manifest, verify=options.verify).examples()
    log.info("snapshot miss: writing %s", storage.url)
    writer = SnapshotWriter(storage, fingerprint=tree.digest, options=options,
                            fingerprint_tree=tree.to_json(), pipeline=describe_pipeline(op.parent))
    source = iterate(op.parent, epoch)

    def tee() -> Iterator[Any]:
        try:
            for item in source:
                writer.write(item)
                yield item
            writer.commit()
        finally:
            writer.abort()  # no-op after a commit; removes partial files otherwise

    return _closing(source, tee())


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
