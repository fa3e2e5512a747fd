"""What a snapshot handle opened from a pipeline needs to build its snapshot stream by stream
(:class:`snapcache.pipeline.handle.Builder`): the Ray build and any other distributed driver go
through ``ds.open_snapshot().write_stream(i, n)`` and ``.commit(n)``, hence through the same
protocol as local writers."""

from __future__ import annotations

from typing import Any

from snapcache.pipeline import ops, plan
from snapcache.store import layout
from snapcache.store.protocol import commit_fields


class SnapshotBuilder:
    """Builds the snapshot of one ``.snapshot()`` op (picklable with the pipeline)."""

    def __init__(self, op: ops.SnapshotOp):
        self._op = op

    def commit_fields(self) -> dict:
        op = self._op
        tree = plan.snapshot_tree(op)
        return commit_fields(op.options.write, key=op.options.key, name=op.options.name,
                             fingerprint=tree.digest, fingerprint_tree=tree.to_json(),
                             pipeline=plan.describe_pipeline(op.parent),
                             run_id=layout.new_run_id())

    def write_stream(self, index: int, count: int) -> int:
        from snapcache.pipeline.dataset import Dataset

        return sum(1 for _ in Dataset(self._op).iterate(epoch=0, stream=(index, count)))

    def resumable(self) -> bool:
        return ops.resumable(self._op.parent)

    def delta_stream(self, index: int, count: int, compute: bool = True) -> Any:
        """A delta snapshot: stream ``index`` of ``count`` computes its share of the tasks
        of the next version (``compute=False``: none), and the version is committed if every
        task is recorded (:func:`snapcache.pipeline.delta_exec.advance`)."""
        from snapcache.pipeline import delta_exec
        from snapcache.store.fs import Storage
        from snapcache.store.protocol import versions

        op, source = self._op, plan.delta_source(self._op)
        lineage = plan.lineage_tree(op)
        storage = Storage(op.path, op.options.storage_options).child(lineage.digest)
        units = plan.delta_units(op, source)
        found = versions.find_version(storage, units.digest)
        if found is not None:
            return delta_exec.Progress(found)
        return delta_exec.advance(op, 0, storage, units, stream=index, count=count,
                                  source=source, lineage=lineage, compute=compute,
                                  describe=plan.describe_pipeline(op.parent))
