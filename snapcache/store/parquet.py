"""Reading Parquet files as examples, split into pieces that streams share exactly once.

A *piece* is a whole file or one row group of a file. :func:`stream_pieces` gives stream
``index`` of ``count`` its pieces: with at least ``count`` files, every ``count``-th file (a
stream opens only its own files' footers); with fewer files, every ``count``-th row group of
all the files in order. Together the streams read every row exactly once.

Rows come back as dicts of column values: numbers, booleans and times as numpy scalars, lists
as 1-d numpy arrays (fixed-size lists too), strings as ``str``, binaries as ``bytes``. Nulls
and struct/map columns cannot be stored in a snapshot and raise with a hint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from snapcache.errors import UnsupportedValueError
from snapcache.store.source_files import expand_files, is_dir, open_input

READ_BATCH_ROWS = 1024
"""Rows decoded at a time: bounds memory whatever the row-group size."""


@dataclass(frozen=True)
class Piece:
    url: str
    row_groups: tuple[int, ...]
    rows: int


def expand_parquet(paths: str | os.PathLike | Sequence[str | os.PathLike],
                   storage_options: dict | None = None) -> list[str]:
    """Files of a path, glob, folder (its ``*.parquet`` files, recursively) or list of them."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    urls: list[str] = []
    for path in paths:
        path = os.fspath(path)
        if not any(ch in path for ch in "*?[") and is_dir(path, storage_options):
            path = path.rstrip("/") + "/**/*.parquet"
        urls.extend(expand_files(path, storage_options))
    return urls


def _row_groups(url: str, storage_options: dict | None) -> list[int]:
    with open_input(url, storage_options) as f:
        metadata = pq.ParquetFile(f).metadata
        return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]


@dataclass(frozen=True)
class RowGroupDigest:
    """One row group of a Parquet file as a delta snapshot's unit: its index, rows, the bytes
    hashed and their xxh3-128 (see :func:`row_group_digests`)."""

    index: int
    rows: int
    nbytes: int
    digest: str


def row_group_digests(url: str, columns: Sequence[str] | None = None,
                      storage_options: dict | None = None) -> list[RowGroupDigest]:
    """Each row group's identity by content: the xxh3-128 of the bytes of its column chunks
    (byte ranges from the footer; only the chunks of ``columns`` when given) and of their
    schema (path, physical and logical type), so a row group whose content is the same in a
    rewritten file keeps its digest. A row group equal to an earlier one of the same file gets
    its occurrence number mixed in (each is a unit of its own). Reads the footer, then each
    range once."""
    wanted = set(columns) if columns else None
    found: list[RowGroupDigest] = []
    seen: dict[str, int] = {}
    with open_input(url, storage_options) as f:
        metadata = pq.ParquetFile(f).metadata
        schema = metadata.schema
        for g in range(metadata.num_row_groups):
            group = metadata.row_group(g)
            h = xxhash.xxh3_128(b"snapcache.parquet-row-group\x00")
            nbytes = 0
            for c in range(group.num_columns):
                chunk = group.column(c)
                top = chunk.path_in_schema.split(".", 1)[0]
                if wanted is not None and top not in wanted:
                    continue
                column = schema.column(c)
                h.update(f"{chunk.path_in_schema}\x00{column.physical_type}\x00"
                         f"{column.logical_type}\x00{chunk.compression}\x00".encode())
                start = chunk.data_page_offset
                if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                    start = min(start, chunk.dictionary_page_offset)
                f.seek(start)
                data = f.read(chunk.total_compressed_size)
                if len(data) != chunk.total_compressed_size:
                    raise OSError(f"{url}: row group {g} column {chunk.path_in_schema}: the "
                                  "footer names bytes past the end of the file (truncated or "
                                  "being rewritten?)")
                h.update(data)
                nbytes += len(data)
            digest = h.hexdigest()
            count = seen.get(digest, 0)
            seen[digest] = count + 1
            if count:
                digest = xxhash.xxh3_128_hexdigest(f"{digest}\x00{count}".encode())
            found.append(RowGroupDigest(g, group.num_rows, nbytes, digest))
    return found


def file_rows(urls: Sequence[str], storage_options: dict | None = None) -> list[int]:
    """Rows of each Parquet file, from its footer (one small read a file)."""
    return [sum(_row_groups(url, storage_options)) for url in urls]


def stream_pieces(urls: Sequence[str], index: int, count: int,
                  storage_options: dict | None = None) -> list[Piece]:
    """The pieces stream ``index`` of ``count`` reads, in order."""
    if len(urls) >= count:
        pieces = []
        for url in urls[index::count]:
            sizes = _row_groups(url, storage_options)
            pieces.append(Piece(url, tuple(range(len(sizes))), sum(sizes)))
        return pieces
    units = [Piece(url, (group,), rows) for url in urls
             for group, rows in enumerate(_row_groups(url, storage_options))]
    return units[index::count]


def read_pieces(pieces: Sequence[Piece], columns: Sequence[str] | None = None, skip: int = 0,
                storage_options: dict | None = None) -> Iterator[dict[str, Any]]:
    """The rows of ``pieces`` in order, after the first ``skip`` (whole pieces skipped unread)."""
    for piece in pieces:
        if skip >= piece.rows:
            skip -= piece.rows
            continue
        with open_input(piece.url, storage_options) as f:
            parquet = pq.ParquetFile(f)
            batches = parquet.iter_batches(batch_size=READ_BATCH_ROWS,
                                           row_groups=list(piece.row_groups),
                                           columns=list(columns) if columns else None)
            for batch in batches:
                if skip >= batch.num_rows:
                    skip -= batch.num_rows
                    continue
                if skip:
                    batch, skip = batch.slice(skip), 0
                yield from batch_rows(batch, piece.url)


def batch_rows(batch: pa.RecordBatch, where: str = "") -> Iterator[dict[str, Any]]:
    """The rows of a record batch as dicts of numpy scalars, arrays, str and bytes."""
    names = batch.schema.names
    columns = [_column_values(batch.column(i), name, where) for i, name in enumerate(names)]
    for values in zip(*columns):
        yield dict(zip(names, values))


def _column_values(column: pa.Array, name: str, where: str) -> Sequence[Any]:
    kind = column.type
    if column.null_count:
        raise UnsupportedValueError(
            f"Parquet column {name!r} of {where} holds nulls, which a snapshot cannot store; "
            "leave it out with from_parquet(..., columns=[...]) or fill it in the file")
    if pa.types.is_dictionary(kind):
        return _column_values(column.dictionary_decode(), name, where)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
            pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return column.to_pylist()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        values = column.values
        if not _primitive(values.type):
            return [np.asarray(row) for row in column.to_pylist()]
        flat = np.array(values.to_numpy(zero_copy_only=False))  # writable copy
        offsets = column.offsets.to_numpy()
        return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    if pa.types.is_fixed_size_list(kind) and _primitive(kind.value_type):
        flat = np.array(column.flatten().to_numpy(zero_copy_only=False))
        return list(flat.reshape(len(column), kind.list_size))
    if _primitive(kind):
        return list(column.to_numpy(zero_copy_only=False))
    raise UnsupportedValueError(
        f"Parquet column {name!r} of {where} has type {kind}, which a snapshot cannot store; "
        "select other columns with from_parquet(..., columns=[...]) or convert it in the file")


def _primitive(kind: pa.DataType) -> bool:
    return (pa.types.is_integer(kind) or pa.types.is_floating(kind)
            or pa.types.is_boolean(kind) or pa.types.is_timestamp(kind)
            or pa.types.is_date(kind) or pa.types.is_duration(kind))
