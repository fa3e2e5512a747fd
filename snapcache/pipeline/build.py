"""What a snapshot handle opened from a pipeline needs to build its snapshot stream by stream
(:class:`snapcache.pipeline.handle.Builder`): the Ray build and any other distributed driver go
through ``ds.open_snapshot().write_stream(i, n)`` and ``.commit(n)``, hence through the same
protocol as local writers."""

from __future__ import annotations

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
