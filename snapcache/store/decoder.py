"""Arrow record batches back into examples: :class:`Decoder` turns a batch written by
:class:`~snapcache.store.encoder.Encoder` into examples (:meth:`Decoder.rows`, one alone:
:meth:`Decoder.row_at`) or whole columns (:meth:`Decoder.columns`), checking as it goes what
would otherwise index outside the batch's buffers; :func:`read_only` hands a writing epoch's
examples on as a read hands them out.

Decoded tensors are **read-only views** of the batch's Arrow buffers (zero copy), from both
``rows()`` and ``columns()``; scalar columns are read-only too. Copy an array before writing to
it. Holding one row keeps the memory of its whole batch alive. The examples an epoch writes are
handed on as :func:`read_only` views too, so that what follows a snapshot gets read-only arrays
in every epoch, the writing one included.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from snapcache.errors import CorruptSnapshotError
from snapcache.store.schema import FieldSpec, Schema, storage_dtype


def _view(array: pa.Array, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    """A read-only numpy view of elements ``[offset, offset + count)`` of a primitive array."""
    buffer = array.buffers()[1]
    start = array.offset + offset
    if buffer is None or count == 0:
        view = np.empty(0, dtype)
    elif (start + count) * dtype.itemsize > buffer.size:
        raise CorruptSnapshotError(f"an Arrow buffer is shorter than its array ({array.type})")
    else:
        view = np.frombuffer(buffer, dtype=dtype, count=count, offset=start * dtype.itemsize)
    view.setflags(write=False)  # Arrow buffers may be mutable (e.g. freshly decompressed)
    return view


ndarray = np.ndarray  # one global lookup per example in read_only


def read_only(example: Any) -> Any:
    """``example`` (a dict, a tuple or a single value) with each numpy array a read-only view
    of it, as a read of the snapshot hands examples out: what an epoch that writes a snapshot
    passes on. The arrays themselves are left as they are (the pipeline above may hold them).
    Called once per example of a writing epoch: a dict without a writable array is returned
    as it is, and one with some is copied once."""
    kind = type(example)
    if kind is dict:
        out = None
        for key, value in example.items():
            if type(value) is ndarray and value.flags.writeable:
                if out is None:
                    out = example.copy()
                view = value.view()
                view.setflags(write=False)
                out[key] = view
        return example if out is None else out
    if kind is tuple:
        return tuple(_read_only(value) for value in example)
    return _read_only(example)


def _read_only(value: Any) -> Any:
    if type(value) is not ndarray or not value.flags.writeable:
        return value
    view = value.view()
    view.setflags(write=False)
    return view


class _Column:
    """One decoded field of a batch: ``column`` for columns(), ``rows`` for rows().

    ``rows`` may be given as ``make_rows``, built when first asked for: a Python scalar
    field's rows are a list of Python objects (``tolist``), which :meth:`Decoder.columns`
    never needs (200,000 ints an epoch of the token-like benchmark rows)."""

    def __init__(self, column: Any, rows: Any = None,
                 make_rows: Callable[[], Any] | None = None) -> None:
        self.column = column
        self._rows = rows
        self._make_rows = make_rows

    @property
    def rows(self) -> Any:
        if self._make_rows is not None:
            self._rows, self._make_rows = self._make_rows(), None
        return self._rows


class Decoder:
    """Turn record batches written by :class:`Encoder` back into examples.

    Tensors come back as read-only numpy views of the batch's buffers (see the module
    docstring); copy one before modifying it.
    """

    def __init__(self, schema: Schema) -> None:
        self._schema = schema
        self._arrow_schema = schema.arrow_schema()
        self._names = tuple(f.name for f in schema.fields)
        self.varying = frozenset(f.name for f in schema.fields if f.varies)
        """The tensor fields whose shape is not the same in every row."""
        self._dtypes = [np.dtype(f.dtype) if f.dtype else None for f in schema.fields]
        self._starts: list[int] = []
        index = 0
        for spec in schema.fields:
            self._starts.append(index)
            index += 2 if spec.kind == "tensor" and spec.ndim >= 2 else 1

    def _decode(self, batch: pa.RecordBatch) -> list[_Column]:
        if not batch.schema.equals(self._arrow_schema):
            raise CorruptSnapshotError(
                f"record batch schema does not match the snapshot schema:\n"
                f"expected {self._arrow_schema}\ngot {batch.schema}"
            )
        if any(column.null_count for column in batch.columns):
            raise CorruptSnapshotError("a record batch holds nulls, which snapcache never writes")
        decoded = []
        for spec, dtype, start in zip(self._schema.fields, self._dtypes, self._starts):
            column = batch.column(start)
            if spec.kind == "tensor":
                shapes = batch.column(start + 1) if spec.ndim >= 2 else None
                decoded.append(_decode_tensor(spec, dtype, column, shapes))
            elif spec.kind == "scalar":
                decoded.append(_decode_scalar(spec, dtype, column))
            else:
                values = column.to_pylist()
                decoded.append(_Column(values, values))
        return decoded

    def columns(self, batch: pa.RecordBatch) -> dict[str, Any]:
        """The whole batch, field by field.

        A tensor field whose rows share one shape is one read-only array ``(n, *shape)``
        (zero copy), a ragged one a list of arrays; a scalar field is a 1-d read-only array
        (int64/float64/bool for Python scalars); str and bytes fields are lists.
        """
        return {name: col.column for name, col in zip(self._names, self._decode(batch))}

    def rows(self, batch: pa.RecordBatch) -> Iterator[Any]:
        """The examples of a batch, one by one, in the structure they were written in."""
        iterators = [iter(col.rows) for col in self._decode(batch)]
        structure = self._schema.structure
        if structure == "single":
            return iterators[0]
        if structure == "tuple":
            return zip(*iterators)
        return map(dict, map(partial(zip, self._names), zip(*iterators)))

    def row_at(self, batch: pa.RecordBatch, k: int) -> Any:
        """Example ``k`` of ``batch``, the same as ``row_reader(batch)(k)``, decoding that row
        alone: for the first row read from a record batch by random access, where decoding
        every row would cost more than reading the batch. ``batch`` must have passed
        :meth:`BatchValidator.check_structure <snapcache.store.validate.BatchValidator.check_structure>`;
        row ``k``'s tensors are checked here as the validator checks every row's."""
        values = []
        for spec, dtype, start in zip(self._schema.fields, self._dtypes, self._starts):
            column = batch.column(start)
            if spec.kind == "tensor":
                shapes = batch.column(start + 1) if spec.ndim >= 2 else None
                values.append(_tensor_at(spec, dtype, column, shapes, k))
            elif spec.kind == "scalar":
                values.append(_scalar_at(spec, dtype, column, k))
            else:
                values.append(column[k].as_py())
        structure = self._schema.structure
        if structure == "single":
            return values[0]
        if structure == "tuple":
            return tuple(values)
        return dict(zip(self._names, values))

    def row_reader(self, batch: pa.RecordBatch) -> Callable[[int], Any]:
        """``get(k)``: example ``k`` of ``batch``, the same as ``list(rows(batch))[k]``. The
        batch is decoded (and checked) once, as zero-copy views where it can be; each
        ``get`` then only indexes them."""
        fields = [col.rows for col in self._decode(batch)]
        structure = self._schema.structure
        if structure == "single":
            return fields[0].__getitem__
        if structure == "tuple":
            return lambda k: tuple(f[k] for f in fields)
        names = self._names
        return lambda k: {name: f[k] for name, f in zip(names, fields)}


def _tensor_at(spec: FieldSpec, dtype: np.dtype, column: pa.Array,
               shape_column: pa.Array | None, k: int) -> np.ndarray:
    """Row ``k`` of a tensor column, checked as :func:`_decode_tensor` and the batch
    validator check every row."""
    storage, factor = storage_dtype(dtype)
    bounds = _view(column, np.dtype(np.int64), k, 2)
    a, b = int(bounds[0]), int(bounds[1])
    if b < a:
        raise CorruptSnapshotError(f"field {spec.name!r}: list offsets decrease")
    if (b - a) % factor:
        raise CorruptSnapshotError(f"field {spec.name!r}: a list length is not a multiple "
                                   f"of {factor}")
    values = _view(column.values, storage, a, b - a).view(dtype)
    count = (b - a) // factor
    if spec.ndim >= 2 and shape_column is not None:
        dims = tuple(_view(shape_column.values, np.dtype(np.int32),
                           (shape_column.offset + k) * spec.ndim, spec.ndim).tolist())
        if min(dims) < 0 or math.prod(dims) != count:
            raise CorruptSnapshotError(f"field {spec.name!r}: shapes disagree with list lengths")
        return values.reshape(dims)
    if spec.ndim == 0:
        if count != 1:
            raise CorruptSnapshotError(f"field {spec.name!r}: a 0-d array with several elements")
        return values.reshape(())
    return values


def _scalar_at(spec: FieldSpec, dtype: np.dtype, column: pa.Array, k: int) -> Any:
    """Row ``k`` of a scalar column, as :func:`_decode_scalar`'s rows give it."""
    if dtype.kind == "b":
        value = bool(column[k].as_py())
        return value if spec.python else np.bool_(value)
    storage, factor = storage_dtype(dtype)
    if factor != 1:
        one = _view(column.values, storage, (column.offset + k) * factor, factor).view(dtype)
    else:
        one = _view(column, storage, k, 1).view(dtype)
    return one.tolist()[0] if spec.python else one[0]


