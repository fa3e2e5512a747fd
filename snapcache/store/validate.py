"""Validate a record batch read from a shard before any of it is handed out.

A shard's checksum only proves its bytes are the ones its manifest names; a crafted shard (its
checksum recomputed) or damage read with ``verify=False`` can still hold offsets that point
outside their buffers, and indexing them reads foreign memory (SIGBUS, SystemError, garbage).
:class:`BatchValidator` proves every offset of every list, string and binary column lies inside
its buffer and never decreases and every string is UTF-8 (Arrow's ``validate(full=True)``), and
that every tensor's list lengths agree with its shapes (ours), so that decoding can never leave
the batch's buffers nor build an array of the wrong size.

Cost: O(rows) on offsets and shapes plus one UTF-8 pass over string bytes; tensor payloads are
never touched. Own numpy checks of the offsets were measured as the alternative and came out
slower than Arrow's (``benchmarks/bench_validate.py``, ``docs/benchmarks.md``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from snapcache.errors import CorruptSnapshotError
from snapcache.store.schema import Schema, storage_dtype


class BatchValidator:
    """Checks record batches against the snapshot ``schema``; raises CorruptSnapshotError."""

    def __init__(self, schema: Schema):
        self._arrow_schema = schema.arrow_schema()
        self._tensors: dict[int, tuple[str, int, int]] = {}   # column -> (name, ndim, factor)
        index = 0
        for spec in schema.fields:
            if spec.kind == "tensor":
                factor = storage_dtype(np.dtype(spec.dtype))[1]
                self._tensors[index] = (spec.name, spec.ndim, factor)
            index += 2 if spec.kind == "tensor" and spec.ndim >= 2 else 1

    def __call__(self, batch: pa.RecordBatch) -> None:
        self.check_structure(batch)
        self.check_shapes(batch)

    def check_shapes(self, batch: pa.RecordBatch) -> None:
        """The tensors' shapes against their lengths, for a batch whose structure was checked
        (:meth:`check_structure`; it may be several such batches concatenated)."""
        n = batch.num_rows
        if not n:
            return
        for index in self._tensors:
            column = batch.column(index)
            offsets = np.frombuffer(column.buffers()[1], np.int64, count=n + 1,
                                    offset=column.offset * 8)
            self._check_tensor(batch, index, np.diff(offsets))

    def check_structure(self, batch: pa.RecordBatch) -> None:
        """The checks of the whole batch that Arrow makes (schema, offsets in bounds and
        non-decreasing, UTF-8, no nulls), without the tensors' shapes: enough to decode single
        rows that check their own shapes (:meth:`snapcache.store.decoder.Decoder.row_at`)."""
        if not batch.schema.equals(self._arrow_schema):
            raise CorruptSnapshotError("record batch schema does not match the snapshot schema")
        try:
            batch.validate(full=True)   # offsets in bounds and non-decreasing, UTF-8
        except pa.ArrowInvalid as e:
            raise CorruptSnapshotError(str(e)) from None
        if any(column.null_count for column in batch.columns):
            raise CorruptSnapshotError("a record batch holds nulls, which snapcache never writes")

    def _check_tensor(self, batch: pa.RecordBatch, index: int, lengths: np.ndarray) -> None:
        name, ndim, factor = self._tensors[index]
        if factor != 1:
            if (lengths % factor).any():
                raise CorruptSnapshotError(f"field {name!r}: a list length is not a multiple "
                                           f"of {factor}")
            lengths = lengths // factor
        if ndim >= 2:
            shape_column = batch.column(index + 1)
            buffer = shape_column.values.buffers()[1]
            start = (shape_column.offset * ndim + shape_column.values.offset) * 4
            shapes = np.frombuffer(buffer, np.int32, count=len(lengths) * ndim, offset=start)
            shapes = shapes.reshape(len(lengths), ndim)
            if (shapes < 0).any() or not np.array_equal(
                    np.prod(shapes, axis=1, dtype=np.int64), lengths):
                raise CorruptSnapshotError(f"field {name!r}: shapes disagree with list lengths")
        elif ndim == 0 and (lengths != 1).any():
            raise CorruptSnapshotError(f"field {name!r}: a 0-d array with several elements")
