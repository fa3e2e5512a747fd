"""Fingerprints of pipeline sources: in-memory data by content, files by identity.

Every function returns a node labelled ``"source"`` (or the given label), so the first child of a
pipeline root explains itself as ``source: 3 files added``.
"""

from __future__ import annotations

import datetime
import operator
from typing import Any, Callable, Iterable, Mapping, Sequence

import xxhash

from snapcache.fingerprint.bulk import hash_items
from snapcache.fingerprint.canonical import feed_value, hash_value
from snapcache.fingerprint.explain import describe
from snapcache.fingerprint.functions import hash_function
from snapcache.fingerprint.tree import FingerprintNode, Unhashable, Walk, combine, leaf, node

__all__ = ["hash_iterable_source", "hash_range_source", "hash_generator_source",
           "hash_files_source", "files_lineage_node", "row_groups_lineage_node"]


def hash_iterable_source(items: Iterable[Any], label: str = "source") -> FingerprintNode:
    """In-memory items by content, in order, streamed into one hasher.

    >>> hash_iterable_source([1, 2, 3]).summary
    '3 items'
    """
    try:
        digest, count = hash_items(items)  # numpy speed for examples of one structure
    except Unhashable as e:
        raise e.to_error(label, "the pipeline's source") from None
    noun = "item" if count == 1 else "items"
    return leaf(label, "source:items", digest + count.to_bytes(8, "little"), f"{count} {noun}")


def hash_range_source(start: int, stop: int, step: int) -> FingerprintNode:
    """A ``range(start, stop, step)`` source."""
    start, stop, step = (operator.index(n) for n in (start, stop, step))
    payload = b"".join(n.to_bytes(16, "little", signed=True) for n in (start, stop, step))
    return leaf("source", "source:range", payload, f"range({start}, {stop}, {step})")


def hash_generator_source(fn: Callable[..., Iterable[Any]], args: Sequence[Any] = (),
                          kwargs: Mapping[str, Any] | None = None) -> FingerprintNode:
    """A source made by calling ``fn(*args, **kwargs)``: the function's code and its arguments."""
    where = "the pipeline's source"
    children = [hash_function(fn, "generator function", where=where)]
    children += [hash_value(a, f"argument #{i}", where=where) for i, a in enumerate(args)]
    children += [hash_value(v, f"argument `{k}`", where=where)
                 for k, v in sorted((kwargs or {}).items())]
    return combine("source", children, kind="source:generator", summary=describe(fn))


def _file_summary(identity: Mapping[str, Any]) -> str:
    parts = [f"{identity.get('size', '?')} bytes"]
    if "etag" in identity:
        parts.append(f"etag {identity['etag'][:12]}")
    elif "mtime_ns" in identity:
        seconds, ns = divmod(int(identity["mtime_ns"]), 1_000_000_000)
        stamp = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
        parts.append(f"modified {stamp:%Y-%m-%d %H:%M:%S}.{ns:09d}")
    if "xxh3_128" in identity:
        parts.append(f"xxh3 {identity['xxh3_128'][:8]}")
    return ", ".join(parts)


def file_node(url: str, identity: Mapping[str, Any]) -> FingerprintNode:
    """The node of one file from its identity (path, size, mtime_ns or etag, xxh3_128)."""
    h = xxhash.xxh3_128()
    feed_value(h, {k: v for k, v in identity.items() if k != "path"}, Walk())
    h.update(url.encode("utf-8", "surrogatepass"))
    return leaf(f"file `{url}`", "file", h.digest(), _file_summary(identity))


def hash_files_source(identities: Sequence[Mapping[str, Any]], *, strict: bool = False
                      ) -> FingerprintNode:
    """Files by identity, in order: each a mapping with the path as given, size and mtime
    (ETag on object stores), and with ``strict=True`` a hash of the content, as
    :func:`snapcache.store.source_files.file_identity` returns them. Pure: the caller does the I/O."""
    files = [file_node(str(identity["path"]), identity) for identity in identities]
    noun = "file" if len(files) == 1 else "files"
    return node("source", "source:files", b"strict" if strict else b"", files,
                f"{len(files)} {noun}")


def named_files_node(files: Sequence[tuple[str, int, int]]) -> FingerprintNode:
    """The files a dataset object names (``from_torch``), ``(path, size, mtime_ns)`` each, in
    order, as one leaf: a dataset may name a million files, re-counted in every worker that
    does not inherit its parent's fingerprint."""
    h = xxhash.xxh3_128()
    for path, size, mtime_ns in files:
        h.update(path.encode("utf-8", "surrogatepass") + b"\0")
        h.update(size.to_bytes(8, "little") + mtime_ns.to_bytes(8, "little", signed=True))
    noun = "file" if len(files) == 1 else "files"
    return leaf("files it names", "source:named-files", h.digest(), f"{len(files)} {noun}")


def files_lineage_node(*, strict: bool) -> FingerprintNode:
    """A file source as a delta snapshot's lineage counts it: by kind, not by file list (each
    file is a unit, keyed by :func:`snapcache.fingerprint.units.unit_key`)."""
    return leaf("source", "source:files-by-unit", b"strict" if strict else b"",
                "files, each a unit" + (" (strict)" if strict else ""))


def row_groups_lineage_node() -> FingerprintNode:
    """A Parquet source as a delta snapshot's lineage counts it: by kind, each row group a unit
    keyed by its content (:func:`snapcache.fingerprint.units.unit_key`). Another kind than
    :func:`files_lineage_node`: lineages whose units were whole Parquet files are not read as
    row-group lineages."""
    return leaf("source", "source:parquet-row-groups", b"",
                "Parquet files, each row group a unit")
