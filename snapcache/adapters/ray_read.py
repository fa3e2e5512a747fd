"""A committed snapshot as a Ray Data datasource (imported by :mod:`snapcache.adapters.ray`
only when Ray is installed).

Each read task reads a run of consecutive shards with :class:`SnapshotReader` (sizes and
checksums verified before any row is used) and turns every record batch into one Arrow block:
tensor fields become Ray's tensor extension columns (fixed shape when the manifest says the
field has one shape, variable-shaped otherwise, so all blocks share one schema), scalars
primitive columns, strings and bytes ``large_string``/``large_binary``. Complex numbers have
no Ray Data type and are refused up front; datetimes come back in the unit Ray Data keeps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Sequence

import pyarrow as pa
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata
from ray.data.extensions import ArrowTensorArray, ArrowVariableShapedTensorArray

from snapcache.pipeline.handle import Snapshot, open_snapshot
from snapcache.store.manifest import ShardInfo
from snapcache.store.schema import Schema


def to_block(schema: Schema, columns: dict[str, Any]) -> pa.Table:
    """One Ray block from decoded columns (:meth:`snapcache.store.decoder.Decoder.columns`)."""
    arrays = []
    for spec in schema.fields:
        value = columns[spec.name]
        if spec.kind == "tensor" and spec.ndim >= 1:
            if not spec.varies and not isinstance(value, list):
                arrays.append(ArrowTensorArray.from_numpy(value))
            else:
                arrays.append(ArrowVariableShapedTensorArray.from_numpy(list(value)))
        elif spec.kind == "str":
            arrays.append(pa.array(value, type=pa.large_string()))
        elif spec.kind == "bytes":
            arrays.append(pa.array(value, type=pa.large_binary()))
        else:
            arrays.append(pa.array(value))
    return pa.Table.from_arrays(arrays, names=[spec.name for spec in schema.fields])


def read_blocks(snapshot: Snapshot, shards: Sequence[ShardInfo]) -> Iterator[pa.Table]:
    """The blocks of ``shards`` of a committed snapshot, one per record batch."""
    schema = snapshot.schema
    assert schema is not None
    # Two read threads: one shard loads while the previous one is converted.
    for columns in snapshot.column_batches(shards, read_threads=2):
        yield to_block(schema, columns)


def block_metadata(num_rows: int, size_bytes: int, input_files: list[str]) -> BlockMetadata:
    """``BlockMetadata`` across Ray versions (its fields changed: ``schema`` moved out)."""
    fields = {f.name for f in dataclasses.fields(BlockMetadata)}
    values = {"num_rows": num_rows, "size_bytes": size_bytes, "input_files": input_files,
              "exec_stats": None, "schema": None}
    return BlockMetadata(**{k: v for k, v in values.items() if k in fields})


def group_shards(shards: Sequence[ShardInfo], parts: int) -> list[list[ShardInfo]]:
    """Split ``shards`` into at most ``parts`` runs of consecutive shards of similar rows."""
    parts = max(1, min(parts, len(shards)))
    total = sum(s.rows for s in shards) or 1
    groups: list[list[ShardInfo]] = [[] for _ in range(parts)]
    seen = 0
    for shard in shards:
        groups[min(parts - 1, seen * parts // total)].append(shard)
        seen += shard.rows
    return [g for g in groups if g]


class SnapshotDatasource(Datasource):
    """A committed snapshot as a Ray Data datasource: one read task per group of consecutive
    shards (``shards_per_task`` of them, or as many groups as Ray Data asks for).

    Rows are dicts ``{field: value}``; tensors are numpy arrays with their dtype and shape,
    tuple examples have fields ``"0"``, ``"1"``, ..., single values the field ``"value"``.

    Example::

        ds = ray.data.read_datasource(SnapshotDatasource("s3://b/snaps/<fingerprint>"))
    """

    def __init__(self, snapshot: "Snapshot | str", *, shards_per_task: int | None = None,
                 storage_options: dict | None = None, verify: bool = True):
        super().__init__()
        if shards_per_task is not None and (not isinstance(shards_per_task, int)
                                            or isinstance(shards_per_task, bool)
                                            or shards_per_task < 1):
            raise ValueError(f"shards_per_task must be an int >= 1; got {shards_per_task!r}")
        if not isinstance(snapshot, Snapshot):
            snapshot = open_snapshot(snapshot, storage_options=storage_options)
        if snapshot.read_options.verify != verify:
            snapshot = open_snapshot(
                snapshot.url, storage_options=snapshot.storage.storage_options,
                read=dataclasses.replace(snapshot.read_options, verify=verify))
        schema = snapshot.schema  # SnapshotStateError unless committed
        complex_fields = [f"{f.name!r} ({f.dtype})" for f in (schema.fields if schema else ())
                          if f.dtype.startswith("complex")]
        if complex_fields:
            raise TypeError(
                f"snapshot {snapshot.url} has complex fields {', '.join(complex_fields)}, which "
                "Ray Data cannot hold; store real and imaginary parts as separate fields, or "
                "read it with ds.snapshot(...) instead of Ray Data")
        self.snapshot = snapshot
        self.url = snapshot.url
        self.shards_per_task = shards_per_task

    def get_name(self) -> str:
        return "Snapcache"

    def estimate_inmemory_data_size(self) -> int | None:
        return self.snapshot.manifest.raw_bytes

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       **_: Any) -> list[ReadTask]:
        shards = list(self.snapshot.shards)
        if not shards:
            return []
        if self.shards_per_task is not None:
            size = self.shards_per_task
            groups = [shards[i:i + size] for i in range(0, len(shards), size)]
        else:
            groups = group_shards(shards, parallelism if parallelism > 0 else len(shards))
        url, snapshot = self.url, self.snapshot
        extra = {"per_task_row_limit": per_task_row_limit} if per_task_row_limit else {}
        tasks = []
        for group in groups:
            metadata = block_metadata(sum(s.rows for s in group), sum(s.raw_bytes for s in group),
                                      [f"{url}/{s.path}" for s in group])

            def read_fn(group: list[ShardInfo] = group) -> Iterator[pa.Table]:
                return read_blocks(snapshot, group)

            tasks.append(ReadTask(read_fn, metadata, **extra))
        return tasks
