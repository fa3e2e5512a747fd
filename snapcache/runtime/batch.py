"""Batching: stack examples into one example of arrays with a leading batch dimension; with
:class:`Padding`, arrays of different shapes padded to the largest of their batch."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from snapcache.errors import SchemaMismatchError


@dataclass(frozen=True)
class Padding:
    """How ``padded_batch`` pads: each array at the end of every dimension to the largest size
    of its batch, with ``values`` (one number for every array, or a dict of numbers by key of
    dict examples: only those keys are padded), the first dimension then rounded up to a
    multiple of ``multiple_of`` (fewer distinct shapes for compiled models)."""

    values: Any = 0
    multiple_of: int = 1

    @classmethod
    def asked(cls, padding_values: Any, pad_to_multiple_of: int | None) -> "Padding":
        """The padding ``padded_batch``'s arguments ask for, checked: numbers (not bools, a
        ``True`` there is a misplaced argument), a copy of a dict of them, a positive int."""
        values = dict(padding_values) if isinstance(padding_values, dict) else padding_values
        for key, value in (values.items() if isinstance(values, dict) else [(None, values)]):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(
                    "padding_values must be a number, or a dict of numbers by key; got "
                    f"{value!r}" + (f" for key {key!r}" if key is not None else ""))
        multiple = 1 if pad_to_multiple_of is None else pad_to_multiple_of
        if not isinstance(multiple, int) or isinstance(multiple, bool) or multiple < 1:
            raise ValueError(f"pad_to_multiple_of must be an int >= 1; got {multiple!r}")
        return cls(values, multiple)

    def value_for(self, key: Any) -> Any:
        """The padding value of dict key ``key`` (None: not padded), or of any other array."""
        if isinstance(self.values, dict):
            return self.values.get(key)
        return self.values

    def describe(self) -> str:
        return f"padding_values={self.values!r}" + (
            f", pad_to_multiple_of={self.multiple_of}" if self.multiple_of > 1 else "")


def batch_examples(items: Iterable[Any], batch_size: int, drop_remainder: bool = False,
                   padding: Padding | None = None) -> Iterator[Any]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == batch_size:
            yield stack(chunk, padding)
            chunk = []
    if chunk and not drop_remainder:
        yield stack(chunk, padding)


def stack(examples: Sequence[Any], padding: Padding | None = None) -> Any:
    """Stack examples of the same structure: dicts per key, tuples per element, values directly.

    Numbers and arrays become one numpy array ``(n, *shape)``; ``str`` and ``bytes`` become a
    1-d object array. Arrays of different shapes are padded with ``padding``, else refused.
    """
    first = examples[0]
    if isinstance(first, dict):
        keys = list(first)
        for e in examples:
            if not isinstance(e, dict) or list(e) != keys:
                raise SchemaMismatchError(
                    f"batch: examples have different keys ({keys} vs "
                    f"{list(e) if isinstance(e, dict) else type(e).__name__})")
        if padding is not None and isinstance(padding.values, dict) and \
                not set(padding.values) <= set(keys):
            raise SchemaMismatchError(
                f"padded_batch: padding_values names keys the examples do not have: "
                f"{', '.join(sorted(map(repr, set(padding.values) - set(keys))))} (they have "
                f"{', '.join(map(repr, keys))})")
        return {k: _stack_values([e[k] for e in examples], f"key {k!r}",
                                 _pad_value(padding, k)) for k in keys}
    if padding is not None and isinstance(padding.values, dict):
        raise SchemaMismatchError(
            f"padded_batch: padding_values is a dict (by key) but the examples are "
            f"{type(first).__name__}s, not dicts; give one number for every array")
    if isinstance(first, tuple):
        for e in examples:
            if not isinstance(e, tuple) or len(e) != len(first):
                raise SchemaMismatchError("batch: examples are tuples of different lengths")
        return tuple(_stack_values([e[i] for e in examples], f"tuple element {i}",
                                   _pad_value(padding, i)) for i in range(len(first)))
    return _stack_values(list(examples), "the example", _pad_value(padding, None))


def _pad_value(padding: Padding | None, key: Any) -> tuple[Any, int] | bool | None:
    """``(value, multiple_of)`` of ``key``; None without padding (``batch``), False for a key
    a dict of padding values leaves out."""
    if padding is None:
        return None
    value = padding.value_for(key)
    return False if value is None else (value, padding.multiple_of)


def _stack_values(values: list[Any], where: str, pad: tuple[Any, int] | bool | None = None
                  ) -> Any:
    first = values[0]
    if isinstance(first, (str, bytes)):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    arrays = [np.asarray(v) for v in values]
    shape = arrays[0].shape
    if not pad or not shape:
        for a in arrays:
            if a.shape != shape:
                raise SchemaMismatchError(
                    f"batch: {where} has examples of different shapes {shape} and {a.shape}; "
                    + ("use padded_batch(), or pad or resize them in a map() before batch()"
                       if pad is None else "padding_values does not name it: add it to them"
                       if pad is False else "padded_batch pads arrays, not scalars"))
        return np.stack(arrays)
    value, multiple = pad
    for a in arrays:
        if a.ndim != len(shape):
            raise SchemaMismatchError(
                f"padded_batch: {where} has examples of {len(shape)} and {a.ndim} dimensions "
                f"({shape} and {a.shape}); padding adds to the sizes of dimensions, never "
                "dimensions: reshape them in a map() first")
    target = [max(a.shape[d] for a in arrays) for d in range(len(shape))]
    target[0] = _round_up(target[0], multiple)
    if tuple(target) == shape and all(a.shape == shape for a in arrays):
        return np.stack(arrays)  # nothing to pad
    dtype = np.result_type(*arrays)
    if len(shape) == 1:
        return _pad_sequences(arrays, where, value, multiple, dtype)
    out = _filled((len(arrays), *target), value, dtype, where)
    for i, a in enumerate(arrays):
        out[(i, *(slice(0, n) for n in a.shape))] = a
    return out


def _round_up(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def _filled(shape: tuple[int, ...], value: Any, dtype: np.dtype, where: str) -> np.ndarray:
    """An array of ``value``: the padding, before the examples are copied in."""
    try:
        return np.full(shape, value, dtype=dtype)
    except (OverflowError, ValueError, TypeError) as e:
        raise SchemaMismatchError(f"padded_batch: the padding value {value!r} does not fit "
                                  f"{where}'s dtype {dtype} ({e}); pass padding_values with "
                                  "one that does") from None


def _pad_sequences(rows: list[np.ndarray], where: str, value: Any, multiple: int,
                   dtype: np.dtype) -> np.ndarray:
    """1-d arrays padded at their end to the longest (rounded up to ``multiple``), with one
    plain slice assignment a row: 73 us for 256 token rows of 16-255, against 97 us for a
    boolean-mask scatter of their concatenation and 213 us for an assignment through a tuple
    of slices a row."""
    out = _filled((len(rows), _round_up(max(map(len, rows)), multiple)), value, dtype, where)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def pad_stacked(batch: Any, padding: Padding) -> Any:
    """A batch cut from whole columns as :func:`stack` with ``padding`` gives it: a column of
    arrays of different shapes (an object array of them) stacked with its padding; the other
    arrays, of one shape already, their first dimension after the batch's rounded up to a
    multiple of ``padding.multiple_of``."""
    if isinstance(batch, dict):
        return {k: _pad_column(v, f"key {k!r}", _pad_value(padding, k))
                for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_pad_column(v, f"tuple element {i}", _pad_value(padding, i))
                     for i, v in enumerate(batch))
    return _pad_column(batch, "the example", _pad_value(padding, None))


def _pad_column(column: Any, where: str, pad: tuple[Any, int] | bool | None) -> Any:
    if not isinstance(column, np.ndarray):
        return column
    if column.dtype == object:
        if not len(column) or not isinstance(column[0], np.ndarray):
            return column  # str, bytes
        rows = column.tolist()  # a tensor field whose rows differ in shape
        if not pad or rows[0].ndim != 1:
            return _stack_values(rows, where, pad)
        return _pad_sequences(rows, where, *pad, rows[0].dtype)  # one dtype: a column
    if not pad or column.ndim < 2:
        return column
    value, multiple = pad
    size = column.shape[1]
    wanted = _round_up(size, multiple)
    if wanted == size:
        return column
    widths = [(0, 0), (0, wanted - size)] + [(0, 0)] * (column.ndim - 2)
    return np.pad(column, widths, constant_values=value)
