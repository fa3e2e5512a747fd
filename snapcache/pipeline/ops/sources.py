"""Sources: where examples come from (in-memory collections, generators, ranges, files,
Parquet, map-style torch datasets), with their runners.

Every source honours the current stream (:mod:`snapcache.pipeline.streams`): it yields its
share of the examples, after skipping the ones a resumed snapshot already holds. A source is
``seekable`` when it can start at any example by index.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator

from snapcache.errors import FingerprintError
from snapcache.fingerprint import FingerprintNode, hash_value
from snapcache.fingerprint import sources as source_fp
from snapcache.pipeline import streams
from snapcache.pipeline.ops.base import Op, Traits, callable_name, runs
from snapcache.store import parquet
from snapcache.store.fs import file_identities as bulk_identities

def file_identities(urls: Any, strict: bool, storage_options: dict) -> list[dict]:
    """What fingerprints a list of files (path, size, mtime or ETag; content if ``strict``):
    read here, in the pipeline, so that fingerprinting stays pure."""
    return bulk_identities([str(url) for url in urls], strict, storage_options)


class UnitSource:
    """What a source made of files offers delta snapshots (see ``Traits.units``)."""

    urls: tuple[str, ...]
    storage_options: dict

    def unit_identities(self) -> list[dict]:
        """Each file's identity, taken once per op object."""
        return self.memo("unit_identities", lambda: file_identities(
            self.urls, getattr(self, "strict", False), self.storage_options))

    def with_units(self, urls: Any) -> Op:
        """This source restricted to ``urls`` (a subset of its files, in order)."""
        return dataclasses.replace(self, urls=tuple(urls))

    def unit_lengths(self, urls: Any) -> list[int] | None:
        """Examples each of ``urls`` yields, in order (None: not known without reading them)."""
        return [1] * len(urls)


SEEKABLE = Traits(source=True, seekable=True, length="rule")
"""A source that can start at any example and whose length is known up front."""


@dataclass(frozen=True, eq=False)
class IterableSource(Op):
    items: Any = None
    kind: ClassVar[str] = "from_iterable"
    fingerprint_source: ClassVar = ("items",)

    @property
    def traits(self) -> Traits:
        indexable = hasattr(self.items, "__getitem__") and hasattr(self.items, "__len__")
        return Traits(source=True, seekable=indexable, length="rule")

    def describe(self) -> str:
        n = len(self.items) if hasattr(self.items, "__len__") else "?"
        return f"from_iterable({n} items)"

    def length(self, upstream: int | None) -> int | None:
        return len(self.items) if hasattr(self.items, "__len__") else None

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_iterable_source(self.items, label="items")]


@runs(IterableSource)
def run_iterable(op: IterableSource, epoch: int) -> Iterator[Any]:
    return streams.split(op.items)


@dataclass(frozen=True, eq=False)
class GeneratorSource(Op):
    fn: Callable[..., Any] = None  # type: ignore[assignment]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    kind: ClassVar[str] = "from_generator"
    TRAITS: ClassVar = Traits(source=True)
    fingerprint_source: ClassVar = ("fn", "args", "kwargs")

    def describe(self) -> str:
        return f"from_generator({callable_name(self.fn)})"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_generator_source(self.fn, self.args, self.kwargs)]


@runs(GeneratorSource)
def run_generator(op: GeneratorSource, epoch: int) -> Iterator[Any]:
    produced = op.fn(*op.args, **op.kwargs)
    try:
        iter(produced)
    except TypeError:
        raise TypeError(
            f"from_generator: {callable_name(op.fn)}(...) returned "
            f"{type(produced).__name__}, not an iterable; pass a generator function") from None
    return streams.split(produced)


