"""Examples into Arrow record batches: :class:`Encoder` checks each example against the
snapshot's schema and copies it, and :meth:`Encoder.flush` returns the pending rows as one
``pa.RecordBatch`` in the column layout of :mod:`snapcache.store.codec`.

The encoder copies each array when it is added (to native byte order, C order), because a
pipeline may reuse or modify the array in place after handing it over: one after the other into
a buffer reused from batch to batch (see ``Encoder._copy``), which ``flush`` wraps in Arrow
buffers without further copies or per-element Python work (rows that do not fit are copied
alone and concatenated once). Arrays in non-native byte order come back in native order, with
equal values.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import numpy as np
import pyarrow as pa

from snapcache.errors import SchemaMismatchError, UnsupportedValueError
from snapcache.store.schema import FieldSpec, Schema, classify, split_example, storage_dtype

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

    >>> from snapcache.store.schema import infer_schema
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
        self._planned_rows = 0  # rows the batch being filled will hold (plan_rows)
        self._reset()

    def plan_rows(self, rows: int) -> None:
        """The batches from the next row on will hold about ``rows`` rows: a tensor field's
        slab is sized for that many of the batch's first row when that is more than the last
        batch held. So the rows of a stream's first record batch, and of a second one larger
        than the first, go into a slab too, instead of one fresh array each."""
        self._planned_rows = rows

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

        A slab is sized from the field's elements in the last batch, or for the rows planned
        (:meth:`plan_rows`) of the batch's first row if that is more, and reused once nothing
        refers to it any more (the record batch made from it was written and dropped): the
        memory is then already mapped, where fresh copies page-faulted every batch in
        (~40 us for a 49 KB example, against ~5 us for the copy itself)."""
        dtype = self._dtypes[i]
        if self._in_slab[i]:
            slab = self._slab[i]
            size = math.prod(value.shape)
            if slab is None:  # the batch's first row
                capacity = max(self._capacity[i], self._planned_rows * size)
                if 0 < capacity and capacity * dtype.itemsize <= SLAB_BYTES:
                    slab = self._slab[i] = self._free_slab(i, capacity)
            start = self._filled[i]
            if slab is not None and start + size <= len(slab):
                flat = slab[start:start + size]
                flat.reshape(value.shape)[...] = value
                self._filled[i] = start + size
                return flat
            self._in_slab[i] = False
        return np.array(value, dtype=dtype, order="C").reshape(-1)

    def _free_slab(self, i: int, capacity: int) -> np.ndarray:
        """A slab of field ``i`` of at least ``capacity`` elements that nothing else refers
        to (no record batch, no view), reused if there is one."""
        pool = self._slabs[i]
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
