"""Op specs: what each pipeline step is, as immutable data. No execution lives here.

Each op knows its parent, a short human description, and the parts of itself that decide what it
computes (its fingerprint children). Ops that never change the examples (prefetch, cache,
snapshot) have ``content = False`` and do not count towards fingerprints.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from snapcache.errors import FingerprintError
from snapcache.fingerprint import FingerprintNode, hash_function, hash_value
from snapcache.fingerprint import sources as source_fp
from snapcache.options import SnapshotOptions


def callable_name(fn: Any) -> str:
    if isinstance(fn, functools.partial):
        return f"partial({callable_name(fn.func)})"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


@dataclass(frozen=True, eq=False)
class Op:
    parent: "Op | None"
    kind: ClassVar[str] = "op"
    content: ClassVar[bool] = True

    def describe(self) -> str:
        return self.kind

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return []


# -- sources -----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class IterableSource(Op):
    items: Any = None
    kind: ClassVar[str] = "from_iterable"

    def describe(self) -> str:
        n = len(self.items) if hasattr(self.items, "__len__") else "?"
        return f"from_iterable({n} items)"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_iterable_source(self.items, label="items")]


@dataclass(frozen=True, eq=False)
class GeneratorSource(Op):
    fn: Callable[..., Any] = None  # type: ignore[assignment]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    kind: ClassVar[str] = "from_generator"

    def describe(self) -> str:
        return f"from_generator({callable_name(self.fn)})"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_generator_source(self.fn, self.args, self.kwargs)]


@dataclass(frozen=True, eq=False)
class RangeSource(Op):
    start: int = 0
    stop: int = 0
    step: int = 1
    kind: ClassVar[str] = "range"

    def describe(self) -> str:
        return f"range({self.start}, {self.stop}" + (f", {self.step})" if self.step != 1 else ")")

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_range_source(self.start, self.stop, self.step)]


@dataclass(frozen=True, eq=False)
class FilesSource(Op):
    urls: tuple[str, ...] = ()
    strict: bool = False
    storage_options: dict = field(default_factory=dict)
    kind: ClassVar[str] = "from_files"

    def describe(self) -> str:
        return f"from_files({len(self.urls)} files)"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_files_source(self.urls, strict=self.strict,
                                            storage_options=self.storage_options)]


@dataclass(frozen=True, eq=False)
class ParquetSource(Op):
    """Rows of Parquet files, as dicts of column values; split by file or row group."""
    urls: tuple[str, ...] = ()
    columns: tuple[str, ...] | None = None
    storage_options: dict = field(default_factory=dict)
    kind: ClassVar[str] = "from_parquet"

    def describe(self) -> str:
        return f"from_parquet({len(self.urls)} files)"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_files_source(self.urls, storage_options=self.storage_options),
                hash_value(self.columns, "argument `columns`", where=where)]


@dataclass(frozen=True, eq=False)
class TorchSource(Op):
    """A map-style dataset (``__getitem__`` and ``__len__``), read by index."""
    dataset: Any = None
    kind: ClassVar[str] = "from_torch"

    def describe(self) -> str:
        return f"from_torch({type(self.dataset).__name__}, {len(self.dataset)} items)"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        try:
            return [hash_value(self.dataset, f"dataset `{type(self.dataset).__name__}`",
                               where=where)]
        except FingerprintError as e:
            raise FingerprintError(
                f"from_torch: the dataset cannot be fingerprinted: {e}. Name the version "
                "yourself with .snapshot(path, key='my-data-v1'), or teach snapcache the type "
                "with snapcache.fingerprint.register(type, fn)") from e


SOURCES = (IterableSource, GeneratorSource, RangeSource, FilesSource, ParquetSource, TorchSource)


# -- transformations ---------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class MapOp(Op):
    fn: Callable[[Any], Any] = None  # type: ignore[assignment]
    num_parallel_calls: int | None = None
    deterministic: bool = True
    executor: str = "thread"  # how, not what: not part of the fingerprint
    kind: ClassVar[str] = "map"

    def describe(self) -> str:
        return f"map `{callable_name(self.fn)}`"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [hash_function(self.fn, f"function `{callable_name(self.fn)}`", where=where)]


@dataclass(frozen=True, eq=False)
class FilterOp(Op):
    predicate: Callable[[Any], bool] = None  # type: ignore[assignment]
    kind: ClassVar[str] = "filter"

    def describe(self) -> str:
        return f"filter `{callable_name(self.predicate)}`"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [hash_function(self.predicate, f"function `{callable_name(self.predicate)}`",
                              where=where)]


@dataclass(frozen=True, eq=False)
class BatchOp(Op):
    batch_size: int = 1
    drop_remainder: bool = False
    kind: ClassVar[str] = "batch"

    def describe(self) -> str:
        return f"batch({self.batch_size})"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [hash_value(self.batch_size, "argument `batch_size`", where=where),
                hash_value(self.drop_remainder, "argument `drop_remainder`", where=where)]


@dataclass(frozen=True, eq=False)
class ShuffleOp(Op):
    buffer_size: int = 1
    seed: int | None = None
    kind: ClassVar[str] = "shuffle"

    def describe(self) -> str:
        return f"shuffle({self.buffer_size})"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [hash_value(self.buffer_size, "argument `buffer_size`", where=where),
                hash_value(self.seed, "argument `seed`", where=where)]


@dataclass(frozen=True, eq=False)
class TakeOp(Op):
    count: int = 0
    kind: ClassVar[str] = "take"

    def describe(self) -> str:
        return f"take({self.count})"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [hash_value(self.count, "argument `count`", where=where)]


@dataclass(frozen=True, eq=False)
class InterleaveOp(Op):
    fn: Callable[[Any], Any] = None  # type: ignore[assignment]
    cycle_length: int = 1
    block_length: int = 1
    num_parallel_calls: int | None = None
    deterministic: bool = True
    kind: ClassVar[str] = "interleave"

    def describe(self) -> str:
        return f"interleave `{callable_name(self.fn)}`"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [hash_function(self.fn, f"function `{callable_name(self.fn)}`", where=where),
                hash_value(self.cycle_length, "argument `cycle_length`", where=where),
                hash_value(self.block_length, "argument `block_length`", where=where)]


@dataclass(frozen=True, eq=False)
class ShardOp(Op):
    num_shards: int = 1
    index: int = 0
    kind: ClassVar[str] = "shard"

    def describe(self) -> str:
        return f"shard({self.num_shards}, {self.index})"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [hash_value(self.num_shards, "argument `num_shards`", where=where),
                hash_value(self.index, "argument `index`", where=where)]


@dataclass(frozen=True, eq=False)
class RepeatOp(Op):
    count: int | None = None
    kind: ClassVar[str] = "repeat"

    def describe(self) -> str:
        return "repeat()" if self.count is None else f"repeat({self.count})"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [hash_value(self.count, "argument `count`", where=where)]


@dataclass(frozen=True, eq=False)
class PrefetchOp(Op):
    buffer_size: int = 1
    kind: ClassVar[str] = "prefetch"
    content: ClassVar[bool] = False

    def describe(self) -> str:
        return "prefetch"


class CacheState:
    """The in-memory copy filled by a cache op's first complete epoch (not part of the spec)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[Any] | None = None


@dataclass(frozen=True, eq=False)
class CacheOp(Op):
    state: CacheState = field(default_factory=CacheState)
    kind: ClassVar[str] = "cache"
    content: ClassVar[bool] = False

    def describe(self) -> str:
        return "cache"


@dataclass(frozen=True, eq=False)
class SnapshotOp(Op):
    path: str = ""
    options: SnapshotOptions = field(default_factory=SnapshotOptions)
    kind: ClassVar[str] = "snapshot"
    content: ClassVar[bool] = False

    def describe(self) -> str:
        return f"snapshot({self.path!r})"


def lineage(op: Op) -> list[Op]:
    """The ops from the source down to ``op``, in pipeline order."""
    chain = []
    node: Op | None = op
    while node is not None:
        chain.append(node)
        node = node.parent
    return chain[::-1]
