"""Turn examples into Arrow record batches and back, exactly.

:class:`Encoder` collects examples and :meth:`Encoder.flush` returns them as one
``pa.RecordBatch``; :class:`Decoder` turns a batch back into examples (:meth:`Decoder.rows`) or
whole columns (:meth:`Decoder.columns`). The column layout is described in
:mod:`snapcache.store.schema`; in short, a tensor field is a ``large_list`` of its flattened
C-order elements (its length is the shape for ndim 1, a companion ``"<name>.shape"``
``fixed_size_list<int32>`` column holds the shape for ndim >= 2).

Decisions:

- ``large_list``/``large_string``/``large_binary`` (int64 offsets) everywhere: one batch of
  images easily passes 2**31 elements, decoding is as fast as with int32 offsets, and the 4
  extra bytes a row vanish under compression. One layout, no fallback logic.
- The encoder copies each array when it is added (to native byte order, C order), because a
  pipeline may reuse or modify the array in place after handing it over: one after the other
  into a buffer reused from batch to batch (see ``Encoder._copy``), which ``flush`` wraps in
  Arrow buffers without further copies or per-element Python work (rows that do not fit are
  copied alone and concatenated once). Arrays in non-native byte order come back in native order, with equal values.
- Decoded tensors are **read-only views** of the batch's Arrow buffers (zero copy), from both
  ``rows()`` and ``columns()``; scalar columns are read-only too. Copy an array before writing
  to it. Holding one row keeps the memory of its whole batch alive. The examples an epoch
  writes are handed on as :func:`read_only` views too, so that what follows a snapshot gets
  read-only arrays in every epoch, the writing one included.
- Round trips are exact: dtypes, shapes (0-d arrays stay 0-d, numpy scalars stay numpy
  scalars, Python ``bool``/``int``/``float`` stay Python objects), NaN payloads and ``-0.0``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from snapcache.errors import CorruptSnapshotError, SchemaMismatchError, UnsupportedValueError
from snapcache.store.schema import (
    FieldSpec,
    Schema,
    classify,
    infer_schema,
    split_example,
    storage_dtype,
)

__all__ = ["Decoder", "Encoder", "FieldSpec", "Schema", "infer_schema"]

_INT32_MAX = 2**31 - 1
SLAB_BYTES = 64 << 20
"""A tensor field's rows of a batch are copied into a reused buffer (a slab) when the last
batch's fit in this many bytes; larger ones (huge examples) are copied one by one as before."""
SLABS_KEPT = 6
"""Slabs a field keeps for reuse: the batches queued for the writer's thread (4), the one it
writes and the one being filled."""
_PYTHON_TYPES = {"bool": "bool", "int64": "int", "float64": "float"}


def _type_text(kind: str, dtype: str, ndim: int, python: bool) -> str:
    if kind == "tensor":
        return f"{dtype} array with ndim {ndim}"
    if kind == "scalar":
        return f"Python {_PYTHON_TYPES[dtype]}" if python else f"numpy {dtype} scalar"
    return kind



def shown_structure(structure: str) -> str:
    """How an error names an example structure ("dict", "tuple", "single")."""
    return {"single": "a single value"}.get(structure, f"a {structure}")

