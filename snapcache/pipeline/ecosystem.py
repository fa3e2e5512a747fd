"""Runners of the sources from the ecosystem: Parquet files and map-style torch datasets.

Both honour the current stream (:mod:`snapcache.pipeline.streams`): Parquet by file or row
group (see :mod:`snapcache.store.parquet`), a torch dataset by striding over its indices.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from snapcache.pipeline import ops, streams
from snapcache.store import parquet


def run_parquet(op: ops.ParquetSource, epoch: int) -> Iterator[Any]:
    spec = streams.current()
    # The pieces are listed now, in the caller's context (streams travel in a context variable).
    pieces = parquet.stream_pieces(op.urls, spec.index, spec.count, op.storage_options)
    return parquet.read_pieces(pieces, op.columns, skip=spec.skip,
                               storage_options=op.storage_options)


def run_torch(op: ops.TorchSource, epoch: int) -> Iterator[Any]:
    from snapcache.adapters.torch import numpy_example  # imports no torch itself

    spec = streams.current()
    dataset = op.dataset
    # By index, always: iter() of a map-style dataset would call __getitem__ until IndexError.
    indices = range(spec.index + spec.count * spec.skip, len(dataset), spec.count)
    return (numpy_example(dataset[i]) for i in indices)


RUNNERS: dict[type, Callable[[Any, int], Iterator[Any]]] = {
    ops.ParquetSource: run_parquet,
    ops.TorchSource: run_torch,
}
