"""The user-facing ``Dataset``: an immutable, chainable handle on an op graph.

Each method validates its arguments eagerly and returns a new ``Dataset`` wrapping one more op
spec (see :mod:`snapcache.pipeline.ops`); nothing runs until the dataset is iterated.
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Sequence

from snapcache.errors import RedundantSnapshotWarning, warn
from snapcache.fingerprint import register
from snapcache.machine import available_cpus
from snapcache.options import AUTOTUNE, SnapshotOptions, check_parallelism, default_root
from snapcache.pipeline import ops, ordered, plan

EXECUTORS = ("thread", "process")
from snapcache.pipeline.build import SnapshotBuilder
from snapcache.pipeline.explain import Explanation
from snapcache.pipeline.iterator import DatasetIterator, Deferred
from snapcache.pipeline.ops.sources import in_order
from snapcache.pipeline.rebuild import Rebuilding
from snapcache.pipeline.streams import StreamSpec, indexable
from snapcache.runtime import stats
from snapcache.runtime.batch import Padding
from snapcache.runtime.process import check_picklable
from snapcache.pipeline.explain import explain as explain_tree
from snapcache.store.fs import Storage, check_url
from snapcache.store.source_files import expand_files
from snapcache.pipeline.handle import Snapshot


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

    __slots__ = ("_op", "_epochs", "_recorder")

    def __init__(self, op: ops.Op):
        self._op = op
        self._epochs = itertools.count()
        self._recorder: stats.Recorder | None = None

    def _then(self, op_type: type, **params: Any) -> "Dataset":
        return Dataset(op_type(parent=self._op, **params))

    def __reduce__(self) -> tuple:
        # Pickled (to DataLoader workers, Ray tasks) as its op graph only: no epoch counter,
        # no statistics; the receiving process takes its own fingerprint.
        return (Dataset, (self._op,))

    def __repr__(self) -> str:
        return f"<snapcache.Dataset {plan.describe_pipeline(self._op)}>"

    # -- sources -------------------------------------------------------------------------------
    @classmethod
    def from_iterable(cls, items: Iterable[Any]) -> "Dataset":
        """Examples from an in-memory collection (a list, tuple, numpy array, ...), in its
        order; a set is taken sorted (its own order changes between processes) and refused if
        its elements have no single order."""
        items = in_order(items, "from_iterable", "items")
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
        their content instead. A list keeps its order; a set of paths is taken sorted.
        """
        pattern_or_list = in_order(pattern_or_list, "from_files", "paths", key=os.fspath)
        urls = tuple(expand_files(pattern_or_list, storage_options))
        return cls(ops.FilesSource(parent=None, urls=urls, strict=strict,
                                   storage_options=dict(storage_options or {})))

    @classmethod
    def from_parquet(cls, path_or_glob: str | os.PathLike | Sequence[str | os.PathLike],
                     columns: Sequence[str] | None = None, *,
                     storage_options: dict | None = None) -> "Dataset":
        """Rows of Parquet files (a file, glob, folder or list; local or any fsspec URL such
        as ``s3://``) as dicts of column values, read lazily, a batch of rows at a time.

        Files are fingerprinted by identity (path, size and mtime; ETag on S3) plus
        ``columns``. Streams (DataLoader workers, ranks) share the work by file, or by row
        group when there are fewer files than streams::

            ds = Dataset.from_parquet("s3://bucket/train/*.parquet", columns=["text", "label"])
        """
        from snapcache.store.parquet import expand_parquet

        if isinstance(columns, str) or (columns is not None and not all(
                isinstance(c, str) for c in columns)):
            raise TypeError(f"columns must be a list of column names or None; got {columns!r}")
        path_or_glob = in_order(path_or_glob, "from_parquet", "paths", key=os.fspath)
        urls = tuple(expand_parquet(path_or_glob, storage_options))
        return cls(ops.ParquetSource(parent=None, urls=urls,
                                     columns=tuple(columns) if columns is not None else None,
                                     storage_options=dict(storage_options or {})))

    @classmethod
    def from_torch(cls, dataset: Any) -> "Dataset":
        """Examples ``dataset[i]`` of a map-style dataset (``torch.utils.data.Dataset`` or
        anything with ``__getitem__`` and ``__len__``), torch tensors turned into numpy arrays.

        The dataset is fingerprinted by its state (its attributes, tensors by content); if it
        holds something that cannot be hashed, name the version with ``snapshot(key=...)``.
        """
        if not indexable(dataset):
            raise TypeError(f"from_torch needs a map-style dataset with __getitem__ and __len__; "
                            f"got {type(dataset).__name__} (for an IterableDataset use "
                            "Dataset.from_generator(iter, dataset))")
        from snapcache.adapters.torch import register_tensor_fingerprint

        register_tensor_fingerprint()
        return cls(ops.TorchSource(parent=None, dataset=dataset))

    # -- transformations -----------------------------------------------------------------------
    def map(self, fn: Callable[[Any], Any], num_parallel_calls: int | None = None,
            deterministic: bool = True, executor: str = "thread") -> "Dataset":
        """Apply ``fn`` to every example, ``num_parallel_calls`` at a time (or AUTOTUNE).

        ``executor="thread"`` suits functions that release the GIL (numpy, decoding, I/O);
        ``executor="process"`` runs ``fn`` in worker processes, for pure-Python work; it must
        then be picklable (a module-level function). Each worker process reseeds numpy's
        (and torch's) global random generator, so random draws differ between workers and
        epochs. Inside a DataLoader worker, which cannot start processes, it runs on threads
        (with a warning). Results keep the input order unless ``deterministic=False``.
        """
        _callable(fn, "map's fn")
        check_parallelism(num_parallel_calls, what="num_parallel_calls")
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(map(repr, EXECUTORS))}; "
                             f"got {executor!r}")
        if executor == "process":
            check_picklable(fn)
        return self._then(ops.MapOp, fn=fn, num_parallel_calls=num_parallel_calls,
                          deterministic=bool(deterministic), executor=executor)

    def interleave(self, fn: Callable[[Any], Iterable[Any]], cycle_length: int = AUTOTUNE,
                   block_length: int = 1, num_parallel_calls: int | None = None,
                   deterministic: bool = True) -> "Dataset":
        """Replace each example by the examples of ``fn(example)`` (a Dataset or any
        iterable), taking ``block_length`` at a time from ``cycle_length`` of them in turn.

        With ``num_parallel_calls`` (or AUTOTUNE) the sources are opened and read on
        background threads, ahead of need: the way to read many files in parallel::

            ds = Dataset.from_files("shards/*.bin").interleave(read_records, cycle_length=4,
                                                              num_parallel_calls=AUTOTUNE)

        ``cycle_length`` decides the order of the examples (and so what a later ``take``
        keeps): AUTOTUNE becomes this machine's CPU count here, when the pipeline is built, and
        that number is what a snapshot downstream is fingerprinted with and what Ray tasks
        and DataLoader workers run, whatever their machine has. Give a number for the same
        order everywhere.
        """
        _callable(fn, "interleave's fn")
        _positive_int(cycle_length, "cycle_length", allow_autotune=True)
        if cycle_length == AUTOTUNE:
            cycle_length = available_cpus()
        _positive_int(block_length, "block_length")
        check_parallelism(num_parallel_calls, what="num_parallel_calls")
        return self._then(ops.InterleaveOp, fn=fn, cycle_length=cycle_length,
                          block_length=block_length, num_parallel_calls=num_parallel_calls,
                          deterministic=bool(deterministic))

    def shard(self, num_shards: int, index: int) -> "Dataset":
        """Every ``num_shards``-th example, starting at ``index``: one worker's disjoint share."""
        _positive_int(num_shards, "num_shards")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < num_shards:
            raise ValueError(f"index must be an int in [0, num_shards={num_shards}); got {index!r}")
        return self._then(ops.ShardOp, num_shards=num_shards, index=index)

    def repeat(self, count: int | None = None) -> "Dataset":
        """The examples ``count`` times over (forever if None); seeded shuffles upstream draw a
        new order each time."""
        if count is not None:
            _positive_int(count, "count", allow_zero=True)
        return self._then(ops.RepeatOp, count=count)

    def filter(self, predicate: Callable[[Any], bool]) -> "Dataset":
        """Keep the examples for which ``predicate(example)`` is true."""
        _callable(predicate, "filter's predicate")
        return self._then(ops.FilterOp, predicate=predicate)

    def batch(self, batch_size: int, drop_remainder: bool = False) -> "Dataset":
        """Stack ``batch_size`` consecutive examples per key into numpy arrays (of one shape
        per key: see :meth:`padded_batch` for sequences of different lengths)."""
        _positive_int(batch_size, "batch_size")
        return self._then(ops.BatchOp, batch_size=batch_size, drop_remainder=drop_remainder)

    def padded_batch(self, batch_size: int, padding_values: Any = 0, *,
                     pad_to_multiple_of: int | None = None,
                     drop_remainder: bool = False) -> "Dataset":
        """:meth:`batch` for arrays of different shapes (token sequences, boxes): each array
        is padded at the end of every dimension to the largest size in its batch, with
        ``padding_values`` -- one number for every array, or a dict by key (dict examples;
        only those keys are padded, the others must agree in shape). Scalars, ``str`` and
        ``bytes`` are stacked as by ``batch``; arrays must agree in their number of
        dimensions. ``pad_to_multiple_of=m`` rounds each padded array's first dimension up to
        a multiple of ``m`` (fewer distinct shapes for XLA or ``torch.compile``). Padding
        happens per batch, after the snapshot when it is downstream of one: the snapshot
        stores each example at its own length. Exact resume, streams and epochs work as for
        ``batch``."""
        _positive_int(batch_size, "batch_size")
        return self._then(ops.BatchOp, batch_size=batch_size, drop_remainder=drop_remainder,
                          padding=Padding.asked(padding_values, pad_to_multiple_of))

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
        """Keep the examples in memory after the first complete epoch, and replay them.

        Only an iteration of the whole epoch as one stream fills or replays it; a stream's
        share (DataLoader workers beyond one, ranks, ``iterate(stream=...)``) passes through,
        computed each epoch: see docs/guide.md, "Workers, ranks and streams"."""
        return self._then(ops.CacheOp)

    def snapshot(self, path: str | os.PathLike | None = None, *, compression: str | None = "auto",
                 compression_level: int | None = None, shard_size: int | str = 64 << 20,
                 record_batch_size: int | str = 16 << 20,
                 key: str | None = None, name: str | None = None, verify: bool = True,
                 on_busy: str = "wait", wait_timeout: float | str | timedelta | None = None,
                 lease_ttl: float | str | timedelta = 30.0,
                 prefetch_bytes: int | str | None = None,
                 progress: bool | Callable[[Any], None] = True,
                 local_cache: str | os.PathLike | None = None,
                 local_cache_limit: int | str = 50 << 30,
                 storage_options: dict | None = None, delta: bool | None = None,
                 on_corrupt: str = "raise") -> "Dataset":
        """Persist the examples up to here under ``path`` (a folder or fsspec URL; default
        ``$SNAPCACHE_ROOT`` or ``~/.cache/snapcache``) and read them back from then on.

        The first epoch computes and writes ``<path>/<fingerprint>/``; it is committed only when
        that epoch is consumed to its end. Later epochs and later runs with the same upstream
        pipeline read it instead of recomputing. ``key`` names the version yourself instead of
        fingerprinting the upstream pipeline.

        When another process is already writing the same snapshot, ``on_busy="wait"`` (the
        default) waits for its commit and then reads it (at most ``wait_timeout`` seconds);
        ``on_busy="compute"`` computes the examples without writing. A writer that stops
        renewing its lease for ``lease_ttl`` seconds is presumed dead and replaced; the
        shards it finished are reused.

        Reading holds at most ``prefetch_bytes`` ahead of the consumer (default: a share of
        the machine's memory). ``progress`` shows the writing epoch (a bar on a terminal, log
        lines otherwise); ``False`` silences it, a callable receives each update.

        Shards hold about ``shard_size`` bytes each, in record batches of at most
        ``record_batch_size`` bytes (and a quarter of a shard): what a random access
        (``ds.open_snapshot()[i]``) reads and verifies for its first row of a record batch.
        Smaller record batches make those first rows cheaper and sequential reads a little
        dearer.

        For remote roots (``s3://...``), ``local_cache=DIR`` keeps copies of the shards read in
        ``DIR``, at most ``local_cache_limit`` bytes, least recently used evicted first.

        Sizes are bytes or strings such as ``"256MB"`` or ``"1GiB"`` (KB, MB, GB are powers of
        1000; KiB, MiB, GiB of 1024, as in the CLI); durations are seconds, a ``timedelta`` or
        strings such as ``"90s"``, ``"5m"``, ``"2h"``.

        A snapshot of files (``from_files``/``from_parquet``, then only element-wise ops such
        as ``map``, ``filter``, ``interleave``, ``prefetch``, and no ``key``) is a *delta
        snapshot* by default: it is built file by file in a folder named by the upstream's code
        alone; when files are added, changed or removed, the next run computes only those and
        commits a new version that reuses every other shard in place (see docs/format.md,
        "Delta snapshots"). An ordinary snapshot of exactly this pipeline made by an earlier
        release is read instead. ``delta=False`` makes an ordinary snapshot (one folder per
        file list); ``delta=True`` insists (an error when the pipeline does not allow it).

        A corrupt snapshot (a shard whose checksum does not match, an unreadable manifest)
        fails the epoch with ``on_corrupt="raise"``; ``"rebuild"`` withdraws it, warns, and
        carries on with the snapshot recomputed (see :mod:`snapcache.pipeline.rebuild`).
        """
        options = SnapshotOptions.from_keywords(
            compression=compression, compression_level=compression_level,
            record_batch_size=record_batch_size,
            shard_size=shard_size, key=key, name=name, verify=verify, on_busy=on_busy,
            wait_timeout=wait_timeout, lease_ttl=lease_ttl, prefetch_bytes=prefetch_bytes,
            progress=progress,
            local_cache=os.fspath(local_cache) if local_cache is not None else None,
            local_cache_limit=local_cache_limit, storage_options=storage_options,
            delta=delta, on_corrupt=on_corrupt)
        if delta is True:
            _check_delta(self._op, key)
        root = os.fspath(path) if path is not None else default_root()
        check_url(root)  # "s3:/bucket" would be a local folder named "s3:"
        _warn_copy(self._op, root)
        return self._then(ops.SnapshotOp, path=root, options=options)

    def __len__(self) -> int:
        """Items one epoch yields, when known without running it: from the source and the ops'
        length rules, a committed snapshot's example count in place of its upstream's (what
        the epoch reads; with ``key=`` the source may have changed since). TypeError
        otherwise."""
        n = plan.known_length(self._op)
        if n is None:
            raise TypeError(
                f"the length of {plan.describe_pipeline(self._op)} is not known without "
                "running it (a filter, a source of unknown length, or a snapshot not yet "
                "committed)")
        return n

    def __bool__(self) -> bool:
        return True  # a pipeline is a pipeline, whether or not its length is known

    _snapcache_iterable_only = True
    """Not read by index, despite ``__getitem__`` (see :func:`streams.indexable`)."""

    def __getitem__(self, index: Any) -> Any:
        """A pipeline is iterated, not indexed: a TypeError saying what to use instead. (With
        ``__len__`` and no ``__getitem__``, ``DataLoader(ds)`` took it for a map-style dataset
        and failed inside torch with "'Dataset' object is not subscriptable".)"""
        raise TypeError(
            f"a snapcache Dataset is iterated, not indexed (ds[{index!r}]): for a torch "
            "DataLoader pass ds.to_torch() (DataLoader(ds.to_torch(), batch_size=None) when "
            "the pipeline batches); for random access to the rows of its snapshot, "
            "ds.open_snapshot()[i], or ds.open_snapshot().to_torch_map_style() with a sampler; "
            "ds.take(n) for the first n examples")

    # -- running -------------------------------------------------------------------------------
    def __iter__(self) -> DatasetIterator:
        return self.iterate()

    def iterate(self, epoch: int | None = None, *, stream: tuple[int, int] | None = None,
                state: dict | None = None, balance: str | None = None) -> DatasetIterator:
        """An iterator over one epoch. ``epoch`` picks the shuffle order of seeded shuffles;
        by default each call (and each ``for`` loop) is the next epoch.

        ``stream=(index, count)`` yields only that share of the examples, for cooperating
        consumers (data-loader workers, ranks): the ``count`` streams together see every
        example once, and while a snapshot is being written each stream writes its own
        shards; the last to finish commits it.

        ``state`` (from ``iterator.state_dict()``) continues that iterator's epoch at its next
        example, reading and computing nothing before it; with another ``stream`` than the
        one that saved it, the rest of the epoch is shared out again (every remaining example
        once, if all streams had consumed as much: lockstep training). Pipelines of the shape
        ``snapshot -> map / filter / shuffle / batch / prefetch`` can be resumed.

        ``balance="drop"`` or ``"pad"`` (same pipelines) gives every stream the same number of
        examples, as DDP needs: the remainder is dropped, or filled with the epoch's first
        examples again.
        """
        shape = ordered.match(self._op)
        if balance is not None and shape is None:
            raise ValueError(
                f"balance={balance!r} needs a pipeline snapshot -> map / filter / shuffle / "
                f"batch / prefetch; got {plan.describe_pipeline(self._op)}")
        if state is not None:
            ordered.check_state(state)
            if shape is None:
                raise ValueError(
                    f"cannot resume {plan.describe_pipeline(self._op)}: only pipelines "
                    "snapshot -> map / filter / shuffle / batch / prefetch can be resumed")
            epoch = state["epoch"]
        if epoch is None:
            epoch = next(self._epochs)
        elif state is not None:
            self._epochs = itertools.count(epoch + 1)
        spec = None
        if stream is not None:
            index, count = stream
            spec = StreamSpec(index, count)
        recorder = stats.Recorder(plan.stage_labels(self._op))
        op = self._op

        def start() -> Iterator[Any]:  # at the first next(): nothing is held before it
            token = stats.current.set(recorder)
            try:
                return plan.iterate(op, epoch, spec)
            finally:
                stats.current.reset(token)

        def make(state: dict | None = state) -> Iterator[Any]:
            token = stats.current.set(recorder)
            try:
                iterator = ordered.iterate(shape, epoch, spec, state=state, balance=balance) \
                    if shape is not None else None
                if iterator is None:
                    iterator = Deferred(start)
                    if shape is not None:  # the writing epoch, with a state
                        iterator = ordered.writing(shape, epoch, spec, iterator)
            finally:
                stats.current.reset(token)
            return iterator

        snap = plan.last_snapshot(op)
        if snap is not None and snap.options.on_corrupt == "rebuild":
            iterator: Iterator[Any] = Rebuilding(
                make, lambda: plan.snapshot_folder(snap), lambda: plan.commit_name(snap),
                delta=plan.delta_source(snap) is not None)
        else:
            iterator = make()
        self._recorder = recorder
        return DatasetIterator(iterator, recorder)

    # -- frameworks ----------------------------------------------------------------------------
    def to_torch(self, *, rank: int | None = None, world_size: int | None = None,
                 drop_remainder: bool = False, pad: bool = False,
                 state: dict | None = None) -> Any:
        """A ``torch.utils.data.IterableDataset`` for a ``DataLoader`` with any number of
        workers and ranks: each example of an epoch is delivered once across all of them.
        Call ``set_epoch(n)`` on it before each epoch to reshuffle. See docs/guide.md::

            loader = DataLoader(ds.batch(64).to_torch(), batch_size=None, num_workers=4)

        With ``torchdata``'s ``StatefulDataLoader`` its ``state_dict()`` resumes exactly.
        ``drop_remainder=True`` / ``pad=True`` give every rank the same number of examples
        (DDP); ``state=snapcache.adapters.torch.job_state(saved)`` resumes a saved epoch with
        another number of ranks or workers.
        """
        from snapcache.adapters.torch import to_torch

        return to_torch(self, rank=rank, world_size=world_size, drop_remainder=drop_remainder,
                        pad=pad, state=state)

    def to_tf(self, *, element_spec: Any = None) -> Any:
        """A ``tf.data.Dataset`` of the examples; its ``element_spec`` comes from the
        snapshot's schema (building the snapshot first if needed), or pass one. See
        docs/guide.md::

            model.fit(ds.map(to_xy).batch(32).to_tf(), epochs=5)
        """
        from snapcache.adapters.tf import to_tf

        return to_tf(self, element_spec=element_spec)

    def as_numpy_iterator(self, epoch: int | None = None) -> Iterator[Any]:
        """One epoch with every number as a numpy array (dicts of arrays for batches), ready
        for ``jax.device_put``."""
        from snapcache.adapters.numpy import as_numpy_iterator

        return as_numpy_iterator(self, epoch)

    def stats(self) -> stats.EpochStats | None:
        """Statistics of the epoch iterated last (or being iterated): per stage (the ops of
        the pipeline that ran, named as ``explain`` names them: "map #1 `decode`") examples/s
        and bytes, and how long the consumer waited on input (``input_wait_fraction``: near
        1 means the input pipeline is the bottleneck). ``finished`` is False until the epoch
        runs to its end, and stays so for an epoch closed before it. None before the first
        epoch."""
        return self._recorder.snapshot() if self._recorder is not None else None

    # -- introspection -------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """The hex fingerprint of the whole pipeline up to here, its snapshots and the ops
        after them included (what a ``.snapshot()`` appended here would key on). The id of the
        pipeline's snapshot, as ``snapcache ls`` shows it, is ``ds.open_snapshot().id``."""
        return plan.pipeline_fingerprint(self._op).digest

    def open_snapshot(self) -> Snapshot:
        """The handle of the pipeline's last ``.snapshot()`` (committed or not: see its
        ``state``); ``snap[i]``, ``snap.take(...)`` and ``snap.to_torch_map_style()`` read a
        committed one by row. ValueError if the pipeline has no snapshot."""
        snap = plan.last_snapshot(self._op)
        if snap is None:
            raise ValueError(f"{plan.describe_pipeline(self._op)} has no .snapshot(): add one "
                             "to get a snapshot handle")
        source = plan.delta_source(snap)
        if source is not None:  # a delta snapshot: the version built from this pipeline's files
            folder = Storage(snap.path, snap.options.storage_options).child(
                plan.lineage_tree(snap).digest)
            return Snapshot(folder, read=snap.options.read, builder=SnapshotBuilder(snap),
                            source_digest=plan.delta_units(snap, source).digest)
        folder = Storage(snap.path, snap.options.storage_options).child(
            plan.snapshot_tree(snap).digest)
        return Snapshot(folder, read=snap.options.read, builder=SnapshotBuilder(snap))

    def explain(self, path: str | os.PathLike | None = None, *,
                storage_options: dict | None = None) -> Explanation:
        """Say whether this pipeline's snapshot is committed and, if not, how it differs from
        the closest snapshot in the root. ``print(ds.explain())`` shows the report.

        The snapshot explained is the last ``.snapshot()`` of the pipeline (in ``path`` if
        given, else where it points); without one, the whole pipeline in ``path`` (default
        ``$SNAPCACHE_ROOT`` or ``~/.cache/snapcache``).
        """
        snap = plan.last_snapshot(self._op)
        source = plan.delta_source(snap) if snap is not None else None
        if snap is not None and source is not None:
            from snapcache.pipeline.explain import explain_delta

            root = os.fspath(path) if path is not None else snap.path
            options = storage_options if storage_options is not None else \
                snap.options.storage_options
            return explain_delta(plan.lineage_tree(snap), Storage(root, options),
                                 plan.delta_units(snap, source))
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