@dataclass(frozen=True, eq=False)
class RangeSource(Op):
    start: int = 0
    stop: int = 0
    step: int = 1
    kind: ClassVar[str] = "range"
    TRAITS: ClassVar = SEEKABLE
    fingerprint_source: ClassVar = ("start", "stop", "step")

    def describe(self) -> str:
        return f"range({self.start}, {self.stop}" + (f", {self.step})" if self.step != 1 else ")")

    def length(self, upstream: int | None) -> int | None:
        return len(range(self.start, self.stop, self.step))

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_range_source(self.start, self.stop, self.step)]


@runs(RangeSource)
def run_range(op: RangeSource, epoch: int) -> Iterator[Any]:
    return iter(streams.split_range(op.start, op.stop, op.step))


@dataclass(frozen=True, eq=False)
class FilesSource(UnitSource, Op):
    urls: tuple[str, ...] = ()
    strict: bool = False
    storage_options: dict = field(default_factory=dict)
    kind: ClassVar[str] = "from_files"
    TRAITS: ClassVar = Traits(source=True, seekable=True, length="rule", units=True)
    fingerprint_source: ClassVar = ("urls", "strict")
    not_fingerprinted: ClassVar = ("storage_options",)

    def describe(self) -> str:
        return f"from_files({len(self.urls)} files)"

    def length(self, upstream: int | None) -> int | None:
        return len(self.urls)

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_files_source(self.unit_identities(), strict=self.strict)]

    def lineage_children(self, where: str) -> list[FingerprintNode]:
        """What counts of this source in a delta snapshot's lineage: not its files."""
        return [source_fp.files_lineage_node(strict=self.strict)]


@runs(FilesSource)
def run_files(op: FilesSource, epoch: int) -> Iterator[Any]:
    return streams.split(op.urls)


@dataclass(frozen=True, eq=False)
class ParquetSource(UnitSource, Op):
    """Rows of Parquet files, as dicts of column values; split by file or row group."""
    urls: tuple[str, ...] = ()
    columns: tuple[str, ...] | None = None
    storage_options: dict = field(default_factory=dict)
    kind: ClassVar[str] = "from_parquet"
    TRAITS: ClassVar = Traits(source=True, seekable=True, units=True)
    fingerprint_source: ClassVar = ("urls", "columns")
    not_fingerprinted: ClassVar = ("storage_options",)

    def describe(self) -> str:
        return f"from_parquet({len(self.urls)} files)"

    def fingerprint_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.hash_files_source(self.unit_identities()),
                hash_value(self.columns, "argument `columns`", where=where)]

    def unit_lengths(self, urls: Any) -> list[int] | None:
        return parquet.file_rows(list(urls), self.storage_options)  # footers only

    def lineage_children(self, where: str) -> list[FingerprintNode]:
        return [source_fp.files_lineage_node(strict=False),
                hash_value(self.columns, "argument `columns`", where=where)]


@runs(ParquetSource)
def run_parquet(op: ParquetSource, epoch: int) -> Iterator[Any]:
    spec = streams.current()
    # The pieces are listed now, in the caller's context (streams travel in a context variable).
    pieces = parquet.stream_pieces(op.urls, spec.index, spec.count, op.storage_options)
    return parquet.read_pieces(pieces, op.columns, skip=spec.skip,
                               storage_options=op.storage_options)


@dataclass(frozen=True, eq=False)
class TorchSource(Op):
    """A map-style dataset (``__getitem__`` and ``__len__``), read by index."""
    dataset: Any = None
    kind: ClassVar[str] = "from_torch"
    TRAITS: ClassVar = Traits(source=True, seekable=True)
    fingerprint_source: ClassVar = ("dataset",)

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


@runs(TorchSource)
def run_torch(op: TorchSource, epoch: int) -> Iterator[Any]:
    from snapcache.adapters.torch import numpy_example  # imports no torch itself

    spec = streams.current()
    dataset = op.dataset
    # By index, always: iter() of a map-style dataset would call __getitem__ until IndexError.
    indices = range(spec.index + spec.count * spec.skip, len(dataset), spec.count)
    return (numpy_example(dataset[i]) for i in indices)
