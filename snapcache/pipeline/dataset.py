"""The user-facing ``Dataset``: an immutable, chainable handle on an op graph.

Each method validates its arguments eagerly and returns a new ``Dataset`` wrapping one more op
spec (see :mod:`snapcache.pipeline.ops`); nothing runs until the dataset is iterated.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Callable, Iterable, Iterator, Sequence

from snapcache.options import AUTOTUNE, SnapshotOptions, check_parallelism, default_root
from snapcache.pipeline import ops, plan
from snapcache.pipeline.explain import Explanation
from snapcache.pipeline.explain import explain as explain_tree
from snapcache.store.fs import Storage, expand_files


def _positive_int(value: Any, what: str, *, allow_zero: bool = False,
                  allow_autotune: bool = False) -> None:
    if allow_autotune and value == AUTOTUNE:
        return
    lowest = 0 if allow_zero else 1
    if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
        extra = " or snapcache.AUTOTUNE" if allow_autotune else ""
        raise ValueError(f"{what} must be an int >= {lowest}{extra}; got {value!r}")


def _callable(fn: Any, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} must be callable; got {type(fn).__name__}")


class Dataset:
    """An input pipeline. Iterating it runs one epoch and yields examples.

    Example::

        ds = (snapcache.Dataset.range(1000)
                .map(expensive, num_parallel_calls=snapcache.AUTOTUNE)
                .snapshot("/tmp/snaps")
                .shuffle(100, seed=0)
                .batch(32))
        for epoch in range(3):
            for batch in ds:
                ...
    """

    __slots__ = ("_op", "_epochs")

    def __init__(self, op: ops.Op):
        self._op = op
        self._epochs = itertools.count()

    def _then(self, op_type: type, **params: Any) -> "Dataset":
        return Dataset(op_type(parent=self._op, **params))

    def __repr__(self) -> str:
        return f"<snapcache.Dataset {plan.describe_pipeline(self._op)}>"

    # -- sources -------------------------------------------------------------------------------
    @classmethod
    def from_iterable(cls, items: Iterable[Any]) -> "Dataset":
        """Examples from an in-memory collection (a list, tuple, numpy array, ...)."""
        if iter(items) is items:
            raise TypeError(
                "from_iterable needs a collection that can be iterated again each epoch, not a "
                "one-shot iterator or generator; use Dataset.from_generator(fn) instead")
        return cls(ops.IterableSource(parent=None, items=items))

    @classmethod
    def from_generator(cls, fn: Callable[..., Iterable[Any]], *args: Any, **kwargs: Any
                       ) -> "Dataset":
        """Examples from ``fn(*args, **kwargs)``, called again at the start of every epoch."""
        _callable(fn, "from_generator's fn")
        return cls(ops.GeneratorSource(parent=None, fn=fn, args=args, kwargs=kwargs))

    @classmethod
    def range(cls, *args: int) -> "Dataset":
        """Like ``range``: ``Dataset.range(10)``, ``Dataset.range(2, 10, 2)``."""
        r = range(*args)
        return cls(ops.RangeSource(parent=None, start=r.start, stop=r.stop, step=r.step))

    @classmethod
    def from_files(cls, pattern_or_list: str | os.PathLike | Sequence[str | os.PathLike], *,
                   strict: bool = False, storage_options: dict | None = None) -> "Dataset":
        """File paths or URLs (any fsspec URL) matching a glob or listed; expanded now.

        Files are fingerprinted by path, size and mtime (ETag on S3); ``strict=True`` hashes
        their content instead.
        """
        urls = tuple(expand_files(pattern_or_list, storage_options))
        return cls(ops.FilesSource(parent=None, urls=urls, strict=strict,
                                   storage_options=dict(storage_options or {})))

    # -- transformations -----------------------------------------------------------------------
    def map(self, fn: Callable[[Any], Any], num_parallel_calls: int | None = None,
            deterministic: bool = True) -> "Dataset":
        """Apply ``fn`` to every example, on ``num_parallel_calls`` threads (or AUTOTUNE)."""
        _callable(fn, "map's fn")
        check_parallelism(num_parallel_calls, what="num_parallel_calls")
        return self._then(ops.MapOp, fn=fn, num_parallel_calls=num_parallel_calls,
                          deterministic=bool(deterministic))

    def filter(self, predicate: Callable[[Any], bool]) -> "Dataset":
        """Keep the examples for which ``predicate(example)`` is true."""
        _callable(predicate, "filter's predicate")
        return self._then(ops.FilterOp, predicate=predicate)

    def batch(self, batch_size: int, drop_remainder: bool = False) -> "Dataset":
        """Stack ``batch_size`` consecutive examples per key into numpy arrays."""
        _positive_int(batch_size, "batch_size")
        return self._then(ops.BatchOp, batch_size=batch_size, drop_remainder=drop_remainder)

    def shuffle(self, buffer_size: int, seed: int | None = None) -> "Dataset":
        """Shuffle through a buffer of ``buffer_size`` examples, differently each epoch;
        reproducibly so if ``seed`` is given."""
        _positive_int(buffer_size, "buffer_size")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f"seed must be an int or None; got {seed!r}")
        return self._then(ops.ShuffleOp, buffer_size=buffer_size, seed=seed)

    def prefetch(self, buffer_size: int = AUTOTUNE) -> "Dataset":
        """Produce up to ``buffer_size`` examples ahead of the consumer on a background thread."""
        _positive_int(buffer_size, "buffer_size", allow_autotune=True)
        return self._then(ops.PrefetchOp, buffer_size=buffer_size)

    def take(self, count: int) -> "Dataset":
        """The first ``count`` examples."""
        _positive_int(count, "count", allow_zero=True)
        return self._then(ops.TakeOp, count=count)

    def cache(self) -> "Dataset":
        """Keep the examples in memory after the first complete epoch."""
        return self._then(ops.CacheOp)

    def snapshot(self, path: str | os.PathLike | None = None, *, compression: str = "zstd",
                 compression_level: int | None = None, shard_size: int = 64 << 20,
                 key: str | None = None, name: str | None = None, verify: bool = True,
                 storage_options: dict | None = None) -> "Dataset":
        """Persist the examples up to here under ``path`` (a folder or fsspec URL; default
        ``$SNAPCACHE_ROOT`` or ``~/.cache/snapcache``) and read them back from then on.

        The first epoch computes and writes ``<path>/<fingerprint>/``; it is committed only when
        that epoch is consumed to its end. Later epochs and later runs with the same upstream
        pipeline read it instead of recomputing. ``key`` names the version yourself instead of
        fingerprinting the upstream pipeline.
        """
        options = SnapshotOptions(
            compression=compression, compression_level=compression_level,
            shard_size=shard_size, key=key, name=name, verify=verify,
            storage_options=dict(storage_options or {}))
        root = os.fspath(path) if path is not None else default_root()
        return self._then(ops.SnapshotOp, path=root, options=options)

    # -- running -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self.iterate()

    def iterate(self, epoch: int | None = None) -> Iterator[Any]:
        """An iterator over one epoch. ``epoch`` picks the shuffle order of seeded shuffles;
        by default each call (and each ``for`` loop) is the next epoch."""
        if epoch is None:
            epoch = next(self._epochs)
        return plan.iterate(self._op, epoch)

    # -- introspection -------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """The hex fingerprint of the pipeline up to here (what ``snapshot`` keys on)."""
        return plan.pipeline_fingerprint(self._op).digest

    def explain(self, path: str | os.PathLike | None = None, *,
                storage_options: dict | None = None) -> Explanation:
        """Say whether this pipeline's snapshot is committed and, if not, how it differs from
        the closest snapshot in the root. ``print(ds.explain())`` shows the report.

        The snapshot explained is the last ``.snapshot()`` of the pipeline (in ``path`` if
        given, else where it points); without one, the whole pipeline in ``path`` (default
        ``$SNAPCACHE_ROOT`` or ``~/.cache/snapcache``).
        """
        snap = plan.last_snapshot(self._op)
        if snap is not None:
            tree = plan.snapshot_tree(snap)
            root = os.fspath(path) if path is not None else snap.path
            options = storage_options if storage_options is not None else \
                snap.options.storage_options
        else:
            tree = plan.pipeline_fingerprint(self._op)
            root = os.fspath(path) if path is not None else default_root()
            options = storage_options or {}
        return explain_tree(tree, Storage(root, options))