class Encoder:
    """Collect examples of one schema and emit them as Arrow record batches.

    >>> enc = Encoder(infer_schema({"x": np.zeros(3, np.float32), "y": 1}))
    >>> enc.add({"x": np.ones(2, np.float32), "y": 2})
    >>> enc.flush().num_rows
    1
    """

    def __init__(self, schema: Schema) -> None:
        self._schema = schema
        self._arrow_schema = schema.arrow_schema()
        fields = schema.fields
        self._names = [f.name for f in fields]
        self._expected = [(f.kind, f.dtype, f.ndim, f.python) for f in fields]
        self._dtypes = [np.dtype(f.dtype) if f.dtype else None for f in fields]
        if schema.structure == "dict":
            self._wheres = [f"key {name!r}" for name in self._names]
        elif schema.structure == "tuple":
            self._wheres = [f"tuple element {i}" for i in range(len(fields))]
        else:
            self._wheres = ["the example"]
        self._observed: list[tuple[int | None, ...] | None] = [None] * len(fields)
        self._count = 0
        # per tensor field: buffers the rows of a batch are copied into (see _copy)
        self._slabs: list[list[np.ndarray]] = [[] for _ in fields]
        self._capacity = [0] * len(fields)  # elements of the last batch: the next slab's size
        self._reset()

    def _reset(self) -> None:
        self._values: list[list[Any]] = [[] for _ in self._names]
        self._shapes: list[list[tuple[int, ...]]] = [[] for _ in self._names]
        self._slab: list[np.ndarray | None] = [None] * len(self._names)
        self._filled = [0] * len(self._names)   # elements copied into the slab
        self._in_slab = [True] * len(self._names)  # every row so far, in order
        self._num_rows = 0
        self._nbytes = 0

    @property
    def num_rows(self) -> int:
        """Rows added since the last flush."""
        return self._num_rows

    @property
    def nbytes(self) -> int:
        """Approximate raw payload bytes added since the last flush."""
        return self._nbytes

    def _field_values(self, example: Any, position: int) -> list[Any]:
        structure = self._schema.structure
        if structure == "dict" and type(example) is dict and len(example) == len(self._names):
            try:
                return [example[name] for name in self._names]
            except KeyError:
                pass
        try:
            got, items = split_example(example)
        except UnsupportedValueError as exc:
            raise UnsupportedValueError(f"example {position}: {exc}") from None
        if got != structure:
            shown = shown_structure(got)
            if example is None:
                shown = ("None; leave such examples out with .filter(lambda e: e is not None) "
                         "before .snapshot(), or return a placeholder")
            raise SchemaMismatchError(
                f"example {position}: expected {shown_structure(structure)} like the first "
                f"example, got {shown}")
        names = [name for name, _, _ in items]
        if names != self._names and (structure != "dict" or set(names) != set(self._names)):
            if structure == "tuple":
                raise SchemaMismatchError(
                    f"example {position}: expected a tuple of {len(self._names)} values, "
                    f"got {len(names)}"
                )
            missing = [n for n in self._names if n not in names]
            extra = [n for n in names if n not in self._names]
            raise SchemaMismatchError(
                f"example {position}: dict keys changed from the first example: "
                f"missing {missing}, unexpected {extra}"
            )
        by_name = {name: value for name, _, value in items}
        return [by_name[name] for name in self._names]

    def add(self, example: Any, index: int | None = None) -> None:
        """Validate one example against the schema and queue it for the next batch.

        ``index`` is the example's position in the whole snapshot, used in error messages;
        by default the number of examples added to this encoder before it. The example is
        queued either entirely or not at all.
        """
        position = self._count if index is None else index
        values = self._field_values(example, position)
        for i, (value, where) in enumerate(zip(values, self._wheres)):
            try:
                got = classify(value, where)
            except UnsupportedValueError as exc:
                raise UnsupportedValueError(f"example {position}, {exc}") from None
            if got != self._expected[i]:
                raise SchemaMismatchError(
                    f"example {position}, {where}: expected {_type_text(*self._expected[i])} "
                    f"like the first example, got {_type_text(*got)}; all examples in a "
                    "snapshot must match, cast or reshape them in the function producing them"
                )
        nbytes = 0
        for i, value in enumerate(values):
            kind = self._expected[i][0]
            if kind == "tensor":
                # Copy now: the pipeline may reuse or modify the array after handing it over.
                flat = self._copy(i, value)
                self._values[i].append(flat)
                shape = value.shape
                self._shapes[i].append(shape)
                observed = self._observed[i]
                if observed is None:
                    self._observed[i] = shape
                elif observed != shape:
                    merged = (o if o == s else None for o, s in zip(observed, shape))
                    self._observed[i] = tuple(merged)
                nbytes += flat.nbytes
            else:
                self._values[i].append(value)
                nbytes += 8 if kind == "scalar" else len(value)
        self._nbytes += nbytes
        self._num_rows += 1
        self._count += 1

    def _copy(self, i: int, value: Any) -> np.ndarray:
        """Tensor ``value`` of field ``i`` copied, flat, C order, native byte order: into the
        batch's slab while the rows fit in it one after the other (``flush`` then wraps the
        slab's filled part without concatenating), else into an array of its own.

        A slab is sized from the field's elements in the last batch, and reused once nothing
        refers to it any more (the record batch made from it was written and dropped): the
        memory is then already mapped, where fresh copies page-faulted every batch in
        (~40 us for a 49 KB example, against ~5 us for the copy itself)."""
        dtype = self._dtypes[i]
        if self._in_slab[i]:
            slab = self._slab[i]
            if slab is None and self._capacity[i]:
                slab = self._slab[i] = self._free_slab(i)
            size = math.prod(value.shape)
            start = self._filled[i]
            if slab is not None and start + size <= len(slab):
                flat = slab[start:start + size]
                flat.reshape(value.shape)[...] = value
                self._filled[i] = start + size
                return flat
            self._in_slab[i] = False
        return np.array(value, dtype=dtype, order="C").reshape(-1)

    def _free_slab(self, i: int) -> np.ndarray:
        """A slab of field ``i`` of the current capacity that nothing else refers to (no
        record batch, no view), reused if there is one."""
        pool, capacity = self._slabs[i], self._capacity[i]
        for k in range(len(pool)):
            # the pool's reference and the argument's: no array, view or Arrow buffer has it
            if sys.getrefcount(pool[k]) == 2:
                if len(pool[k]) >= capacity:
                    return pool[k]
                del pool[k]  # too small now
                break
        slab = np.empty(capacity, self._dtypes[i])
        if len(pool) < SLABS_KEPT:
            pool.append(slab)
        return slab

    def flush(self) -> pa.RecordBatch:
        """Return the pending rows as one record batch (possibly empty) and forget them."""
        arrays: list[pa.Array] = []
        for i, (spec, dtype, values, shapes) in enumerate(zip(
            self._schema.fields, self._dtypes, self._values, self._shapes
        )):
            if spec.kind == "tensor":
                slab = self._slab[i]
                whole = slab is not None and self._in_slab[i] and len(values) > 1
                arrays.extend(_tensor_arrays(spec, dtype, values, shapes,
                                             slab[:self._filled[i]] if whole else None))
                elements = self._filled[i] if whole else sum(v.size for v in values)
                self._capacity[i] = elements if elements * dtype.itemsize <= SLAB_BYTES else 0
            elif spec.kind == "scalar":
                arrays.append(_scalar_array(dtype, values))
            elif spec.kind == "str":
                arrays.append(_bytes_array(pa.large_string(), [v.encode() for v in values]))
            else:
                arrays.append(_bytes_array(pa.large_binary(), [bytes(v) for v in values]))
        batch = pa.RecordBatch.from_arrays(arrays, schema=self._arrow_schema)
        self._reset()
        return batch

    def observed_schema(self) -> Schema:
        """The schema with each tensor's shape as observed over every row ever added.

        A dimension that varied between rows is ``None``. Fields with no rows keep the shape
        of the schema given to the constructor.
        """
        fields = tuple(
            dataclasses.replace(spec, shape=tuple(observed)) if observed is not None else spec
            for spec, observed in zip(self._schema.fields, self._observed)
        )
        return Schema(self._schema.structure, fields)