def _check_delta(op: ops.Op, key: str | None) -> None:
    """``snapshot(delta=True)`` on a pipeline that cannot be built file by file is an error,
    not a silent ordinary snapshot."""
    if key is not None:
        raise ValueError("snapshot(delta=True) builds versions keyed by the source's files; "
                         "with key=... you name the version yourself: pass one or the other")
    if ops.delta_source(op) is None:
        steps = [node.describe() for node in ops.lineage(op)
                 if not (node.traits.source and node.traits.units) and not (
                     (node.traits.element_wise or node.traits.per_input)
                     and not node.traits.keeps_copy)]
        raise ValueError(
            f"snapshot(delta=True) needs a file source (from_files or from_parquet) followed "
            f"only by ops whose every output comes from one file (map, filter, interleave, "
            f"prefetch); {plan.describe_pipeline(op)} has {', '.join(steps)}. Drop delta=True, "
            "or move those ops after the snapshot")


# A Dataset captured by a function (an interleave source, a closure) counts by its pipeline's
# fingerprint, not by its Python object state (iteration counters, caches).
register(Dataset, lambda ds: ("snapcache.Dataset", ds.fingerprint()))


def _warn_copy(op: ops.Op, root: str) -> None:
    """Warn when a snapshot at ``op`` would store the examples of the snapshot below again."""
    copied = ops.copied_snapshot(op)
    if copied is None:
        return
    below, between = copied
    what = ", ".join(node.describe() for node in between)
    way = "remove one of the two .snapshot() calls"
    if what:
        way += f"; {what} can run after the last snapshot instead, every epoch, at little cost"
    if "://" in below.path and "://" not in root:
        way += (f"; for a local copy of a remote snapshot, use .snapshot({below.path!r}, "
                f"local_cache={root!r})")
    warn(f"this .snapshot() would store the examples of {below.describe()} again"
         + (f", with only {what} between them" if what else "")
         + f": a second copy on disk that saves no computation. To fix it, {way}.",
         RedundantSnapshotWarning)
