"""Build and read snapshots on a Ray cluster (``pip install 'snapcache[ray]'``).

:func:`build` writes the first epoch of a snapshot with ``num_tasks`` Ray tasks: task ``i``
runs stream ``i`` of ``num_tasks`` of the upstream pipeline (sources split by stride, see
:mod:`snapcache.pipeline.streams`) and writes that stream's shards and completion marker
straight into the snapshot root; the last stream to finish creates the manifest. It is the
same protocol as several processes iterating ``ds.iterate(epoch=0, stream=(i, n))``, so the
result is an ordinary snapshot: same folder (fingerprint), same format, readable by
``.snapshot(path)`` anywhere. Ray retries failed and lost tasks; a retried stream resumes from
the shards its earlier attempt finished, and a stream already complete is not redone.

:func:`read` turns a committed snapshot into a ``ray.data.Dataset`` through
:class:`SnapshotDatasource`: one read task per group of consecutive shards, each verified
(size and checksum) before any of its rows is used.

Ray is imported on first use; nothing here runs at import time.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from snapcache.errors import FingerprintMismatchError, StoreError
from snapcache.pipeline import ops, queries
from snapcache.pipeline.dataset import Dataset
from snapcache.pipeline.handle import Snapshot, StreamWrite, open_snapshot
from snapcache.store.protocol import HOST

log = logging.getLogger("snapcache")

__all__ = ["BuildResult", "FingerprintMismatchError", "PendingBuild", "SnapshotDatasource",
           "StreamOutcome", "build", "read"]


def _ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError("snapcache.ray needs Ray: pip install 'snapcache[ray]'") from e
    return ray


# -- building ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamOutcome(StreamWrite):
    """What one task did for its stream (:class:`snapcache.Snapshot.write_stream`'s
    :class:`StreamWrite`) and where it ran."""

    host: str = ""
    pid: int = 0


@dataclass(frozen=True)
class BuildResult:
    """A committed snapshot built on Ray (``str()`` gives a one-line summary)."""

    fingerprint: str
    url: str
    num_examples: int
    num_shards: int
    total_bytes: int
    seconds: float
    streams: tuple[StreamOutcome, ...]

    def __str__(self) -> str:
        written = sum(s.status == "written" for s in self.streams)
        return (f"snapshot {self.fingerprint} at {self.url}: {self.num_examples} examples in "
                f"{self.num_shards} shards ({self.total_bytes / 1e6:.1f} MB), "
                f"{written}/{len(self.streams)} streams written in {self.seconds:.1f} s")


def _snapshot_op(ds: "Dataset") -> ops.SnapshotOp:
    snap = queries.last_snapshot(ds)
    if snap is None:
        raise ValueError("snapcache.ray.build needs a pipeline with a .snapshot(path); add "
                         "one after the expensive steps, e.g. ds.map(f).snapshot('s3://b/snaps')")
    if snap.options.coordination.on_busy != "wait":
        # A task that computed without writing would leave its stream unwritten.
        coordination = dataclasses.replace(snap.options.coordination, on_busy="wait")
        snap = dataclasses.replace(snap, options=dataclasses.replace(
            snap.options, coordination=coordination))
    return snap


def _check_splittable(snap: ops.SnapshotOp, num_tasks: int) -> None:
    if num_tasks == 1:
        return
    for node in ops.lineage(snap.parent):
        # An op applied to each stream's share separately would make n streams write other
        # examples than one process (batch groups shares). take and shard select by position:
        # each stream its own after a strided upstream, else stream 0 alone (ops.slicing).
        if node.traits.per_stream and not node.traits.by_position:
            raise ValueError(
                f"{node.describe()} before the snapshot would run in each of the {num_tasks} "
                "streams on its share of the source, so the snapshot would not hold what one "
                "process writes; move it after .snapshot(), or build with num_tasks=1")


def _run_stream(snap: ops.SnapshotOp, index: int, count: int, expected: str) -> StreamOutcome:
    """The body of one Ray task: write stream ``index`` of ``count`` (or find it done), through
    the snapshot handle, hence the same protocol as local writers."""
    handle = Dataset(snap).open_snapshot()
    if handle.id != expected:
        raise FingerprintMismatchError(
            f"stream {index} on {HOST}: the pipeline's fingerprint is {handle.id} here but "
            f"{expected} on the driver; install the same package versions on every node, and "
            "read sources from shared storage (s3://...) rather than local files")
    done = handle.write_stream(index, count)
    return StreamOutcome(**dataclasses.asdict(done), host=HOST, pid=os.getpid())


def _task_options(resources: dict | None, max_retries: int, ray_remote_args: dict | None
                  ) -> dict:
    resources = dict(resources or {})
    options: dict[str, Any] = {"num_cpus": resources.pop("CPU", 1),
                               "max_retries": max_retries, "retry_exceptions": True}
    if "GPU" in resources:
        options["num_gpus"] = resources.pop("GPU")
    if "memory" in resources:
        options["memory"] = resources.pop("memory")
    if resources:
        options["resources"] = resources
    options.update(ray_remote_args or {})
    return options


class PendingBuild:
    """A build started with ``wait=False``: ``refs`` are the tasks' object refs (one per
    stream); :meth:`result` waits for them and returns the :class:`BuildResult`."""

    def __init__(self, handle: Snapshot, refs: list, started: float):
        self._handle, self.refs, self._started = handle, refs, started

    def result(self, timeout: float | None = None) -> BuildResult:
        outcomes = tuple(_ray().get(self.refs, timeout=timeout))
        manifest = self._handle.commit(len(self.refs))
        if manifest is None:
            missing = self._handle.stream_status(len(self.refs)).missing
            raise StoreError(f"snapshot {self._handle.url} was not committed: streams {missing} "
                             f"of {len(self.refs)} are not complete; run build() again to "
                             "finish them (finished shards are reused)")
        result = BuildResult(fingerprint=manifest.fingerprint, url=self._handle.url,
                             num_examples=manifest.num_examples, num_shards=len(manifest.shards),
                             total_bytes=manifest.total_bytes,
                             seconds=time.monotonic() - self._started, streams=outcomes)
        log.info("%s", result)
        return result


def build(ds: "Dataset", *, num_tasks: int, resources: dict | None = None,
          max_retries: int = 3, wait: bool = True, ray_remote_args: dict | None = None
          ) -> BuildResult | PendingBuild:
    """Write the snapshot of ``ds`` (its last ``.snapshot()``) with ``num_tasks`` Ray tasks.

    Task ``i`` runs stream ``i`` of ``num_tasks`` of the pipeline up to the snapshot and writes
    its shards straight to the snapshot root; the last one to finish commits the manifest.
    Each task reserves ``resources`` (Ray's names: ``{"CPU": 4, "GPU": 1, "memory": 8e9,
    "my_label": 1}``; default one CPU). A task that raises or whose worker dies is retried up
    to ``max_retries`` times and resumes from its finished shards; streams an earlier run
    completed are not redone. ``ray_remote_args`` go to ``.options()`` of every task
    (``runtime_env``, ``scheduling_strategy``, ...).

    The snapshot is the one a single process writes (same fingerprint and format); its
    examples are in stream order: stream 0's (examples 0, n, 2n, ...), then stream 1's, ...
    A delta snapshot (the default for ``from_files``/``from_parquet`` then element-wise ops)
    is built the same way as by ``n`` local streams: task ``i`` computes segments ``i, i + n,
    ...`` of the next version (only new and changed files), the last one commits it.

    Example::

        ray.init()
        ds = sc.Dataset.from_files("s3://raw/*.jpg").map(decode).snapshot("s3://b/snaps")
        print(snapcache.ray.build(ds, num_tasks=64))
        for batch in ds: ...          # every later epoch and run reads the snapshot
    """
    if not isinstance(num_tasks, int) or isinstance(num_tasks, bool) or num_tasks < 1:
        raise ValueError(f"num_tasks must be an int >= 1; got {num_tasks!r}")
    if not isinstance(max_retries, int) or max_retries < -1:
        raise ValueError(f"max_retries must be an int >= -1 (-1: retry forever); "
                         f"got {max_retries!r}")
    snap = _snapshot_op(ds)
    _check_splittable(snap, num_tasks)
    options = _task_options(resources, max_retries, ray_remote_args)
    ray = _ray()
    handle = Dataset(snap).open_snapshot()
    started = time.monotonic()
    task = ray.remote(_run_stream).options(name="snapcache-stream", **options)
    snap_ref = ray.put(snap)  # the pipeline (user functions included) is pickled once
    refs = [task.remote(snap_ref, i, num_tasks, handle.id) for i in range(num_tasks)]
    pending = PendingBuild(handle, refs, started)
    return pending.result() if wait else pending


# -- reading -----------------------------------------------------------------------------------
def __getattr__(name: str) -> Any:
    # SnapshotDatasource subclasses ray.data.Datasource, so it lives in a module importing Ray.
    if name == "SnapshotDatasource":
        _ray()
        from snapcache.adapters.ray_read import SnapshotDatasource

        return SnapshotDatasource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _snapshot(source: "str | os.PathLike | Snapshot | Dataset", id: str | None,
              storage_options: dict | None) -> Snapshot:
    if isinstance(source, Snapshot):
        return source
    if isinstance(source, (str, os.PathLike)):
        return open_snapshot(source, id, storage_options=storage_options)
    if id is not None:
        raise ValueError("id= is for a root path; a Dataset names its own snapshot")
    if storage_options is not None:  # reach the pipeline's snapshot with other credentials
        snap = source.open_snapshot()
        return open_snapshot(snap.url, storage_options=storage_options, read=snap.read_options)
    return source.open_snapshot()


def read(source: "str | os.PathLike | Snapshot | Dataset", id: str | None = None, *,
         shards_per_task: int | None = None, storage_options: dict | None = None,
         verify: bool = True, **read_args: Any):
    """A committed snapshot as a ``ray.data.Dataset``.

    ``source`` is a root with ``id`` (an id prefix or a name, as ``snapcache ls`` shows; left
    out when the root holds one snapshot), a snapshot folder, a :class:`snapcache.Snapshot`,
    or a Dataset whose last ``.snapshot()`` is committed. Each read task reads
    ``shards_per_task`` consecutive shards (default: as many tasks as Ray Data asks for),
    verifying every checksum. ``read_args`` go to ``ray.data.read_datasource``
    (``override_num_blocks``, ``ray_remote_args``, ...).

    Example::

        train_ds = snapcache.ray.read(ds)          # then ray.train's datasets={"train": ...}
        train_ds = snapcache.ray.read("s3://bucket/snaps", "train-224px")
        for batch in train_ds.iter_batches(batch_size=256): ...
    """
    _ray()
    try:
        import ray.data
    except ImportError as e:  # a plain `pip install ray` lacks Ray Data's dependencies
        raise ImportError("snapcache.ray.read needs Ray Data: pip install 'snapcache[ray]'"
                          ) from e
    from snapcache.adapters.ray_read import SnapshotDatasource

    datasource = SnapshotDatasource(_snapshot(source, id, storage_options),
                                    shards_per_task=shards_per_task, verify=verify)
    return ray.data.read_datasource(datasource, **read_args)