# Arrays are built from buffers, never with pa.array: its first call imports pandas (about a
# second, on every writing epoch's first batch).
def _primitive(dtype: np.dtype, data: np.ndarray) -> pa.Array:
    """Wrap a 1-d native numpy array as an Arrow array of the same storage, without copying."""
    data = np.ascontiguousarray(data)
    return pa.Array.from_buffers(pa.from_numpy_dtype(dtype), len(data), [None, pa.py_buffer(data)])


def _bytes_array(type: pa.DataType, values: list[bytes]) -> pa.Array:
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    return pa.Array.from_buffers(type, len(values), [None, pa.py_buffer(offsets),
                                                     pa.py_buffer(b"".join(values))])


def _tensor_arrays(
    spec: FieldSpec, dtype: np.dtype, values: list[np.ndarray], shapes: list[tuple[int, ...]],
    flat: np.ndarray | None = None
) -> list[pa.Array]:
    """``flat``: the values already one after the other in one array (a slab), if they are."""
    storage, factor = storage_dtype(dtype)
    # One value (a huge example is flushed alone): its copy made by add() is used as is.
    if flat is None:
        flat = values[0] if len(values) == 1 else np.concatenate(values) if values else \
            np.empty(0, dtype)
    flat = flat.view(storage)
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum([v.size for v in values], out=offsets[1:])
    if factor != 1:
        offsets *= factor
    lists = pa.LargeListArray.from_arrays(_primitive(offsets.dtype, offsets),
                                          _primitive(storage, flat))
    if spec.ndim < 2:
        return [lists]
    dims = np.array(shapes, dtype=np.int64).reshape(len(values), spec.ndim)
    if dims.size and dims.max() > _INT32_MAX:
        raise UnsupportedValueError(f"field {spec.name!r}: an array dimension exceeds 2**31 - 1")
    shape_values = dims.astype(np.int32).reshape(-1)
    shape_values = _primitive(shape_values.dtype, shape_values)
    return [lists, pa.FixedSizeListArray.from_arrays(shape_values, spec.ndim)]


def _scalar_array(dtype: np.dtype, values: list[Any]) -> pa.Array:
    data = np.array(values, dtype=dtype) if values else np.empty(0, dtype)
    if dtype.kind == "b":
        bits = np.packbits(data.astype(bool), bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(data), [None, pa.py_buffer(bits)])
    storage, factor = storage_dtype(dtype)
    data = data.view(storage)
    if factor == 1:
        return _primitive(storage, data)
    return pa.FixedSizeListArray.from_arrays(_primitive(storage, data), factor)


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