def _decode_tensor(
    spec: FieldSpec, dtype: np.dtype, column: pa.Array, shape_column: pa.Array | None
) -> _Column:
    storage, factor = storage_dtype(dtype)
    n = len(column)
    offsets = _view(column, np.dtype(np.int64), 0, n + 1) if n else np.zeros(1, np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    values = _view(column.values, storage, first, last - first).view(dtype)
    offsets = offsets - first
    if factor != 1:
        offsets //= factor
    lengths = np.diff(offsets)
    if n and lengths.min() < 0:
        raise CorruptSnapshotError(f"field {spec.name!r}: list offsets decrease")
    if spec.ndim >= 2 and shape_column is not None:
        # .values plus the offset, not .flatten(): flatten imports pyarrow.compute (~30 ms),
        # which would be the largest part of the time to a snapshot's first batch.
        shapes = _view(shape_column.values, np.dtype(np.int32), shape_column.offset * spec.ndim,
                       n * spec.ndim).reshape(n, spec.ndim)
        if not np.array_equal(np.prod(shapes, axis=1, dtype=np.int64), lengths):
            raise CorruptSnapshotError(f"field {spec.name!r}: shapes disagree with list lengths")
    elif spec.ndim == 1:
        shapes = lengths.reshape(n, 1)
    else:
        if n and (lengths != 1).any():
            raise CorruptSnapshotError(f"field {spec.name!r}: a 0-d array with several elements")
        shapes = np.zeros((n, 0), np.int64)
    if n == 0 or (shapes == shapes[0]).all():
        if n:
            shape = tuple(shapes[0].tolist())
        else:
            shape = tuple(d or 0 for d in (spec.shape or (0,) * spec.ndim))
        array = values.reshape(n, *shape)
        if spec.ndim == 0:
            return _Column(array, _ZeroDim(array))
        return _Column(array, array)
    bounds = offsets.tolist()
    if spec.ndim == 1:
        arrays = [values[a:b] for a, b in zip(bounds, bounds[1:])]
    else:
        arrays = [
            values[a:b].reshape(shape)
            for a, b, shape in zip(bounds, bounds[1:], map(tuple, shapes.tolist()))
        ]
    return _Column(arrays, arrays)


class _ZeroDim:
    """The rows of a 0-d tensor field: ``array[k, ...]`` (a 0-d view), by index or in order."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __getitem__(self, k: int) -> np.ndarray:
        return self._array[k, ...]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self._array[k, ...] for k in range(len(self._array)))


def _decode_scalar(spec: FieldSpec, dtype: np.dtype, column: pa.Array) -> _Column:
    n = len(column)
    if dtype.kind == "b":
        array = column.to_numpy(zero_copy_only=False)
        array.setflags(write=False)
    else:
        storage, factor = storage_dtype(dtype)
        if factor != 1:
            array = _view(column.values, storage, column.offset * factor, n * factor).view(dtype)
        else:
            array = _view(column, storage, 0, n).view(dtype)
    if spec.python:
        return _Column(array, make_rows=array.tolist)
    return _Column(array, array)
