"""Batching: stack examples into one example of arrays with a leading batch dimension."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from snapcache.errors import SchemaMismatchError


def batch_examples(items: Iterable[Any], batch_size: int, drop_remainder: bool = False
                   ) -> Iterator[Any]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == batch_size:
            yield stack(chunk)
            chunk = []
    if chunk and not drop_remainder:
        yield stack(chunk)


def stack(examples: Sequence[Any]) -> Any:
    """Stack examples of the same structure: dicts per key, tuples per element, values directly.

    Numbers and arrays become one numpy array ``(n, *shape)``; ``str`` and ``bytes`` become a
    1-d object array. Arrays of different shapes cannot be stacked: pad them in a ``map`` first.
    """
    first = examples[0]
    if isinstance(first, dict):
        keys = list(first)
        for e in examples:
            if not isinstance(e, dict) or list(e) != keys:
                raise SchemaMismatchError(
                    f"batch: examples have different keys ({keys} vs "
                    f"{list(e) if isinstance(e, dict) else type(e).__name__})")
        return {k: _stack_values([e[k] for e in examples], f"key {k!r}") for k in keys}
    if isinstance(first, tuple):
        for e in examples:
            if not isinstance(e, tuple) or len(e) != len(first):
                raise SchemaMismatchError("batch: examples are tuples of different lengths")
        return tuple(_stack_values([e[i] for e in examples], f"tuple element {i}")
                     for i in range(len(first)))
    return _stack_values(list(examples), "the example")


def _stack_values(values: list[Any], where: str) -> Any:
    first = values[0]
    if isinstance(first, (str, bytes)):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    arrays = [np.asarray(v) for v in values]
    shape = arrays[0].shape
    for a in arrays:
        if a.shape != shape:
            raise SchemaMismatchError(
                f"batch: {where} has examples of different shapes {shape} and {a.shape}; "
                "pad or resize them in a map() before batch()")
    return np.stack(arrays)
